"""Every adapter, in the order they apply.

Consumer before provider: the first adapter makes ``import speculators`` possible, the rest
patch names in speculators' own modules (and a subclass that only speculators uses), so vLLM's
own engine never runs patched code.
"""

from __future__ import annotations

from specshim.adapters import (
    attention_block_size,
    checkpoint_device,
    cpu_flex_attention,
    device_memory_query,
    extensible_kv_cache_off,
    extraction_executor,
    finished_requests_reach_workers,
    kv_cache_config,
    kv_cache_layout,
    kv_cache_planner_moved,
    prefix_caching_off,
    request_batching,
    request_eos_token_id,
    request_order,
    rpc_reply_shape,
    sample_tokens_split,
    scheduler_block_size,
    scheduler_config_encoder_decoder,
    speculators_config_transformers5,
    transformers_annotations,
    transformers_attn_mask_utils,
    warmup_split,
    worker_batch_order_v2,
    worker_embed_input_ids,
    worker_start_method,
)
from specshim.adapters.base import Adapter

#: The adapters that patch the generator's executor subclass; they require the seam.
_EXECUTOR_LEVEL = (
    worker_start_method.ADAPTER,
    kv_cache_layout.ADAPTER,
    warmup_split.ADAPTER,
    sample_tokens_split.ADAPTER,
    rpc_reply_shape.ADAPTER,
)

ADAPTERS: tuple[Adapter, ...] = (
    transformers_annotations.ADAPTER,
    transformers_attn_mask_utils.ADAPTER,
    speculators_config_transformers5.ADAPTER,
    cpu_flex_attention.ADAPTER,
    checkpoint_device.ADAPTER,
    # vLLM's KV-cache planner, before speculators' generator imports it
    kv_cache_planner_moved.ADAPTER,
    # speculators' generator module (the consumer)
    attention_block_size.ADAPTER,
    prefix_caching_off.ADAPTER,
    device_memory_query.ADAPTER,
    scheduler_config_encoder_decoder.ADAPTER,
    kv_cache_config.ADAPTER,
    extensible_kv_cache_off.ADAPTER,
    scheduler_block_size.ADAPTER,
    request_eos_token_id.ADAPTER,
    request_order.ADAPTER,
    finished_requests_reach_workers.ADAPTER,  # inside request_batching: after every call
    request_batching.ADAPTER,
    # the generator's executor (a subclass only the generator uses)
    extraction_executor.seam_for(_EXECUTOR_LEVEL),
    *_EXECUTOR_LEVEL,
    # speculators' worker extension, inside vLLM's worker processes
    worker_embed_input_ids.ADAPTER,
    worker_batch_order_v2.ADAPTER,
)


def names() -> list[str]:
    return [a.name for a in ADAPTERS]


def get(name: str) -> Adapter:
    for adapter in ADAPTERS:
        if adapter.name == name:
            return adapter
    raise KeyError(f"no adapter named {name!r}; known adapters: {names()}")
