"""A model's own Python code runs only with ``--trust-remote-code``, and no pickled file runs
code when it is read: real tiny model folders whose ``config.json`` names code of its own
(``auto_map``) that leaves a mark when imported, real transformers, real speculators' readers
(in their own processes, as the e2e harness selects a release), and ``.pt`` files made to run
code on unpickling. vLLM's side: tests/e2e/test_runner.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SPECULATORS, carrying_own_code, speculators_path
from specshim import cli
from specshim.runner import files, remote_code, vocab
from specshim.runner.extraction import options
from specshim.runner.train.options import check_verifier

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    from specshim.testbed import tiny_model

    return tiny_model.build(tmp_path_factory.mktemp("m") / "four", num_layers=4)


def refusal(model: Path) -> str:
    return (
        f"{model} is read only by Python code of its own (auto_map in its config), which "
        "specshim runs only with --trust-remote-code: pass it if you trust that code"
    )


def test_a_model_only_its_own_code_reads_is_one_line_from_each_command(
    capsys, four_layers, tmp_path
) -> None:
    marker = tmp_path / "ran"
    model = carrying_own_code(four_layers, tmp_path / "own", marker, "specshim_own")
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    out = tmp_path / "out"
    for argv in (
        ["extract", "--model", str(model), "--data", str(data), "--out", str(out)],
        ["vocab", "--data", str(out), "--draft-vocab-size", "8", "--model", str(model)],
        ["eval", "--verifier", str(model), "--draft", str(model), "--out", str(out)],
    ):
        code = cli.main(argv)
        assert (code, capsys.readouterr().err) == (1, f"specshim {argv[0]}: {refusal(model)}\n")
    with pytest.raises(remote_code.RemoteCodeRefused) as refused:
        check_verifier(str(model), trust_remote_code=False)
    assert str(refused.value) == refusal(model)
    assert not marker.exists(), "the model's own code ran"
    assert not out.exists()


def test_a_model_transformers_knows_is_read_without_its_own_code(four_layers, tmp_path) -> None:
    """Its own code is left unrun, unless asked for; then it is what reads the config."""
    marker = tmp_path / "ran"
    model = carrying_own_code(four_layers, tmp_path / "own", marker)
    size = json.loads((model / "config.json").read_text())["vocab_size"]
    assert options.model_config(str(model)).num_hidden_layers == 4
    assert vocab.target_vocab_size(model) == size
    check_verifier(str(model), trust_remote_code=False)
    assert len(remote_code.tokenizer(str(model), trust=False)) == size
    assert not marker.exists(), "the model's own code ran"
    config = options.model_config(str(model), trust_remote_code=True)
    assert type(config).__name__ == "OwnConfig"
    assert marker.read_text().split() == [str(os.getpid())]


SPECULATORS_READERS = """
import sys
import specshim
specshim.apply()
from speculators.data_generation import config_generator
from speculators.data_generation import vllm_hidden_states_generator as generator
from specshim.runner import remote_code
known, own_only = sys.argv[1:3]
with remote_code.in_speculators(False, remote_code.EXTRACTION_LOADERS):
    print("hidden size:", config_generator._get_hidden_size_from_model(known))
    try:
        generator.AutoConfig.from_pretrained(own_only, trust_remote_code=True)
    except remote_code.RemoteCodeRefused:
        print("generator: refused")
    made = generator.ModelConfig(model=known, tokenizer=known, trust_remote_code=True,
                                 max_model_len=64, enforce_eager=True)
    print("vLLM told:", made.trust_remote_code)
with remote_code.in_speculators(False, remote_code.TRAINING_LOADERS):
    from speculators.models.eagle3 import core
    try:
        core.AutoConfig.from_pretrained(own_only)
    except remote_code.RemoteCodeRefused:
        print("training: refused")
print("after:", generator.AutoConfig.__name__, generator.ModelConfig.__name__)
"""


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_speculators_readers_take_the_setting_not_their_own_true(
    four_layers, tmp_path, speculators
) -> None:
    """speculators 0.3/0.4's generator and data config pass trust_remote_code=True for every
    model, its training reads the verifier with transformers' default: inside
    ``in_speculators`` each takes the setting, vLLM's ModelConfig included; after, their
    names are speculators' own again."""
    marker = tmp_path / "ran"
    known = carrying_own_code(four_layers, tmp_path / "known", marker)
    own_only = carrying_own_code(four_layers, tmp_path / "own", marker, "specshim_own")
    path = f"{speculators_path(speculators)}:{Path('src').resolve()}"
    done = subprocess.run(
        [sys.executable, "-c", SPECULATORS_READERS, str(known), str(own_only)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "hidden size: 128",
        "generator: refused",
        "vLLM told: False",
        "training: refused",
        "after: AutoConfig ModelConfig",
    ]
    assert not marker.exists(), "the model's own code ran"


def test_a_speculators_release_without_a_loader_it_overrides_is_one_line() -> None:
    """Where a release reads models some other way, its own trust_remote_code=True could run
    unseen: no extraction runs there."""
    with (
        pytest.raises(RuntimeError) as refused,
        remote_code.in_speculators(False, {"json": ("AutoConfig",)}),
    ):
        pass
    assert str(refused.value) == (
        "json has no AutoConfig: specshim cannot give it the --trust-remote-code setting "
        "(expected speculators 0.3/0.4)"
    )


class RunsWhenUnpickled:
    """Pickles as a call of ``os.mkdir(marker)``: reading it with pickle runs that."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


def test_a_pt_file_made_to_run_code_is_read_without_running_it(capsys, tmp_path) -> None:
    """convert, vocab and train read sample and count files with torch's weights-only
    unpickler: the call a crafted file carries is refused, not made, and the command fails.
    (Unpickled in full, the same file makes the call: the check can fail.)"""
    marker = tmp_path / "ran"
    crafted = RunsWhenUnpickled(marker)
    folder = tmp_path / "data"
    folder.mkdir()
    torch.save({"input_ids": crafted, "hidden_states": [], "loss_mask": crafted},
               folder / "data_0.pt")  # fmt: skip
    torch.save({1: crafted}, folder / "token_freq.pt")
    files.save_json(folder / "sample_lengths.json", {"0": 3})
    files.save_json(folder / "data_config.json", {"hidden_states": {"layer_ids": [0, 1, 2, 3]}})
    for name in ("d2t.npy", "t2d.npy"):
        (folder / name).write_bytes(b"")

    assert cli.main(["convert", "--data", str(folder), "--out", str(tmp_path / "converted")]) == 1
    assert "data_0.pt: could not be loaded" in capsys.readouterr().err
    env = {**os.environ, "PYTHONPATH": f"{speculators_path('0.4.0.1')}:{Path('src').resolve()}"}
    sizes = ["--draft-vocab-size", "8", "--target-vocab-size", "64"]
    for argv in (
        ["vocab", "--data", str(folder), *sizes, "--overwrite"],  # over train's d2t.npy/t2d.npy
        ["train", "--data", str(folder), "--verifier", str(tmp_path), "--out", str(tmp_path / "t")],
    ):
        done = subprocess.run([sys.executable, "-m", "specshim.cli", *argv], env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode != 0, done.stderr[-2000:]
    assert not marker.exists(), "a crafted file ran its code"
    torch.load(folder / "token_freq.pt", weights_only=False)
    assert marker.is_dir()
