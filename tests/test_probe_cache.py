"""``specshim report`` keeps a healthy probe outcome and reuses it only while nothing the
probes imported, no ``sys.path`` entry, the interpreter and no VLLM_/SPECSHIM_ setting has
changed (specshim.probe_cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specshim import applier, probe_cache

ROOT = Path(__file__).resolve().parents[1]


def _report(cache: Path, extra_path: Path, *args: str) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop(applier.APPLY_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / ".spec" / "0.4.0.1"), str(extra_path)])
    done = subprocess.run(
        [sys.executable, "-m", "specshim.cli", "report", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.vllm
def test_a_report_reuses_the_probes_until_something_is_installed(tmp_path: Path) -> None:
    from conftest import speculators_path

    speculators_path("0.4.0.1")
    pytest.importorskip("vllm")
    cache, site = tmp_path / "cache", tmp_path / "site"
    site.mkdir()
    first = _report(cache, site)
    again = _report(cache, site)
    assert (first["probes"]["kept"], again["probes"]["kept"]) == (False, True)
    assert again["probes"]["at"] == first["probes"]["at"]
    assert again["adapters"] == first["adapters"]
    assert any(a["state"] == "applied" for a in again["adapters"])
    assert _report(cache, site, "--fresh")["probes"]["kept"] is False

    time.sleep(0.01)  # a folder's time moves with what is installed into it
    (site / "newly_installed.py").write_text("")
    assert _report(cache, site)["probes"]["kept"] is False


@pytest.fixture
def shelf_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of this test's own, and a module imported from a folder of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "site").mkdir()
    module = tmp_path / "site" / "probed_module_of_this_test.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(module.parent))
    __import__(module.stem)
    yield module
    sys.modules.pop(module.stem, None)


def _healthy() -> probe_cache.Probed:
    status = applier.AdapterStatus(
        "some_adapter", applier.State.APPLIED, "needed here", "why", "upstream", "never", ("x",)
    )
    return probe_cache.Probed(applier.Report((status,)), None)


def test_an_edited_imported_file_makes_the_next_report_probe_again(shelf_here: Path) -> None:
    probe_cache.Shelf().save(_healthy())
    kept = probe_cache.Shelf().load()
    assert kept is not None and kept.kept and kept.adapters == _healthy().adapters
    shelf_here.write_text("VALUE = 22\n")
    assert probe_cache.Shelf().load() is None


@pytest.mark.parametrize(
    "setting", ["VLLM_USE_V2_MODEL_RUNNER", "LD_LIBRARY_PATH", "CUDA_HOME", "TORCH_LOGS"]
)
def test_another_setting_the_stack_reads_is_another_installation(
    shelf_here: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    """A loader path or a torch setting can break the import the probes made: not the same
    installation. The setting's value is never written down."""
    probe_cache.Shelf().save(_healthy())
    monkeypatch.setenv(setting, "/a/secret/value")
    assert probe_cache.Shelf().load() is None
    probe_cache.Shelf().save(_healthy())
    assert not any("/a/secret/value" in p.read_text() for p in probe_cache.folder().iterdir())


def test_a_broken_fresh_outcome_forgets_the_healthy_one(shelf_here: Path) -> None:
    """``report --fresh`` that finds the generator broken: the next report must not bring back
    the healthy outcome kept before."""
    probe_cache.Shelf().save(_healthy())
    broken = probe_cache.Probed(_healthy().adapters, "ImportError: libc10.so")
    probe_cache.Shelf().save(broken)
    assert probe_cache.Shelf().load() is None


def test_only_the_newest_outcomes_are_kept(
    shelf_here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(probe_cache.KEPT + 3):
        monkeypatch.setenv("VLLM_PORT", str(8000 + n))
        probe_cache.Shelf().save(_healthy())
    assert len(list(probe_cache.folder().iterdir())) == probe_cache.KEPT
    assert probe_cache.Shelf().load() is not None  # the newest stays


def test_without_a_home_nothing_is_kept_and_nothing_fails(
    shelf_here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's user without a home (HOME unset, no passwd entry): probe, keep nothing."""
    monkeypatch.delenv("XDG_CACHE_HOME")

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")  # as pathlib says it

    monkeypatch.setattr(Path, "home", no_home)
    probe_cache.Shelf().save(_healthy())
    assert probe_cache.Shelf().load() is None


def test_a_broken_outcome_is_never_kept(shelf_here: Path) -> None:
    broken = probe_cache.Probed(_healthy().adapters, "ImportError: cannot import name 'X'")
    probe_cache.Shelf().save(broken)
    assert probe_cache.Shelf().load() is None
    assert not probe_cache.folder().exists() or not list(probe_cache.folder().iterdir())


def test_an_unwritable_cache_costs_only_the_reuse(
    shelf_here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/dev/null/not-a-folder")
    probe_cache.Shelf().save(_healthy())
    assert probe_cache.Shelf().load() is None


def test_an_edited_file_a_probe_read_without_importing_makes_it_probe_again(
    shelf_here: Path,
) -> None:
    """Some probes read a module's source without importing it (its imports are what broke):
    that file is part of the fingerprint too."""
    from specshim.adapters import kit

    package = shelf_here.parent / "package_read_by_this_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "moved.py").write_text("def f(): ...\n")
    assert kit.module_source("package_read_by_this_test.moved") == "def f(): ...\n"
    probe_cache.Shelf().save(_healthy())
    assert probe_cache.Shelf().load() is not None
    (package / "moved.py").write_text("def f(renamed): ...\n")
    assert probe_cache.Shelf().load() is None
