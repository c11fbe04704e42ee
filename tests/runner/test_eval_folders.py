"""`specshim eval` and the folders around its draft, without starting vLLM.

eval holds a training folder (it exports ``served/`` there) as ``train`` does, and an exported
draft shared; ``train --overwrite`` removes no folder another command holds; eval's and the
export's files are refused, when not theirs, before anything is written; and a file a kill
left unrecorded is still the run's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.test_checkpoints import checkpoint
from runner.test_out_lock import hold, specshim
from specshim import cli
from specshim.runner import evaluate, export, files, out_lock
from specshim.runner.train import out as train_out


def training_folder(root: Path) -> Path:
    """A training run's folder with one complete checkpoint that export reads, and its
    extraction's ``data_config.json`` in ``root/hs``."""
    draft = root / "draft"
    epoch = checkpoint(draft / "checkpoints", 0)
    (epoch / "config.json").write_text("{}\n")
    (root / "hs").mkdir()
    (root / "hs" / "data_config.json").write_text(
        json.dumps({"hidden_states": {"layer_ids": [2, 4, 5, 6]}})
    )
    return draft


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_eval_of_a_training_folder_another_command_holds_stops_before_exporting(
    tmp_path: Path,
) -> None:
    draft = training_folder(tmp_path)
    process = hold(draft)  # as train holds its --out
    try:
        result = specshim("eval", "--verifier", "v", "--draft", str(draft), "--data", "hs")
    finally:
        process.kill()
        process.wait()
    assert result.returncode == 2, result.stderr
    assert one_line(result).startswith(
        f"specshim eval: --draft {draft} is in use by specshim extract (pid {process.pid}, "
    )
    assert [p.name for p in out_lock.contents(draft)] == ["checkpoints"]


def test_eval_reads_an_exported_draft_beside_readers_and_never_beside_a_writer(
    tmp_path: Path,
) -> None:
    draft, out = tmp_path / "exported", tmp_path / "results"
    out.mkdir()
    (out / "eval.json").write_text('{"mine": true}\n')  # refused: eval stops there, not in vLLM
    args = ("eval", "--verifier", "v", "--draft", str(draft), "--out", str(out))
    writer = hold(draft)
    try:
        result = specshim(*args)
    finally:
        writer.kill()
        writer.wait()
    assert result.returncode == 2 and f"--draft {draft} is in use" in one_line(result)
    reader = hold(draft, "--data")
    try:
        result = specshim(*args)  # goes on, to the files in --out
    finally:
        reader.kill()
        reader.wait()
    assert result.returncode == 1 and "eval.json; nothing was changed" in one_line(result)


def test_train_overwrite_removes_no_folder_another_command_holds(tmp_path: Path) -> None:
    draft = training_folder(tmp_path)
    process = hold(draft / "eval-served")  # as eval of draft/served holds its --out
    try:
        with pytest.raises(out_lock.OutInUse, match=f"^--overwrite: {draft}/eval-served is in"):
            train_out.remove_run(draft)
    finally:
        process.kill()
        process.wait()
    assert [p.name for p in out_lock.contents(draft)] == ["checkpoints", "eval-served"]
    train_out.remove_run(draft)  # the holder gone: its folder goes with the run
    assert out_lock.contents(draft) == []


def test_served_files_specshim_did_not_write_are_refused_before_export(
    capsys, tmp_path: Path
) -> None:
    draft = training_folder(tmp_path)
    served = export.export(draft, tmp_path / "hs", draft / "served")
    (served / "config.json").write_text('{"mine": true}\n')  # edited by hand
    argv = ["eval", "--verifier", "v", "--draft", str(draft), "--data", str(tmp_path / "hs")]
    assert cli.main(argv) == 1
    refused = files.refusal("--draft", served, ["config.json"])
    assert capsys.readouterr().err == f"specshim eval: {refused}\n"
    assert (served / "config.json").read_text() == '{"mine": true}\n'
    export.export(draft, tmp_path / "hs", served)  # as --overwrite does
    export.check(served, "--draft", overwrite=False)  # its own now: a re-export replaces them


def test_foreign_files_in_out_stop_eval_before_served_is_written(capsys, tmp_path) -> None:
    draft = training_folder(tmp_path)
    out = tmp_path / "results"
    out.mkdir()
    (out / "eval.json").write_text('{"mine": true}\n')
    argv = ["eval", "--verifier", "v", "--draft", str(draft), "--data", str(tmp_path / "hs"),
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 1
    refused = files.refusal("--out", out, ["eval.json"])
    assert capsys.readouterr().err == f"specshim eval: {refused}\n"
    assert not (draft / "served").exists()


def test_a_file_the_child_wrote_before_a_kill_is_the_runs_own(monkeypatch, tmp_path) -> None:
    """Killed after the child process wrote its output and before the parent recorded it:
    the claim made before the child started makes the file the next run's to replace."""
    from specshim.testbed import tiny_model

    verifier = tiny_model.build(tmp_path / "verifier", "llama")

    def fake_run_killed_after_writing(verifier: str, draft: object, prompts: Path, out: Path,
                                      *args: object, **options: int) -> dict:  # fmt: skip
        files.save_json(out, {"token_ids": [[1]]})
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "_run", fake_run_killed_after_writing)
    out = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt):
        evaluate.evaluate(str(verifier), "d", ["hi"], out)
    assert (out / "without_draft.json").exists()
    assert evaluate.not_written_here(out, files.Ledger(out / evaluate.LEDGER)) == []
    os.utime(out / "prompts.json", ns=(1, 1))  # a recorded file changed since stays refused
    assert evaluate.not_written_here(out, files.Ledger(out / evaluate.LEDGER)) == ["prompts.json"]


@pytest.mark.parametrize("made", [False, True])
def test_a_draft_that_is_no_draft_is_one_line_and_leaves_nothing(tmp_path, made: bool) -> None:
    """A missing --draft, or a folder without config.json, is refused before eval starts vLLM
    (which ended in a 35-line traceback), and leaves no eval-NAME folder behind."""
    draft = tmp_path / "exported"
    if made:
        draft.mkdir()
    result = specshim("eval", "--verifier", "v", "--draft", str(draft))
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    what = "has no config.json" if made else "does not exist"
    assert result.stderr.startswith(f"specshim eval: --draft {draft} {what}: give ")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["exported"] if made else [])
