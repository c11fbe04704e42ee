"""``specshim convert`` on real files: data written by real torch in the exact layouts each
speculators generation writes, converted both ways, and read back by speculators' own readers
(0.9.0's ``ArrowDataset`` and 0.4.0.1's ``Eagle3SampleFileDataset``) in their own processes.

The 0.3/0.4 folder is what ``specshim extract`` writes (``data_{i}.pt``,
``sample_lengths.json``, ``token_freq.pt``, ``data_config.json``) with seeded random bf16
states, no vLLM needed: conversion moves tensors, so their values do not matter, only that
each arrives unchanged in its place. The >= 0.5 folder that did not come from specshim is
written as speculators 0.9.0 writes one: ``prepare-data``'s ``save_to_disk`` of
``input_ids``/``loss_mask``/``seq_len`` in torch format, and vLLM's
ExampleHiddenStatesConnector's ``hs_{i}.safetensors`` (``hidden_states`` ``[seq, layers,
hidden]``, ``token_ids``).

Memory stays flat in the number of samples by construction (``convert._convert_samples``
holds one sample's tensors at a time, the Arrow dataset is written by ``datasets`` as rows
come); no test times or measures it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import ROOT, _missing, speculators_path
from specshim import cli
from specshim.runner import convert, files
from specshim.runner.convert.samples import given_ids

SAMPLES, HIDDEN, VOCAB = 5, 8, 50
GENERATOR_IDS = [1, 3, 4, 5]  # a 6-layer verifier: three auxiliary layers and the last
LENGTHS = [7, 12, 3, 9, 16]


def speculators_reader(version: str) -> Path:
    """speculators ``version`` (>= 0.5, data reader only), as scripts/setup_env.sh installs it."""
    path = ROOT / ".wheels" / f"speculators-{version}"
    if not (path / "speculators").is_dir():
        _missing(f"speculators {version} ({path})")
    return path


def legacy_sample(i: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(i)
    seq = LENGTHS[i]
    return {
        "input_ids": torch.randint(VOCAB, (seq,), generator=generator),
        "hidden_states": [
            torch.randn(seq, HIDDEN, generator=generator).to(torch.bfloat16) for _ in GENERATOR_IDS
        ],
        "loss_mask": (torch.arange(seq) >= seq // 3).to(torch.long),
    }


def write_legacy(out: Path) -> Path:
    """A folder as ``specshim extract`` writes it (see the module docstring)."""
    counts: dict[int, int] = {}
    for i in range(SAMPLES):
        sample = legacy_sample(i)
        files.save_torch(out / f"data_{i}.pt", sample)
        for t in sample["input_ids"][sample["loss_mask"].bool()].tolist():
            counts[t] = counts.get(t, 0) + 1
    files.save_torch(out / "token_freq.pt", counts)
    files.save_json(out / "sample_lengths.json", {str(i): n for i, n in enumerate(LENGTHS)})
    files.save_json(
        out / "data_config.json",
        {
            "version": "2.0",
            "model": {"target_model_path": "tiny", "hidden_size": HIDDEN},
            "data": {"num_samples": SAMPLES, "seq_length": 64},
            "hidden_states": {"layer_ids": GENERATOR_IDS},
        },
    )
    return out


def write_native(out: Path, vllm_ids: list[int]) -> Path:
    """A >= 0.5 folder as speculators 0.9.0 and vLLM write it (see the module docstring)."""
    from datasets import Dataset
    from safetensors.torch import save_file

    rows: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for i in range(SAMPLES):
        sample = legacy_sample(i)
        rows["input_ids"].append(sample["input_ids"])
        rows["loss_mask"].append(sample["loss_mask"])
        rows["seq_len"].append(LENGTHS[i])
        states = torch.stack(sample["hidden_states"][: len(vllm_ids)], dim=1)
        tensors = {"hidden_states": states, "token_ids": sample["input_ids"]}
        (out / "hidden_states").mkdir(parents=True, exist_ok=True)
        save_file(tensors, out / "hidden_states" / f"hs_{i}.safetensors")
    dataset = Dataset.from_dict(rows)
    dataset.set_format("torch")
    dataset.save_to_disk(str(out))
    return out


def in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["convert", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_with(path: Path, script: str, *args: str) -> None:
    """``script`` in a fresh interpreter that imports speculators from ``path`` (its pins
    exclude this environment, as the e2e harness selects 0.3/0.4)."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: same dtype, shape and bytes."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.view(torch.uint8).equal(b.contiguous().view(torch.uint8))
    )


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_legacy(tmp_path_factory.mktemp("legacy"))


@pytest.fixture(scope="module")
def arrow(legacy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("arrow") / "out"
    convert.convert(legacy, out, progress=False)
    return out


def test_round_trip_gives_back_the_same_files_bit_for_bit(
    legacy: Path, arrow: Path, tmp_path: Path
) -> None:
    back = tmp_path / "back"
    summary = convert.convert(arrow, back, progress=False)
    assert (summary.samples, summary.written) == (SAMPLES, SAMPLES)
    for i in range(SAMPLES):
        want, got = load(legacy / f"data_{i}.pt"), load(back / f"data_{i}.pt")
        assert same(got["input_ids"], want["input_ids"])
        assert same(got["loss_mask"], want["loss_mask"])
        assert len(got["hidden_states"]) == len(GENERATOR_IDS)
        for g, w in zip(got["hidden_states"], want["hidden_states"], strict=True):
            assert same(g, w)
    for name in ("sample_lengths.json", "data_config.json"):
        assert json.loads((back / name).read_text()) == json.loads((legacy / name).read_text())
    assert load(back / "token_freq.pt") == load(legacy / "token_freq.pt")


def test_the_layer_ids_are_carried_over_in_each_side_s_numbering(
    capsys: pytest.CaptureFixture[str], legacy: Path, tmp_path: Path
) -> None:
    """vLLM id = generator id + 1, in the manifest and in the training command printed."""
    code, out, _ = in_process(capsys, "--data", str(legacy), "--out", str(tmp_path / "a"))
    assert code == 0
    manifest = json.loads((tmp_path / "a" / convert.MANIFEST).read_text())
    assert manifest["generator_layer_ids"] == [1, 3, 4, 5]
    assert manifest["vllm_layer_ids"] == [2, 4, 5, 6]
    assert "--target-layer-ids 2 4 5 " in out
    assert "speculators 0.3/0.4 [1, 3, 4, 5] = vLLM [2, 4, 5, 6]" in out


def test_layer_ids_listed_out_of_order_are_taken_ascending_as_the_files_hold_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """speculators 0.3/0.4's generator records its ids in the order it was given them and
    stores the layers ascending: the conversion labels the states with the ids ascending, in
    the manifest, the training command and the data_config.json it keeps; --layers in another
    order names the same ids; an id given twice is one line."""
    source = write_legacy(tmp_path / "src")
    config = json.loads((source / "data_config.json").read_text())
    config["hidden_states"]["layer_ids"] = [5, 1, 4, 3]
    files.save_json(source / "data_config.json", config)
    code, out, _ = in_process(capsys, "--data", str(source), "--out", str(tmp_path / "a"),
                              "--layers", "4,3,5,1")  # fmt: skip
    assert code == 0
    manifest = json.loads((tmp_path / "a" / convert.MANIFEST).read_text())
    assert manifest["generator_layer_ids"] == [1, 3, 4, 5]
    assert manifest["vllm_layer_ids"] == [2, 4, 5, 6]
    assert manifest["data_config"]["hidden_states"]["layer_ids"] == [1, 3, 4, 5]
    assert "--target-layer-ids 2 4 5 " in out
    code, _, err = in_process(capsys, "--data", str(source), "--out", str(tmp_path / "b"),
                              "--layers", "1,3,3,5")  # fmt: skip
    assert (code, err) == (1, "specshim convert: --layers: 3 is given twice (expected "
                              "distinct ids)\n")  # fmt: skip
    assert not (tmp_path / "b").exists()


def test_the_printed_training_command_is_quoted_for_the_shell(
    capsys: pytest.CaptureFixture[str], legacy: Path, tmp_path: Path
) -> None:
    """An --out with a space and a quote comes back as one word when the printed command is
    pasted into a shell."""
    out = tmp_path / "it's converted"
    code, printed, _ = in_process(capsys, "--data", str(legacy), "--out", str(out))
    assert code == 0
    [line] = [x for x in printed.splitlines() if "speculators train" in x]
    command = line.split(": ", 1)[1].removesuffix(" ...")
    assert shlex.split(command) == [
        "speculators", "train", "--data-path", str(out),
        "--target-layer-ids", "2", "4", "5", "--on-missing", "raise",
    ]  # fmt: skip
    back = tmp_path / "back again"
    code, printed, _ = in_process(capsys, "--data", str(out), "--out", str(back))
    assert code == 0
    [line] = [x for x in printed.splitlines() if "specshim train" in x]
    command = line.split(": ", 1)[1].removesuffix(" ...")
    assert shlex.split(command) == ["specshim", "train", "--data", str(back)]


def test_speculators_0_9_reads_the_converted_data(arrow: Path, tmp_path: Path) -> None:
    """speculators 0.9.0's own ArrowDataset gives each sample's ids, mask and states."""
    result = tmp_path / "read.pt"
    run_with(
        speculators_reader("0.9.0"),
        """
        import sys, torch
        from speculators.version import version
        from speculators.train.data import ArrowDataset
        assert version.startswith("0.9.0"), version
        data = ArrowDataset(max_len=64, datapath=sys.argv[1], on_missing="raise")
        items = [data[i] for i in range(len(data))]
        torch.save({"items": items, "lengths": data.approx_lengths}, sys.argv[2])
        """,
        str(arrow),
        str(result),
    )
    read = torch.load(result, weights_only=False)
    assert read["lengths"] == LENGTHS
    assert len(read["items"]) == SAMPLES
    for i, item in enumerate(read["items"]):
        want = legacy_sample(i)
        assert item["input_ids"].tolist() == want["input_ids"].tolist()
        assert item["loss_mask"].tolist() == want["loss_mask"].tolist()
        aux = torch.cat(want["hidden_states"][:-1], dim=-1)  # 0.3/0.4's standardize_data_v1
        assert same(item["hidden_states"], aux)
        assert same(item["verifier_last_hidden_states"], want["hidden_states"][-1])


def test_native_data_converts_with_layers_in_vllm_numbering_and_0_4_reads_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Data speculators 0.9.0 wrote records no layer ids: --layers gives vLLM's, and
    data_config.json gets the generator's (each minus one), which 0.4.0.1's own reader and
    specshim's export then use."""
    native = write_native(tmp_path / "native", [2, 4, 5, 6])
    capsys.readouterr()  # datasets' own progress while writing it
    out = tmp_path / "legacy"
    code, _, err = in_process(capsys, "--data", str(native), "--out", str(out))
    assert code == 1
    assert err.count("\n") == 1 and "pass --layers" in err
    code, _, _ = in_process(capsys, "--data", str(native), "--out", str(out), "--layers", "2,4,5,6")
    assert code == 0
    config = json.loads((out / "data_config.json").read_text())
    assert config["hidden_states"]["layer_ids"] == [1, 3, 4, 5]
    assert config["data"]["num_samples"] == SAMPLES
    result = tmp_path / "read.pt"
    run_with(
        speculators_path("0.4.0.1"),
        """
        import sys, glob, torch, specshim
        specshim.apply()  # as specshim train does before importing speculators 0.4 on this vLLM
        from speculators.train.data import Eagle3SampleFileDataset, standardize_data_v1
        names = sorted(glob.glob(sys.argv[1] + "/data_*.pt"))
        data = Eagle3SampleFileDataset(max_len=64, file_list=names)
        raw = [standardize_data_v1(torch.load(n, weights_only=True)) for n in names]
        torch.save({"raw": raw, "lengths": data.approx_lengths, "names": names}, sys.argv[2])
        """,
        str(out),
        str(result),
    )
    read = torch.load(result, weights_only=False)
    assert read["lengths"] == [LENGTHS[int(Path(n).stem[5:])] for n in read["names"]]
    for name, item in zip(read["names"], read["raw"], strict=True):
        want = legacy_sample(int(Path(name).stem[5:]))
        assert same(item["input_ids"], want["input_ids"])
        assert same(item["loss_mask"], want["loss_mask"])
        assert same(item["hidden_states"], torch.cat(want["hidden_states"][:-1], dim=-1))
        assert same(item["verifier_last_hidden_states"], want["hidden_states"][-1])


def test_a_rerun_after_an_interruption_converts_only_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, arrow: Path
) -> None:
    """The first run stops at a damaged sample (as a kill would, after whole files only);
    once the file is good again the rerun keeps what was converted and does the rest."""
    source = write_legacy(tmp_path / "src")
    good = (source / "data_3.pt").read_bytes()
    (source / "data_3.pt").write_bytes(good[: len(good) // 2])
    out = tmp_path / "out"
    code, _, err = in_process(capsys, "--data", str(source), "--out", str(out))
    assert code == 1
    assert err.count("\n") == 1 and "data_3.pt: could not be loaded" in err
    states = out / "hidden_states"
    assert sorted(p.name for p in states.iterdir()) == [f"hs_{i}.safetensors" for i in range(3)]
    assert not (out / "state.json").exists()  # the Arrow dataset waits for every sample
    written = {i: (states / f"hs_{i}.safetensors").stat().st_mtime_ns for i in range(3)}

    (source / "data_3.pt").write_bytes(good)
    summary = convert.convert(source, out, progress=False)
    assert (summary.written, summary.kept) == (2, 3)
    assert {i: (states / f"hs_{i}.safetensors").stat().st_mtime_ns for i in range(3)} == written
    for i in range(SAMPLES):
        name = f"hidden_states/hs_{i}.safetensors"
        assert (out / name).read_bytes() == (arrow / name).read_bytes()
    assert not list(out.rglob(".*.tmp"))


def test_a_source_sample_changed_since_is_converted_again(tmp_path: Path) -> None:
    source = write_legacy(tmp_path / "src")
    out = tmp_path / "out"
    convert.convert(source, out, progress=False)
    changed = legacy_sample(1)
    changed["hidden_states"][0] = changed["hidden_states"][0] + 1
    files.save_torch(source / "data_1.pt", changed)
    summary = convert.convert(source, out, progress=False)
    assert (summary.written, summary.kept) == (1, SAMPLES - 1)
    from safetensors.torch import load_file

    got = load_file(out / "hidden_states" / "hs_1.safetensors")["hidden_states"]
    assert same(got[:, 0], changed["hidden_states"][0])


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda d: (d / "notes.txt").write_text("x"), "is neither speculators 0.3/0.4 data"),
        (lambda d: (write_legacy(d), (d / "data_2.pt").unlink()), "data_2.pt is missing"),
        (
            lambda d: (write_legacy(d), (d / "data_1.pt").write_text("not torch")),
            "data_1.pt: could not be loaded as speculators 0.3/0.4 data",
        ),
        (
            lambda d: (write_legacy(d), files.save_torch(d / "data_4.pt", {"input_ids": 1})),
            "data_4.pt: could not be loaded",
        ),
    ],
    ids=["not-either-format", "gap", "not-torch", "wrong-keys"],
)
def test_bad_input_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setup: Any, expected: str
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    setup(source)
    code, out, err = in_process(capsys, "--data", str(source), "--out", str(tmp_path / "out"))
    assert (code, out) == (1, "")
    assert err.startswith("specshim convert: ") and err.count("\n") == 1
    assert expected in err


def test_an_out_holding_other_files_is_refused_and_left_alone(
    capsys: pytest.CaptureFixture[str], legacy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    code, _, err = in_process(capsys, "--data", str(legacy), "--out", str(out))
    assert code == 1 and "holds no specshim_convert.json" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_fp8_quantized_states_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """hs_connectors' FP8 backend stores scales beside float8 states; moving the float8
    tensors into data_{i}.pt would drop the scales, so the file is refused."""
    from safetensors.torch import load_file, save_file

    native = write_native(tmp_path / "native", [2, 4, 5, 6])
    path = native / "hidden_states" / "hs_2.safetensors"
    tensors = load_file(path)
    tensors["hidden_states_scales"] = torch.ones(LENGTHS[2], dtype=torch.float32)
    save_file(tensors, path)
    capsys.readouterr()
    argv = ["--data", str(native), "--out", str(tmp_path / "out"), "--layers", "2,4,5,6"]
    code, _, err = in_process(capsys, *argv)
    assert code == 1 and err.count("\n") == 1
    assert "hs_2.safetensors: FP8-quantized states" in err


def test_an_out_without_room_is_refused_before_the_first_sample(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, small_disk
) -> None:
    """On a real small filesystem: one line with what the samples need (their files' size in
    --data) and what is free; once there is room, the same command converts them all."""
    source = write_legacy(tmp_path / "src")
    need = sum(p.stat().st_size for p in source.glob("data_*.pt"))
    assert need >> 10 >= 8, "a tmpfs of size 0 has no limit: the half below must not be 0"
    out = small_disk(need // 2 >> 10) / "out"
    code, _, err = in_process(capsys, "--data", str(source), "--out", str(out))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(
        f"specshim convert: --out {out}: the {SAMPLES} samples to convert need about "
        f"{files.size(need)} (their files' size in --data), and "
    )
    assert err.endswith(" are free there: free some space or choose another --out\n")
    assert not list((out / "hidden_states").iterdir())

    small_disk((need * 4 >> 10) + 1024)
    code, _, err = in_process(capsys, "--data", str(source), "--out", str(out))
    assert code == 0, err
    assert len(list((out / "hidden_states").glob("hs_*.safetensors"))) == SAMPLES


def test_layer_ids_in_a_refusal_are_written_as_they_are_typed(tmp_path: Path) -> None:
    """``--layers 0,2,3``, not a Python list."""
    where = tmp_path / "data_config.json"
    with pytest.raises(convert.ConversionError) as differs:
        given_ids([3, 0, 2, 5], [3, 2, 0], where, "")
    assert str(differs.value) == f"--layers 0,2,3 differs from the ids {where} records: 0,2,3,5"
    with pytest.raises(convert.ConversionError, match=r"^layer ids 3: expected two or more"):
        given_ids(None, [3], where, "")
