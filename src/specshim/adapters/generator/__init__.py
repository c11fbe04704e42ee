"""Names in speculators' generator module (the consumer): how it builds the scheduler, the KV cache
and its requests.

In the order they apply: :data:`ADAPTERS`.
"""

from specshim.adapters.generator import (
    attention_block_size,
    device_memory_query,
    extensible_kv_cache_off,
    finished_requests_reach_workers,
    kv_cache_config,
    prefix_caching_off,
    request_batching,
    request_eos_token_id,
    request_order,
    scheduler_block_size,
    scheduler_config_encoder_decoder,
)

ADAPTERS = (
    attention_block_size.ADAPTER,
    prefix_caching_off.ADAPTER,
    device_memory_query.ADAPTER,
    scheduler_config_encoder_decoder.ADAPTER,
    kv_cache_config.ADAPTER,
    extensible_kv_cache_off.ADAPTER,
    scheduler_block_size.ADAPTER,
    request_eos_token_id.ADAPTER,
    request_order.ADAPTER,
    finished_requests_reach_workers.ADAPTER,
    request_batching.ADAPTER,
)
