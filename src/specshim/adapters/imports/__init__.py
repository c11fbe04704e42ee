"""Make ``import speculators`` and its generator's imports work: providers patched as soon as they
are imported, before the consumer imports them.

In the order they apply: :data:`ADAPTERS`.
"""

from specshim.adapters.imports import (
    kv_cache_planner_moved,
    transformers_annotations,
    transformers_attn_mask_utils,
)

ADAPTERS = (
    transformers_annotations.ADAPTER,
    transformers_attn_mask_utils.ADAPTER,
    kv_cache_planner_moved.ADAPTER,
)
