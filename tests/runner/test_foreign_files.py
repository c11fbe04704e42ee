"""`specshim run` and `specshim vocab` leave files they did not write alone.

`run` writes a marker first into its work directory; a folder with files and no marker is
refused before anything is written there, and `vocab` refuses d2t.npy/t2d.npy already in
its --out. Each refusal is one line, and `--overwrite` lets the command go on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from conftest import speculators_path
from specshim import cli
from specshim.runner import pipeline


def user_folder(root: Path) -> Path:
    """A folder of the user's: a chat file and a vocabulary of their own."""
    root.mkdir()
    (root / "data.jsonl").write_text('{"messages": []}\n')
    (root / "d2t.npy").write_text("mine\n")
    (root / "notes.txt").write_text("mine\n")
    (root / "t2d.npy").write_text("mine\n")
    return root


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_run_refuses_a_workdir_of_someone_elses_files_before_writing(capsys, tmp_path) -> None:
    work = user_folder(tmp_path / "w")
    before = snapshot(work)
    assert cli.main(["run", "--workdir", str(work), "--verifier-seconds", "1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert "d2t.npy, data.jsonl, notes.txt, ..." in err[0] and "--overwrite" in err[0], err
    assert snapshot(work) == before, "nothing may be written into the refused folder"


def test_run_claims_its_own_workdir_and_reruns_there(tmp_path) -> None:
    """A new (or empty) folder gets the marker; then its own files do not stop a rerun, and
    --overwrite takes a folder of other files."""
    work = tmp_path / "w"
    work.mkdir()
    pipeline.claim(work, overwrite=False)
    (work / "data.jsonl").write_text("written by the run\n")
    pipeline.claim(work, overwrite=False)  # a rerun: its own folder
    assert sorted(p.name for p in work.iterdir()) == ["data.jsonl", pipeline.MARKER]
    other = user_folder(tmp_path / "other")
    pipeline.claim(other, overwrite=True)
    assert (other / pipeline.MARKER).exists()


def vocab(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``specshim vocab`` with real speculators into a folder of the user's, from counts in
    ``tmp_path/hs``: its result and that folder."""
    data = tmp_path / "hs"
    data.mkdir()
    torch.save({3: 5, 7: 2}, data / "token_freq.pt")
    out = user_folder(tmp_path / "vu")
    env = {**os.environ, "PYTHONPATH": f"{speculators_path('0.4.0.1')}:{Path('src').resolve()}"}
    argv = ["vocab", "--data", str(data), "--out", str(out), "--draft-vocab-size", "4",
            "--target-vocab-size", "16", *extra]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "specshim.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return done, out


def test_vocab_refuses_vocabulary_files_it_did_not_write(tmp_path) -> None:
    done, out = vocab(tmp_path)
    err = done.stderr.splitlines()
    assert done.returncode == 1 and len(err) == 1, done.stderr[-2000:]
    assert "d2t.npy and t2d.npy" in err[0] and "--overwrite" in err[0], err
    assert snapshot(out) == snapshot(user_folder(tmp_path / "same")), "the user's files changed"


def test_vocab_overwrite_replaces_them(tmp_path) -> None:
    done, out = vocab(tmp_path, "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.load(out / "t2d.npy").shape == (16,)
    assert (out / "notes.txt").read_text() == "mine\n"


def test_eval_refuses_result_files_it_did_not_write_before_vllm(capsys, tmp_path) -> None:
    """An --out holding an eval.json of the user's (or another draft's, changed since) is
    refused in one line before vLLM starts, every byte kept; the files an evaluation wrote
    and recorded are its own to replace, and --overwrite passes the refusal."""
    from specshim.runner import evaluate, files
    from specshim.testbed import tiny_model

    verifier = tiny_model.build(tmp_path / "verifier", "llama")
    capsys.readouterr()  # the build's progress
    out = user_folder(tmp_path / "results")
    (out / "eval.json").write_text('{"mine": true}\n')
    before = snapshot(out)
    argv = ["eval", "--verifier", str(verifier), "--draft", str(tmp_path / "d"), "--out", str(out)]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        f"specshim eval: {files.refusal('--out', out, ['eval.json'])}\n"
    )
    assert snapshot(out) == before

    ledger = files.Ledger(out / evaluate.LEDGER)
    ledger.record(out / "eval.json", "d")  # an evaluation's own file: its to replace
    files.save_json(out / "prompts.json", ["mine"])  # written, then changed by the user
    ledger.record(out / "prompts.json", "d")
    os.utime(out / "prompts.json", ns=(1, 1))
    assert evaluate.not_written_here(out, ledger) == ["prompts.json"]
