"""tests/markers.py: a test's markers come from what its code reaches.

The sample functions below are looked up by name (``SAMPLES[name]``), so that the tests here
do not themselves refer to what the samples reach and stay runnable without vLLM.
"""

from __future__ import annotations

import types

import pytest

import markers
from conftest import speculators_path
from e2e import harness


def helper_that_finds_speculators() -> object:
    return speculators_path("0.4.0.1")


def calls_the_helper() -> object:
    return helper_that_finds_speculators()


def runs_the_driver() -> object:
    return harness.run  # through a module of tests/: the function it names


def imports_vllm_inside() -> None:
    import vllm  # noqa: F401


def reads_an_attribute_named_vllm(row: types.SimpleNamespace) -> str:
    return row.vllm  # an attribute, not an import


def skips_without_vllm() -> None:
    pytest.importorskip("vllm")


def pure(numbers: list[int]) -> int:
    return sum(numbers)


SAMPLES = {n: f for n, f in globals().items() if isinstance(f, types.FunctionType)}


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("helper_that_finds_speculators", True),
        ("calls_the_helper", True),
        ("runs_the_driver", True),
        ("imports_vllm_inside", True),
        ("skips_without_vllm", True),
        ("reads_an_attribute_named_vllm", False),
        ("pure", False),
    ],
)
def test_what_a_function_reaches_decides_the_vllm_marker(name: str, needs: bool) -> None:
    assert markers._needs(SAMPLES[name], markers.ENVIRONMENT_FUNCTIONS, set()) is needs


def test_only_the_unpacked_wheel_reaches_another_environment() -> None:
    reach = markers._needs(SAMPLES["calls_the_helper"], markers.OTHER_ENVIRONMENT_FUNCTIONS, set())
    assert not reach


def test_a_test_that_uses_an_environment_unmarked_fails_naming_the_marker(request) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"has no vllm marker: mark it @pytest\.mark"):
        markers.check("speculators 0.4.0.1")
    request.node.add_marker(pytest.mark.vllm)
    markers.check("speculators 0.4.0.1")  # marked: nothing to say


def test_the_markers_collected_here(request) -> None:
    """This file's tests call markers' own functions, which name vLLM without needing it: no
    environment; an end-to-end test's, slow unless a smoke case."""
    marks_itself = "test_a_test_that_uses_an_environment_unmarked_fails_naming_the_marker"
    here = [i for i in request.session.items if i.path == request.node.path]
    here = [i for i in here if i.name != marks_itself]
    assert here and all(i.get_closest_marker(m) is None for i in here for m in ("vllm", "slow"))
    e2e = [i for i in request.session.items if "e2e" in i.path.parts]
    assert all(i.get_closest_marker("vllm") for i in e2e)
