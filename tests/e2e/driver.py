"""Run speculators' real generator on real vLLM in a fresh process and save what it returned.

Used by the end-to-end tests, one process per (vLLM environment, speculators version,
adapter selection): vLLM's workers and patches must start from a clean slate each time.

    python driver.py --model DIR --out FILE [--exclude a,b] [--no-shim] [--batches 1,11,40]

Writes FILE (torch.save) with the results of each batching, or FILE.error.json with the
exception when the generator fails, and exits 3 in that case. It leaves with ``os._exit``:
a generator that failed half-way has no shutdown path, and its vLLM workers (which exit when
their parent dies) would otherwise keep the interpreter from exiting.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import traceback

from specshim import hardware

PROMPTS = 40
MAX_MODEL_LEN = 256


def prompts(
    vocab_size: int, length: int = 0, count: int = PROMPTS, seed: int = 0
) -> list[list[int]]:
    """``count`` deterministic prompts: of ``length`` tokens each, or (``length=0``) of 4 to 96
    tokens with the last one longer than max_model_len."""
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(8, vocab_size) for _ in range(n)]

    if length:
        return [prompt(length) for _ in range(count)]
    return [prompt(rng.randint(4, 96)) for _ in range(count - 1)] + [prompt(MAX_MODEL_LEN + 20)]


def in_worker(worker: object) -> dict[str, object]:
    """Run inside each vLLM worker: which model runner it uses, what specshim applied there."""
    import specshim

    runner = type(worker.model_runner)  # type: ignore[attr-defined]
    return {
        "runner": f"{runner.__module__}.{runner.__qualname__}",
        "applied": specshim.status().applied,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--exclude", default="")
    parser.add_argument("--no-shim", action="store_true")
    parser.add_argument("--batches", default="1,11,40")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=0, help="0: mixed lengths")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    parser.add_argument("--gpu", action="store_true", help="vLLM's CUDA build: no CPU settings")
    args = parser.parse_args()
    if not args.gpu:
        hardware.configure_cpu()
        hardware.bind_threads(args.tp)
    applied: list[str] = []
    try:
        if not args.no_shim:
            import specshim

            exclude = [x for x in args.exclude.split(",") if x]
            specshim.apply(exclude=exclude)
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        if not args.no_shim:
            applied = list(specshim.status().applied)
        # scripts/gpu_test.sh with STREAMS=N runs N tests at once on one GPU: each engine
        # then asks for its share of the device's memory, not speculators' 0.8 of it.
        share = os.environ.get("SPECSHIM_E2E_GPU_MEMORY")
        memory = {"gpu_memory_utilization": float(share)} if share else {}
        generator = VllmHiddenStatesGenerator(
            args.model, max_model_len=args.max_model_len, tensor_parallel_size=args.tp, **memory
        )
        data = prompts(len(generator.tokenizer), args.prompt_len)
        results: dict[str, object] = {"prompts": data, "layer_ids": generator.layer_ids}
        for size in (int(b) for b in args.batches.split(",")):
            batch_results = []
            for start in range(0, len(data), size):
                batch_results += generator.generate(data[start : start + size])
            results[f"batch_{size}"] = batch_results
        results["applied"] = applied
        results["workers"] = generator.executor.collective_rpc(in_worker)
    except Exception as exc:  # noqa: BLE001 any failure is the result, written for the test
        error = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
            "applied": applied,
        }
        with open(args.out + ".error.json", "w") as f:
            json.dump(error, f)
        print(error["traceback"], file=sys.stderr)
        return 3
    import torch

    torch.save(results, args.out)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
