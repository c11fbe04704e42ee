"""What every benchmark script shares: a fresh worker process per measurement, its result
line, and the JSON the plot is drawn from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def run_worker(script: Path, *args: str, timeout: int = 1800) -> dict[str, Any]:
    """Run ``script`` with this interpreter; return the JSON of its last ``RESULT`` line."""
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def save_results(name: str, data: Any) -> Path:
    """Keep a benchmark's figures beside docs/benchmarks.md, for benchmarks/plot.py."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
