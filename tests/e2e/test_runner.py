"""`specshim extract` end to end on the real vLLM and speculators 0.4.0.1 (`run`: test_eval)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import speculators_path, vllm_python
from specshim.testbed import data

pytestmark = pytest.mark.vllm


def specshim_command(*args: str) -> tuple[list[str], dict[str, str]]:
    python = vllm_python("0.32.0")
    env = {**os.environ, "PYTHONPATH": str(speculators_path("0.4.0.1"))}
    env.pop("SPECSHIM_APPLY", None)
    return [str(python), "-m", "specshim.cli", *args], env


def extract_args(model: Path, dataset: Path, out: Path) -> list[str]:
    return ["extract", "--model", str(model), "--data", str(dataset), "--out", str(out),
            "--max-model-len", "256", "--batch-size", "4"]  # fmt: skip


def test_extract_resumes_after_a_kill_without_loss_or_duplicates(tiny_models, tmp_path) -> None:
    model, out = tiny_models["llama"], tmp_path / "out"
    dataset = data.write(tmp_path / "data.jsonl", count=48)
    cmd, env = specshim_command(*extract_args(model, dataset, out))
    first = subprocess.Popen(cmd, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while len(list(out.glob("data_*.pt"))) < 8:
        assert first.poll() is None, "extraction ended before it could be killed"
        assert time.monotonic() < deadline, "no samples written within 5 minutes"
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the whole group: vLLM's workers too
    first.wait()
    done_before = len(list(out.glob("data_*.pt")))
    assert done_before < 48, "the kill came too late to test resumption"

    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{done_before} already done" in second.stdout

    from transformers import AutoTokenizer

    from specshim.runner import dataset as rows

    expected = list(rows.read(dataset, AutoTokenizer.from_pretrained(model)))
    written = sorted(out.glob("data_*.pt"))
    assert len(written) == len(expected) == 48
    assert not list(out.glob(".*.tmp"))
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
    assert "sample 0 has 300 tokens, more than max_model_len - 1 = 255" in result.stderr
    assert not list((tmp_path / "o").glob("data_*.pt"))
