"""The applier's contract, on fake adapters over a fake module.

These adapters are fakes (``fake_*``) because the applier's rules (rollback, deferral,
strictness, idempotence, threads) are about the applier, not about vLLM; the same rules are
checked against the real adapters and the real vLLM in ``test_applier_real.py``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

import specshim
from fakes import fake_adapter, original, use
from specshim import applier
from specshim.adapters.model import not_needed


def test_apply_twice_changes_nothing_the_second_time(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"))
    first = specshim.apply()
    patched = fake_module.a
    second = specshim.apply()
    assert first.changed and not second.changed
    assert fake_module.a is patched and second.applied == ("a", "b")


def test_revert_restores_identity(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"))
    before = dict(vars(fake_module))
    specshim.apply()
    assert fake_module.a == "patched by a"
    specshim.revert()
    assert all(vars(fake_module)[k] is v for k, v in before.items())


def test_failed_adapter_rolls_back_the_others_and_is_named(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b", fail=True), fake_adapter("c"))
    with pytest.raises(specshim.AdapterError, match="adapter 'b' failed to apply"):
        specshim.apply()
    assert fake_module.a is original and fake_module.b is original and fake_module.c is original
    status = specshim.status()
    assert status["b"].state is specshim.State.FAILED
    assert status["a"].state is specshim.State.ROLLED_BACK and "adapter 'b'" in status["a"].reason
    assert status["a"].reason.startswith("undone: ")
    assert status["c"].reason.startswith("not tried: adapter 'b'") and not status.ok


def test_unknown_shape_warns_or_raises_in_strict_mode(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b", shape=True))
    with pytest.warns(applier.ShapeWarning, match="adapter 'b' expected a function named original"):
        report = specshim.apply()
    assert report["b"].state is specshim.State.UNKNOWN_SHAPE and fake_module.a != original
    assert not report.ok and [a.name for a in report.broken] == ["b"]
    specshim.revert()
    monkeypatch.setenv("SPECSHIM_STRICT", "1")
    with pytest.raises(specshim.AdapterError, match="expected a function named original, found"):
        specshim.apply()
    assert fake_module.a is original


def test_disable_env_and_only(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"), fake_adapter("c"))
    monkeypatch.setenv("SPECSHIM_DISABLE", "b")
    report = specshim.apply(only=["a", "b"])
    assert report.applied == ("a",)
    assert report["b"].state is specshim.State.DISABLED
    assert report["c"].state is specshim.State.DISABLED
    with pytest.raises(ValueError, match=r"unknown adapter name\(s\) \['nope'\]"):
        specshim.apply(only=["nope"])


@pytest.mark.parametrize(
    ("value", "strict"),
    [("1", True), ("TRUE", True), ("yes", True), ("On", True), (" true ", True),
     ("0", False), ("false", False), ("NO", False), ("off", False), ("", False)],
)  # fmt: skip
def test_strict_takes_the_usual_spellings(monkeypatch, fake_module, value, strict) -> None:
    use(monkeypatch, fake_adapter("a", shape=True))
    monkeypatch.setenv("SPECSHIM_STRICT", value)
    if strict:
        with pytest.raises(specshim.AdapterError, match="expected a function named original"):
            specshim.apply()
    else:
        with pytest.warns(applier.ShapeWarning):
            specshim.apply()


@pytest.mark.parametrize("value", ["2", "ture", "enabled", "1,"])
def test_strict_refuses_anything_else_naming_it(monkeypatch, fake_module, value) -> None:
    """Before, anything but "1" meant off: a misspelt "ture" silently ran lenient."""
    use(monkeypatch, fake_adapter("a"))
    monkeypatch.setenv("SPECSHIM_STRICT", value)
    with pytest.raises(ValueError, match=f"^SPECSHIM_STRICT='{value}': expected 1, true, yes, on"):
        specshim.apply()
    assert fake_module.a is original


def test_an_unknown_name_in_disable_is_refused_naming_the_variable(monkeypatch, fake_module):
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"))
    monkeypatch.setenv("SPECSHIM_DISABLE", "b,nope")
    with pytest.raises(
        ValueError, match=r"^SPECSHIM_DISABLE: unknown adapter name\(s\) \['nope'\]"
    ):
        specshim.apply()
    monkeypatch.setenv("SPECSHIM_DISABLE", "b")
    with pytest.raises(ValueError, match=r"^exclude: unknown adapter name\(s\) \['nope'\]"):
        specshim.apply(exclude="nope")


def test_a_bad_variable_is_one_line_from_the_command_line(monkeypatch, capsys) -> None:
    from specshim import cli

    monkeypatch.setenv("SPECSHIM_STRICT", "maybe")
    assert cli.main(["report", "--no-import"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "specshim report: SPECSHIM_STRICT='maybe': expected 1, true, yes, on (on) or 0, false, "
        "no, off, empty (off), in any case"
    ]


def test_not_needed_adapter_patches_nothing(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a", probe=lambda: not_needed("already fine")))
    report = specshim.apply()
    assert report["a"].state is specshim.State.NOT_NEEDED and fake_module.a is original
    assert report["a"].reason == "already fine"


def test_adapter_waits_for_its_module_and_applies_on_import(monkeypatch, tmp_path: Path) -> None:
    name = "specshim_fake_later"
    (tmp_path / f"{name}.py").write_text("def late():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use(monkeypatch, fake_adapter("late", waits=name))
    try:
        report = specshim.apply()
        assert report["late"].state is specshim.State.WAITING
        import specshim_fake_later  # noqa: F401  (the import fires the hook)

        assert sys.modules[name].late == "patched by late"
        assert specshim.status()["late"].state is specshim.State.APPLIED
        specshim.revert()
        assert sys.modules[name].late() == "original"
    finally:
        specshim.revert()
        sys.modules.pop(name, None)


def test_a_failure_inside_an_import_hook_warns_and_leaves_the_original(
    monkeypatch, tmp_path: Path
) -> None:
    """Lenient mode: an adapter that fails when its module is imported does not break the
    import; it warns with its own category (not an unknown shape's) and stays failed."""
    name = "specshim_fake_failing_later"
    (tmp_path / f"{name}.py").write_text("def broken():\n    return 'original'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    use(monkeypatch, fake_adapter("broken", waits=name, fail=True))
    try:
        assert specshim.apply(strict=False)["broken"].state is specshim.State.WAITING
        with pytest.warns(applier.HookWarning, match="adapter 'broken' failed to apply"):
            import specshim_fake_failing_later  # noqa: F401  (the import fires the hook)
        assert sys.modules[name].broken() == "original"
        assert specshim.status()["broken"].state is specshim.State.FAILED
    finally:
        specshim.revert()
        sys.modules.pop(name, None)


def test_concurrent_apply_patches_once(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"))
    reports: list[specshim.Report] = []
    threads = [threading.Thread(target=lambda: reports.append(specshim.apply())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.changed for r in reports) == 1
    specshim.revert()
    assert fake_module.a is original


def test_apply_records_the_selection_for_child_processes(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"))
    specshim.apply(exclude=["b"])
    recorded = applier.os.environ[applier.APPLY_ENV]
    specshim.revert()
    assert applier.APPLY_ENV not in applier.os.environ
    monkeypatch.setenv(applier.APPLY_ENV, recorded)
    report = applier.apply_from_environment()
    assert report is not None and report.applied == ("a",)


def test_a_module_still_importing_is_not_ready(monkeypatch, tmp_path: Path) -> None:
    """speculators' generator imports kv_cache_utils: the hook for kv_cache_utils fires while
    the generator is half executed, so adapters waiting for the generator must wait on, and
    the adapter waiting for kv_cache_utils must act before the generator's next line."""
    outer, inner = "specshim_fake_outer", "specshim_fake_inner"
    (tmp_path / f"{inner}.py").write_text("def early():\n    return 'original'\n")
    (tmp_path / f"{outer}.py").write_text(
        f"from {inner} import early\nSEEN = early\n\ndef late():\n    return 'original'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    use(monkeypatch, fake_adapter("early", waits=inner), fake_adapter("late", waits=outer))
    try:
        specshim.apply()
        import specshim_fake_outer  # noqa: F401  (fires both hooks, inner first)

        assert sys.modules[outer].SEEN == "patched by early"
        assert sys.modules[outer].late == "patched by late"
        assert specshim.status().applied == ("early", "late")
    finally:
        specshim.revert()
        sys.modules.pop(outer, None)
        sys.modules.pop(inner, None)


def test_a_single_name_is_one_name_not_its_letters(monkeypatch, fake_module) -> None:
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"))
    assert specshim.apply(only="a").applied == ("a",)
    assert specshim.apply(exclude="a").applied == ("b",)
    with pytest.raises(TypeError, match=r"only= takes an adapter name or names, got 3"):
        specshim.apply(only=3)
    with pytest.raises(TypeError, match=r"exclude= takes adapter names \(strings\), got 1"):
        specshim.apply(exclude=[1])


def test_a_narrower_selection_reverts_what_it_leaves_out(monkeypatch, fake_module) -> None:
    """apply() then apply(exclude=["b"]): b comes off, and what the workers are told to apply
    (SPECSHIM_APPLY) is what this process has applied."""
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"), fake_adapter("c"))
    specshim.apply()
    report = specshim.apply(exclude=["b"])
    assert report.changed and report.applied == ("a", "c")
    assert fake_module.b is original and fake_module.a == "patched by a"
    assert report["b"].state is specshim.State.DISABLED
    assert applier.json.loads(applier.os.environ[applier.APPLY_ENV])["exclude"] == ["b"]
    assert specshim.apply(only=["c"]).applied == ("c",) and fake_module.a is original


def test_a_failed_apply_still_records_its_selection(monkeypatch, fake_module) -> None:
    """apply() then a narrower apply() that fails: the earlier selection is reverted, so the
    workers must be told the new one, not re-apply the old."""
    use(monkeypatch, fake_adapter("a"), fake_adapter("b"), fake_adapter("c", fail=True))
    specshim.apply(exclude=["c"])
    with pytest.raises(specshim.AdapterError, match="adapter 'c' failed to apply"):
        specshim.apply(exclude=["b"])
    assert fake_module.b is original and fake_module.a is original
    assert applier.json.loads(applier.os.environ[applier.APPLY_ENV])["exclude"] == ["b"]
