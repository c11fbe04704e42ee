"""Every adapter has its note in patches/, and the notes match the code."""

import subprocess
import sys
from pathlib import Path

from conftest import VLLM_ENVS
from specshim.adapters import registry

ROOT = Path(__file__).resolve().parents[1]


def test_every_adapter_has_a_note() -> None:
    missing = [
        a.name for a in registry.ADAPTERS if not (ROOT / "patches" / f"{a.name}.md").exists()
    ]
    assert missing == []


def test_notes_are_up_to_date() -> None:
    check = [sys.executable, str(ROOT / "scripts" / "gen_patch_notes.py"), "--check"]
    result = subprocess.run(check, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_adapter_declares_its_contract() -> None:
    for adapter in registry.ADAPTERS:
        assert adapter.targets and adapter.waits_for, adapter.name
        assert adapter.why and adapter.upstream and adapter.remove_when, adapter.name
        assert all(r in registry.names() for r in adapter.requires), adapter.name
        # requirements apply first
        assert all(
            registry.names().index(r) < registry.names().index(adapter.name)
            for r in adapter.requires
        ), adapter.name


def test_every_adapter_names_the_tests_that_show_it_needed() -> None:
    """Each adapter's tests (``shown_by``: its leave-one-out cases and other evidence) are
    tests pytest collects (a renamed test or case would leave the note pointing at nothing);
    an adapter no test here can show says why instead."""
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run([*collect, "tests"], capture_output=True, text=True, cwd=ROOT).stdout
    collected = {line.strip() for line in out.splitlines() if "::" in line}
    assert len(collected) > 100, out[-2000:]
    selectable = collected | {test.split("[")[0] for test in collected}  # all its cases
    # a case at a change's first release runs where that release's environment is selected
    elsewhere = {
        case.test_id(adapter.name)
        for adapter in registry.ADAPTERS
        for case in adapter.left_out
        if case.vllm and case.vllm not in VLLM_ENVS
    }
    for adapter in registry.ADAPTERS:
        assert bool(adapter.shown_by) != bool(adapter.unobservable), adapter.name
        assert set(adapter.shown_by) - elsewhere <= selectable, (adapter.name, adapter.shown_by)
