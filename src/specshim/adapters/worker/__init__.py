"""speculators' worker extension, inside vLLM's worker processes (re-applied there by specshim's
vLLM plugin).

In the order they apply: :data:`ADAPTERS`.
"""

from specshim.adapters.worker import (
    worker_batch_order_v2,
    worker_embed_input_ids,
)

ADAPTERS = (
    worker_embed_input_ids.ADAPTER,
    worker_batch_order_v2.ADAPTER,
)
