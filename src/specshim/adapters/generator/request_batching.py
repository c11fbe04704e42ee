"""Feed the generator batches that one scheduler step can finish.

The generator never calls ``Scheduler.update_from_output``, so no request ever finishes
while a call runs: with more prompts than ``max_num_seqs`` (32), 0.4 never schedules the rest
and fails with ``Request req_0_32 not found in captured states``; 0.3.0 aborts each request
after its first scheduled chunk, so a prompt split across steps loses its tail. Splitting the
input into batches of at most ``max_num_seqs`` prompts and ``max_num_batched_tokens`` tokens
avoids both; results are concatenated in input order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from specshim.adapters.kit import source, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class


def batches(lengths: Sequence[int], max_seqs: int, max_tokens: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` ranges of consecutive prompts within both limits (one prompt at least)."""
    start, tokens = 0, 0
    for i, length in enumerate(lengths):
        if i > start and (i - start >= max_seqs or tokens + length > max_tokens):
            yield start, i
            start, tokens = i, 0
        tokens += length
    if start < len(lengths):
        yield start, len(lengths)


def probe() -> Probe:
    if "update_from_output" in source(generator_class().generate):
        return not_needed("the generator lets the scheduler finish requests")
    return needed("requests never finish during a call, so the scheduler caps each call")


def _generate(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> list[dict]:
    token_ids = kwargs.pop("token_ids", None) if "token_ids" in kwargs else args[0]
    prompts = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
    if not prompts:
        return wrapped(prompts)  # let the generator raise its own error for empty input
    config = instance.vllm_config
    limit = config.model_config.max_model_len - 1
    lengths = [min(len(p), limit) for p in prompts]
    results: list[dict] = []
    for start, stop in batches(
        lengths,
        config.scheduler_config.max_num_seqs,
        config.scheduler_config.max_num_batched_tokens,
    ):
        results += wrapped(prompts[start:stop])
    return results


def patches() -> list[Patch]:
    return [wrap(generator_class(), "generate", _generate)]


ADAPTER = Adapter(
    name="request_batching",
    targets=(f"{GENERATOR}.VllmHiddenStatesGenerator.generate",),
    waits_for=(GENERATOR,),
    why="more prompts than max_num_seqs starve (0.4) or lose chunked tails (0.3.0)",
    upstream="speculators 0.3.0/0.4 generate() never calls Scheduler.update_from_output",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        LeftOut("0.4.0.1", raises="RuntimeError", text="not found in captured states"),
        LeftOut("0.3.0", wrong="states_misaligned"),
    ),
    probe=probe,
    patches=patches,
)
