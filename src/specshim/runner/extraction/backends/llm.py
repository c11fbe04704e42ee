"""speculators' generator's interface over vLLM's ``LLM``, shared by the engine and native
backends, and the ``LLM`` options they share."""

from __future__ import annotations

from typing import Any

from specshim import console
from specshim.runner import remote_code


def llm_options(
    model: str, max_model_len: int, tensor_parallel_size: int, worker_extension_cls: str
) -> dict[str, Any]:
    """``LLM(...)``'s arguments shared by the backends that run vLLM's ``LLM``, vLLM set up as
    speculators' generator sets it up: eager (speculators' forward is Python), no prefix
    caching (every token's states must be computed), a memory fraction of 0.8; the worker
    mixes in ``worker_extension_cls``."""
    return {
        "model": model,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.8,
        "worker_extension_cls": worker_extension_cls,
    }


class LLMGenerator:
    """speculators' generator's interface over vLLM's ``LLM``, for the backends that run it.

    ``model_path``, ``layer_ids``, ``tensor_parallel_size`` and ``vllm_config`` are what
    speculators' ``DataGenerationConfig.from_generator`` reads; ``generate`` (each backend's)
    cuts every sequence to ``max_model_len - 1`` tokens (:meth:`cut`) as the generator does.
    """

    def __init__(
        self,
        model: str,
        layer_ids: list[int],
        max_model_len: int,
        tensor_parallel_size: int,
        options: dict[str, Any],
        trust_remote_code: bool = False,
    ) -> None:
        from vllm import LLM

        console.phase("vLLM imported")
        self.model_path = model
        self.layer_ids = layer_ids
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len
        self.llm = LLM(**options, **remote_code.vllm_options(trust_remote_code))
        self.vllm_config = self.llm.llm_engine.vllm_config
        console.phase("vLLM's LLM made")

    def cut(self, token_ids: list[list[int]]) -> list[list[int]]:
        """Each sequence as the generator runs it: at most ``max_model_len - 1`` tokens."""
        return [ids[: self.max_model_len - 1] for ids in token_ids]

    def shutdown(self) -> None:
        """Stop vLLM's engine and its processes."""
        self.llm.llm_engine.engine_core.shutdown()
