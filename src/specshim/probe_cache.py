"""The outcome of ``specshim report``'s probes, kept while the installation stays the same.

Probing imports speculators' generator and every module an adapter waits for (vLLM,
transformers, torch): seconds each time, for an answer that depends only on the code those
imports ran, the files the probes read and the settings they saw. A healthy outcome (the
generator imports, no patch broken) is kept in the user's cache with a fingerprint of all
three: the size and time of every imported file and every file a probe read without importing
it, the time of every folder they sit in and of every ``sys.path`` entry, the interpreter, and
the settings vLLM, torch, CUDA and the loader read. It is reused while the fingerprint holds,
so any install, upgrade or edit makes the next report probe again. A broken outcome is never
kept (that is the installation a user is changing), and it replaces a healthy one kept before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from specshim import applier
from specshim.adapters import kit

#: The settings a probe's outcome may depend on: what vLLM, specshim, torch, CUDA, NCCL,
#: Triton, the hub and transformers read, where the dynamic loader and Python look.
SETTING_PREFIXES = (
    "VLLM_", "SPECSHIM_", "TORCH", "PYTORCH_", "CUDA", "NCCL_", "TRITON_", "HF_",
    "TRANSFORMERS_", "LD_", "PYTHON",
)  # fmt: skip
FORMAT = 2
#: How many outcomes (installations and settings) are kept; the oldest go first.
KEPT = 8


@dataclass(frozen=True)
class Probed:
    """What the probes found: every adapter's state, and the generator's import error."""

    adapters: applier.Report
    import_error: str | None
    #: when the probes ran, as ``time.time()``; earlier than now when reused
    at: float = field(default_factory=time.time)
    #: whether this outcome was kept from an earlier report rather than probed now
    kept: bool = False

    @property
    def healthy(self) -> bool:
        """Whether the outcome may be kept: the generator imported and no patch is broken."""
        return self.import_error is None and self.adapters.ok


def folder() -> Path | None:
    """Where outcomes are kept: ``$XDG_CACHE_HOME/specshim/report``, by default under
    ``~/.cache`` (where vLLM keeps its own cache too); None where there is no home to find (a
    container's user without one): nothing is kept then."""
    try:
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except (RuntimeError, KeyError):
        return None
    return Path(cache) / "specshim" / "report"


def _settings() -> str:
    """A digest of the interpreter, its path and the settings of :data:`SETTING_PREFIXES`
    (their values, a token among them, are never written down)."""
    settings = {
        "format": FORMAT,
        "interpreter": sys.executable,
        "python": sys.version,
        "path": list(sys.path),
        "environment": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(SETTING_PREFIXES)
        },
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _imported_files() -> dict[str, list[int] | None]:
    """Every imported module's file and every file a probe read without importing it, the
    folders they sit in, and ``sys.path``'s entries, with their stamps now (None for an entry
    that does not exist)."""
    files = {
        file
        for module in list(sys.modules.values())
        if isinstance(file := getattr(module, "__file__", None), str)
    } | {str(path) for path in kit.LOOKED_AT}
    paths = files | {os.path.dirname(f) for f in files} | {p or os.getcwd() for p in sys.path}
    return {path: _stamp(path) for path in sorted(paths)}


class Shelf:
    """Where the outcome for this interpreter and its settings is kept. Make it before
    probing: probes add to ``sys.path`` and set ``SPECSHIM_APPLY``."""

    def __init__(self) -> None:
        self.settings = _settings()
        where = folder()
        self.place = where / f"{self.settings[:24]}.json" if where else None

    def load(self) -> Probed | None:
        """The kept outcome, if every file and folder it was probed with is as it was; else
        None (probe again)."""
        if self.place is None:
            return None
        try:
            kept = json.loads(self.place.read_text())
            if kept["settings"] != self.settings:
                return None
            if any(_stamp(path) != stamp for path, stamp in kept["files"].items()):
                return None
            statuses = tuple(applier.AdapterStatus.from_dict(a) for a in kept["adapters"])
            return Probed(applier.Report(statuses), None, float(kept["at"]), kept=True)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # nothing kept, or kept by another specshim: probe again

    def save(self, probed: Probed) -> None:
        """Keep a healthy ``probed`` for the next report, or forget what was kept where it is
        not healthy; call it in the process that probed, right after, so that the fingerprint
        is of the code the probes met. Failing to write (read-only home, full disk) only costs
        the next report its probes."""
        if self.place is None:
            return
        if not probed.healthy:  # nor the healthy one kept before: it is not this one's truth
            with contextlib.suppress(OSError):
                self.place.unlink(missing_ok=True)
            return
        entry = {
            "settings": self.settings,
            "at": probed.at,
            "adapters": [a.to_dict() for a in probed.adapters.adapters],
            "files": _imported_files(),
        }
        try:
            self.place.parent.mkdir(parents=True, exist_ok=True)
            out = tempfile.NamedTemporaryFile(  # noqa: SIM115 closed below
                "w", dir=self.place.parent, suffix=".tmp", delete=False
            )
        except OSError:
            return
        try:
            with out:
                json.dump(entry, out)
            os.replace(out.name, self.place)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(out.name)
            return
        _prune(self.place.parent)


def _prune(where: Path) -> None:
    """Keep the :data:`KEPT` newest outcomes in ``where``."""
    with contextlib.suppress(OSError):
        kept = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEPT:]:
            old.unlink(missing_ok=True)
