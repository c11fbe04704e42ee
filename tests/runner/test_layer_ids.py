"""One order for layer ids: ascending, as every backend stores the layers, wherever a list of
them is taken (``extract --layers``) or read back (``export``); an id given twice is refused.
``convert``'s side: tests/runner/test_convert.py; the files against transformers on the real
vLLM: tests/e2e/test_runner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specshim.runner import export, files
from specshim.runner.extraction import options, resume
from specshim.runner.layer_ids import LayerIdError, ascending, generator_ids, vllm_ids


def test_ids_are_taken_ascending_and_a_repeated_id_is_one_line() -> None:
    assert ascending([3, 0, 2], "--layers") == [0, 2, 3]
    with pytest.raises(LayerIdError) as refused:
        ascending([3, 0, 3], "data_config.json hidden_states.layer_ids")
    assert str(refused.value) == (
        "data_config.json hidden_states.layer_ids: 3 is given twice (expected distinct ids)"
    )


def test_the_two_numberings_undo_each_other() -> None:
    assert vllm_ids([0, 2, 3]) == [1, 3, 4]
    assert generator_ids([1, 3, 4]) == [0, 2, 3]
    with pytest.raises(LayerIdError, match="include 0 \\(the embeddings\\)"):
        generator_ids([0, 2])


def test_extract_records_layers_given_out_of_order_ascending() -> None:
    """The list the manifest, the fingerprints and data_config.json record: the same for the
    same ids in any order, so a rerun in another order resumes the same extraction."""
    chosen = options.choose_layers(4, [3, 0, 2])
    assert chosen == [0, 2, 3]
    model, data = "m", Path("d.jsonl")
    assert resume.settings_for(model, data, chosen, 64) == resume.settings_for(
        model, data, options.choose_layers(4, [2, 3, 0]), 64
    )
    with pytest.raises(LayerIdError, match=r"^--layers: 2 is given twice"):
        options.choose_layers(4, [2, 0, 2])


def test_export_serves_the_ids_ascending_whatever_order_data_config_lists(tmp_path) -> None:
    """speculators 0.3/0.4's generator writes its ids as given, its files hold the layers
    ascending: the draft is served with the three lowest as its inputs, the highest its
    target."""
    files.save_json(tmp_path / "data_config.json", {"hidden_states": {"layer_ids": [3, 0, 2, 1]}})
    ids = export.generator_layer_ids(tmp_path)
    assert ids == [0, 1, 2, 3]
    assert export.serving_layer_ids(ids) == [1, 2, 3]
    files.save_json(tmp_path / "data_config.json", {"hidden_states": {"layer_ids": [3, 0, 3, 1]}})
    with pytest.raises(LayerIdError) as refused:
        export.generator_layer_ids(tmp_path)
    where = tmp_path / "data_config.json"
    expected = f"{where} hidden_states.layer_ids: 3 is given twice (expected distinct ids)"
    assert str(refused.value) == expected
