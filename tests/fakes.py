"""Fake adapters over a fake module, for testing the applier's rules without vLLM.

Named fake on purpose: the real adapters are exercised against the real vLLM in
``test_applier_real.py`` and ``e2e/``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator

import pytest

import specshim
from specshim import applier
from specshim.adapters.model import Adapter, Patch, Probe, UnknownShape, needed

FAKE = "specshim_fake_target"


def original() -> str:
    return "original"


def fake_adapter(
    name: str,
    *,
    fail: bool = False,
    shape: bool = False,
    waits: str = FAKE,
    probe: Callable[[], Probe] | None = None,
) -> Adapter:
    def probe_() -> Probe:
        if shape:
            raise UnknownShape("a function named original", "something else")
        return needed("fake") if probe is None else probe()

    def patches() -> list[Patch]:
        target = sys.modules[waits]
        made = [Patch(target, name, f"patched by {name}")]
        if fail:
            made.append(Patch(None, "cannot", 1))  # setattr(None, ...) raises
        return made

    return Adapter(name, (f"{waits}.{name}",), (waits,), "fake", "none", "never", probe_, patches)


@pytest.fixture
def fake_module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType(FAKE)
    mod.a = mod.b = mod.c = original
    sys.modules[FAKE] = mod
    yield mod
    specshim.revert()
    del sys.modules[FAKE]


def use(monkeypatch: pytest.MonkeyPatch, *adapters: Adapter) -> None:
    """``specshim.apply()`` and friends drive an applier of ``adapters`` (every distribution
    taken as installed) for the rest of the test."""
    monkeypatch.setattr(applier, "default", applier.Applier(adapters, installed=lambda root: True))
