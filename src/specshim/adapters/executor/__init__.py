"""The generator's executor: a subclass only the generator uses (the seam,
``extraction_executor``), so vLLM's own engine never runs patched code.

In the order they apply: :data:`ADAPTERS`.
"""

from specshim.adapters.executor import (
    extraction_executor,
    kv_cache_layout,
    rpc_reply_shape,
    sample_tokens_split,
    warmup_split,
    worker_start_method,
)

#: The adapters that patch the generator's executor subclass; they require the seam.
DEPENDENTS = (
    worker_start_method.ADAPTER,
    kv_cache_layout.ADAPTER,
    warmup_split.ADAPTER,
    sample_tokens_split.ADAPTER,
    rpc_reply_shape.ADAPTER,
)

ADAPTERS = (extraction_executor.seam_for(DEPENDENTS), *DEPENDENTS)
