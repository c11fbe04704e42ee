"""Warm the model up after the KV cache exists, as the engine core does since vLLM 0.27.

Up to 0.26 ``Executor.initialize_from_config`` also compiled and warmed up the model; from
0.27 the engine core makes a separate ``compile_or_warm_up_model()`` call, which the
generator does not know about. Without it the first real batch pays for warm-up, and backends
that allocate workspaces during warm-up meet them missing. (vLLM's CPU worker skips warm-up
once a KV cache exists, so on the CPU this call changes nothing: its effect is on GPU workers,
and it cannot be observed by this project's CPU tests.)
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.executor.extraction_executor import NAME as SEAM
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.kit import module, source, wrap
from specshim.adapters.model import Adapter, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import EXECUTOR, GENERATOR


def probe() -> Probe:
    executor = vars(module(GENERATOR))["MultiprocExecutor"]
    if not hasattr(executor, "compile_or_warm_up_model"):
        return not_needed("the executor has no compile_or_warm_up_model")
    if "compile_or_warm_up_model" in source(executor.initialize_from_config):
        return not_needed("initialize_from_config still warms the model up (vLLM before 0.27)")
    return needed("initialize_from_config no longer warms up; the engine calls it separately")


def _initialize(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    wrapped(*args, **kwargs)
    instance.compile_or_warm_up_model()


def patches() -> list[Patch]:
    return [wrap(installed_executor_class(), "initialize_from_config", _initialize)]


ADAPTER = Adapter(
    name="warmup_split",
    targets=("SpecshimExtractionExecutor.initialize_from_config",),
    waits_for=(GENERATOR,),
    requires=(SEAM,),
    why="vLLM 0.27 split warm-up out of initialize_from_config",
    upstream="vLLM 0.27.0 EngineCore._initialize_kv_caches (compile_or_warm_up_model)",
    remove_when="speculators' generator is no longer used (0.5+)",
    unobservable=(
        "vLLM's CPU worker skips warm-up once a KV cache exists, so the call changes nothing on "
        "the CPU; its effect is on GPU workers of vLLM 0.27+, and CUDA vLLM 0.27+ pins a torch the "
        "H200 test machine's image lacked"
    ),
    facts=(
        *facts("exists", f"{EXECUTOR}.compile_or_warm_up_model"),
        *facts("source", f"{EXECUTOR}.initialize_from_config", marker="compile_or_warm_up_model"),
    ),
    probe=probe,
    patches=patches,
)
