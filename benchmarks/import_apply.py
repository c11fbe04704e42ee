"""What specshim costs at start-up: `import specshim`, and `apply()` on an imported stack.

Each figure is the median of several fresh processes, next to a baseline measured in the same
run (this machine is shared and noisy): `python -c pass` for the import, and importing
speculators' generator (vLLM included) for apply.

    PYTHONPATH=.spec/0.4.0.1 .venv/bin/python benchmarks/import_apply.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

IMPORT = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
# speculators cannot be imported on transformers 5 without its first adapter: import it with
# that one applied, revert, then time a full apply() over the imported stack.
APPLY = (
    "import time, specshim; specshim.apply(only=['transformers_annotations']); "
    "import speculators.data_generation.vllm_hidden_states_generator; "
    "import speculators.data_generation.custom_worker; specshim.revert(); "
    "t = time.perf_counter(); specshim.apply(); print(time.perf_counter() - t)"
)
STACK = (
    "import time; t = time.perf_counter(); "
    "import speculators.data_generation.vllm_hidden_states_generator; "
    "print(time.perf_counter() - t)"
)


def timed(code: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = [
        (
            "import specshim",
            timed(IMPORT.format(stmt="import specshim"), args.runs),
            "import json (stdlib)",
            timed(IMPORT.format(stmt="import json"), args.runs),
            0.010,
        ),
    ]
    # apply() needs speculators importable; its import must succeed through specshim's hook
    stack = timed("import specshim; specshim.apply(); " + STACK, args.runs)
    rows.append(("specshim.apply() (stack imported)", timed(APPLY, args.runs),
                 "import generator + vLLM", stack, 0.100))  # fmt: skip
    print(f"{'measure':<36}{'median s':>10}  {'baseline':<26}{'median s':>10}{'ratio':>8}  goal")
    for name, value, base_name, base, goal in rows:
        verdict = "met" if value < goal else "MISSED"
        print(f"{name:<36}{value:>10.4f}  {base_name:<26}{base:>10.4f}{value / base:>8.3f}  "
              f"< {goal * 1000:.0f} ms: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
