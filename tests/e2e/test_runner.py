"""`specshim extract` end to end on the real vLLM and speculators 0.4.0.1 (`run`: test_eval).

Resume, Ctrl-C and --verify on a 4-layer verifier (fast to start): the default layer ids
there are where speculators' own rule repeats an id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import SPECULATORS, speculators_path, vllm_python
from e2e import harness
from specshim.runner import files
from specshim.runner.extraction import resume
from specshim.testbed import data

pytestmark = pytest.mark.vllm


def specshim_command(
    *args: str, vllm: str = "0.32.0", speculators: str = "0.4.0.1"
) -> tuple[list[str], dict[str, str]]:
    python = vllm_python(vllm)
    env = {**os.environ, "PYTHONPATH": str(speculators_path(speculators))}
    env.pop("SPECSHIM_APPLY", None)
    return [str(python), "-m", "specshim.cli", *args], env


def extract_args(model: Path, dataset: Path, out: Path) -> list[str]:
    return ["extract", "--model", str(model), "--data", str(dataset), "--out", str(out),
            "--max-model-len", "256", "--batch-size", "4"]  # fmt: skip


def wait_for_samples(process: subprocess.Popen, out: Path, ending: str, count: int = 8) -> None:
    """Wait (up to 5 minutes) until ``process`` has written ``count`` samples into ``out``."""
    harness.wait_while_running(process, lambda: len(list(out.glob("data_*.pt"))) >= count,
                               f"it could be {ending}", seconds=300)  # fmt: skip


#: Enough that the kill lands mid-run: 48 were all written before it on a fast CI machine.
KILLED_RUN_SAMPLES = 160


@pytest.mark.smoke
def test_extract_resumes_after_a_kill_without_loss_or_duplicates(tiny_models, tmp_path) -> None:
    model, out = tiny_models["llama"], tmp_path / "out"
    dataset = data.write(tmp_path / "data.jsonl", count=KILLED_RUN_SAMPLES)
    cmd, env = specshim_command(*extract_args(model, dataset, out))
    first = subprocess.Popen(cmd, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    # A second run while the first holds the folder, before its vLLM starts: on a quiet
    # machine the first could write every sample during the second's start.
    holder = out / ".specshim.lock"
    harness.wait_while_running(first, lambda: holder.exists() and "pid" in holder.read_text(),
                               "it held the folder", seconds=120)  # fmt: skip
    other = data.write(tmp_path / "other.jsonl", count=4)  # other data, the same folder
    busy_cmd, _ = specshim_command(*extract_args(model, other, out))
    busy = subprocess.run(busy_cmd, env=env, capture_output=True, text=True, timeout=120)
    assert busy.returncode == 2 and busy.stdout == "", busy.stderr[-3000:]
    assert re.fullmatch(
        rf"specshim extract: --out {re.escape(str(out))} is in use by specshim extract \(pid "
        rf"{first.pid}, since [-\d]+ [:\d]+ \w+\): wait for it to end, or pick another folder\n",
        busy.stderr,
    ), busy.stderr[-3000:]
    wait_for_samples(first, out, "killed")
    left = harness.shared_memory_of_group(first.pid)
    os.killpg(first.pid, signal.SIGKILL)  # the whole group: vLLM's workers too
    first.wait()
    for path in left:
        path.unlink(missing_ok=True)
    assert (out / ".specshim.lock").exists()  # the file stays, but not its lock: resumed below
    written_before_kill = len(list(out.glob("data_*.pt")))
    assert written_before_kill < KILLED_RUN_SAMPLES, "the kill came too late to test resumption"
    # A file renamed into place but not yet recorded when the kill came is extracted again.
    entries = files.Ledger(out / resume.LEDGER).entries().values()
    recorded = sum(e.still_there(out) for e in entries)

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{KILLED_RUN_SAMPLES - recorded} extracted, {recorded} already done" in second.stdout

    from transformers import AutoTokenizer

    from specshim.runner import dataset as rows

    expected = list(rows.read(dataset, AutoTokenizer.from_pretrained(model)))
    written = sorted(out.glob("data_*.pt"))
    assert len(written) == len(expected) == KILLED_RUN_SAMPLES
    assert not list(out.glob(".*.tmp")) and not (out / ".specshim.lock").exists()
    for sample in expected:
        saved = torch.load(out / f"data_{sample.index}.pt", weights_only=True)
        assert saved["input_ids"].tolist() == sample.input_ids
        assert saved["loss_mask"].tolist() == sample.loss_mask
        assert [h.shape for h in saved["hidden_states"]] == [(len(sample.input_ids), 128)] * 4
    lengths = json.loads((out / "sample_lengths.json").read_text())
    assert lengths == {str(s.index): len(s.input_ids) for s in expected}
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    assert sum(freq.values()) == sum(sum(s.loss_mask) for s in expected)
    config = json.loads((out / "data_config.json").read_text())
    assert config["hidden_states"]["layer_ids"] == [2, 4, 5, 7]


def test_over_long_sample_is_an_error_unless_truncation_is_asked(tiny_models, tmp_path) -> None:
    dataset = tmp_path / "long.jsonl"
    dataset.write_text(json.dumps({"input_ids": [5] * 300}) + "\n")
    cmd, env = specshim_command(*extract_args(tiny_models["llama"], dataset, tmp_path / "o"))
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert f"{dataset}, line 1: 300 tokens, more than max_model_len - 1 = 255" in result.stderr
    assert not list((tmp_path / "o").glob("data_*.pt"))


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    from specshim.testbed import tiny_model

    return tiny_model.build(tmp_path_factory.mktemp("m") / "four", num_layers=4)


def rows(model: Path, count: int) -> list[dict[str, list[int]]]:
    """``count`` distinct token-id rows of different lengths."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = (
        f"What comes after {n}? " * (1 + n % 3) + f"After {n} comes {n + 1}." for n in range(count)
    )
    return [{"input_ids": tokenizer(t)["input_ids"]} for t in texts]


def write_rows(path: Path, rows_: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    return path


def extract_cmd(
    model: Path, dataset: Path, out: Path, *extra: str, speculators: str = "0.4.0.1"
) -> subprocess.CompletedProcess:
    cmd, env = specshim_command(*extract_args(model, dataset, out), *extra, speculators=speculators)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def assert_files_match(out: Path, rows_: list[dict[str, list[int]]]) -> None:
    """One data_i.pt per row, in order, holding that row; the final files agree with them."""
    assert sorted(out.glob("data_*.pt")) == sorted(out / f"data_{i}.pt" for i in range(len(rows_)))
    for i, row in enumerate(rows_):
        saved = torch.load(out / f"data_{i}.pt", weights_only=True)
        assert saved["input_ids"].tolist() == row["input_ids"], f"data_{i}.pt holds another row"
        assert len(saved["hidden_states"]) == 4
    lengths = json.loads((out / "sample_lengths.json").read_text())
    assert lengths == {str(i): len(r["input_ids"]) for i, r in enumerate(rows_)}
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    assert sum(freq.values()) == sum(len(r["input_ids"]) for r in rows_)
    config = json.loads((out / "data_config.json").read_text())
    assert config["data"]["num_samples"] == len(rows_)


def assert_equal_files(one: Path, other: Path) -> int:
    """The same data_i.pt files in both folders, tensor for tensor, bit for bit; how many."""
    names = sorted(p.name for p in one.glob("data_*.pt"))
    assert names == sorted(p.name for p in other.glob("data_*.pt")) and names
    for name in names:
        a, b = (torch.load(folder / name, weights_only=True) for folder in (one, other))
        assert torch.equal(a["input_ids"], b["input_ids"]), name
        assert torch.equal(a["loss_mask"], b["loss_mask"]), name
        assert len(a["hidden_states"]) == len(b["hidden_states"]), name
        for x, y in zip(a["hidden_states"], b["hidden_states"], strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y), f"{name} differs"
    return len(names)


SUMMARY = ("samples:", "truncated", "skipped", "throughput", "backend", "engine steps",
           "extracted again", "removed", "verified", "  ")  # fmt: skip


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_files_written_in_the_worker_equal_the_generators(
    four_layers, tmp_path, speculators
) -> None:
    """--handoff worker: vLLM's worker writes the files; they hold the tensors the generator
    returns through speculators' RPC, bit for bit, for 0.3.0's concatenated reply and 0.4's
    reply keyed by request, and resume keeps them. 40 prompts in a batch: request_batching
    splits it into two calls of the generator (32 + 8), each fetched on its own."""
    masked = [{**r, "loss_mask": [int((i + j) % 3 != 0) for j in range(len(r["input_ids"]))]}
              for i, r in enumerate(rows(four_layers, 40))]  # fmt: skip
    dataset = write_rows(tmp_path / "data.jsonl", masked)
    outs = {how: tmp_path / how for how in ("rpc", "worker")}
    for how, out in outs.items():
        done = extract_cmd(four_layers, dataset, out, "--handoff", how, "--batch-size", "40",
                           speculators=speculators)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"states handed over by {how})" in done.stdout
        # speculators' own step limits: its MAX_NUM_SEQS, and max(8192, --max-model-len)
        assert "engine steps: at most 32 prompts, 8,192 tokens" in done.stdout
    assert assert_equal_files(outs["rpc"], outs["worker"]) == len(masked)
    for i, row in enumerate(masked):
        by_worker = torch.load(outs["worker"] / f"data_{i}.pt", weights_only=True)
        assert by_worker["input_ids"].tolist() == row["input_ids"]
        assert by_worker["loss_mask"].tolist() == row["loss_mask"]
        assert len(by_worker["hidden_states"]) == 4
    # --verify's single requests are not announced: the worker answers them with the states
    again = extract_cmd(four_layers, dataset, outs["worker"], "--handoff", "worker",
                        "--verify", "3", speculators=speculators)  # fmt: skip
    assert "samples: 40 (0 extracted, 40 already done)" in again.stdout, again.stdout
    assert "verified: 3 samples re-extracted one at a time match" in again.stdout


@pytest.mark.parametrize(
    ("speculators", "backend"),
    [*((s, "generator") for s in SPECULATORS), ("0.4.0.1", "native")],
)
def test_engine_steps_are_the_ones_asked_for(four_layers, tmp_path, speculators, backend) -> None:
    """--max-num-seqs and --max-num-batched-tokens reach vLLM's scheduler through either
    backend (speculators' generator reads them from two module constants), and
    --gpu-memory-utilization vLLM's cache config (the generator's keyword argument); the
    summary says what vLLM used, and every row is extracted in order: 10 rows in batches of
    4, at most 3 prompts and 300 tokens a step."""
    rows_ = rows(four_layers, 10)
    dataset = write_rows(tmp_path / "data.jsonl", rows_)
    out = tmp_path / "out"
    done = extract_cmd(four_layers, dataset, out, "--backend", backend, "--max-num-seqs", "3",
                       "--max-num-batched-tokens", "300", "--gpu-memory-utilization", "0.5",
                       speculators=speculators)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = "engine steps: at most 3 prompts, 300 tokens (gpu_memory_utilization 0.5)"
    assert steps in done.stdout, done.stdout
    assert_files_match(out, rows_)


def test_resume_follows_the_rows_not_the_positions(four_layers, tmp_path) -> None:
    """The issue's run: --skip-bad over 10 bad rows of 21, the rows fixed in place, rerun."""
    good, out = rows(four_layers, 21), tmp_path / "out"
    bad = [{"input_ids": "oops"} if i % 2 == 0 and i < 20 else r for i, r in enumerate(good)]
    dataset = write_rows(tmp_path / "data.jsonl", bad)
    first = extract_cmd(four_layers, dataset, out, "--skip-bad")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "samples: 11 (11 extracted, 0 already done)" in first.stdout
    assert all(line.startswith(SUMMARY) for line in first.stdout.splitlines()), first.stdout
    # --backend auto (the default): this vLLM, speculators and CPU have matrix rows
    assert "backend: generator (auto: the matrix shows it extracting here: reached" in first.stdout
    config = json.loads((out / "data_config.json").read_text())
    assert config["hidden_states"]["layer_ids"] == [0, 1, 2, 3]  # distinct: not [2, 2, 1, 3]
    states = torch.load(out / "data_0.pt", weights_only=True)["hidden_states"]
    assert not any(torch.equal(a, b) for i, a in enumerate(states) for b in states[i + 1 :])

    write_rows(dataset, good)  # fixed in place: every sample now sits at another index
    second = extract_cmd(four_layers, dataset, out, "--skip-bad", "--verify", "3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "samples: 21 (21 extracted, 0 already done)" in second.stdout
    assert "extracted again, their row changed or their file was damaged" in second.stdout
    assert "verified: 3 samples re-extracted one at a time match" in second.stdout
    assert_files_match(out, good)

    whole = (out / "data_5.pt").read_bytes()
    (out / "data_5.pt").write_bytes(whole[: len(whole) // 2])  # truncated
    (out / "data_6.pt").write_bytes(b"")  # emptied
    for name in ("data_config.json", "sample_lengths.json", "token_freq.pt"):
        (out / name).unlink()
    write_rows(dataset, good[:18])  # three rows removed: data_18..20 must not stay
    # damaged files no longer hold what specshim wrote: replaced only when the user says so
    refused = extract_cmd(four_layers, dataset, out, "--skip-bad")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == refusal_of(out, "data_5.pt, data_6.pt")
    third = extract_cmd(four_layers, dataset, out, "--skip-bad", "--overwrite")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "samples: 18 (2 extracted, 16 already done)" in third.stdout
    assert "removed data_i.pt beyond the current samples: 3" in third.stdout
    assert_files_match(out, good[:18])

    fourth = extract_cmd(four_layers, dataset, out, "--skip-bad")  # nothing to do: no vLLM
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "samples: 18 (0 extracted, 18 already done)" in fourth.stdout
    assert "throughput: none, nothing was left to extract" in fourth.stdout.splitlines()
    assert "Loading safetensors" not in fourth.stderr


def test_verify_fails_loudly_when_batched_states_differ(four_layers, tmp_path) -> None:
    """Batched states that disagree with a single request (simulated: every file's states
    scaled by 1.5 and recorded as if written so) fail --verify, naming the line."""
    good, out = rows(four_layers, 6), tmp_path / "out"
    dataset = write_rows(tmp_path / "data.jsonl", good)
    assert extract_cmd(four_layers, dataset, out).returncode == 0
    ledger = files.Ledger(out / resume.LEDGER)
    entries = ledger.entries()
    for i in range(len(good)):
        path = out / f"data_{i}.pt"
        saved = torch.load(path, weights_only=True)
        saved["hidden_states"] = [h * 1.5 for h in saved["hidden_states"]]
        files.save_torch(path, saved)
        ledger.record(path, entries[path.name].fingerprint)
    result = extract_cmd(four_layers, dataset, out, "--verify", "2")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("specshim extract: --verify: line "), last
    found = re.search(r"differ from a single-request extraction by ([\d.]+)% \(tolerance 5%", last)
    assert found and 49 < float(found.group(1)) < 51, last  # 1.5x, rounded to bf16


def group_members(group: int) -> list[int]:
    """The processes of process group ``group`` still running (zombies left out), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _parent, process_group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except OSError:  # ended meanwhile
            continue
        if int(process_group) == group and state != "Z":
            members.append(int(stat.parent.name))
    return members


#: How each stop reaches specshim, and the exit status it must give: Ctrl-C in a terminal
#: signals the whole process group, vLLM's workers too; ``kill`` signals specshim alone.
STOPS = {"ctrl-c": (signal.SIGINT, os.killpg, 130), "kill": (signal.SIGTERM, os.kill, 143)}


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("backend", ["generator", "engine"])
def test_ctrl_c_and_sigterm_are_one_line_and_resume(
    four_layers, tmp_path, backend: str, stop: str
) -> None:
    """The engine backend's files are written by vLLM's worker, which gets the Ctrl-C too:
    those it reported (every ``RECORD_EVERY`` prompts) are kept, the rest written again.
    SIGTERM (``kill``) gets what Ctrl-C gets, with 143, and no process of the run outlives it."""
    number, send, status = STOPS[stop]
    out = tmp_path / "out"
    dataset = write_rows(tmp_path / "data.jsonl", rows(four_layers, 200))
    cmd, env = specshim_command(*extract_args(four_layers, dataset, out), "--batch-size", "2",
                                "--backend", backend)  # fmt: skip
    first = subprocess.Popen(cmd, env=env, start_new_session=True, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    wait_for_samples(first, out, "interrupted")
    assert len(group_members(first.pid)) > 1  # vLLM's or the writers' processes run beside it
    send(first.pid, number)
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == status, stderr[-3000:]
    # multiprocessing's resource tracker ends once specshim has: a moment to see it go
    deadline = time.monotonic() + 5
    while group_members(first.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(first.pid) == []
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("specshim extract: interrupted after "), last
    assert last.endswith("; run the same command to resume"), last
    done = int(last.split("(")[1].split(" of ")[0])
    on_disk = len(list(out.glob("data_*.pt")))
    assert stdout == "" and done <= on_disk < 200
    if backend == "generator":  # this process writes: each file recorded as it is in place
        assert done >= 8

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{200 - done} extracted, {done} already done" in second.stdout


def refusal_of(out: Path, names: str) -> str:
    """The line that refuses to replace or remove ``names`` in ``out``."""
    return (
        f"specshim extract: --out {out} holds files specshim did not write there that this run "
        f"would replace or remove: {names}; nothing was changed: pass --overwrite to let it, "
        "or pick another --out"
    )


def test_files_specshim_did_not_write_are_kept_unless_overwrite(four_layers, tmp_path) -> None:
    """A new --out holding the user's files that a run would replace or remove: refused before
    vLLM starts, naming them, every byte kept; --overwrite lets the run replace them. A sample
    file a run put in place but had not recorded when it was killed is the folder's own."""
    good, out = rows(four_layers, 3), tmp_path / "out"
    dataset = write_rows(tmp_path / "data.jsonl", good)
    out.mkdir()
    theirs = {"data_1.pt": b"mine", "data_77.pt": b"mine", "token_freq.pt": b"counts",
              ".draft.tmp": b"half", "notes.txt": b"a run never touches it"}  # fmt: skip
    for name, content in theirs.items():
        (out / name).write_bytes(content)
    refused = extract_cmd(four_layers, dataset, out)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    names = "data_1.pt, data_77.pt, token_freq.pt and 1 more"
    assert refused.stderr.strip().splitlines()[-1] == refusal_of(out, names)
    assert "Loading safetensors" not in refused.stderr  # vLLM never started
    assert {p.name: p.read_bytes() for p in out.iterdir()} == theirs

    overwritten = extract_cmd(four_layers, dataset, out, "--overwrite")
    assert overwritten.returncode == 0, overwritten.stderr[-3000:]
    assert "removed data_i.pt beyond the current samples: 1" in overwritten.stdout
    assert_files_match(out, good)
    assert not (out / "data_77.pt").exists() and not (out / ".draft.tmp").exists()
    assert (out / "notes.txt").read_bytes() == theirs["notes.txt"]

    ledger = files.Ledger(out / resume.LEDGER)  # a kill between data_1.pt and its entry
    ledger.keep(e for e in ledger.entries().values() if e.file != "data_1.pt")
    (out / "data_9.pt").write_bytes(b"mine")  # and the user's file since
    refused = extract_cmd(four_layers, dataset, out)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == refusal_of(out, "data_9.pt")
    (out / "data_9.pt").unlink()
    resumed = extract_cmd(four_layers, dataset, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "samples: 3 (1 extracted, 2 already done)" in resumed.stdout
    assert_files_match(out, good)

    # A ledger line and a claim naming the user's own sample file do not make it specshim's:
    # only a file holding what was recorded for it is (a stale or planted line names others).
    mine = {"input_ids": torch.tensor([1, 2]), "loss_mask": torch.tensor([1, 1])}
    torch.save(mine, out / "data_77.pt")
    entry = files.Ledger(out / resume.LEDGER).entries()["data_2.pt"]
    with (out / resume.LEDGER).open("a") as f:
        f.write(json.dumps({**dataclasses.asdict(entry), "file": "data_77.pt"}) + "\n")
    manifest = json.loads((out / resume.MANIFEST).read_text())
    files.save_json(out / resume.MANIFEST, {**manifest, resume.CLAIMED: 100})
    before = (out / "data_77.pt").read_bytes()
    refused = extract_cmd(four_layers, dataset, out)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == refusal_of(out, "data_77.pt")
    assert (out / "data_77.pt").read_bytes() == before


def test_a_failed_start_leaves_nothing_that_blocks_the_corrected_command(
    four_layers, tmp_path
) -> None:
    """vLLM itself refuses to start (a model folder without weights): one line, and no
    specshim_extract.json recording the wrong model for the corrected command to trip on."""
    broken, out = tmp_path / "no-weights", tmp_path / "out"
    broken.mkdir()
    for config in four_layers.glob("*.json"):
        (broken / config.name).write_bytes(config.read_bytes())
    dataset = write_rows(tmp_path / "data.jsonl", rows(four_layers, 3))
    failed = extract_cmd(broken, dataset, out)
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"specshim extract: vLLM could not start {broken}: "), last
    assert not out.exists()  # made for the run, and removed again: it wrote nothing
    corrected = extract_cmd(four_layers, dataset, out)
    assert corrected.returncode == 0, corrected.stderr[-3000:]
    assert "samples: 3 (3 extracted, 0 already done)" in corrected.stdout


@pytest.mark.parametrize("backend", ["generator", "native"])
def test_a_full_disk_is_one_line_before_or_during_the_run_and_resumes(
    tiny_models, tmp_path, small_disk, backend
) -> None:
    """A real small filesystem (tmpfs). The 48 samples' states need at least 1,384 KiB and
    take about 1,600 KiB as files: 800 KiB is refused before vLLM starts, 1,480 KiB passes that
    floor and fills up part-way (with the native backend, where vLLM's connector writes its
    files: under ``--out``), and once there is room the same command resumes."""
    model, dataset = tiny_models["llama"], data.write(tmp_path / "data.jsonl", count=48)
    out = small_disk(800) / "out"
    cmd, env = specshim_command(*extract_args(model, dataset, out), "--backend", backend)

    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"specshim extract: {out}: the 48 samples to extract need at least")
    assert "Loading safetensors" not in refused.stderr  # vLLM never loaded the model
    assert not out.exists()

    small_disk(1480)
    filled = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert filled.returncode == 1 and "Traceback" not in filled.stderr, filled.stderr[-3000:]
    last = filled.stderr.strip().splitlines()[-1]
    # whichever write meets the full disk first: the caller's, or vLLM's connector's
    assert re.match(
        rf"specshim extract: (writing extracted samples failed: )?no space left in "
        rf"{re.escape(str(out))}(/\.specshim-native)? \(",
        last,
    ), last
    assert last.endswith(
        "free some space there and run the same command again (the files already written are "
        "kept), or start over elsewhere"
    ), last
    assert not list(out.glob(".*.tmp"))
    written = list(out.glob("data_*.pt"))
    assert 0 < len(written) < 48
    for path in written:  # whole files only
        assert len(torch.load(path, weights_only=True)["hidden_states"]) == 4

    small_disk(4096)
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    kept = int(resumed.stdout.split(" extracted, ")[1].split(" already done")[0])
    assert f"samples: 48 ({48 - kept} extracted, {kept} already done)" in resumed.stdout
    assert kept > 0 and len(list(out.glob("data_*.pt"))) == 48
