"""Every patch the commands make of vLLM or speculators goes through :mod:`specshim.patches`:
declared there (so ``specshim report --verbose`` lists it), made with the adapters' ``Patch``
and undone by ``specshim.revert()``, original objects back by identity."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import types
import weakref
from pathlib import Path

import pytest

import specshim
from specshim import patches
from specshim.adapters.model import Patch

ROOT = Path(__file__).resolve().parents[1]
#: a patch made by name in the code: patches.apply("name", ...) or patches.scoped("name", ...)
MADE = re.compile(r"patches\.(?:apply|scoped)\(\s*\"(\w+)\"")


@pytest.fixture(autouse=True)
def nothing_applied() -> None:
    """Each test starts with no command patch applied (an earlier test's fake worker may
    hold one)."""
    patches.revert()


def sources() -> list[Path]:
    """The library's code, the test bed's aside (it builds test environments)."""
    return [p for p in sorted((ROOT / "src/specshim").rglob("*.py")) if "testbed" not in p.parts]


def test_no_command_patches_with_unittest_mock() -> None:
    """``unittest.mock`` patches nothing report lists or revert undoes."""
    found = [str(p.relative_to(ROOT)) for p in sources() if "unittest.mock" in p.read_text()]
    assert found == []


def test_every_patch_made_is_declared_and_every_declared_one_is_made() -> None:
    made = {name for path in sources() for name in MADE.findall(path.read_text())}
    assert made == set(patches.DECLARED)


def test_an_undeclared_patch_is_refused() -> None:
    owner = types.SimpleNamespace(value=1)
    with pytest.raises(ValueError, match="patch 'mine' is not declared"):
        patches.apply("mine", [Patch(owner, "value", 2)])
    assert owner.value == 1 and patches.applied() == ()


def test_a_scoped_patch_is_undone_on_the_way_out_or_by_revert_and_only_once() -> None:
    original = object()
    owner = types.SimpleNamespace(value=original)
    with patches.scoped("engine_steps", [Patch(owner, "value", 7)]):
        assert owner.value == 7 and patches.applied() == ("engine_steps",)
    assert owner.value is original and patches.applied() == ()
    with patches.scoped("engine_steps", [Patch(owner, "value", 7)]):
        specshim.revert()
        assert owner.value is original and patches.applied() == ()
        owner.value = "set since"
    assert owner.value == "set since"  # the way out does not revert a second time


class StandIn:
    """An object with a lifetime, as vLLM's worker or model runner: one method to patch."""

    def execute_model(self) -> str:
        return "original"


def test_a_patch_undone_by_its_owner_is_restored_and_holds_its_object_no_longer() -> None:
    target = StandIn()
    owner = types.SimpleNamespace(value=1)
    patches.apply("engine_steps", [Patch(owner, "value", 2)])
    patches.apply("engine_capture", [Patch(target, "execute_model", lambda: "patched")])
    assert target.execute_model() == "patched"
    patches.undo("engine_capture")
    assert target.execute_model() == "original" and "execute_model" not in vars(target)
    assert patches.applied() == ("engine_steps",) and owner.value == 2  # others stay
    patches.undo("engine_capture")  # undone already: nothing
    alive = weakref.ref(target)
    del target
    gc.collect()
    assert alive() is None
    assert patches.revert() == ("engine_steps",) and owner.value == 1


#: The engine backend closing, with a stand-in worker and engine, through the real extension's
#: and generator's methods on speculators 0.4.0.1: what of the worker is left after.
ENGINE_CLOSED = """
import gc, types, weakref
import specshim
specshim.apply()
from specshim import patches
from specshim.adapters.model import Patch
from specshim.runner.extraction.backends.engine import EngineGenerator
from specshim.runner.in_worker.capture_extension import EngineCapture

class Worker:
    def execute_model(self):
        return "original"

worker = Worker()
patches.apply("engine_capture", [Patch(worker, "execute_model", lambda: "patched")])
stopped = []
generator = EngineGenerator.__new__(EngineGenerator)
generator.llm = types.SimpleNamespace(
    collective_rpc=lambda method: [getattr(EngineCapture, method)(worker)],
    llm_engine=types.SimpleNamespace(
        engine_core=types.SimpleNamespace(shutdown=lambda: stopped.append(True))
    ),
)
generator.shutdown()
print("closed:", stopped, patches.applied(), worker.execute_model())
alive = weakref.ref(worker)
del worker, generator
gc.collect()
print("worker alive:", alive() is not None)
"""


def test_the_engine_backend_closing_undoes_the_capture_in_its_worker_fake_engine() -> None:
    """The worker runs in the calling process on vLLM's CPU backend: once the engine closes,
    nothing of specshim's holds it (its weights and KV cache)."""
    from conftest import speculators_path

    paths = [str(speculators_path("0.4.0.1")), str(ROOT / "src")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", ENGINE_CLOSED], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["closed: [True] () original", "worker alive: False"]


def test_report_lines_name_every_declared_patch() -> None:
    shown = patches.lines()
    assert [line.split()[0] for line in shown] == list(patches.DECLARED)
    assert all(d.where in line for d, line in zip(patches.DECLARED.values(), shown, strict=True))


#: ``EngineSettings.for_speculators`` on speculators 0.4.0.1's real generator module, with
#: ``specshim.revert()`` called inside.
ENGINE_STEPS = """
import specshim
specshim.apply()
from speculators.data_generation import vllm_hidden_states_generator as module
from specshim import patches
from specshim.runner.extraction.options import EngineSettings
before = module.MAX_NUM_SEQS
with EngineSettings(max_num_seqs=7).for_speculators():
    print("inside:", module.MAX_NUM_SEQS, patches.applied())
    specshim.revert()
    print("reverted:", module.MAX_NUM_SEQS is before, patches.applied())
print("after:", module.MAX_NUM_SEQS is before)
"""


def test_extracts_engine_steps_are_listed_and_reverted_on_real_speculators() -> None:
    from conftest import speculators_path

    paths = [str(speculators_path("0.4.0.1")), str(ROOT / "src")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", ENGINE_STEPS], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-3:] == [
        "inside: 7 ('engine_steps',)",
        "reverted: True ()",
        "after: True",
    ]
