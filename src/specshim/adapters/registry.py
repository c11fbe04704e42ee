"""Every adapter, in the order they apply: phase by phase, each phase a sub-package.

``imports`` makes ``import speculators`` possible; ``training`` adapts speculators' trainer;
``generator``, ``executor`` and ``worker`` patch names in speculators' own modules, a subclass
only speculators uses, and speculators' worker extension inside vLLM's workers, so vLLM's own
engine never runs patched code.
"""

from __future__ import annotations

from specshim.adapters import executor, generator, imports, training, worker
from specshim.adapters.model import Adapter

#: The phases, in the order they act: each sub-package of ``specshim.adapters`` is one, and
#: lists its adapters in their order.
PHASES = (imports, training, generator, executor, worker)

ADAPTERS: tuple[Adapter, ...] = tuple(a for phase in PHASES for a in phase.ADAPTERS)


def names() -> list[str]:
    """Every adapter's name, in the order they apply."""
    return [a.name for a in ADAPTERS]


def get(name: str, among: tuple[Adapter, ...] = ADAPTERS) -> Adapter:
    """The adapter called ``name`` (in the registry, or ``among`` others); ``KeyError``
    naming the known ones otherwise."""
    for adapter in among:
        if adapter.name == name:
            return adapter
    raise KeyError(f"no adapter named {name!r}; known adapters: {[a.name for a in among]}")
