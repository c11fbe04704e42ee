"""What one sample's announcement costs on its way to vLLM's worker, as bytes (what
:func:`specshim.runner.in_worker.protocol.announcing` sends) against lists (what it sent before).

The engine and native backends announce each sample in its request's
``SamplingParams.extra_args``: the file, the row's token ids and loss mask. vLLM checks every
integer of ``extra_args`` when the parameters are made, deep-copies them in ``add_request``,
encodes them with MessagePack for the engine core (these three on the caller's thread, the one
that also steps the engine), which decodes them, and pickles the scheduler's output to the
worker. Each step here is vLLM's own code; medians of ``--repeats`` rounds, per prompt.

    .venv/bin/python benchmarks/announcement.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import functools
import pickle
import statistics
import time
from typing import Any

from common import save_results
from vllm import SamplingParams
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from specshim.runner.in_worker.protocol import ANNOUNCED, Expected, announcing

TOKENS = (512, 2048, 8192)


def as_lists(expected: Expected, with_ids: bool) -> SamplingParams:
    """The announcement as it was sent before: lists (with the row's ids, or the mask alone
    as in benchmarks.md run 12)."""
    said: dict[str, Any] = {"file": expected.path, "loss_mask": expected.loss_mask,
                            "where": expected.where}  # fmt: skip
    if with_ids:
        said["input_ids"] = expected.input_ids
    return SamplingParams(max_tokens=1, extra_args={ANNOUNCED: said})


def seconds(make: Any, repeats: int) -> tuple[float, float]:
    """Median seconds per prompt on the caller's side (make, copy, encode) and on vLLM's
    (decode in the engine core, pickle to the worker and back)."""
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(SamplingParams)
    caller, engine = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        sent = encoder.encode(make().clone())
        middle = time.perf_counter()
        pickle.loads(pickle.dumps(decoder.decode(sent)))
        caller.append(middle - start)
        engine.append(time.perf_counter() - middle)
    return statistics.median(caller), statistics.median(engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    ways = {
        "lists, mask only (run 12)": lambda e: as_lists(e, with_ids=False),
        "lists, mask and ids": lambda e: as_lists(e, with_ids=True),
        "bytes, mask and ids (now)": announcing,
    }
    print("| prompt tokens | announcement | caller ms | vLLM ms | total vs run 12's |")
    print("| --- | --- | --- | --- | --- |")
    results = []
    for tokens in TOKENS:
        expected = Expected("/out/data_0.pt", list(range(1000, 1000 + tokens)), [1] * tokens,
                            "line 1 (data_0.pt)")  # fmt: skip
        measured = {way: seconds(functools.partial(make, expected), args.repeats)
                    for way, make in ways.items()}  # fmt: skip
        baseline = sum(measured["lists, mask only (run 12)"])
        for way, (caller, engine) in measured.items():
            ratio = (caller + engine) / baseline
            print(f"| {tokens} | {way} | {caller * 1e3:.3f} | {engine * 1e3:.3f} | {ratio:.2f} |")
            results.append({"tokens": tokens, "way": way, "caller_s": caller,
                            "vllm_s": engine, "vs_run12": ratio})  # fmt: skip
    save_results("announcement", results)


if __name__ == "__main__":
    main()
