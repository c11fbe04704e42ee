"""Training throughput: `specshim train` against speculators' trainer driven directly.

Both train the same draft (the same model builder, TrainerConfig and data loader) in one
process, alternately, after one untimed warm-up run each (FlexAttention compiles once per
process); the table gives the median wall time of a full run of EPOCHS epochs (checkpoints
included) and the ratio of throughputs (goal: specshim at least 0.98 of direct).

    PYTHONPATH=.spec/0.4.0.1 python benchmarks/training_ratio.py --data HS --verifier M \
        [--device cuda] [--epochs 5] [--repeats 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import tempfile
import time
from pathlib import Path


def direct(args: argparse.Namespace, out: Path) -> float:
    """speculators' Trainer, built and run by hand the way its own script does (timed from the
    model's construction, as `specshim train` is: for a large draft, loading the verifier's
    embeddings and lm_head takes seconds)."""
    started = time.perf_counter()
    import numpy as np
    import torch
    from speculators.train.trainer import Trainer, TrainerConfig

    from specshim.runner import distributed, train

    dtype = getattr(torch, args.dtype)
    d2t = torch.from_numpy(np.load(args.data / "d2t.npy"))
    t2d = torch.from_numpy(np.load(args.data / "t2d.npy"))
    torch.manual_seed(0)
    model = train.build_model(args.verifier, d2t, t2d, 1, 3).to(dtype)
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


def through_specshim(args: argparse.Namespace, out: Path) -> float:
    from specshim.runner import train

    started = time.perf_counter()
    train.train(
        args.data, args.verifier, out, epochs=args.epochs, max_len=args.max_len,
        device=args.device, dtype=args.dtype,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--verifier", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    import specshim

    specshim.apply()
    runs: dict[str, list[float]] = {"direct": [], "specshim": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats + 1):  # repeat 0 warms up
            for name, run in (("direct", direct), ("specshim", through_specshim)):
                seconds = run(args, Path(scratch) / f"{name}-{repeat}")
                if repeat:
                    runs[name].append(seconds)
    base, ours = statistics.median(runs["direct"]), statistics.median(runs["specshim"])
    print(f"| path | median run of {args.epochs} epochs | throughput vs direct |")
    print("| --- | --- | --- |")
    print(f"| speculators' trainer, direct | {base:.2f} s | 1.000 |")
    print(f"| specshim train | {ours:.2f} s | {base / ours:.3f} |")
    print(f"runs: {runs}")


if __name__ == "__main__":
    main()
