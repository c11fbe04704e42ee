"""Pass ``Scheduler`` the block sizes it now requires, computed as the engine core does.

vLLM 0.11.1 made ``block_size`` a required argument (speculators 0.3.0 does not pass it:
``TypeError``); 0.20 added ``hash_block_size`` (optional), which the engine takes, with the
scheduler block size, from ``resolve_kv_cache_block_sizes``. When a required size is missing
the wrapper passes both, as the engine would; everything by keyword, because
``hash_block_size`` was inserted before parameters that used to be positional.
"""

from __future__ import annotations

import inspect
from typing import Any

from specshim.adapters.kit import calls_with_keyword, module, parameters, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import GENERATOR, KV_UTILS, generator_class


def _missing_required() -> list[str]:
    params = parameters(vars(module(GENERATOR))["Scheduler"].__init__)
    init = generator_class().__init__
    return [
        name
        for name in ("block_size", "hash_block_size")
        if name in params
        and params[name].default is inspect.Parameter.empty
        and not calls_with_keyword(init, "Scheduler", name)
    ]


def probe() -> Probe:
    missing = _missing_required()
    if missing:
        return needed(f"Scheduler requires {', '.join(missing)}, which the generator does not pass")
    return not_needed("the generator passes every block size the Scheduler requires")


def block_sizes(kv_cache_config: Any, vllm_config: Any) -> tuple[int, int | None]:
    """(scheduler block size, hash block size) as the installed engine core derives them."""
    utils = module(KV_UTILS)
    if hasattr(utils, "resolve_kv_cache_block_sizes"):
        return utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    parallel = vllm_config.parallel_config
    size = vllm_config.cache_config.block_size
    for factor in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        size *= getattr(parallel, factor, 1)
    return size, None


def _construct(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    params = parameters(wrapped.__init__)
    scheduler_block, hash_block = block_sizes(kwargs["kv_cache_config"], kwargs["vllm_config"])
    if "block_size" in params:
        kwargs.setdefault("block_size", scheduler_block)
    if "hash_block_size" in params and hash_block is not None:
        kwargs.setdefault("hash_block_size", hash_block)
    return wrapped(*args, **kwargs)


def patches() -> list[Patch]:
    return [wrap(module(GENERATOR), "Scheduler", _construct)]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut(
    "0.3.0", raises="TypeError", text="missing 1 required positional argument: 'block_size'"
)


ADAPTER = Adapter(
    name="scheduler_block_size",
    targets=(f"{GENERATOR}.Scheduler",),
    waits_for=(GENERATOR,),
    why="Scheduler requires block_size (0.11.1) and takes hash_block_size (0.20)",
    upstream="vllm-project/vllm#44165 (block sizes from resolve_kv_cache_block_sizes)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        WITHOUT,
        WITHOUT.also(vllm="0.11.1.post2"),
        WITHOUT.also(runner="v2", accelerator="gpu"),
    ),
    facts=(
        *facts("exists", f"{KV_UTILS}:resolve_kv_cache_block_sizes"),
        *facts("signature", "vllm.v1.core.sched.scheduler:Scheduler.__init__"),
    ),
    probe=probe,
    patches=patches,
)
