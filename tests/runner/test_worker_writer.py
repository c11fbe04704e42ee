"""The ``worker`` hand-off's worker side, run here on host tensors as vLLM's CPU worker holds
them (the whole path through vLLM: tests/e2e/test_runner.py; on CUDA: tests/gpu)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import torch

from specshim.runner.in_worker.protocol import Expected
from specshim.runner.in_worker.writer import WRITERS_VARIABLE, WorkerFiles


def expected(tmp_path: Path, lengths: list[int]) -> list[Expected]:
    return [
        Expected(str(tmp_path / f"data_{i}.pt"), list(range(10 + i, 10 + i + n)), [i % 2] * n,
                 f"line {i + 1} (data_{i}.pt)")
        for i, n in enumerate(lengths)
    ]  # fmt: skip


def keyed(call: int, per_request: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """speculators 0.4.x's reply for one call: ``req_{call}_{i}`` -> per-layer states, the
    ids in the string order 0.4 sorts them in."""
    return {f"req_{call}_{i}": [t] for i, t in sorted(enumerate(per_request), key=str)}


def assert_written(batch: list[Expected], states: list[list[torch.Tensor]]) -> None:
    for e, layers in zip(batch, states, strict=True):
        saved = torch.load(e.path, weights_only=True)
        assert saved["input_ids"].tolist() == e.input_ids
        assert saved["loss_mask"].tolist() == e.loss_mask
        for got, want in zip(saved["hidden_states"], layers, strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want)
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()


def test_concatenated_reply_is_split_in_input_order_and_written(tmp_path) -> None:
    """speculators 0.3.0's reply: one tensor per layer, the requests one after another."""
    batch = expected(tmp_path, [3, 5, 2])
    layers = [torch.randn(10, 8).to(torch.bfloat16) for _ in range(2)]
    writer = WorkerFiles(layers=[1, 3])
    writer.expect(batch)
    reply = writer.reply(layers)
    assert [tuple(t.shape) for t in reply] == [(10, 0), (10, 0)]
    assert sorted(writer.finished(wait=True)) == [(e.path, None) for e in batch]
    assert_written(batch, [[t[a:b] for t in layers] for a, b in [(0, 3), (3, 8), (8, 10)]])
    assert writer.written == 3


def test_writer_processes_write_files_without_crc_that_torch_load_reads(tmp_path) -> None:
    """The processes turn ``torch.save``'s CRC-32 off (a quarter of a file's CPU): every zip
    entry's CRC is 0, Python's zipfile calls the states corrupt, torch.load reads them whole."""
    batch = expected(tmp_path, [4])
    layers = [torch.randn(4, 8).to(torch.bfloat16) for _ in range(2)]
    writer = WorkerFiles(layers=[1, 3])
    writer.expect(batch)
    writer.reply(layers)
    assert writer.finished(wait=True) == [(batch[0].path, None)]
    assert_written(batch, [layers])
    with zipfile.ZipFile(batch[0].path) as archive:
        entries = archive.infolist()
        assert {entry.CRC for entry in entries} == {0}
        states = next(e for e in entries if e.filename.endswith("/data/1"))
        with pytest.raises(zipfile.BadZipFile, match="CRC"):
            archive.read(states)


def test_a_whole_replys_samples_are_out_to_one_process_at_once(tmp_path, monkeypatch) -> None:
    """The worker hands out jobs only when the engine calls it, once a step: a step's samples
    must all reach the processes then, not wait for the next step (run 12 on an H100)."""
    monkeypatch.setenv(WRITERS_VARIABLE, "1")
    batch = expected(tmp_path, [2] * 12)
    layers = [torch.randn(24, 8).to(torch.bfloat16) for _ in range(2)]
    writer = WorkerFiles(layers=[1, 3])
    writer.expect(batch)
    writer.reply(layers)
    assert writer.writers == 1 and writer.waiting == 0
    assert len(writer.finished(wait=True)) == 12


def test_the_worker_says_where_its_time_went(tmp_path) -> None:
    """``state()`` reports each step's seconds: the fetch, the split and the writers' check
    and save, so a slow run on a GPU shows which of them it is."""
    from specshim.runner.in_worker import writer as worker_writer

    class FakeWorker:  # vLLM's worker as far as the hand-off touches it
        rank = 0

        def _get_captured_states(self) -> list[torch.Tensor]:
            return [torch.randn(5, 8)]

    worker = FakeWorker()
    assert worker_writer.install_in_worker(worker, [2])
    worker_writer.expect_in_worker(worker, expected(tmp_path, [5]))
    reply = worker._get_captured_states()
    assert [tuple(t.shape) for t in reply] == [(5, 0)]
    done = worker_writer.finished_in_worker(worker, wait=True)
    assert done == [(str(tmp_path / "data_0.pt"), None)]
    found = worker_writer.state(worker)
    assert found is not None and found["written"] == 1 and found["replies"] == 1
    assert {
        "answer",
        "fetch",
        "split",
        "hold",
        "room",
        "copies",
        "check",
        "save",
        "save_cpu",
    } <= set(found["seconds"])
    assert found["seconds"]["save"] > 0
    assert found["seconds"]["answer"] >= found["seconds"]["fetch"] + found["seconds"]["split"]


def test_reply_keyed_by_request_is_written_by_place_not_by_key_order(tmp_path) -> None:
    """speculators 0.4.x's reply, 12 requests: as strings req_0_10 sorts before req_0_2."""
    batch = expected(tmp_path, [2] * 12)
    states = [torch.full((2, 4), float(i + 1)) for i in range(12)]
    writer = WorkerFiles(layers=[2])
    writer.expect(batch)
    reply = writer.reply(keyed(7, states))
    assert {k: v[0].shape for k, v in reply.items()} == {f"req_7_{i}": (2, 0) for i in range(12)}
    assert len(writer.finished(wait=True)) == 12
    assert_written(batch, [[t] for t in states])


def test_one_announcement_fetched_in_several_calls(tmp_path) -> None:
    """specshim's request_batching splits one generate into calls, each fetched on its own."""
    batch = expected(tmp_path, [2, 3, 1, 4])
    states = [torch.randn(n, 4) for n in (2, 3, 1, 4)]
    by_list, by_dict = WorkerFiles(layers=[0]), WorkerFiles(layers=[0])
    by_list.expect(batch[:])
    by_list.reply([torch.cat(states[:3])])
    by_list.reply([states[3]])
    assert len(by_list.finished(wait=True)) == 4
    assert_written(batch, [[t] for t in states])
    for e in batch:
        Path(e.path).unlink()
    by_dict.expect(batch)
    by_dict.reply(keyed(0, states[:1]))
    by_dict.reply(keyed(1, states[1:]))
    assert len(by_dict.finished(wait=True)) == 4
    assert_written(batch, [[t] for t in states])


def test_a_fetch_that_was_not_announced_is_answered_with_the_states() -> None:
    states = [torch.ones(3, 4)]
    assert WorkerFiles(layers=[1]).reply(states) is states


def test_announced_samples_never_fetched_are_an_error(tmp_path) -> None:
    writer = WorkerFiles(layers=[1])
    writer.expect(expected(tmp_path, [2, 2]))
    writer.reply(keyed(0, [torch.ones(2, 4)]))
    with pytest.raises(RuntimeError, match=r"1 announced samples were never fetched, the first "
                                           r"line 2 \(data_1.pt\)"):  # fmt: skip
        writer.finished(wait=True)


def test_other_request_ids_are_an_error_naming_them(tmp_path) -> None:
    writer = WorkerFiles(layers=[1])
    writer.expect(expected(tmp_path, [2]))
    with pytest.raises(RuntimeError, match=r"req_\{call\}_\{i\} .* found \['request-0'\]"):
        writer.reply({"request-0": [torch.ones(2, 4)]})


def test_a_reply_that_splits_a_prompt_is_an_error(tmp_path) -> None:
    writer = WorkerFiles(layers=[1])
    writer.expect(expected(tmp_path, [2, 2]))
    with pytest.raises(RuntimeError, match=r"found \[3\] tokens per layer, the prompts' ends"):
        writer.reply([torch.ones(3, 4)])


def test_a_refused_sample_is_not_written_and_stops_the_writing(tmp_path) -> None:
    batch = expected(tmp_path, [2, 2, 2])
    states = torch.ones(6, 4)
    states[3, 1] = float("nan")  # the second sample's
    writer = WorkerFiles(layers=[5], writers=1)  # one process: the samples are written in order
    writer.expect(batch)
    writer.reply([states])
    done = dict(writer.finished(wait=True))
    assert done[batch[0].path] is None and Path(batch[0].path).exists()
    assert done[batch[1].path] == "line 2 (data_1.pt), layer 5: states hold NaN or Inf; " \
        "refusing to write them"  # fmt: skip
    assert not Path(batch[1].path).exists() and not Path(batch[2].path).exists()


def test_a_ring_smaller_than_the_batch_waits_for_room_and_writes_every_file(tmp_path) -> None:
    """Twelve samples of 256 KiB through a ring of 1 MiB (the smallest it holds): the worker
    waits for the writers to give room back, round the ring several times, and every file
    holds its own sample."""
    batch = expected(tmp_path, [64] * 12)
    states = [torch.randn(64, 2048) for _ in range(12)]
    writer = WorkerFiles(layers=[2], writers=2, ring_bytes=1 << 20)
    writer.expect(batch)
    writer.reply([torch.cat(states)])
    assert sorted(writer.finished(wait=True)) == sorted((e.path, None) for e in batch)
    assert writer.describe("worker")["ring_bytes"] == 1 << 20
    assert writer.seconds["room"] > 0
    assert_written(batch, [[t] for t in states])


def test_a_sample_larger_than_the_ring_grows_it(tmp_path) -> None:
    batch = expected(tmp_path, [16, 1024])  # 64 KiB, then 8 MiB
    states = [
        torch.randn(16, 1024, dtype=torch.float64),
        torch.randn(1024, 1024, dtype=torch.float64),
    ]
    writer = WorkerFiles(layers=[1], writers=1, ring_bytes=1 << 20)
    writer.expect(batch[:1])
    writer.reply([states[0]])
    assert writer.describe("worker")["ring_bytes"] == 1 << 20
    writer.expect(batch[1:])
    writer.reply([states[1]])
    assert len(writer.finished(wait=True)) == 2
    assert writer.describe("worker")["ring_bytes"] >= 8 << 20
    assert_written(batch, [[t] for t in states])


def test_a_writer_process_that_dies_is_named_for_the_samples_it_held(tmp_path) -> None:
    writer = WorkerFiles(layers=[1], writers=1)
    writer.start(cuda=False)
    (process,) = writer._processes._processes  # the one process, killed before any sample
    process.popen.kill()
    writer.expect(expected(tmp_path, [2]))
    writer.reply([torch.ones(2, 4)])
    ((path, problem),) = writer.finished(wait=True)
    assert path == str(tmp_path / "data_0.pt") and not Path(path).exists()
    assert problem == f"writer process {process.popen.pid} exited with code -9 before writing it"


def test_a_process_the_worker_left_while_it_wrote_finishes_the_file_quietly(
    tmp_path, capfd
) -> None:
    """The worker closes the socket (its run ended, or failed) while a file is being written:
    the process finishes the file and leaves without a traceback on the user's terminal."""
    writer = WorkerFiles(layers=[1], writers=1)
    batch = expected(tmp_path, [4096])
    writer.expect(batch)
    writer.reply([torch.randn(4096, 1024).to(torch.bfloat16)])
    assert writer._processes.out == 1
    writer._processes.close()  # waits for the process to leave
    assert torch.load(batch[0].path, weights_only=True)["input_ids"].tolist() == batch[0].input_ids
    assert "Traceback" not in capfd.readouterr().err


def test_a_writer_process_that_exits_before_it_is_ready_is_one_line(monkeypatch) -> None:
    from specshim.runner.in_worker import writer_processes

    monkeypatch.setattr(writer_processes.sys, "executable", "/bin/false")  # exits with 1
    writer = WorkerFiles(layers=[1], writers=2)
    with pytest.raises(RuntimeError) as error:
        writer.start(cuda=False)
    assert re.fullmatch(
        r"worker writer: writer process \d+ exited with code 1 before it could take samples "
        r"\(its error is above it, on stderr\)",
        str(error.value),
    )
    assert writer._processes._processes == []


def _fake_full_shm(room: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``/dev/shm`` with ``room`` bytes free: ``posix_fallocate`` refuses more, as a full
    tmpfs does (a fake; this machine's tmpfs is larger than the test needs to refuse)."""
    import errno
    import os

    from specshim.runner.in_worker import ring as handoff

    real = os.posix_fallocate

    def fallocate(fd: int, offset: int, size: int) -> None:
        if size > room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, offset, size)

    monkeypatch.setattr(handoff.os, "posix_fallocate", fallocate)


def test_the_ring_and_the_processes_are_ready_from_the_start(tmp_path) -> None:
    """Run 9 on an H100: the ring was sized from the first reply (one sample) and the worker
    spent most of the run waiting for room; run 10: the first samples waited for the
    processes to import torch. Both now happen in ``start``, before any sample."""
    writer = WorkerFiles(layers=[1], writers=2, ring_bytes=16 << 20)
    writer.start(cuda=False)
    assert writer.describe("worker")["ring_bytes"] == 16 << 20
    for process in writer._processes._processes:  # each answered that it is ready
        assert process.popen.poll() is None and not process.connection.poll()
    batch = expected(tmp_path, [2])
    writer.expect(batch)
    writer.reply([torch.ones(2, 4)])
    assert writer.describe("worker")["ring_bytes"] == 16 << 20
    assert writer.finished(wait=True) == [(batch[0].path, None)]


def test_a_full_shared_memory_gets_a_smaller_ring(tmp_path, monkeypatch) -> None:
    """Room for 5 MiB of a ring of 16 MiB: the ring is halved to 4 MiB, every file written."""
    _fake_full_shm(5 << 20, monkeypatch)
    batch = expected(tmp_path, [64] * 12)  # 256 KiB each
    states = [torch.randn(64, 1024) for _ in range(12)]
    writer = WorkerFiles(layers=[2], writers=2, ring_bytes=16 << 20)
    writer.expect(batch)
    writer.reply([torch.cat(states)])
    assert len(writer.finished(wait=True)) == 12
    assert writer.describe("worker")["ring_bytes"] == 4 << 20
    assert_written(batch, [[t] for t in states])


def test_shared_memory_without_room_for_one_sample_is_one_line(tmp_path, monkeypatch) -> None:
    _fake_full_shm(1 << 20, monkeypatch)
    writer = WorkerFiles(layers=[1], writers=1, ring_bytes=16 << 20)
    writer.expect(expected(tmp_path, [1024]))  # 4 MiB of float32 states
    with pytest.raises(RuntimeError) as error:
        writer.reply([torch.ones(1024, 1024)])
    assert str(error.value).startswith("worker writer: could not hold 4.00MB of states in ")
    assert "No space left on device" in str(error.value) and "--shm-size" in str(error.value)
    assert not Path(tmp_path / "data_0.pt").exists()
