"""Let speculators 0.3.0's capture forward find the embedding under its new name.

vLLM 0.11.1 renamed the models' ``get_input_embeddings`` to ``embed_input_ids``. speculators
0.3.0 replaces the base model's ``forward`` with its own loop that calls
``self.get_input_embeddings(input_ids)``, so the first forward pass in the worker raises
``AttributeError``. After the capture is set up, the base model instance gets the old name
bound to the new method. This runs in vLLM's worker processes, where the plugin entry point
applies specshim.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.kit import module, source, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import WORKER, WORKER_EXTENSION

REFERENCE_MODEL = "vllm.model_executor.models.llama"


def probe() -> Probe:
    if "get_input_embeddings" not in source(module(WORKER)._patched_forward):
        return not_needed("the capture forward calls embed_input_ids")
    if hasattr(module(REFERENCE_MODEL).LlamaModel, "get_input_embeddings"):
        return not_needed("vLLM's models still have get_input_embeddings (before 0.11.1)")
    return needed("vLLM's models renamed get_input_embeddings to embed_input_ids")


def base_model(model: Any) -> Any:
    """The decoder stack the capture forward replaces, as speculators finds it."""
    if hasattr(model, "get_language_model"):
        return model.get_language_model().model
    return model.model


def _setup(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    result = wrapped(*args, **kwargs)
    base = base_model(instance.model_runner.model)
    if not hasattr(base, "get_input_embeddings"):
        base.get_input_embeddings = base.embed_input_ids
    return result


def patches() -> list[Patch]:
    extension = getattr(module(WORKER), WORKER_EXTENSION)
    return [wrap(extension, "_setup_hidden_states_capture", _setup)]


ADAPTER = Adapter(
    name="worker_embed_input_ids",
    targets=(f"{WORKER}.{WORKER_EXTENSION}._setup_hidden_states_capture",),
    waits_for=(WORKER,),
    why="vLLM 0.11.1 renamed get_input_embeddings to embed_input_ids; 0.3.0's worker calls the old",
    upstream="vLLM 0.11.1 (models' embed_input_ids)",
    remove_when="speculators 0.3.0 is no longer supported (0.4 calls embed_input_ids)",
    left_out=(
        LeftOut("0.3.0", raises="RuntimeError", text="has no attribute 'get_input_embeddings'"),
    ),
    facts=facts(
        "exists",
        f"{REFERENCE_MODEL}:LlamaModel.get_input_embeddings",
        f"{REFERENCE_MODEL}:LlamaModel.embed_input_ids",
    ),
    probe=probe,
    patches=patches,
)
