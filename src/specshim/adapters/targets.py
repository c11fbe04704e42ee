"""Module paths of the speculators code we adapt (the consumer side)."""

GENERATOR = "speculators.data_generation.vllm_hidden_states_generator"
WORKER = "speculators.data_generation.custom_worker"
CONFIG_UTILS = "transformers.configuration_utils"
WORKER_EXTENSION = "HiddenStatesWorkerExtension"
SPECULATORS_CONFIG = "speculators.config"
EAGLE3_CONFIG = "speculators.models.eagle3.config"
EAGLE3_ATTENTION = "speculators.models.eagle3.attention"
