"""Resolve the KV-cache layout right after the executor starts, as the engine core does (0.29+).

From vLLM 0.29 the engine core calls ``resolve_kv_cache_layout`` and
``executor.set_kv_cache_layout`` before it builds any KV-cache config; building one without
that raises ``ValueError: KV cache layout has not been resolved yet``. speculators' generator
never does it, so its executor does it at the end of ``__init__``. From 0.34 the call also
carries the context-parallel KV interleave size (``set_kv_cache_layout(name, interleave)``);
the generator never uses decode context parallelism, so the configured value is passed as it is
(the engine's ``adjust_dcp_kv_cache_interleave_size`` only changes it under DCP).
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.executor.extraction_executor import NAME as SEAM
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.kit import module, parameters, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import EXECUTOR, GENERATOR

LAYOUT_UTILS = "vllm.v1.attention.backends.utils"
INTERLEAVE = "cp_kv_cache_interleave_size"


def probe() -> Probe:
    executor = vars(module(GENERATOR))["MultiprocExecutor"]
    if not hasattr(executor, "set_kv_cache_layout"):
        return not_needed("the executor has no set_kv_cache_layout (vLLM before 0.29)")
    if not hasattr(module(LAYOUT_UTILS), "resolve_kv_cache_layout"):
        return not_needed("vLLM has set_kv_cache_layout but no resolve_kv_cache_layout")
    return needed("the engine core resolves the KV-cache layout; the generator does not")


def resolve_layout(executor: Any) -> None:
    specs = executor.get_kv_cache_specs()
    layout = module(LAYOUT_UTILS).resolve_kv_cache_layout(
        executor.vllm_config,
        executor.get_supported_kv_cache_layouts(),
        [spec for worker_specs in specs for spec in worker_specs.values()],
    )
    arguments: list[Any] = [layout.name]
    if INTERLEAVE in parameters(executor.set_kv_cache_layout):
        arguments.append(getattr(executor.vllm_config.parallel_config, INTERLEAVE))
    executor.set_kv_cache_layout(*arguments)


def _init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    wrapped(*args, **kwargs)
    resolve_layout(instance)


def patches() -> list[Patch]:
    return [wrap(installed_executor_class(), "__init__", _init)]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="ValueError", text="KV cache layout has not been resolved yet")


ADAPTER = Adapter(
    name="kv_cache_layout",
    targets=("SpecshimExtractionExecutor.__init__",),
    waits_for=(GENERATOR,),
    requires=(SEAM,),
    why="vLLM 0.29+ refuses to build a KV-cache config before the layout is resolved",
    upstream="vLLM 0.29.0 EngineCore._initialize_kv_caches (resolve_kv_cache_layout)",
    remove_when="speculators' generator is no longer used (0.5+), or it resolves the layout itself",
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
    ),
    facts=(
        *facts("exists", f"{EXECUTOR}.set_kv_cache_layout"),
        *facts("signature", f"{EXECUTOR}.set_kv_cache_layout"),
        *facts("exists", "vllm.v1.attention.backends.utils:resolve_kv_cache_layout"),
    ),
    probe=probe,
    patches=patches,
)
