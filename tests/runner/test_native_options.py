"""``specshim.runner.native.engine_options``: what the native path asks of vLLM, read from the
installed vLLM where releases differ (the whole path: tests/e2e/test_native.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specshim.runner import native


def options(tmp_path: Path) -> dict[str, object]:
    return native.engine_options("/m", [0, 1, 2, 3], 64, 1, tmp_path)


def test_chunked_prefill_is_left_on_where_vllm_allows_the_connector_beside_it(tmp_path) -> None:
    """This environment's vLLM (0.32.0) has no check against chunked prefill: nothing is
    turned off."""
    pytest.importorskip("vllm")
    assert "enable_chunked_prefill" not in options(tmp_path)


def test_chunked_prefill_is_turned_off_where_vllm_refuses_the_connector_beside_it(
    monkeypatch, tmp_path
) -> None:
    """vLLM 0.22's config raises "ExampleHiddenStatesConnector does not support chunked
    prefill" (seen in the matrix's 0.22.1 rows); here its line in a module standing in for
    ``vllm/config/vllm.py``."""
    package = tmp_path / "stand_in_vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(
        f'MESSAGE = "{native.CHUNKED_PREFILL_REFUSAL}. Please disable it."\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(native, "VLLM_CONFIG", "stand_in_vllm.config")
    assert options(tmp_path)["enable_chunked_prefill"] is False
