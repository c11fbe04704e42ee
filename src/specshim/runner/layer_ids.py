"""Layer ids: the one order every list of them takes, and the two numberings.

Order: every extraction path (speculators' generator, its capture in vLLM's engine loop, vLLM's
``extract_hidden_states``) captures the layers as the forward pass reaches them, so a sample
holds its states in ascending layer order whatever order the ids were asked in. A list kept in
another order would label those states with the wrong ids, and a draft would be served with
layers it was not trained on; so every list specshim takes, records or reads (``--layers``,
the extraction's manifest and resume fingerprints, ``data_config.json``, ``convert``,
``export``) is :func:`ascending`, and an id given twice is refused.

Numbering: speculators 0.3/0.4's id ``k`` is the output of decoder layer ``k``; vLLM's id ``k``
(``eagle_aux_hidden_state_layer_ids``, and the >= 0.5 data written through it) is the stream
entering layer ``k``, so **vLLM id = speculators 0.3/0.4 id + 1** (docs/migration.md).
"""

from __future__ import annotations

from collections import Counter


class LayerIdError(ValueError):
    """A list of layer ids that cannot label a sample's states; the message is one line."""


def ascending(ids: list[int], what: str) -> list[int]:
    """``ids`` in ascending order, the order a sample holds its layers; an id given twice is
    an error naming ``what`` (where the ids came from)."""
    if repeated := [k for k, n in Counter(ids).items() if n > 1]:
        raise LayerIdError(f"{what}: {repeated[0]} is given twice (expected distinct ids)")
    return sorted(ids)


def typed(ids: list[int]) -> str:
    """``ids`` as ``--layers`` takes them: ``3,16,30``."""
    return ",".join(map(str, ids))


def vllm_ids(generator_ids: list[int], shift: int = 1) -> list[int]:
    """vLLM's ids for speculators 0.3/0.4's ``generator_ids`` (the same tensors); a ``shift``
    other than 1 numbers them wrongly on purpose (``eval --layer-shift``, for comparisons)."""
    return [k + shift for k in generator_ids]


def generator_ids(vllm: list[int]) -> list[int]:
    """speculators 0.3/0.4's ids for vLLM's ids: :func:`vllm_ids` undone; vLLM's id 0 (the
    embeddings) has no such id."""
    if min(vllm, default=1) < 1:
        raise LayerIdError(
            f"vLLM layer ids {vllm} include 0 (the embeddings), which speculators 0.3/0.4 "
            "cannot name"
        )
    return [k - 1 for k in vllm]
