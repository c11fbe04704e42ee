"""Build speculators' KV cache the classic way: switch vLLM 0.34's extensible KV cache off.

vLLM 0.34.0 turns ``CacheConfig.enable_extensible_kv_cache`` on by default on CUDA and ROCm:
workers reserve the cache's address range with virtual memory and only commit pages when the
engine core calls ``finalize_extensible_kv_cache`` after warm-up. speculators' generator starts
the engine by hand and never makes that call, so the cache would stay uncommitted. The
generator's ``CacheConfig`` is built with the feature off (vLLM's own documented opt-out),
which keeps the estimate-based sizing the generator was written for. On the CPU vLLM resolves
it to off anyway; the probe decides on the field, not the platform, so GPU runs are covered.
"""

from __future__ import annotations

from specshim.adapters.kit import calls_with_keyword, module, parameters, with_keywords
from specshim.adapters.model import Adapter, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class

FIELD = "enable_extensible_kv_cache"


def probe() -> Probe:
    cache_config = vars(module(GENERATOR))["CacheConfig"]
    if FIELD not in parameters(cache_config):
        return not_needed("CacheConfig has no enable_extensible_kv_cache (vLLM before 0.34)")
    if calls_with_keyword(generator_class()._create_vllm_config, "CacheConfig", FIELD):
        return not_needed("the generator sets enable_extensible_kv_cache itself")
    return needed("vLLM defaults to an extensible KV cache the generator never finalizes")


def patches() -> list[Patch]:
    return [with_keywords(module(GENERATOR), "CacheConfig", force={FIELD: False})]


ADAPTER = Adapter(
    name="extensible_kv_cache_off",
    targets=(f"{GENERATOR}.CacheConfig",),
    waits_for=(GENERATOR,),
    why="vLLM 0.34 defaults to an extensible KV cache that only the engine core finalizes",
    upstream="vLLM 0.34.0 vllm/config/cache.py enable_extensible_kv_cache, "
    "EngineCore._initialize_kv_caches (finalize_extensible_kv_cache)",
    remove_when="speculators' generator is no longer used (0.5+)",
    unobservable=(
        "vLLM resolves the extensible KV cache to off on the CPU; it is on by default only on "
        "CUDA and ROCm from vLLM 0.34, whose CUDA build pins a torch the H200 test machine's "
        "image lacked"
    ),
    facts=facts("fields", "vllm.config:CacheConfig"),
    probe=probe,
    patches=patches,
)
