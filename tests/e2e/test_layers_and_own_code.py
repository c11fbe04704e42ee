"""On the real vLLM, with models carrying Python code of their own (``auto_map``), which runs
only with ``--trust-remote-code``: not in specshim, not in speculators, not in vLLM.

``--layers`` given out of order: every backend stores the layers ascending, and the manifest
and ``data_config.json`` label them so, each state the output of the decoder layer its id names
in float32 transformers; the same ids in another order resume the same extraction. A model only
its own code reads: refused without the flag, extracted with it, vLLM told too."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from conftest import carrying_own_code
from e2e import harness
from e2e.test_runner import extract_cmd, rows, write_rows
from specshim.runner.extraction import resume

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specshim.testbed import tiny_model

    return tiny_model.build(tmp_path_factory.mktemp("m") / "four", num_layers=4)


@pytest.mark.parametrize("backend", ["generator", "engine", "native"])
def test_layers_out_of_order_are_labelled_as_the_files_hold_them(
    four_layers: Path, tmp_path: Path, backend: str
) -> None:
    marker = tmp_path / "ran"
    model = carrying_own_code(four_layers, tmp_path / "model", marker)
    dataset = write_rows(tmp_path / "data.jsonl", rows(four_layers, 3))
    out = tmp_path / "out"
    done = extract_cmd(model, dataset, out, "--backend", backend, "--layers", "3,0,2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists(), "the model's own code ran without --trust-remote-code"
    manifest = json.loads((out / resume.MANIFEST).read_text())
    config = json.loads((out / "data_config.json").read_text())
    assert manifest["layers"] == config["hidden_states"]["layer_ids"] == [0, 2, 3]
    saved = [torch.load(out / f"data_{i}.pt", weights_only=True) for i in range(3)]
    harness.assert_matches_transformers(model, {"layer_ids": [0, 2, 3], "files": saved}, "files")
    again = extract_cmd(model, dataset, out, "--backend", backend, "--layers", "2,3,0")
    assert "samples: 3 (0 extracted, 3 already done)" in again.stdout, again.stderr[-3000:]


@pytest.mark.parametrize("backend", ["generator", "engine", "native"])
def test_trust_remote_code_reaches_vllm(four_layers: Path, tmp_path: Path, backend: str) -> None:
    """A model whose config only its own code reads (a model type transformers does not
    know): refused in one line before anything is written, its code unrun; with
    --trust-remote-code extracted, which vLLM can do only when it was told to trust the code
    too (its ModelConfig refuses the model otherwise)."""
    marker = tmp_path / "ran"
    model = carrying_own_code(four_layers, tmp_path / "model", marker, "specshim_own")
    dataset = write_rows(tmp_path / "data.jsonl", rows(four_layers, 3))
    refused = extract_cmd(model, dataset, tmp_path / "refused", "--backend", backend)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-1] == (
        f"specshim extract: {model} is read only by Python code of its own (auto_map in its "
        "config), which specshim runs only with --trust-remote-code: pass it if you trust "
        "that code"
    )
    assert not marker.exists() and not (tmp_path / "refused").exists()
    out = tmp_path / "out"
    done = extract_cmd(model, dataset, out, "--backend", backend, "--trust-remote-code")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "samples: 3 (3 extracted, 0 already done)" in done.stdout
    assert marker.exists()


def test_eval_hands_the_setting_to_vllm_and_quotes_a_failed_command(
    four_layers: Path, tmp_path: Path
) -> None:
    """``specshim eval``'s vLLM run (its own process) on a model only its own code reads:
    refused by vLLM without the setting, the failed command printed so that a shell reads the
    model's path (a space and a quote in it) as one word; generating with it."""
    from specshim.runner import evaluate, files

    model = carrying_own_code(four_layers, tmp_path / "it's own", tmp_path / "ran", "specshim_own")
    prompts = tmp_path / "prompts.json"
    files.save_json(prompts, ["What comes after 3?"])
    options = {"k": 1, "max_tokens": 4, "max_model_len": 64}
    with pytest.raises(RuntimeError) as refused:
        evaluate._run(str(model), None, prompts, tmp_path / "without.json", False, **options)
    command = shlex.split(str(refused.value).split("(", 1)[1].split("):\n", 1)[0])
    assert command[2:6] == ["specshim.runner.evaluate", str(model), str(prompts),
                            str(tmp_path / "without.json")]  # fmt: skip
    done = evaluate._run(str(model), None, prompts, tmp_path / "with.json", True, **options)
    assert len(done["token_ids"]) == 1 and len(done["token_ids"][0]) == 4
