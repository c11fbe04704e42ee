"""The markers ``vllm``, ``other_vllm``, ``gpu`` and ``slow``, given to each test from what it
needs.

Nothing is listed by hand, so a test added anywhere gets its markers from its code:

- ``gpu``: a test under ``tests/gpu`` (CUDA vLLM, scripts/gpu_test.sh).
- ``vllm``: a test that needs the environments of scripts/setup_env.sh: it lives under
  ``tests/e2e`` or ``tests/gpu``; or its parameter ``vllm`` is the release of one of
  :data:`ENVIRONMENTS` (conftest's ``VLLM_ENVS``); or its code, its fixtures' code or the
  helpers they call (functions defined under ``tests/``, followed through modules) call one
  of :data:`ENVIRONMENT_FUNCTIONS` or import vLLM or speculators. ``-m "not vllm"`` runs
  without them; a test that reaches one of those functions unmarked fails (:func:`check`),
  so a rule missed here shows up in the next full run, not as a skip somewhere else.
- ``other_vllm``: a ``vllm`` test that runs in an environment other than the default
  ``.venv``: one of :data:`OTHER_ENVIRONMENTS` among its parameters, or it reaches one of
  :data:`OTHER_ENVIRONMENT_FUNCTIONS`. scripts/test.sh runs these last, once the second
  environment it builds meanwhile is ready.
- ``slow``: a test that starts vLLM or trains (under ``tests/e2e`` or ``tests/gpu``) or runs in
  another environment (``other_vllm``), and is not a smoke test. ``scripts/test.sh --fast``
  runs ``-m "not slow"``: every other test (those that only import vLLM or speculators too),
  and the few smoke tests that start vLLM once per extraction backend in the default
  environment. A smoke test is marked ``smoke``, with the ids of its smoke cases where only
  those are: ``@pytest.mark.smoke("0.32.0-0.4.0.1")``.
"""

from __future__ import annotations

import dis
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: Where every test needs the environments.
VLLM_FOLDERS = (TESTS / "e2e", TESTS / "gpu")
#: Top-level packages only the environments have.
ENVIRONMENT_PACKAGES = ("vllm", "speculators")
#: conftest's functions that find an environment (filled in by conftest).
ENVIRONMENT_FUNCTIONS: set[Callable[..., object]] = set()
#: Those of them that find one other than the default ``.venv``; the vLLM releases of the
#: selected environments, and of those other than the default (filled in by conftest).
OTHER_ENVIRONMENT_FUNCTIONS: set[Callable[..., object]] = set()
ENVIRONMENTS: set[str] = set()
OTHER_ENVIRONMENTS: set[str] = set()

_running: pytest.Item | None = None


def apply(items: list[pytest.Item]) -> None:
    """Give each item the markers it needs (see the module docstring)."""
    for item in items:
        path = Path(item.path)
        if path.is_relative_to(TESTS / "gpu"):
            item.add_marker(pytest.mark.gpu)
        in_vllm_folder = any(path.is_relative_to(folder) for folder in VLLM_FOLDERS)
        if not _marked(item, "vllm") and (
            in_vllm_folder
            or _parameters(item, "vllm") & ENVIRONMENTS
            or _reaches(item, ENVIRONMENT_FUNCTIONS)
        ):
            item.add_marker(pytest.mark.vllm)
        if _marked(item, "vllm") and (
            _parameters(item) & OTHER_ENVIRONMENTS or _reaches(item, OTHER_ENVIRONMENT_FUNCTIONS)
        ):
            item.add_marker(pytest.mark.other_vllm)
        heavy = in_vllm_folder or _marked(item, "other_vllm")
        if heavy and not _smoke(item):
            item.add_marker(pytest.mark.slow)


def schedule(items: list[pytest.Item]) -> None:
    """Order the items for pytest-xdist's ``--dist loadfile --no-loadscope-reorder``
    (scripts/test.sh), which hands out whole files in the order of their first item: first the
    files that start vLLM (their ``other_vllm`` tests last), then the other files with
    ``other_vllm`` tests, then the rest (short tests, which fill in while the last long ones
    end). The ``other_vllm`` tests' environment is built meanwhile: by the time a process
    reaches one it is usually ready, and a test that needs it waits for it (conftest)."""

    def rank(item: pytest.Item) -> int:
        if _marked(item, "other_vllm"):
            return 1
        return 0 if any(Path(item.path).is_relative_to(f) for f in VLLM_FOLDERS) else 2

    items.sort(key=rank)


def running(item: pytest.Item | None) -> None:
    """Remember the test being run, for :func:`check`."""
    global _running
    _running = item


def check(what: str, marker: str = "vllm") -> None:
    """Fail the running test if it uses ``what`` (an environment) without ``marker``: the rules
    above missed it, and ``-m "not vllm"`` (or scripts/test.sh's first run, for
    ``other_vllm``) would run it without that environment."""
    if _running is not None and not _marked(_running, marker):
        pytest.fail(
            f"{_running.nodeid} uses {what} but has no {marker} marker: mark it "
            f"@pytest.mark.{marker} (tests/markers.py could not tell from its code)",
            pytrace=False,
        )


def _marked(item: pytest.Item, name: str) -> bool:
    return item.get_closest_marker(name) is not None


def _smoke(item: pytest.Item) -> bool:
    smoke = item.get_closest_marker("smoke")
    callspec = getattr(item, "callspec", None)
    return smoke is not None and (not smoke.args or bool(callspec and callspec.id in smoke.args))


def _parameters(item: pytest.Item, name: str = "") -> set[str]:
    """The test's parameters (or its parameter ``name``) that are strings, those inside tuples
    included."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    values = [params[name]] if name in params else [] if name else params.values()
    every = (v for value in values for v in (value if isinstance(value, tuple) else (value,)))
    return {v for v in every if isinstance(v, str)}


def _reaches(item: pytest.Item, targets: set[Callable[..., object]]) -> bool:
    """Whether the test's function or fixtures reach one of ``targets`` (module docstring)."""
    functions: list[object] = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in item.fixturenames:  # type: ignore[attr-defined]
            functions += [definition.func for definition in info.name2fixturedefs.get(name, ())]
    seen: set[int] = set()
    return any(_needs(f, targets, seen) for f in functions if f is not None)


def _needs(function: object, targets: set[Callable[..., object]], seen: set[int]) -> bool:
    """Whether ``function`` (defined under ``tests/``) reaches one of ``targets``, or imports
    vLLM or speculators where ``targets`` are all of :data:`ENVIRONMENT_FUNCTIONS`."""
    if not callable(function):
        return False
    function = inspect.unwrap(function)
    if any(function is target for target in targets):
        return True
    if not isinstance(function, types.FunctionType) or id(function) in seen:
        return False
    seen.add(id(function))
    if not Path(function.__code__.co_filename).resolve().is_relative_to(TESTS):
        return False
    scope = function.__globals__
    for code in _codes(function.__code__):
        imported = list(_imported(code))
        found = [*imported, *(scope.get(name) for name in code.co_names)]
        if targets is ENVIRONMENT_FUNCTIONS and _imports_an_environment(code, imported, found):
            return True
        if any(_needs(f, targets, seen) for f in found) or any(
            _needs(getattr(module, name, None), targets, seen)
            for module in found
            if isinstance(module, types.ModuleType)  # harness.run: the functions it names
            for name in code.co_names
        ):
            return True
    return False


def _imports_an_environment(
    code: types.CodeType, imported: list[object], found: list[object]
) -> bool:
    """Whether ``code`` imports vLLM or speculators (``imported``: what :func:`_imported` gave),
    uses what its module imported of them (``found``: the names it uses), or skips without
    them (``pytest.importorskip("vllm")``)."""
    if "importorskip" in code.co_names and set(code.co_consts) & set(ENVIRONMENT_PACKAGES):
        return True
    named = (getattr(f, key, None) for f in found for key in ("__name__", "__module__"))
    return any(f is _IMPORTS_AN_ENVIRONMENT for f in imported) or any(
        _environment_package(name) for name in named if isinstance(name, str)
    )


#: What :func:`_imported` yields for an import of vLLM or speculators.
_IMPORTS_AN_ENVIRONMENT = object()


def _imported(code: types.CodeType) -> Iterator[object]:
    """What ``code`` imports inside itself: ``from conftest import speculators_path`` gives
    that function; ``import vllm`` or ``from speculators... import x``,
    :data:`_IMPORTS_AN_ENVIRONMENT`."""
    module = ""
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            module = instruction.argval
            if _environment_package(module):
                yield _IMPORTS_AN_ENVIRONMENT
        elif instruction.opname == "IMPORT_FROM" and module in sys.modules:
            yield getattr(sys.modules[module], instruction.argval, None)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code of the functions, lambdas and comprehensions inside it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _codes(constant)


def _environment_package(name: str) -> bool:
    return name.split(".")[0] in ENVIRONMENT_PACKAGES
