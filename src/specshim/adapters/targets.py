"""Module paths of the speculators code we adapt (the consumer side), and its generator class."""

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


def generator_class() -> Any:
    """speculators' ``VllmHiddenStatesGenerator``, from its already imported module."""
    return module(GENERATOR).VllmHiddenStatesGenerator
