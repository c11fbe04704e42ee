"""What keeps a sample's states from being written: the checks every writer makes.

Shared by every path that writes ``data_{i}.pt`` files: ``extract``'s own writer, the worker
writer (:mod:`specshim.runner.in_worker.writer`) and its writer processes
(:mod:`specshim.runner.in_worker.writer_processes`), and the native connector. Light on imports
(torch only inside the checks): a writer process imports it before anything else.
"""

from __future__ import annotations

import math
from typing import Any


def misaligned(where: str, ran: list[int], row: list[int]) -> str | None:
    """The refusal of a sample whose prompt vLLM ran with other token ids than its row's, or
    None: its states would be written under the row's ids and loss mask."""
    if ran == row:
        return None
    return (
        f"{where}: vLLM ran other input ids than the row's ({len(ran)} vs {len(row)} tokens): "
        "refusing to write misaligned data"
    )


def state_problem(state: Any, tokens: int, largest: Any = None) -> str | None:
    """What is wrong with one layer's ``[tokens, hidden]`` states, or None.

    One pass of ``aminmax`` (it propagates NaN; Inf is an end), not ``isfinite(...).all()``
    plus ``any()``: three passes over every state. ``largest``: the states' largest magnitude
    where it is known already (the worker computes it on the GPU, beside the copies to the
    host: :func:`largest_magnitudes`); it tells the same, being NaN, Inf or 0 exactly where
    the ends are."""
    import torch

    if state.shape[0] != tokens:
        return f"states for {state.shape[0]} tokens, the row has {tokens}"
    ends = [float(x) for x in (torch.aminmax(state) if largest is None else (largest,))]
    if not all(math.isfinite(x) for x in ends):
        return "states hold NaN or Inf"
    if not any(ends):
        return "states are all zero"
    return None


def sample_problem(
    where: str, layer_ids: list[int], states: list[Any], tokens: int, largest: Any = None
) -> str | None:
    """What keeps one sample's per-layer states (``layer_ids``' order) from being written, as
    the line the user sees (it names ``where`` and the layer), or None. ``largest``: the
    layers' largest magnitudes where known (:func:`state_problem`)."""
    for place, (layer, state) in enumerate(zip(layer_ids, states, strict=True)):
        known = None if largest is None else largest[place]
        if found := state_problem(state, tokens, known):
            return f"{where}, layer {layer}: {found}; refusing to write them"
    return None


def largest_magnitudes(per_sample: list[list[Any]]) -> Any:
    """Each sample's layers' largest magnitude, ``[samples, layers]`` float32 on the states'
    device, in one pass over the whole batch: ``torch._foreach_norm`` with ``ord=inf`` (its
    maximum propagates NaN; torch's own gradient clipping uses it), where a reduction per
    sample and layer would cost the worker's thread a kernel launch each."""
    import torch

    found = torch._foreach_norm([t for layers in per_sample for t in layers], ord=math.inf)
    return torch.stack(found).float().view(len(per_sample), -1)
