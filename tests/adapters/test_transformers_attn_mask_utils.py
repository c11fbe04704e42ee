"""The re-implemented mask equals transformers' own, wherever transformers still ships it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specshim.adapters.imports.transformers_attn_mask_utils import prepare_4d_causal_attention_mask

torch = pytest.importorskip("torch")
original = pytest.importorskip("transformers.modeling_attn_mask_utils")


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    query=st.integers(1, 9),
    past=st.integers(0, 6),
    window=st.one_of(st.none(), st.integers(1, 12)),
    padded=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_matches_transformers(batch, query, past, window, padded, seed) -> None:
    torch.manual_seed(seed)
    embeds = torch.zeros(batch, query, 4)
    mask = (torch.rand(batch, query + past) > 0.3).long() if padded else None
    args = (mask, (batch, query), embeds, past)
    want = original._prepare_4d_causal_attention_mask(*args, sliding_window=window)
    got = prepare_4d_causal_attention_mask(*args, sliding_window=window)
    assert (got is None and want is None) or torch.equal(got, want)
