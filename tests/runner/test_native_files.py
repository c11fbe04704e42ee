"""``specshim.runner.extraction.backends.native.NativeFiles``: the caller's side of specshim's
connector, on real lock files held as vLLM's connector holds them (``flock(LOCK_EX)`` on
``<file>.lock`` until its writer thread has written the outcome). The whole path on vLLM:
tests/e2e/test_native.py."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from specshim.runner.extraction.backends import native
from specshim.runner.extraction.backends.feed import EngineFeed
from specshim.runner.in_worker import protocol
from specshim.runner.in_worker.protocol import Expected


class Connector:
    """What vLLM's connector does with one request's lock file, done by hand."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = str(folder / f"{name}.safetensors")
        self.fd = os.open(self.path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def done(self, outcome: str) -> None:
        os.write(self.fd, outcome.encode())
        os.close(self.fd)


def native_files(bytes_per_token: int) -> native.NativeFiles:
    """The caller's side with a feed that sent nothing (the lock files are made by hand)."""
    return native.NativeFiles(bytes_per_token, EngineFeed(engine=None, ahead_tokens=0))


def sample(tmp_path: Path, i: int, tokens: int) -> Expected:
    return Expected(str(tmp_path / f"data_{i}.pt"), [7] * tokens, [1] * tokens, f"line {i + 1}")


def test_a_file_is_reported_once_the_connector_lets_go_of_its_lock(tmp_path) -> None:
    files = native_files(bytes_per_token=8)
    first, second = Connector(tmp_path, "a"), Connector(tmp_path, "b")
    files.writing(sample(tmp_path, 0, 4), first.path)
    files.writing(sample(tmp_path, 1, 4), second.path)
    assert files.finished() == []
    first.done(protocol.WRITTEN)
    assert files.finished() == [(str(tmp_path / "data_0.pt"), None)]
    assert not Path(first.path + ".lock").exists()
    refused = "line 2, layer 3: states are all zero; refusing to write them"
    second.done(refused)
    assert files.finished(wait=True) == [(str(tmp_path / "data_1.pt"), refused)]
    assert list(tmp_path.iterdir()) == []


def test_a_connector_that_said_nothing_is_a_line_naming_the_sample(tmp_path) -> None:
    """A worker that died, or whose write failed before it could say so."""
    files = native_files(bytes_per_token=8)
    gone = Connector(tmp_path, "a")
    files.writing(sample(tmp_path, 4, 4), gone.path)
    gone.done("")
    assert files.finished(wait=True) == [
        (str(tmp_path / "data_4.pt"),
         "line 5: vLLM's worker wrote no file for it: its log above says why")
    ]  # fmt: skip


def test_announcing_waits_for_the_oldest_files_while_too_many_states_wait(
    monkeypatch, tmp_path
) -> None:
    """vLLM's connector bounds nothing: two samples of 5 tokens at 10 bytes fill a 100-byte
    cap, so announcing a third waits until the oldest is written, and reports it."""
    monkeypatch.setattr(native, "PENDING_BYTES", 100)
    files = native_files(bytes_per_token=10)
    oldest, newer = Connector(tmp_path, "a"), Connector(tmp_path, "b")
    files.writing(sample(tmp_path, 0, 5), oldest.path)
    files.writing(sample(tmp_path, 1, 5), newer.path)
    later = threading.Timer(0.3, oldest.done, args=(protocol.WRITTEN,))
    later.start()
    files.expect([sample(tmp_path, 2, 5)])  # blocks until the timer writes the oldest
    assert not Path(oldest.path + ".lock").exists()  # settled by expect, not after it
    later.join()
    assert files.finished() == [(str(tmp_path / "data_0.pt"), None)]
    newer.done(protocol.WRITTEN)
    assert files.take_for([sample(tmp_path, 2, 5).input_ids]) == [sample(tmp_path, 2, 5)]
    assert files.finished(wait=True) == [(str(tmp_path / "data_1.pt"), None)]
