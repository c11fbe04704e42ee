"""Module paths of the speculators code we adapt (the consumer side), its generator class, and
the vLLM targets several adapters' facts name."""

from typing import Any

from specshim.adapters.kit import module

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"
CONFIG_UTILS = "transformers.configuration_utils"
WORKER_EXTENSION = "HiddenStatesWorkerExtension"
SPECULATORS_CONFIG = "speculators.config"
EAGLE3_CONFIG = "speculators.models.eagle3.config"
EAGLE3_ATTENTION = "speculators.models.eagle3.attention"
CHECKPOINTER = "speculators.train.checkpointer"
#: vLLM: the executor speculators' generator drives, and the KV-cache helpers it calls.
EXECUTOR = "vllm.v1.executor.multiproc_executor:MultiprocExecutor"
KV_UTILS = "vllm.v1.core.kv_cache_utils"


def generator_class() -> Any:
    """speculators' ``VllmHiddenStatesGenerator``, from its already imported module."""
    return module(GENERATOR).VllmHiddenStatesGenerator
