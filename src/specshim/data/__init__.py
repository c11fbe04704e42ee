"""Data shipped inside the package: the recorded vLLM snapshots (``contracts/vllm-<version>.json``)
and, in a wheel, the compatibility matrix (``top_level/compat_matrix.yaml``: the repository's
top-level file, mapped there by pyproject.toml; :func:`specshim.matrix.shipped` finds it).

They are found through :mod:`importlib.resources`, so an installed wheel reads the files it
ships exactly as a checkout (an editable install) reads ``src/specshim/data``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def path(name: str) -> Path:
    """``name`` (a file or folder of this package) as a file-system path.

    pip installs a wheel unpacked, so the resource is a real path; the scripts that rewrite
    these files and ``specshim triage --contracts`` need one (a zipped install has none, and
    is named as the reason).
    """
    resource = resources.files(__name__) / name
    if not isinstance(resource, Path):
        raise FileNotFoundError(f"{resource}: specshim's data must be installed unpacked")
    return resource
