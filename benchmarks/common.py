"""What every benchmark script shares: a fresh worker process per measurement, its result
line, the JSON the plot is drawn from, and the ceiling a GPU run's paths are read against."""

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


def ceiling(rates: dict[str, float]) -> tuple[float, str] | None:
    """A GPU run's ceiling, min(vLLM's prefill, the faster disk path), and which one it is;
    None for a run with neither."""
    bounds = {"prefill": rates.get("vllm_prefill", 0.0)}
    bounds["disk"] = max((r for p, r in rates.items() if p.startswith("disk")), default=0.0)
    measured = {name: rate for name, rate in bounds.items() if rate}
    if not measured:
        return None
    name = min(measured, key=measured.__getitem__)
    return measured[name], name
