"""Return samples in input order: sort request ids numerically, not as strings.

speculators 0.4 names requests ``req_{call}_{i}`` and walks ``sorted(ids)``; as strings
``"req_0_10" < "req_0_2"``, so from 11 prompts on, results come back out of input order and
no longer line up with the loss masks the caller holds. A ``sorted`` that orders the numeric
parts as numbers is placed in the generator module's namespace (builtins stay untouched).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Iterable
from typing import Any

from specshim.adapters.kit import module, source
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class

_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[Any, ...]:
    """``"req_0_10"`` -> ``("req_", 0, "_", 10, "")``: numbers compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(text))


def natural_sorted(
    iterable: Iterable[Any], /, *, key: Callable[[Any], Any] | None = None, reverse: bool = False
) -> list[Any]:
    """``sorted`` that orders strings by their numeric parts when no key is given."""
    items = list(iterable)
    if key is None and items and all(isinstance(i, str) for i in items):
        key = natural_key
    return builtins.sorted(items, key=key, reverse=reverse)


def probe() -> Probe:
    generate = source(generator_class().generate)
    if "sorted(request_id_to_idx" not in generate:
        return not_needed("the generator does not sort request ids")
    return needed("the generator sorts ids like req_0_10 as strings")


def patches() -> list[Patch]:
    return [Patch(module(GENERATOR), "sorted", natural_sorted)]


ADAPTER = Adapter(
    name="request_order",
    targets=(f"{GENERATOR}.sorted",),
    waits_for=(GENERATOR,),
    why="string-sorted request ids return samples out of input order from 11 prompts on",
    upstream="speculators 0.4.0 vllm_hidden_states_generator.generate (sorted request ids)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(LeftOut("0.4.0.1", wrong="out_of_order"),),
    probe=probe,
    patches=patches,
)
