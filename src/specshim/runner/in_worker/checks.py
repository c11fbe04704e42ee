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


def state_problem(state: Any, tokens: int, extremes: Any = None) -> str | None:
    """What is wrong with one layer's ``[tokens, hidden]`` states, or None.

    One pass of ``aminmax`` (it propagates NaN; Inf is an end), not ``isfinite(...).all()``
    plus ``any()``: three passes over every state. ``extremes``: the states' ``(min, max)``
    where they are known already (the worker computes them on the GPU, beside the copies to the
    host)."""
    import torch

    if state.shape[0] != tokens:
        return f"states for {state.shape[0]} tokens, the row has {tokens}"
    low, high = (float(x) for x in (torch.aminmax(state) if extremes is None else extremes))
    if not (math.isfinite(low) and math.isfinite(high)):
        return "states hold NaN or Inf"
    if low == 0 and high == 0:
        return "states are all zero"
    return None


def sample_problem(
    where: str, layer_ids: list[int], states: list[Any], tokens: int, extremes: Any = None
) -> str | None:
    """What keeps one sample's per-layer states (``layer_ids``' order) from being written, as
    the line the user sees (it names ``where`` and the layer), or None. ``extremes``: the
    layers' ``[layers, 2]`` (min, max) where known (:func:`state_problem`)."""
    for place, (layer, state) in enumerate(zip(layer_ids, states, strict=True)):
        known = None if extremes is None else extremes[place]
        if found := state_problem(state, tokens, known):
            return f"{where}, layer {layer}: {found}; refusing to write them"
    return None
