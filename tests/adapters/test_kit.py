"""The adapter-writing kit: the proxy (one module's view of another, with a few names
replaced) and the source readers."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from specshim.adapters import kit
from specshim.adapters.kit import Proxy
from specshim.adapters.model import Patch


def test_a_proxy_overrides_only_the_names_given() -> None:
    def dumps(obj: object) -> str:
        return "replaced"

    proxy = Proxy(json, dumps=dumps)
    assert proxy.dumps({}) == "replaced"
    assert proxy.loads("[1]") == [1]  # everything else is the module's own
    assert isinstance(proxy, types.ModuleType) and proxy.__name__ == "json"
    assert "overriding ['dumps']" in repr(proxy)
    assert json.dumps({}) == "{}"  # the module itself is untouched


def test_a_proxy_patch_changes_one_consumers_view_and_reverts() -> None:
    consumer = types.ModuleType("consumer")
    consumer.json = json
    patch = Patch(consumer, "json", Proxy(json, dumps=lambda obj: "seen by consumer"))
    patch.apply()
    assert consumer.json.dumps({}) == "seen by consumer"
    patch.revert()
    assert consumer.json is json


def _builds_a_config(make: Any) -> Any:
    # CacheConfig(enable_prefix_caching=True) in a comment is not a call
    note = "CacheConfig(block_size=16)"  # nor is one in a string
    return make.CacheConfig(
        gpu_memory_utilization=min(0.9, max(0.1, 0.8)),  # nested calls before the keyword
        swap_space=len(note),
    ), make.SchedulerConfig(is_encoder_decoder=False)


@pytest.mark.parametrize(
    ("callee", "keyword", "called"),
    [
        ("CacheConfig", "swap_space", True),
        ("CacheConfig", "gpu_memory_utilization", True),
        ("SchedulerConfig", "is_encoder_decoder", True),
        ("CacheConfig", "enable_prefix_caching", False),
        ("CacheConfig", "block_size", False),
        ("CacheConfig", "is_encoder_decoder", False),
    ],
)
def test_calls_with_keyword_reads_calls_not_text(callee: str, keyword: str, called: bool) -> None:
    """Read from the syntax tree: a keyword counts only as an argument of that very call,
    past nested calls, and never from a comment or a string."""
    assert kit.calls_with_keyword(_builds_a_config, callee, keyword) is called


class _Base:
    @staticmethod
    def scale(x: int) -> int:
        return 2 * x

    @classmethod
    def name(cls) -> str:
        return cls.__name__


class _Derived(_Base):
    pass


def _add_one(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return wrapped(*args, **kwargs) + 1


def test_wrap_keeps_static_and_class_methods_what_they_are() -> None:
    """Wrapped as wrapt finds them (the descriptor from the defining class's ``vars()``), an
    inherited staticmethod gets no ``self`` and a classmethod still gets the subclass."""
    patches = [
        kit.wrap(_Derived, "scale", _add_one),
        kit.wrap(
            _Derived, "name", lambda wrapped, _i, args, kwargs: wrapped(*args, **kwargs) + "!"
        ),
    ]
    for patch in patches:
        patch.apply()
    try:
        assert (_Derived.scale(3), _Derived().scale(3)) == (7, 7)
        assert (_Derived.name(), _Derived().name()) == ("_Derived!", "_Derived!")
        assert _Base.scale(3) == 6  # the base class is untouched
    finally:
        for patch in reversed(patches):
            patch.revert()
    assert "scale" not in vars(_Derived) and _Derived.scale(3) == 6
