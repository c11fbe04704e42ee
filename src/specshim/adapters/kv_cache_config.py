"""Build the KV-cache config the way the installed ``EngineCore._initialize_kv_caches`` does.

speculators builds it by hand with ``get_kv_cache_config_from_groups``. Upstream moved under it:
- 0.11.1 dropped the ``kv_cache_specs`` argument (0.3.0 still passes it: ``TypeError``);
- 0.18 has the engine set ``cache_config.block_size`` to the smallest group block size;
- 0.29 stores the resolved KV-cache layout on every config (``kv_cache_layout``);
- 0.32 stores ``hash_block_size`` and ``cache_hit_alignment_tokens`` on every config.
The wrapper drops the argument that is gone and fills in what the engine would fill in.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.base import (
    Adapter,
    Patch,
    Probe,
    calls_with_keyword,
    generator_class,
    module,
    needed,
    not_needed,
    parameters,
    wrap,
)
from specshim.adapters.targets import GENERATOR

KV_UTILS = "vllm.v1.core.kv_cache_utils"
ENGINE_FIELDS = ("kv_cache_layout", "hash_block_size", "cache_hit_alignment_tokens")


def _missing_pieces() -> list[str]:
    function = vars(module(GENERATOR))["get_kv_cache_config_from_groups"]
    pieces = []
    passes_specs = calls_with_keyword(
        generator_class().__init__, "get_kv_cache_config_from_groups", "kv_cache_specs"
    )
    if passes_specs and "kv_cache_specs" not in parameters(function):
        pieces.append("kv_cache_specs is no longer accepted")
    config_fields = getattr(
        module("vllm.v1.kv_cache_interface").KVCacheConfig, "__dataclass_fields__", {}
    )
    pieces += [
        f"KVCacheConfig.{f} is set by the engine" for f in ENGINE_FIELDS if f in config_fields
    ]
    return pieces


def probe() -> Probe:
    pieces = _missing_pieces()
    if pieces:
        return needed("; ".join(pieces))
    return not_needed("get_kv_cache_config_from_groups takes what the generator passes")


def complete_like_engine_core(config: Any, vllm_config: Any) -> None:
    """Set what the installed engine core sets on a freshly built KV-cache config."""
    fields = getattr(config, "__dataclass_fields__", {})
    cache_config = vllm_config.cache_config
    if "kv_cache_layout" in fields:
        config.kv_cache_layout = cache_config.kv_cache_layout
    if config.kv_cache_groups:
        cache_config.block_size = min(g.kv_cache_spec.block_size for g in config.kv_cache_groups)
    utils = module(KV_UTILS)
    if "hash_block_size" in fields and hasattr(utils, "resolve_kv_cache_block_sizes"):
        scheduler_block, hash_block = utils.resolve_kv_cache_block_sizes(config, vllm_config)
        config.hash_block_size = hash_block
        if "cache_hit_alignment_tokens" in fields:
            config.cache_hit_alignment_tokens = utils.resolve_cache_hit_alignment_tokens(
                config, vllm_config, scheduler_block, hash_block
            )


def _build(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    if "kv_cache_specs" not in parameters(wrapped):
        kwargs.pop("kv_cache_specs", None)
    config = wrapped(*args, **kwargs)
    complete_like_engine_core(config, kwargs.get("vllm_config", args[0] if args else None))
    return config


def patches() -> list[Patch]:
    return [wrap(module(GENERATOR), "get_kv_cache_config_from_groups", _build)]


ADAPTER = Adapter(
    name="kv_cache_config",
    targets=(f"{GENERATOR}.get_kv_cache_config_from_groups",),
    waits_for=(GENERATOR,),
    why="the KV-cache config API lost kv_cache_specs and gained fields the engine must fill",
    upstream="vLLM 0.11.1 (3-argument get_kv_cache_config_from_groups), 0.29 (layout), "
    "0.32 (hash_block_size); see research/vllm_internals.md section 1",
    remove_when="speculators builds its KV-cache config through the engine (0.5+ does not "
    "drive vLLM in-process at all)",
    probe=probe,
    patches=patches,
)
