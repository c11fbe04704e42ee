"""speculators' trainer: its config classes, attention and checkpoints.

In the order they apply: :data:`ADAPTERS`.
"""

from specshim.adapters.training import (
    checkpoint_device,
    cpu_flex_attention,
    speculators_config_transformers5,
)

ADAPTERS = (
    speculators_config_transformers5.ADAPTER,
    cpu_flex_attention.ADAPTER,
    checkpoint_device.ADAPTER,
)
