"""examples/tiny_workflow.sh, run for real: the tiny verifier built, then report, extract,
vocab, train and eval as a user types them, each command's output where the next reads it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import ROOT, speculators_path, vllm_python

SCRIPT = ROOT / "examples" / "tiny_workflow.sh"
#: Fewer prompts and a shorter verifier than the script's defaults: the test proves that each
#: step runs and hands on its files, not how good the draft gets.
SAMPLES = 40


def test_the_tiny_workflow_runs_every_command_and_leaves_their_outputs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = {
        **os.environ,
        "PATH": f"{vllm_python('0.32.0').parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(speculators_path("0.4.0.1")),
        "VERIFIER_SECONDS": "20",
        "SAMPLES": str(SAMPLES),
        "EPOCHS": "1",
    }
    env.pop("SPECSHIM_APPLY", None)
    done = subprocess.run(
        [str(SCRIPT), str(work)], env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # report (the tokenizer's training, in step 0, prints blank lines before it)
    assert done.stdout.lstrip().startswith("verdict: ")
    hs = work / "hs"
    assert len(list(hs.glob("data_*.pt"))) == SAMPLES  # extract
    assert (hs / "d2t.npy").is_file() and (hs / "t2d.npy").is_file()  # vocab
    assert len(json.loads((work / "draft" / "train_log.json").read_text())["losses"]) > 0
    (evaluation,) = (work / "draft").glob("*/eval.json")  # eval, beside the served draft
    assert json.loads(evaluation.read_text())["identical"]


def test_the_tiny_workflow_refuses_a_folder_that_holds_files(tmp_path: Path) -> None:
    """Into a folder with files in it, the script stops first, naming it, and writes nothing."""
    (tmp_path / "notes.txt").write_text("mine")
    done = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert (
        done.stderr
        == f"tiny_workflow.sh: {tmp_path} is not empty: give a new folder (or remove it)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
