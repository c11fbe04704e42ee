"""The ring the worker writer's states wait in: room taken in turn, given back in any order."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from specshim.runner.in_worker.ring import HostBuffer, HostRing

MIB = 1 << 20


@pytest.fixture
def ring(tmp_path):
    ring = HostRing(HostBuffer(tmp_path))
    ring.hold(MIB, cuda=False)
    yield ring
    ring.release()


def test_room_is_taken_in_turn_and_wraps_once_the_oldest_is_back(ring) -> None:
    assert ring.size == MIB
    first, second = ring.take(400_000), ring.take(400_000)
    assert (first, second) == (0, 400_000)
    assert ring.take(400_000) is None  # 248,576 bytes left at the end, none at the start
    ring.give_back(second)  # out of order: waits for the first
    assert ring.take(300_000) is None
    ring.give_back(first)
    assert ring.take(300_000) == 0  # everything is back: from the start again
    assert ring.take(500_000) == 300_000
    assert ring.take(300_000) is None  # only 248,576 left at the end


def test_a_full_ring_takes_nothing_until_given_back(ring) -> None:
    spans = [ring.take(MIB // 4) for _ in range(4)]
    assert spans == [0, MIB // 4, MIB // 2, 3 * MIB // 4]
    assert ring.take(1) is None
    ring.give_back(0)
    assert ring.take(MIB // 4) == 0  # wrapped behind the head
    assert ring.take(1) is None


def test_more_than_the_ring_is_never_taken_and_growing_waits_for_every_span(ring) -> None:
    assert ring.take(MIB + 1) is None
    start = ring.take(10)
    with pytest.raises(RuntimeError, match="cannot grow with 1 spans taken"):
        ring.hold(2 * MIB, cuda=False)
    ring.give_back(start)
    ring.hold(2 * MIB, cuda=False)
    assert ring.take(MIB + 1) == 0


def test_giving_back_what_was_not_taken_is_an_error(ring) -> None:
    ring.take(10)
    with pytest.raises(RuntimeError, match="no span taken at 64"):
        ring.give_back(64)


HOLDER = """
import sys, time
from pathlib import Path
from specshim.runner.in_worker.ring import HostBuffer
buffer = HostBuffer(Path(sys.argv[1]))
buffer.hold(1 << 20, cuda=False)
print(buffer.path.name, flush=True)
if sys.argv[2] == "die":
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)  # as a worker killed mid-run: nothing released
time.sleep(60)
"""


def hold_in_another_process(directory, how: str) -> tuple[subprocess.Popen[str], str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), how], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip()


def test_a_buffer_left_by_a_killed_worker_is_removed_by_the_next_and_a_live_one_kept(
    tmp_path,
) -> None:
    """A worker killed mid-run leaves its buffer (a gigabyte of memory by default) in
    /dev/shm; the next buffer made there removes it, and leaves alone one a live process
    holds."""
    alive, held = hold_in_another_process(tmp_path, "live")
    try:
        dead, left = hold_in_another_process(tmp_path, "die")
        assert dead.wait(timeout=60) == -signal.SIGKILL
        assert (tmp_path / left).exists() and (tmp_path / held).exists()
        mine = HostBuffer(tmp_path)
        mine.hold(MIB, cuda=False)
        assert mine.path is not None
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([held, mine.path.name])
        mine.release()
        assert [p.name for p in tmp_path.iterdir()] == [held]
    finally:
        alive.kill()
        alive.wait()
