"""The ``worker`` hand-off's worker side, run here on host tensors as vLLM's CPU worker holds
them (the whole path through vLLM: tests/e2e/test_runner.py; on CUDA: tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specshim.runner.worker_writer import Expected, WorkerFiles


def expected(tmp_path: Path, lengths: list[int], call: int = 0) -> list[Expected]:
    return [
        Expected(str(tmp_path / f"data_{i}.pt"), f"req_{call}_{i}", list(range(10 + i, 10 + i + n)),
                 [i % 2] * n, f"line {i + 1} (data_{i}.pt)")
        for i, n in enumerate(lengths)
    ]  # fmt: skip


def written(writer: WorkerFiles) -> list[tuple[str, str | None]]:
    done = writer.finished(wait=True)
    return sorted(done)


def test_concatenated_reply_is_split_in_input_order_and_written(tmp_path) -> None:
    """speculators 0.3.0's reply: one tensor per layer, the requests one after another."""
    batch = expected(tmp_path, [3, 5, 2])
    layers = [torch.randn(10, 8).to(torch.bfloat16) for _ in range(2)]
    writer = WorkerFiles(layers=[1, 3])
    writer.expect(batch)
    reply = writer.reply(layers)
    assert [tuple(t.shape) for t in reply] == [(10, 0), (10, 0)]
    assert written(writer) == [(e.path, None) for e in batch]
    for e, (a, b) in zip(batch, [(0, 3), (3, 8), (8, 10)], strict=True):
        saved = torch.load(e.path, weights_only=True)
        assert saved["input_ids"].tolist() == e.input_ids
        assert saved["loss_mask"].tolist() == e.loss_mask
        for got, layer in zip(saved["hidden_states"], layers, strict=True):
            assert got.dtype == torch.bfloat16 and torch.equal(got, layer[a:b])
            assert got.untyped_storage().nbytes() == got.numel() * 2  # its own storage
    assert writer.written == 3


def test_reply_keyed_by_request_is_written_by_id_not_by_position(tmp_path) -> None:
    """speculators 0.4.x's reply: request id -> per-layer states, in any order."""
    batch = expected(tmp_path, [2, 4], call=7)
    states = {e.request_id: [torch.full((len(e.input_ids), 4), float(i + 1))]
              for i, e in enumerate(batch)}  # fmt: skip
    writer = WorkerFiles(layers=[2])
    writer.expect(batch)
    reply = writer.reply(dict(reversed(states.items())))
    assert {k: v[0].shape for k, v in reply.items()} == {"req_7_1": (4, 0), "req_7_0": (2, 0)}
    assert written(writer) == [(e.path, None) for e in batch]
    for i, e in enumerate(batch):
        assert torch.equal(torch.load(e.path)["hidden_states"][0], states[e.request_id][0])
        assert torch.load(e.path)["hidden_states"][0][0, 0] == i + 1


def test_a_fetch_that_was_not_announced_is_answered_with_the_states() -> None:
    states = [torch.ones(3, 4)]
    assert WorkerFiles(layers=[1]).reply(states) is states


def test_other_request_ids_are_an_error_naming_both(tmp_path) -> None:
    writer = WorkerFiles(layers=[1])
    writer.expect(expected(tmp_path, [2]))
    with pytest.raises(RuntimeError, match=r"keyed by \['req_0_0'\], found \['request-0'\]"):
        writer.reply({"request-0": [torch.ones(2, 4)]})


def test_other_token_counts_are_an_error(tmp_path) -> None:
    writer = WorkerFiles(layers=[1])
    writer.expect(expected(tmp_path, [2, 2]))
    with pytest.raises(
        RuntimeError, match=r"expected 4 tokens of states for the batch, found \[5\]"
    ):
        writer.reply([torch.ones(5, 4)])


def test_a_refused_sample_is_not_written_and_stops_the_writing(tmp_path) -> None:
    batch = expected(tmp_path, [2, 2, 2])
    states = torch.ones(6, 4)
    states[3, 1] = float("nan")  # the second sample's
    writer = WorkerFiles(layers=[5], threads=1)  # the samples are taken in order
    writer.expect(batch)
    writer.reply([states])
    done = dict(writer.finished(wait=True))
    assert done[batch[0].path] is None and Path(batch[0].path).exists()
    assert done[batch[1].path] == "line 2 (data_1.pt), layer 5: states hold NaN or Inf; " \
        "refusing to write them"  # fmt: skip
    assert not Path(batch[1].path).exists() and not Path(batch[2].path).exists()
