"""Training throughput: `specshim train` against speculators' trainer driven directly.

Both train the same draft (the same model builder, TrainerConfig and data loader) in one
process after one untimed warm-up run each (FlexAttention compiles once per process). Two
figures, each a ratio of throughputs (goal: specshim at least 0.98 of direct):

- **steps**: the median training step, read from the time stamps of the per-step metrics
  speculators logs (one clock, attached the same way to both paths; the first step of each
  run, which pays for compilation, is left out). This is what the issue's goal is about.
- **runs**: the median wall time of a whole run of EPOCHS epochs, from the model's
  construction to the last checkpoint. For a large draft most of a run is building the model
  and writing checkpoints (GBs per epoch), so disk and page-cache state weigh on it.

Runs alternate in ABBA order (direct first in even repeats, specshim first in odd ones), and
each run starts from the same state: the previous run's checkpoints deleted and flushed, its
garbage collected, the CUDA cache emptied. (The first GPU measurement ran direct always
first, without the flush, and came out 0.91-0.97 for the 8B-shaped draft.)

    PYTHONPATH=.spec/0.4.0.1 python benchmarks/training_ratio.py --data HS --verifier M \
        [--device cuda] [--epochs 5] [--repeats 4] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: a way to train: (options, output folder) -> wall seconds
TrainingPath = Callable[[Any, Path], float]


def direct(args: Any, out: Path) -> float:
    """speculators' Trainer, built and run by hand the way its own script does (timed from the
    model's construction, as `specshim train` is: for a large draft, loading the verifier's
    embeddings and lm_head takes seconds)."""
    started = time.perf_counter()
    import numpy as np
    import torch
    from speculators.train.trainer import Trainer, TrainerConfig

    from specshim.runner import distributed, train
    from specshim.runner.train.draft import build_model

    dtype = getattr(torch, args.dtype)
    d2t = torch.from_numpy(np.load(args.data / "d2t.npy"))
    t2d = torch.from_numpy(np.load(args.data / "t2d.npy"))
    torch.manual_seed(0)
    model = build_model(args.verifier, d2t, t2d, 1, 3).to(dtype)
    options = dict(
        lr=1e-3,
        num_epochs=args.epochs,
        save_path=str(out / "checkpoints"),
        resume_from_checkpoint=False,
        is_distributed=False,
        local_rank=0 if args.device == "cuda" else torch.device(args.device),
        train_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": 3},
        val_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": 3},
    )
    accepted = inspect.signature(TrainerConfig).parameters
    config = TrainerConfig(**{k: v for k, v in options.items() if k in accepted})
    files = sorted(str(p) for p in args.data.glob("data_*.pt"))
    world = distributed.World(1, 0, 0)
    loader = train._loader(files, args.max_len, 0, dtype, world)
    Trainer(model, config, loader, None).run_training()
    return time.perf_counter() - started


def through_specshim(args: Any, out: Path) -> float:
    from specshim.runner import train

    started = time.perf_counter()
    train.train(
        args.data, args.verifier, out, epochs=args.epochs, max_len=args.max_len,
        device=args.device, dtype=args.dtype,
    )  # fmt: skip
    return time.perf_counter() - started


PATHS: dict[str, TrainingPath] = {"direct": direct, "specshim": through_specshim}


def clean_slate(out: Path) -> None:
    """Start the next run where this one started: no checkpoints, no garbage, no dirty pages."""
    import torch

    shutil.rmtree(out, ignore_errors=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    os.sync()


def compare(args: Any, root: Path, repeats: int) -> dict:
    """Run both paths ``repeats`` times (after a warm-up each), ABBA; medians and ratios."""
    from specshim.runner.train.metrics import MetricCollector

    metrics = logging.getLogger("speculators.metrics")
    metrics.setLevel(logging.INFO)  # what speculators' own script does; specshim train too
    runs: dict[str, list[float]] = {name: [] for name in PATHS}
    steps: dict[str, list[float]] = {name: [] for name in PATHS}
    for repeat in range(repeats + 1):  # repeat 0 warms up
        order = list(PATHS) if repeat % 2 == 0 else list(reversed(PATHS))
        for name in order:
            clock = MetricCollector()
            metrics.addHandler(clock)
            out = root / f"{name}-{repeat}"
            try:
                seconds = PATHS[name](args, out)
            finally:
                metrics.removeHandler(clock)
                clean_slate(out)
            print(f"{name} run {repeat}: {seconds:.2f} s, {len(clock.times)} steps", flush=True)
            if repeat:  # each run's first step compiles: left out
                runs[name].append(seconds)
                steps[name].extend(clock.step_seconds()[1:])
    run_median = {name: statistics.median(v) for name, v in runs.items()}
    step_median = {name: statistics.median(v) for name, v in steps.items()}
    return {
        "runs": runs,
        "median_run_seconds": run_median,
        "run_ratio": run_median["direct"] / run_median["specshim"],
        "median_step_seconds": step_median,
        "step_ratio": step_median["direct"] / step_median["specshim"],
        "steps_timed": {name: len(v) for name, v in steps.items()},
    }


def table(result: dict, epochs: int) -> str:
    runs, step = result["median_run_seconds"], result["median_step_seconds"]
    rows = [
        f"| path | median step | step throughput vs direct | median run of {epochs} epochs "
        "| run throughput vs direct |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, label in (("direct", "speculators' trainer, direct"), ("specshim", "specshim train")):
        rows.append(
            f"| {label} | {step[name] * 1000:.1f} ms | {step['direct'] / step[name]:.3f} "
            f"| {runs[name]:.2f} s | {runs['direct'] / runs[name]:.3f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=4)  # even: ABBA order balances
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    import specshim

    specshim.apply()
    with tempfile.TemporaryDirectory() as scratch:
        result = compare(args, Path(scratch), args.repeats)
    print(table(result, args.epochs))
    print(f"runs: {result['runs']}; steps timed: {result['steps_timed']}")


if __name__ == "__main__":
    main()
