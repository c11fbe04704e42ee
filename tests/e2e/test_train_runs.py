"""One `--out`, one training run: the real speculators 0.4.0.1 trainer on the CPU.

The training data is written here in the exact files an extraction writes (``data_i.pt`` with
``input_ids``, four ``[seq, hidden]`` states and ``loss_mask``; ``sample_lengths.json``; an
identity ``d2t.npy``/``t2d.npy``), with seeded random states for a real tiny verifier: what is
tested (what ``--out`` may hold, the log, the progress shown) does not depend on the states'
values, and writing them takes a second where a vLLM extraction takes minutes. One real
training run (one epoch) is shared; the runs that refuse train nothing and run in-process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import termios
import tty
from pathlib import Path

import pytest

from conftest import speculators_path, vllm_python
from e2e import harness
from e2e.test_train import specshim, speculators_env
from specshim import cli
from specshim.runner import files

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("speculators_importable")]

#: What a run writes into --out: its log and the settings a resume must match.
LOG, SETTINGS = "train_log.json", "train_settings.json"

SAMPLES, TOKENS = 8, 40


def write_synthetic_extraction(out: Path, verifier: Path) -> Path:
    """An extraction folder for ``verifier`` with random states (see the module docstring)."""
    import numpy as np
    import torch

    config = json.loads((verifier / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    for i in range(SAMPLES):
        sample = {
            "input_ids": torch.randint(vocab, (TOKENS,), generator=generator),
            "hidden_states": [torch.randn(TOKENS, hidden, generator=generator) for _ in range(4)],
            "loss_mask": torch.ones(TOKENS, dtype=torch.long),
        }
        files.save_torch(out / f"data_{i}.pt", sample)
    files.save_json(out / "sample_lengths.json", {str(i): TOKENS for i in range(SAMPLES)})
    np.save(out / "d2t.npy", np.zeros(vocab, dtype=np.int64))
    np.save(out / "t2d.npy", np.ones(vocab, dtype=bool))
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """(extraction folder, verifier)."""
    from specshim.testbed import tiny_model

    root = tmp_path_factory.mktemp("train-runs")
    verifier = tiny_model.build(root / "verifier", "llama")
    return write_synthetic_extraction(root / "hs", verifier), verifier


def args(inputs: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    data, verifier = inputs
    return ["train", "--data", str(data), "--verifier", str(verifier), "--out", str(out),
            "--max-len", "128", "--device", "cpu", *extra]  # fmt: skip


def on_a_terminal(*argv: str) -> subprocess.CompletedProcess:
    """``specshim ARGV`` (speculators 0.4.0.1) with its stderr on a terminal, as a user sees it
    (a pseudo-terminal of 100 columns in raw mode: its lines end in ``\n`` as written)."""
    master, terminal = pty.openpty()
    tty.setraw(terminal)
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    cmd = [str(vllm_python("0.32.0")), "-m", "specshim.cli", *argv]
    process = subprocess.Popen(cmd, env=speculators_env("0.4.0.1"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=terminal)  # fmt: skip
    os.close(terminal)
    said = []
    with contextlib.suppress(OSError):  # EIO: the process closed its end
        while chunk := os.read(master, 65536):
            said.append(chunk)
    os.close(master)
    out, _ = process.communicate(timeout=900)
    return subprocess.CompletedProcess(cmd, process.returncode, out.decode(),
                                       b"".join(said).decode(errors="replace"))  # fmt: skip


@pytest.fixture(scope="module")
def first_run(inputs, tmp_path_factory):
    """One real epoch into a fresh ``--out``, on a terminal: the run the other tests find
    there."""
    out = tmp_path_factory.mktemp("first") / "draft"
    result = on_a_terminal(*args(inputs, out, "--epochs", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


@pytest.fixture
def earlier(first_run, tmp_path) -> Path:
    """A copy of the first run's ``--out``, for a test to try a second run into."""
    return Path(shutil.copytree(first_run[0], tmp_path / "draft"))


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under ``out``, by relative path, with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.fixture
def speculators_importable(monkeypatch) -> None:
    """speculators 0.4.0.1 importable in-process, as in the subprocess runs: the refusals
    below come before any import of it, but without them the command would train."""
    monkeypatch.syspath_prepend(str(speculators_path("0.4.0.1")))


def in_process(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """``specshim ARGV`` in this process: exit status, stdout, stderr lines."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def test_training_shows_steps_epoch_loss_and_throughput(first_run) -> None:
    out, result = first_run
    steps = json.loads((out / LOG).read_text())["steps"]
    final = [part for part in result.stderr.split("\r") if "[specshim train]" in part][-1]
    assert "epoch 1/1: 100%" in final and f"{steps}/{steps}" in final, result.stderr[-2000:]
    assert "loss " in final and "tok/s" in final


def test_what_speculators_says_goes_to_the_log_file(first_run) -> None:
    """speculators' records (loguru's and ``logging``'s) and Python's warnings go to
    ``--out``/libraries.log, which the last line names; the terminal shows specshim's own
    lines and its bar only."""
    out, result = first_run
    log = out / "libraries.log"
    assert "speculators.utils.loading" in log.read_text()
    shown = [line.split("\r")[-1] for line in result.stderr.splitlines()]
    own = ("specshim: ", "[specshim train]")  # and empty lines: the bar's last "\r" ends one
    assert [line for line in shown if line and not line.startswith(own)] == []
    assert shown[-1] == f"specshim: what vLLM and the other libraries said is in {log}"


def test_a_second_run_into_the_same_out_is_refused(capsys, inputs, earlier) -> None:
    before = snapshot(earlier)
    code, _, err = in_process(capsys, *args(inputs, earlier, "--epochs", "2"))
    assert code == 1 and len(err) == 1, err
    assert f"--out {earlier} is not empty" in err[0]
    assert "--resume" in err[0] and "--overwrite" in err[0] and "new --out" in err[0]
    assert snapshot(earlier) == before


def test_resuming_a_finished_run_changes_nothing(capsys, inputs, earlier) -> None:
    before = snapshot(earlier)
    code, out, err = in_process(capsys, *args(inputs, earlier, "--epochs", "1", "--resume"))
    assert code == 0, err
    assert out.startswith("already trained to 1 epoch; nothing to do"), out
    assert snapshot(earlier) == before


@pytest.mark.parametrize(
    ("option", "value"),
    [("--num-layers", "2"), ("--max-len", "96"), ("--data", "other"), ("--verifier", "other")],
)
def test_resume_with_other_settings_is_refused(capsys, inputs, earlier, option, value) -> None:
    data, verifier = inputs
    if value == "other":  # the same files under another name: still another setting
        original = data if option == "--data" else verifier
        value = str(shutil.copytree(original, earlier.parent / "other"))
    before = snapshot(earlier)
    argv = [*args(inputs, earlier, "--epochs", "2", "--resume"), option, value]
    code, _, err = in_process(capsys, *argv)
    assert code == 1 and len(err) == 1, err
    assert f"--resume: the run in {earlier} had other settings: {option} {value}" in err[0]
    assert "(the run in it used" in err[0] and "--overwrite" in err[0]
    assert snapshot(earlier) == before


def test_the_same_data_by_a_relative_path_is_the_same_setting(
    capsys, inputs, earlier, monkeypatch
) -> None:
    data, verifier = inputs
    monkeypatch.chdir(data.parent)
    argv = args((Path(data.name), verifier), earlier, "--epochs", "1", "--resume")
    code, out, err = in_process(capsys, *argv)
    assert code == 0 and "nothing to do" in out, err


def test_resume_appends_to_the_log_and_says_where_it_continued(inputs, earlier) -> None:
    first = json.loads((earlier / LOG).read_text())
    result = specshim("0.4.0.1", *args(inputs, earlier, "--epochs", "2", "--resume"))
    assert result.returncode == 0, result.stderr[-3000:]
    where = f"resuming from {earlier / 'checkpoints' / '0'} (1 of 2 epochs done; training epoch 2)"
    assert where in result.stderr
    log = json.loads((earlier / LOG).read_text())
    steps = first["steps"]
    assert log["losses"][:steps] == first["losses"]
    assert log["step_epochs"] == [0] * steps + [1] * steps
    assert sorted(p.name for p in (earlier / "checkpoints").iterdir()) == ["0", "1"]


def test_overwrite_removes_the_earlier_run_and_only_it(capsys, inputs, earlier) -> None:
    shutil.copytree(earlier / "checkpoints" / "0", earlier / "checkpoints" / "1")
    (earlier / "served").mkdir()  # `specshim eval`'s export of the earlier run, and results
    (earlier / "eval").mkdir()
    (earlier / "notes.txt").write_text("mine")
    before = snapshot(earlier)
    code, _, err = in_process(capsys, *args(inputs, earlier, "--epochs", "1", "--overwrite"))
    assert code == 1 and len(err) == 1 and "notes.txt" in err[0], err
    assert snapshot(earlier) == before  # nothing removed
    (earlier / "notes.txt").unlink()
    result = specshim("0.4.0.1", *args(inputs, earlier, "--epochs", "1", "--overwrite"))
    assert result.returncode == 0, result.stderr[-3000:]
    # the libraries' log is kept and added to: it is never one of a run's files
    assert sorted(p.name for p in earlier.iterdir()) == ["checkpoints", "libraries.log", LOG,
                                                          SETTINGS]  # fmt: skip
    assert sorted(p.name for p in (earlier / "checkpoints").iterdir()) == ["0"]
    log = json.loads((earlier / LOG).read_text())
    assert set(log["step_epochs"]) == {0}


def test_resume_sets_aside_a_checkpoint_with_a_damaged_model_file(inputs, earlier) -> None:
    """Every file of the last checkpoint is checked before a resume trusts it, not only the
    scheduler's (before: speculators loaded the truncated weights, a SafetensorError traceback
    "incomplete metadata, file not fully covered"). It is set aside, the line says which file,
    and its epoch is trained again."""
    model = earlier / "checkpoints" / "0" / "model.safetensors"
    whole = model.read_bytes()
    model.write_bytes(whole[: len(whole) // 2])
    result = specshim("0.4.0.1", *args(inputs, earlier, "--epochs", "2", "--resume"))
    assert result.returncode == 0, result.stderr[-3000:]
    said = (
        f"set aside checkpoint {earlier / 'checkpoints' / '0'} as incomplete-0 (model.safetensors "
        "could not be loaded as the draft's weights (Error while deserializing header: "
        "incomplete metadata, file not fully covered))"
    )
    assert said in result.stderr, result.stderr[-3000:]
    assert "--resume: no checkpoint in" in result.stderr  # both epochs trained anew
    checkpoints = sorted(p.name for p in (earlier / "checkpoints").iterdir())
    assert checkpoints == ["0", "1", "incomplete-0"]
    assert (earlier / "checkpoints" / "incomplete-0" / "model.safetensors").read_bytes() != whole
    steps = json.loads((earlier / LOG).read_text())["step_epochs"]
    assert steps == sorted(steps) and set(steps) == {0, 1}


def test_sigterm_stops_training_as_ctrl_c_does_and_the_run_resumes(inputs, tmp_path) -> None:
    """``kill`` (SIGTERM to specshim alone) mid-training: one line, exit status 143, no
    process of the run left, and ``--resume`` goes on from the last complete checkpoint."""
    import os
    import signal
    import subprocess

    from e2e.test_runner import group_members, specshim_command
    from specshim.runner.train.checkpoints import is_complete, trained_epochs

    out = tmp_path / "draft"
    cmd, env = specshim_command(*args(inputs, out, "--epochs", "200"))
    first = subprocess.Popen(cmd, env=env, start_new_session=True, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    harness.wait_while_running(first, lambda: is_complete(out / "checkpoints" / "0"),
                               "it could be stopped")  # fmt: skip
    os.kill(first.pid, signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr and stdout == "", stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == "specshim train: interrupted"
    assert group_members(first.pid) == [] and not (out / ".specshim.lock").exists()
    done = trained_epochs(out / "checkpoints")
    resumed = subprocess.run([*cmd[:-1], str(done + 1), "--resume"], env=env,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = out / "checkpoints" / str(done - 1)
    assert f"resuming from {last} ({done} of {done + 1} epochs done" in resumed.stderr


def test_an_extraction_into_the_data_a_run_trains_on_stops_at_once(inputs, tmp_path) -> None:
    """``specshim train`` holds its --data for reading from its check to its last step: an
    ``extract --out`` into that folder meanwhile is one line and exit 2, naming the run, and
    leaves every file as it was; a second reader (another train) is welcome."""
    import os
    import signal
    import subprocess

    from e2e.test_runner import specshim_command
    from specshim.runner import out_lock
    from specshim.runner.train.checkpoints import is_complete

    data = Path(shutil.copytree(inputs[0], tmp_path / "hs"))
    out = tmp_path / "draft"
    cmd, env = specshim_command(*args((data, inputs[1]), out, "--epochs", "200"))
    training = subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)  # fmt: skip
    try:
        harness.wait_while_running(  # steps in: the data read
            training, lambda: is_complete(out / "checkpoints" / "0"), "the extraction was tried"
        )
        before = snapshot(data)
        rows = tmp_path / "rows.jsonl"
        rows.write_text('{"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]}\n')
        cmd_x, env_x = specshim_command("extract", "--model", str(inputs[1]), "--data",
                                        str(rows), "--out", str(data), "--overwrite")  # fmt: skip
        refused = subprocess.run(cmd_x, env=env_x, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert refused.stderr.startswith(
            f"specshim extract: --out {data} is in use by specshim train (pid {training.pid}, "
        ), refused.stderr[-3000:]
        assert len(refused.stderr.splitlines()) == 1 and snapshot(data) == before
        with out_lock.held(data, "train", "--data", shared=True):  # a second reader
            assert training.poll() is None
    finally:
        os.kill(training.pid, signal.SIGTERM)
        training.communicate(timeout=120)
    assert not (data / out_lock.LOCK_FILE).exists()
