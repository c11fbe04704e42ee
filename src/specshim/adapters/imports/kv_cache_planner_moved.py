"""Make the KV-cache planner names speculators imports from ``kv_cache_utils`` resolve again.

vLLM 0.33.0 moved the KV-cache planner (``get_kv_cache_config_from_groups``,
``_get_kv_cache_groups_uniform_spec``, ``unify_hybrid_kv_cache_specs``, ``get_kv_cache_configs``
and friends) from ``vllm.v1.core.kv_cache_utils`` to ``vllm.v1.core.kv_cache_planning`` without
re-exporting them, so importing speculators' generator fails at its first line of vLLM imports:
``ImportError: cannot import name '_get_kv_cache_groups_uniform_spec'``. The generator cannot be
patched before it is imported, so this adapter acts on the provider: as soon as
``kv_cache_utils`` is imported it gains, under their old names, exactly the names the installed
generator imports from it and that now live in ``kv_cache_planning`` (the same function
objects; their signatures did not change with the move). The names are read from the
generator's source on disk, without importing it.
"""

from __future__ import annotations

from specshim.adapters.kit import imported_names, module, module_source
from specshim.adapters.model import (
    Adapter,
    Patch,
    Probe,
    UnknownShape,
    facts,
    needed,
    not_applicable,
    not_needed,
)
from specshim.adapters.targets import GENERATOR, KV_UTILS

PLANNING = "vllm.v1.core.kv_cache_planning"
#: What vLLM 0.33 moved there that speculators' generator imports.
PLANNER_NAMES = (
    "_get_kv_cache_groups_uniform_spec",
    "get_kv_cache_config_from_groups",
    "unify_hybrid_kv_cache_specs",
)


def moved_names() -> list[str]:
    """Names the generator imports from ``kv_cache_utils`` that it no longer has."""
    text = module_source(GENERATOR)
    utils = module(KV_UTILS)
    return (
        [] if text is None else [n for n in imported_names(text, KV_UTILS) if not hasattr(utils, n)]
    )


def probe() -> Probe:
    if module_source(GENERATOR) is None:
        return not_applicable("speculators' generator is not installed")
    missing = moved_names()
    if not missing:
        return not_needed("kv_cache_utils still has every name the generator imports")
    try:
        planning = module(PLANNING)
    except ImportError:
        planning = None
    unresolved = [name for name in missing if not hasattr(planning, name)]
    if unresolved:
        raise UnknownShape(
            f"{', '.join(missing)} in {PLANNING} (where vLLM 0.33 moved them)",
            f"{', '.join(unresolved)} in neither {KV_UTILS} nor {PLANNING}",
        )
    return needed(f"{', '.join(missing)} moved from kv_cache_utils to kv_cache_planning")


def patches() -> list[Patch]:
    utils, planning = module(KV_UTILS), module(PLANNING)
    return [Patch(utils, name, getattr(planning, name)) for name in moved_names()]


ADAPTER = Adapter(
    name="kv_cache_planner_moved",
    targets=(KV_UTILS,),
    waits_for=(KV_UTILS,),
    why="vLLM 0.33 moved the KV-cache planner to kv_cache_planning; speculators imports it from "
    "kv_cache_utils",
    upstream="vLLM 0.33.0 vllm/v1/core/kv_cache_planning.py (split out of kv_cache_utils.py)",
    remove_when="speculators' generator is no longer used (0.5+ stop importing the planner)",
    evidence=(
        "tests/e2e/test_newest_vllm.py::test_generator_imports_on_0_34_once_the_planner_names_resolve",
    ),
    facts=facts("exists", *(f"{PLANNING}:{name}" for name in PLANNER_NAMES)),
    probe=probe,
    patches=patches,
)
