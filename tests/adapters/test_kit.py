"""The adapter-writing kit's proxy: one module's view of another, with a few names replaced."""

from __future__ import annotations

import json
import types

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
