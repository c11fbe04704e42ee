"""The seam is needed exactly when an executor-level adapter is, and knows them all."""

from __future__ import annotations

from dataclasses import replace

from specshim.adapters import executor, registry
from specshim.adapters.executor import extraction_executor
from specshim.adapters.model import Decision, needed, not_needed


def test_the_seam_serves_every_adapter_that_requires_it() -> None:
    """An adapter naming the seam in ``requires`` but missing from the registry's
    ``executor.DEPENDENTS`` would be applied without the seam's probe asking it."""
    requiring = {a.name for a in registry.ADAPTERS if extraction_executor.NAME in a.requires}
    assert requiring == {a.name for a in executor.DEPENDENTS}
    assert len(requiring) >= 5


def test_the_seam_is_needed_exactly_when_a_dependent_is() -> None:
    dependents = executor.DEPENDENTS[:2]
    no, yes = not_needed("fine here"), needed("broken here")
    seam = extraction_executor.seam_for(
        [replace(dependents[0], probe=lambda: no), replace(dependents[1], probe=lambda: no)]
    )
    assert seam.probe().decision is Decision.NOT_NEEDED
    seam = extraction_executor.seam_for(
        [replace(dependents[0], probe=lambda: no), replace(dependents[1], probe=lambda: yes)]
    )
    probe = seam.probe()
    assert probe.decision is Decision.NEEDED
    assert probe.reason == f"needed by {dependents[1].name}"
