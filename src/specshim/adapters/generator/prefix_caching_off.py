"""Switch prefix caching off for extraction (speculators 0.3.0 leaves vLLM's default, on).

With prefix caching on, a prompt that shares a prefix with an earlier one skips the forward
pass over the cached blocks, so its captured hidden states come back *shorter* than its input
ids and every later sample in the batch is shifted. speculators 0.4 turned it off for this
reason (speculators issue #279); 0.3.0 did not.
"""

from __future__ import annotations

from specshim.adapters.kit import calls_with_keyword, module, with_keywords
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class


def probe() -> Probe:
    create = generator_class()._create_vllm_config
    if calls_with_keyword(create, "CacheConfig", "enable_prefix_caching"):
        return not_needed("the generator sets enable_prefix_caching itself")
    return needed("the generator leaves prefix caching at vLLM's default (on)")


def patches() -> list[Patch]:
    return [with_keywords(module(GENERATOR), "CacheConfig", force={"enable_prefix_caching": False})]


ADAPTER = Adapter(
    name="prefix_caching_off",
    targets=(f"{GENERATOR}.CacheConfig",),
    waits_for=(GENERATOR,),
    why="prefix caching skips cached tokens, so their hidden states are never captured",
    upstream="vllm-project/speculators#279 (fixed in speculators 0.4.0)",
    remove_when="speculators 0.3.0 is no longer supported",
    left_out=(LeftOut("0.3.0", raises="IndexError", text="new_block_hashes[i]"),),
    probe=probe,
    patches=patches,
)
