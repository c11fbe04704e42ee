"""Start and end cost: `specshim extract` from start to exit against vLLM's own prefill process.

Each path runs in a fresh process, the paths alternating round by round (``--rounds``), on the
same rows, each extraction into a fresh folder:

- ``vllm``: what a user runs instead: import vLLM, ``LLM(...)`` with the engine backend's
  settings (``llm_options`` without specshim's worker extension), the rows tokenized as
  ``extract`` tokenizes them, ``generate(max_tokens=1)``, exit;
- ``engine``, ``generator``: ``specshim extract --backend ...`` (``--paths`` picks them).

The wall time is from the process's start to its exit, seen from here. Where each one spent it
comes from its phase marks (``SPECSHIM_DEBUG``, :func:`specshim.console.phase`), read from its
stderr: seconds from the process's start to each boundary, medians over the rounds.

    PYTHONPATH=.spec/0.4.0.1 .venv/bin/python benchmarks/start_cost.py [--rounds 3] \\
        [--model DIR --data FILE] [--rows 32] [--paths vllm,engine,generator]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PATHS = ("vllm", "engine", "generator")
#: A phase mark on stderr, as specshim's command line writes it and as :func:`prefill` does.
MARK = re.compile(r"^(?:specshim: )?phase (.+) at (\d+\.\d+)$", re.MULTILINE)


def mark(name: str) -> None:
    """The vLLM path's phase marks, in the form specshim's command line writes its own."""
    print(f"phase {name} at {time.monotonic():.6f}", file=sys.stderr, flush=True)


def prefill(model: str, data: str, max_model_len: int) -> None:
    """vLLM alone: start, prefill every row once (one token generated), exit."""
    from specshim import hardware
    from specshim.runner import dataset, remote_code
    from specshim.runner.extraction.backends.llm import llm_options

    if hardware.detect().kind == "cpu":  # what vLLM needs on a CPU; elsewhere vLLM's defaults
        hardware.prepare_for_vllm(1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    mark("vLLM imported")
    tokenizer = remote_code.tokenizer(model, False)
    prompts = [s.input_ids[: max_model_len - 1] for s in dataset.read(Path(data), tokenizer)]
    mark("rows tokenized")
    options = llm_options(model, max_model_len, 1, "")
    del options["worker_extension_cls"]
    llm = LLM(**options)
    mark("engine started")
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                 SamplingParams(max_tokens=1), use_tqdm=False)  # fmt: skip
    mark("prefill done")


def run_once(path: str, model: str, data: str, max_model_len: int, out: Path) -> dict:
    """One fresh process of ``path``: its wall time and its phases, in seconds from its start."""
    if path == "vllm":
        cmd = [sys.executable, __file__, "--prefill", model, data, str(max_model_len)]
    else:
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "specshim.cli", "extract", "--model", model,
               "--data", data, "--out", str(out), "--max-model-len", str(max_model_len),
               "--backend", path]  # fmt: skip
    env = {**os.environ, "SPECSHIM_DEBUG": "1"}
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"{path} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    phases = {name: float(at) - start for name, at in MARK.findall(done.stderr)}
    return {"wall": wall, "phases": phases}


def build(work: Path, rows: int) -> tuple[str, str]:
    """A tiny model and ``rows`` chat rows from specshim's test bed."""
    from specshim.testbed import data, tiny_model

    model = tiny_model.build(work / "model")
    return str(model), str(data.write(work / "data.jsonl", count=rows))


def table(results: dict[str, list[dict]]) -> str:
    """Wall times (median, spread, against vLLM alone) and each path's phases (medians)."""
    base = statistics.median(r["wall"] for r in results["vllm"]) if "vllm" in results else None
    lines = ["| path | wall to exit, median (s) | spread (s) | vs vLLM alone (s) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for path, runs in results.items():
        walls = [r["wall"] for r in runs]
        median = statistics.median(walls)
        diff = f"{median - base:+.1f}" if base is not None else "-"
        lines.append(f"| {path} | {median:.1f} | {min(walls):.1f} to {max(walls):.1f} | {diff} |")
    for path, runs in results.items():
        names = list(dict.fromkeys(n for r in runs for n in r["phases"]))
        lines += ["", f"| {path}: phase ended | s from start (median) | this phase (s) |",
                  "| --- | --- | --- |"]  # fmt: skip
        before = 0.0
        for name in [*names, "exit"]:
            ats = [r["wall"] if name == "exit" else r["phases"].get(name) for r in runs]
            at = statistics.median(a for a in ats if a is not None)
            lines.append(f"| {name} | {at:.1f} | {at - before:.1f} |")
            before = at
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", help="a model folder (default: build a tiny Llama)")
    parser.add_argument("--data", help="chat rows, JSONL (default: the test bed's)")
    parser.add_argument("--rows", type=int, default=32, help="rows of the built data")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--paths", default="vllm,engine", help=f"of {','.join(PATHS)}")
    parser.add_argument("--work", type=Path, help="where the folders go (default: a temporary)")
    parser.add_argument("--prefill", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prefill:
        prefill(args.prefill[0], args.prefill[1], int(args.prefill[2]))
        return
    paths = args.paths.split(",")
    if unknown := sorted(set(paths) - set(PATHS)):
        parser.error(f"--paths: {', '.join(unknown)} is not one of {', '.join(PATHS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="specshim-start-"))
    model, data = args.model, args.data
    if model is None or data is None:
        built = build(work, args.rows)
        model, data = model or built[0], data or built[1]
    results: dict[str, list[dict]] = {p: [] for p in paths}
    for _ in range(args.rounds):  # alternating: the machine's noise spreads over every path
        for path in paths:
            found = run_once(path, model, data, args.max_model_len, work / f"out-{path}")
            results[path].append(found)
            print(f"{path}: {found['wall']:.1f} s", file=sys.stderr, flush=True)
    print(table(results))
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
