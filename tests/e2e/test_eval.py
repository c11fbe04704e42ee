"""`specshim run` from a clean directory, ending with `specshim eval`: acceptance for real.

One run of the whole pipeline (a verifier trained for minutes on a learnable corpus, extraction
through vLLM, vocabulary, EAGLE-3 training through speculators 0.4.0.1, export, evaluation in
vLLM's own speculative decoding), then two comparisons on the same data: a negative control
trained on shuffled hidden states, and the same draft served with off-by-one layer ids.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from e2e.test_runner import specshim_command

pytestmark = pytest.mark.vllm
#: What the trained draft must reach at the first draft position (vLLM's own counters).
MIN_FIRST_POSITION_ACCEPTANCE = 0.5
#: How much worse the control must be at the first position.
CONTROL_MARGIN = 0.2


def specshim(*args: str) -> subprocess.CompletedProcess:
    cmd, env = specshim_command(*args)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    work = tmp_path_factory.mktemp("run")
    result = specshim("run", "--workdir", str(work), "--verifier-seconds", "150")
    return work, result


def first_position(eval_json: Path) -> float:
    return json.loads(eval_json.read_text())["acceptance"]["rate_per_position"][0]


def test_run_ends_with_acceptance_above_the_stated_floor(pipeline) -> None:
    work, result = pipeline
    assert "samples: 300 (300 extracted, 0 already done)" in result.stdout
    assert "position  accepted  rate" in result.stdout
    assert "greedy output identical to the run without the draft: True" in result.stdout
    losses = json.loads((work / "draft" / "train_log.json").read_text())["losses"]
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0], losses
    evaluation = json.loads((work / "eval" / "eval.json").read_text())
    assert evaluation["identical"]
    assert evaluation["acceptance"]["drafts"] > 0
    assert first_position(work / "eval" / "eval.json") >= MIN_FIRST_POSITION_ACCEPTANCE


def test_served_draft_names_layers_in_vllm_convention(pipeline) -> None:
    work, _ = pipeline
    config = json.loads((work / "draft" / "served" / "config.json").read_text())
    assert config["specshim"]["generator_layer_ids"] == [0, 1, 2, 3]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # generator id + 1


def shuffle_positions(source: Path, target: Path) -> None:
    """The same samples, each auxiliary layer's token positions permuted (one permutation per
    sample); input ids, loss mask and the last layer (the training target) unchanged."""
    shutil.copytree(source, target)
    generator = torch.Generator().manual_seed(0)
    for path in sorted(target.glob("data_*.pt")):
        sample = torch.load(path, weights_only=True)
        states = sample["hidden_states"]
        order = torch.randperm(states[0].shape[0], generator=generator)
        sample["hidden_states"] = [h[order] for h in states[:-1]] + [states[-1]]
        torch.save(sample, path)


def test_control_trained_on_shuffled_states_is_clearly_worse(pipeline, tmp_path) -> None:
    work, _ = pipeline
    shuffled = tmp_path / "shuffled"
    shuffle_positions(work / "hidden_states", shuffled)
    verifier = str(work / "verifier")
    specshim("train", "--data", str(shuffled), "--verifier", verifier, "--vocab", str(work),
             "--out", str(tmp_path / "control"), "--epochs", "3")  # fmt: skip
    control = specshim("eval", "--verifier", verifier, "--draft", str(tmp_path / "control"),
                       "--data", str(shuffled))  # fmt: skip
    assert "greedy output identical to the run without the draft: True" in control.stdout
    real = first_position(work / "eval" / "eval.json")
    results = tmp_path / "control" / "eval-served"  # the default: beside the served draft
    worse = first_position(results / "eval.json")
    assert worse <= real - CONTROL_MARGIN, (real, worse)
    written = (results / "eval.json").stat().st_mtime_ns
    specshim("eval", "--verifier", verifier, "--draft", str(tmp_path / "control"),
             "--data", str(shuffled))  # fmt: skip
    assert (results / "eval.json").stat().st_mtime_ns != written  # its own: no --overwrite


def test_off_by_one_layer_ids_serve_and_are_measured(pipeline) -> None:
    """The same draft served reading each feature one layer early. On this 4-layer verifier
    neighbouring layers are alike, so the loss is small (docs/eval.md); the run shows the
    comparison is made on the same data and that serving stays exact."""
    work, _ = pipeline
    result = specshim("eval", "--verifier", str(work / "verifier"), "--draft",
                      str(work / "draft"), "--data", str(work / "hidden_states"),
                      "--layer-shift", "0", "--out", str(work / "eval-shift-0"))  # fmt: skip
    config = json.loads((work / "draft" / "served-shift-0" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert "greedy output identical to the run without the draft: True" in result.stdout
    print(f"first position: consistent {first_position(work / 'eval' / 'eval.json'):.3f}, "
          f"off by one {first_position(work / 'eval-shift-0' / 'eval.json'):.3f}")  # fmt: skip


def test_a_second_run_in_the_same_workdir_resumes_extraction_and_retrains(
    pipeline, tmp_path
) -> None:
    """The README's main command, run again in its work directory: the extracted states are
    reused (every sample already done) and the draft is trained anew, not refused as a mixed
    run. Its own work directory (the pipeline's verifier copied in, which takes --overwrite:
    the folder is not one `specshim run` made), so the draft the tests above read is never
    replaced."""
    work, _ = pipeline
    again = tmp_path / "again"
    shutil.copytree(work / "verifier", again / "verifier")
    specshim("run", "--workdir", str(again), "--samples", "40", "--epochs", "2", "--overwrite")
    second = specshim("run", "--workdir", str(again), "--samples", "40", "--epochs", "1")
    assert "(0 extracted, 40 already done)" in second.stdout
    log = json.loads((again / "draft" / "train_log.json").read_text())
    assert set(log["step_epochs"]) == {0}, "the earlier run's epochs must be gone"
    assert not (again / "draft" / "checkpoints" / "1").exists(), "an old epoch was left behind"
    assert "greedy output identical to the run without the draft: True" in second.stdout
