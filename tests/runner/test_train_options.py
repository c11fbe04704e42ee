"""`specshim train` and `specshim vocab` refuse bad input with one line, before loading anything.

These run the command line in-process: every check here comes before speculators, a model or
the data is read, so none of them needs the training environment (and none writes `--out`).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from specshim import cli


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``specshim ARGS``."""
    code = cli.main(list(args))
    return code, capsys.readouterr().err.splitlines()


def extraction_folder(root: Path) -> Path:
    """A folder that passes for an extraction by its files' names (none is read here)."""
    root.mkdir()
    for name in ("data_0.pt", "sample_lengths.json", "d2t.npy", "t2d.npy"):
        (root / name).touch()
    return root


def train_args(tmp_path: Path, data: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(data), "--verifier", str(tmp_path / "no-verifier"),
            "--out", str(tmp_path / "out"), *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--epochs", "0"),
        ("--lr", "0"),
        ("--lr", "-0.001"),
        ("--lr", "nan"),
        ("--max-len", "0"),
        ("--num-layers", "0"),
        ("--ttt-steps", "-1"),
        ("--dtype", "float16"),
        ("--device", "tpu"),
    ],
)
def test_a_bad_number_or_name_is_one_line(capsys, tmp_path, option, value) -> None:
    data = extraction_folder(tmp_path / "hs")
    code, err = run(capsys, *train_args(tmp_path, data, option, value))
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"specshim train: {option} must be"), err
    assert value in err[0]
    assert not (tmp_path / "out").exists()


def test_resume_and_overwrite_together_are_refused(capsys, tmp_path) -> None:
    data = extraction_folder(tmp_path / "hs")
    code, err = run(capsys, *train_args(tmp_path, data, "--resume", "--overwrite"))
    assert code == 1 and len(err) == 1 and "pass one" in err[0], err


def test_data_that_is_not_an_extraction_folder_is_one_line(capsys, tmp_path) -> None:
    data = extraction_folder(tmp_path / "hs")
    (data / "sample_lengths.json").unlink()  # an extraction that never finished
    code, err = run(capsys, *train_args(tmp_path, data))
    assert code == 1 and len(err) == 1, err
    assert f"--data {data} is not an extraction folder" in err[0]
    assert "sample_lengths.json" in err[0] and "specshim extract" in err[0]


def test_a_folder_without_the_vocabulary_names_the_command_that_writes_it(capsys, tmp_path) -> None:
    data = extraction_folder(tmp_path / "hs")
    (data / "t2d.npy").unlink()
    code, err = run(capsys, *train_args(tmp_path, data))
    assert code == 1 and len(err) == 1, err
    assert f"--vocab {data} has no t2d.npy" in err[0] and "specshim vocab" in err[0]


def test_sample_lengths_that_do_not_read_are_one_line_naming_the_file(capsys, tmp_path) -> None:
    data = extraction_folder(tmp_path / "hs")  # sample_lengths.json: empty
    code, err = run(capsys, *train_args(tmp_path, data))
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"specshim train: {data / 'sample_lengths.json'}: cannot be read (")
    assert err[0].endswith(f"run `specshim extract` with --out {data} again")
    (data / "sample_lengths.json").write_text('{"0": "40"}')
    code, err = run(capsys, *train_args(tmp_path, data))
    assert code == 1 and len(err) == 1 and "not a positive integer" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        (("--draft-vocab-size", "0", "--model", "/no/such/model"), "--draft-vocab-size must be"),
        (("--draft-vocab-size", "-5", "--target-vocab-size", "384"), "--draft-vocab-size must"),
        (("--draft-vocab-size", "500", "--target-vocab-size", "384"), "at most the target"),
        (("--draft-vocab-size", "8", "--target-vocab-size", "0"), "--target-vocab-size must"),
        (("--draft-vocab-size", "8", "--model", "/no/such/model"), "--model /no/such/model"),
    ],
)
def test_vocab_sizes_and_model_are_one_line(capsys, tmp_path, sizes, expected) -> None:
    data = tmp_path / "hs"
    data.mkdir()  # no token_freq.pt: the sizes are checked first
    code, err = run(capsys, "vocab", "--data", str(data), *sizes)
    assert code == 1 and len(err) == 1, err
    assert expected in err[0]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    commands = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def subcommand(name: str) -> argparse.ArgumentParser:
    return subcommands()[name]


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_has_help_and_shows_its_default(name) -> None:
    command = subcommand(name)
    options = [a for a in command._actions if a.option_strings and a.dest != "help"]
    assert [a.dest for a in options if not a.help] == []
    shown = command.format_help()
    for action in options:
        if not action.required and action.default not in (None, False, []):
            assert f"(default: {action.default})" in " ".join(shown.split()), action.dest


@pytest.mark.parametrize(
    ("text", "expected"), [("{not json", "cannot be read"), ("[1]", "holds a list")]
)
def test_a_damaged_run_file_is_one_line_naming_it(tmp_path, text, expected) -> None:
    """train_log.json / train_settings.json as a resume reads them (before: a bare
    JSONDecodeError, or an AttributeError traceback for a list)."""
    from specshim.runner.train.out import run_file

    path = tmp_path / "train_settings.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{path} {expected}"):
        run_file(path)


def test_overwrite_after_an_overwrite_that_was_killed(tmp_path) -> None:
    """A kill during --overwrite leaves .overwritten/ holding a run's folders; a later run
    made checkpoints/ again; the next --overwrite must not trip over the leftover."""
    from specshim.runner.train.out import TRASH, remove_run

    out = tmp_path / "out"
    (out / TRASH / "checkpoints" / "0").mkdir(parents=True)
    (out / "checkpoints" / "0").mkdir(parents=True)
    remove_run(out)
    assert list(out.iterdir()) == []


def test_the_commands_to_run_first_are_quoted_for_the_shell(capsys, tmp_path) -> None:
    """A folder named with a space and a quote comes back as one word when the command the
    line names is pasted into a shell."""
    data = extraction_folder(tmp_path / "it's hs")
    (data / "t2d.npy").unlink()
    _, err = run(capsys, *train_args(tmp_path, data))
    command = err[0].split("`")[1]
    assert shlex.split(command) == ["specshim", "vocab", "--data", str(data), "--out", str(data)]
    (data / "sample_lengths.json").unlink()
    _, err = run(capsys, *train_args(tmp_path, data))
    assert shlex.split(err[0].split("`")[1]) == ["specshim", "extract", "--out", str(data)]


def test_out_that_is_the_data_folder_is_one_line_not_a_lock_on_itself(capsys, tmp_path) -> None:
    """--out holds the run's lock and --data a reader's: the same folder for both would be
    refused by the run's own lock; it is said as what it is."""
    data = extraction_folder(tmp_path / "hs")
    code, err = run(capsys, "train", "--data", str(data), "--verifier", "v", "--out", str(data))
    expected = f"--out {data} is the --data folder: pick a folder of its own for the run"
    assert (code, err) == (1, [f"specshim train: {expected}"])
    names = sorted(p.name for p in data.iterdir())
    assert names == ["d2t.npy", "data_0.pt", "sample_lengths.json", "t2d.npy"]
