"""``specshim.runner.extraction.backends.native.engine_options``: what the native path asks of vLLM,
read from the installed vLLM where releases differ (the whole path: tests/e2e/test_native.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specshim.runner.extraction.backends import native


def options(tmp_path: Path) -> dict[str, object]:
    return native.engine_options("/m", [0, 1, 2, 3], 64, 1, tmp_path)


def test_chunked_prefill_is_left_on_where_vllm_allows_the_connector_beside_it(tmp_path) -> None:
    """This environment's vLLM (0.32.0) has no check against chunked prefill: nothing is
    turned off."""
    pytest.importorskip("vllm")
    assert "enable_chunked_prefill" not in options(tmp_path)


def test_chunked_prefill_is_turned_off_where_vllm_refuses_the_connector_beside_it(
    monkeypatch, tmp_path, stand_in
) -> None:
    """vLLM 0.22's config raises "ExampleHiddenStatesConnector does not support chunked
    prefill" (seen in the matrix's 0.22.1 rows); here its line in a module standing in for
    ``vllm/config/vllm.py``."""
    refusal = f'MESSAGE = "{native.CHUNKED_PREFILL_REFUSAL}. Please disable it."\n'
    monkeypatch.setattr(native, "VLLM_CONFIG", stand_in("config", refusal))
    assert options(tmp_path)["enable_chunked_prefill"] is False


def test_specshims_connector_is_chosen_where_vllms_has_what_it_overrides() -> None:
    """This environment's vLLM (0.32.0): the worker writes the files, through specshim's
    connector, loaded from its module path."""
    pytest.importorskip("vllm")
    assert native.writes_in_worker()
    config = native.engine_options("/m", [0], 64, 1, Path("/w"), own_connector=True)
    module, name = native.OWN_CONNECTOR
    assert config["kv_transfer_config"]["kv_connector"] == name
    assert config["kv_transfer_config"]["kv_connector_module_path"] == module


#: vLLM 0.19.1's connector writes each request in ``save_kv_layer`` itself: no
#: ``_write_tensors`` for specshim's connector to replace.
CONNECTOR_0_19 = """
class ExampleHiddenStatesConnector:
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        safetensors.torch.save_file(tensors, request.filename)
"""


def test_the_caller_reads_vllms_files_back_where_its_connector_lacks_the_write_step(
    monkeypatch, tmp_path, stand_in
) -> None:
    """Where the installed connector has no ``_write_tensors`` (0.19.1's, here in a module
    standing in for it), vLLM's own connector is asked for and the caller reads back."""
    monkeypatch.setattr(native, "CONNECTOR", stand_in("connector", CONNECTOR_0_19))
    assert not native.writes_in_worker()
    config = options(tmp_path)["kv_transfer_config"]
    assert config["kv_connector"] == "ExampleHiddenStatesConnector"
    assert "kv_connector_module_path" not in config
