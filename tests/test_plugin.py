"""The vllm.general_plugins entry point: discoverable, idempotent, and silent unless asked."""

from importlib.metadata import entry_points

from fakes import fake_adapter, original, use
from specshim import applier


def test_entry_point_is_discoverable() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("specshim") == "specshim.plugin:register"


def test_plugin_is_a_no_op_without_a_recorded_selection(monkeypatch, fake_module) -> None:
    from specshim import plugin

    use(monkeypatch, fake_adapter("a"))
    monkeypatch.delenv(applier.APPLY_ENV, raising=False)
    plugin.register()
    plugin.register()
    assert fake_module.a is original
    monkeypatch.setenv(applier.APPLY_ENV, '{"only": null, "exclude": [], "strict": false}')
    plugin.register()
    plugin.register()  # vLLM may load plugins more than once per process
    assert fake_module.a == "patched by a"
