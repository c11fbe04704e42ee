"""The seam: give speculators' generator its own subclass of vLLM's ``MultiprocExecutor``.

The executor-level adapters (``kv_cache_layout``, ``warmup_split``, ``sample_tokens_split``,
``rpc_reply_shape``) change how the *generator* drives the executor. Patching vLLM's own
``MultiprocExecutor`` would change vLLM's engine too, so they patch this subclass instead, and
this adapter puts it in the generator's namespace. It applies only when one of them is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from specshim.adapters.kit import module
from specshim.adapters.model import Adapter, Decision, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR

NAME = "extraction_executor"


@functools.cache
def executor_class(base: type) -> type:
    """One subclass per vLLM executor class, created once per process."""
    return type(
        "SpecshimExtractionExecutor",
        (base,),
        {"__doc__": f"{base.__name__} as driven by speculators' generator, adapted by specshim."},
    )


def installed_executor_class() -> Any:
    """The subclass for the executor class the generator imported."""
    base = vars(module(GENERATOR))["MultiprocExecutor"]
    return base if base.__name__ == "SpecshimExtractionExecutor" else executor_class(base)


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="ValueError", text="KV cache layout has not been resolved yet")


def seam_for(dependents: Sequence[Adapter]) -> Adapter:
    """The seam adapter, needed exactly when one of ``dependents`` (the adapters that name
    it in ``requires``) is. The registry passes them, so that this module imports nothing
    above it (no circle through the registry)."""

    def probe() -> Probe:
        wanting = [a.name for a in dependents if a.probe().decision is Decision.NEEDED]
        if wanting:
            return needed(f"needed by {', '.join(wanting)}")
        return not_needed("no executor-level adapter is needed")

    return Adapter(
        name=NAME,
        targets=(f"{GENERATOR}.MultiprocExecutor",),
        waits_for=(GENERATOR,),
        why="executor-level fixes must not leak into vLLM's own engine, so they go on a subclass",
        upstream="none: specshim's own seam",
        remove_when="no executor-level adapter remains",
        left_out=(
            WITHOUT,
            WITHOUT.also(speculators="0.4.0.1"),
        ),
        probe=probe,
        patches=patches,
    )


def patches() -> list[Patch]:
    return [Patch(module(GENERATOR), "MultiprocExecutor", installed_executor_class())]
