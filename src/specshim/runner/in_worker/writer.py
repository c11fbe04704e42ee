"""vLLM's worker writes each announced sample's file itself (the ``worker`` hand-off, and the
engine backend's capture).

The states never cross to the caller: the worker splits them per request exactly as the
generator would (:meth:`WorkerFiles.split`: speculators 0.3.0 replies one tensor per layer,
the call's requests concatenated; 0.4.x a dict keyed ``req_{call}_{i}``), copies them on a side
stream into one shared ring of host memory (:mod:`specshim.runner.in_worker.ring`), and its
writer processes (:mod:`specshim.runner.in_worker.writer_processes`, outside the GIL vLLM's
engine loop needs) check and write ``data_{i}.pt`` atomically. The generator receives states
without columns; the caller records each file once the worker reports it in place
(:meth:`WorkerFiles.finished`), so resume is unchanged. A fetch the caller did not announce
(``extract --verify``'s) is answered as speculators' RPC answers it. Only rank 0 writes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from specshim import patches
from specshim.adapters.model import Patch
from specshim.runner import files
from specshim.runner.in_worker.checks import largest_magnitudes
from specshim.runner.in_worker.protocol import Expected, Report, columnless_like
from specshim.runner.in_worker.ring import HostRing, aligned, each_tensor
from specshim.runner.in_worker.writer_processes import (
    WRITER_PROCESSES,
    WriteJob,
    WriterProcesses,
    Written,
)

#: The worker attribute holding its :class:`WorkerFiles`.
_STATE = "_specshim_worker_files"
#: The size of the ring the states wait in for their writer processes (one sample larger than
#: it grows it): the host memory the worker's states take, page-locked on a GPU.
RING_BYTES = 1 << 30
#: The least ring the worker starts with where ``/dev/shm`` has no room for ``RING_BYTES``
#: (a sample larger than the ring grows it, or is told to need more room).
SMALLEST_RING = 1 << 20
#: The environment variable that sets how many writer processes a worker starts (default:
#: :data:`specshim.runner.in_worker.writer_processes.WRITER_PROCESSES`).
WRITERS_VARIABLE = "SPECSHIM_WRITER_PROCESSES"


def writers_from_environment() -> int:
    """:data:`WRITERS_VARIABLE` as a number of processes, or the default where unset."""
    value = os.environ.get(WRITERS_VARIABLE, "")
    if not value:
        return WRITER_PROCESSES
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{WRITERS_VARIABLE}={value!r}: expected a whole number from 1")
    return int(value)


#: speculators' request ids, ``req_{call}_{i}``: ``i`` is the prompt's place in that call.
REQUEST_ID = re.compile(r"req_(\d+)_(\d+)")


def positions(keys: Iterable[str]) -> dict[int, str]:
    """Each request id of one 0.4.x reply by the prompt's place in its call (0, 1, ...).

    speculators 0.4.x names the requests of one ``generate`` call ``req_{call}_{i}``, and its
    reply is keyed by them; another naming, or places that are not ``0..n-1`` of one call,
    is an error naming what was found."""
    keys = list(keys)
    found = [REQUEST_ID.fullmatch(k) for k in keys]
    places = {int(m.group(2)): m.group(0) for m in found if m}
    calls = {m.group(1) for m in found if m}
    if len(calls) != 1 or sorted(places) != list(range(len(keys))):
        raise RuntimeError(
            "worker writer: expected the reply's request ids as req_{call}_{i} for i = 0.."
            f"{len(keys) - 1} of one call (speculators 0.4's naming), found {sorted(keys)[:8]}"
        )
    return places


@dataclass
class _Copying:
    """A job whose states are being copied into the ring; ``copied``: the CUDA event after
    the copies, None where they are done (on the CPU)."""

    job: WriteJob
    copied: Any


@dataclass
class WorkerFiles:
    """The worker's side: the announced samples not yet fetched, the ring and the writer
    processes, what they finished.

    specshim's ``request_batching`` adapter splits one ``generate`` into calls that one
    scheduler step can finish, each with its own fetch; each fetch takes as many announced
    samples, in order, as its reply holds. Everything here runs on the worker's own thread,
    without threads of its own: what is copied is handed out, and what was written collected,
    at each write and each :meth:`finished`."""

    layers: list[int]
    writers: int = field(default_factory=writers_from_environment)
    ring_bytes: int = RING_BYTES
    replies: int = 0
    written: int = 0
    #: Seconds spent, by step. On the worker's thread: ``fetch`` (speculators'
    #: ``_get_captured_states``), ``split``, ``hold`` (making the ring: allocating and
    #: page-locking it), ``room`` (waiting for the writers while the ring is full),
    #: ``copies`` (issuing the copies into it, the checks' magnitudes computed on the GPU
    #: beside them), ``copied`` (waiting for copies to end, where it had to), ``answer`` (all
    #: of one fetch's reply). In the writer processes, summed over them: ``check``, ``save``
    #: (wall) and ``save_cpu`` (the process's CPU time in it; the rest it waited for the disk).
    seconds: collections.defaultdict[str, float] = field(
        default_factory=lambda: collections.defaultdict(float)
    )
    _queue: collections.deque[Expected] = field(default_factory=collections.deque)
    _copying: collections.deque[_Copying] = field(default_factory=collections.deque)
    _done: list[Report] = field(default_factory=list)
    _failed: bool = False
    _ring: HostRing = field(default_factory=HostRing)
    _stream: Any = None

    def __post_init__(self) -> None:
        self._processes = WriterProcesses(self.writers)
        weakref.finalize(self, _close, self._processes, self._ring)

    @property
    def waiting(self) -> int:
        """Samples copied (or being copied) into the ring and not yet handed to a process."""
        return len(self._copying)

    @property
    def pinned(self) -> bool:
        """Whether the ring is page-locked (on a CUDA device, where ``cudaHostRegister``
        took it)."""
        return self._ring.buffer.pinned

    def start(self, cuda: bool) -> None:
        """Start the writer processes and hold the ring (page-locked where ``cuda``), if not
        done yet. The worker does it when installed, in the engine's start: the processes'
        start (importing torch) and page-locking the ring take seconds, costs of starting
        that would otherwise keep the first samples waiting."""
        if self._ring.size:
            return
        with self._clock("start"):
            self._processes.start()
        with self._clock("hold"):
            self._hold(self.ring_bytes, min(self.ring_bytes, SMALLEST_RING), cuda)

    def expect(self, batch: list[Expected]) -> None:
        """The next fetches are for ``batch``, in input order."""
        self.check_fetched()
        self._queue.extend(batch)

    def check_fetched(self) -> None:
        """Raise if announced samples were never fetched (their files would be missing)."""
        if self._queue:
            raise RuntimeError(
                f"worker writer: {len(self._queue)} announced samples were never fetched, "
                f"the first {self._queue[0].where}"
            )

    @contextlib.contextmanager
    def _clock(self, step: str) -> Iterator[None]:
        """Add the seconds spent inside to :attr:`seconds` [step]."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] += time.perf_counter() - start

    def answer(self, fetch: Callable[[], Any]) -> Any:
        """Fetch the captured states with speculators' own ``fetch`` and :meth:`reply`."""
        with self._clock("answer"):
            with self._clock("fetch"):
                states = fetch()
            return self.reply(states)

    def reply(self, states: Any) -> Any:
        """The generator's reply for ``states``: unchanged when nothing is announced, else
        their shapes without columns, the files being written meanwhile."""
        if not self._queue or states is None:
            return states
        self.replies += 1
        with self._clock("split"):
            batch, per_sample = self.split(states)
        self.write(batch, per_sample)
        return each_tensor(states, columnless_like)

    def write(self, batch: list[Expected], per_sample: list[list[Any]]) -> None:
        """Copy ``batch``'s per-layer states (on the device) into the ring, and hand each
        sample to a writer process once its copies are done."""
        self._hand_out()
        if not batch or self._failed:  # the writing stops at the first refusal
            return
        cuda = per_sample[0][0].is_cuda
        self.start(cuda)
        sizes = [_span(layers, cuda) for layers in per_sample]
        largest: list[Any] = [None] * len(batch)
        if cuda:
            import torch

            self._stream = self._stream or torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            with self._clock("copies"), torch.cuda.stream(self._stream):
                largest = list(largest_magnitudes(per_sample))
        for expected, layers, nbytes, known in zip(batch, per_sample, sizes, largest, strict=True):
            with self._clock("room"):
                start = self._room(nbytes, cuda)
            with self._clock("copies"):
                self._copying.append(self._copy(expected, layers, start, known))
        self._hand_out()

    def split(self, states: Any) -> tuple[list[Expected], list[list[Any]]]:
        """The announced samples this reply holds, and each one's per-layer states, sliced as
        the generator itself slices them."""
        if isinstance(states, list):  # 0.3.0: the call's requests concatenated in input order
            total = states[0].shape[0] if states else 0
            batch: list[Expected] = []
            taken = 0
            while self._queue and taken < total:
                batch.append(self._queue.popleft())
                taken += len(batch[-1].input_ids)
            ends = list(itertools.accumulate(len(e.input_ids) for e in batch))
            if not ends or ends[-1] != total or any(s.shape[0] != total for s in states):
                raise RuntimeError(
                    f"worker writer: expected a reply of whole announced prompts, found "
                    f"{[s.shape[0] for s in states]} tokens per layer, the prompts' ends at "
                    f"{ends[-3:]}"
                )
            return batch, [[s[a:b] for s in states] for a, b in itertools.pairwise([0, *ends])]
        if isinstance(states, dict):  # 0.4.x: request id -> per-layer states
            places = positions(states)
            if len(places) > len(self._queue):
                raise RuntimeError(
                    f"worker writer: a reply for {len(places)} requests, "
                    f"{len(self._queue)} announced"
                )
            batch = [self._queue.popleft() for _ in places]
            return batch, [list(states[places[i]]) for i in range(len(batch))]
        raise RuntimeError(
            "worker writer: expected the captured states as a list of per-layer tensors or a "
            f"dict of request id to such a list, found {type(states).__name__}"
        )

    def _hold(self, nbytes: int, least: int, cuda: bool) -> None:
        """Make the ring ``nbytes`` long, or where ``/dev/shm`` has less room (64 MB in a
        default Docker container) the largest half of it that fits, down to ``least``: fewer
        samples then wait for the writers at once, which is slower but runs. Without room for
        ``least``, one line says so. (A ring sized from one sample keeps the worker waiting
        for room most of the run.)"""
        while True:
            try:
                self._ring.hold(nbytes, cuda)
                return
            except OSError as exc:
                if nbytes <= least:
                    raise RuntimeError(
                        f"worker writer: could not hold {files.size(least)} of states in "
                        f"{self._ring.buffer.directory} ({exc.strerror or exc}): give it more "
                        "room (Docker: --shm-size), or use extract --handoff rpc"
                    ) from None
                nbytes = max(least, nbytes // 2)

    def _room(self, nbytes: int, cuda: bool) -> int:
        """Where in the ring ``nbytes`` go: taken once the writers have given back enough;
        a sample larger than the whole ring grows it (once every other one is written)."""
        while (start := self._ring.take(nbytes)) is None:
            if self._ring.spans:
                self._hand_out(wait=True)
            else:
                with self._clock("hold"):
                    self._hold(nbytes, nbytes, cuda)
        return start

    def _copy(self, expected: Expected, layers: list[Any], start: int, largest: Any) -> _Copying:
        """Copy one sample's layers into the ring at ``start``: on a CUDA device (``largest``,
        the layers' largest magnitudes computed there, given) on the side stream, ``largest``
        copied after them (so the checks on the host need not read every state)."""
        import torch

        memory, places, views = self._ring.memory, [], []
        offset = start
        for t in layers:
            nbytes = t.numel() * t.element_size()
            views.append(memory[offset : offset + nbytes].view(t.dtype).view(t.shape))
            places.append((offset, tuple(t.shape)))
            offset += aligned(nbytes)
        largest_at, copied = None, None
        if largest is not None:
            with torch.cuda.stream(self._stream):
                for view, t in zip(views, layers, strict=True):
                    view.copy_(t, non_blocking=True)
                    t.record_stream(self._stream)  # not reused before the copy is done
                place = memory[offset : offset + largest.numel() * 4].view(torch.float32)
                place.copy_(largest, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self._stream)
            largest_at = offset
        else:
            for view, t in zip(views, layers, strict=True):
                view.copy_(t)
        ring = (str(self._ring.buffer.path), self._ring.size)
        dtype = str(layers[0].dtype).removeprefix("torch.")
        job = WriteJob(start, expected, self.layers, ring, dtype, places, largest_at)
        return _Copying(job, copied)

    def _hand_out(self, wait: bool = False) -> None:
        """Hand the copied samples, in order, to the writer processes that have room, and
        collect what they wrote; with ``wait``, wait for the copies and for one answer at
        least (the ring's room comes back with answers)."""
        for written in self._processes.answers(0):  # a refusal stops what follows
            self._answered(written)
        while self._copying:
            head = self._copying[0]
            if head.copied is not None and not head.copied.query():
                if not wait:
                    break
                with self._clock("copied"):
                    head.copied.synchronize()
            if self._failed:  # the writing stops at the first refusal
                self._ring.give_back(head.job.key)
            elif not self._processes.submit(head.job):
                break
            self._copying.popleft()
        if wait:
            for written in self._processes.answers(None):
                self._answered(written)

    def refuse(self, expected: Expected, problem: str) -> None:
        """Report ``expected`` as not written, for ``problem`` found before its states were
        captured; the writing stops, as at any refusal."""
        self._failed = True
        self._done.append((expected.path, problem))

    def _answered(self, written: Written) -> None:
        self._ring.give_back(written.key)
        for step, seconds in written.seconds.items():
            self.seconds[step] += seconds
        if written.skipped:
            return
        self._failed = self._failed or written.problem is not None
        self.written += written.problem is None
        self._done.append((written.path, written.problem))

    def describe(self, how: str) -> dict[str, Any]:
        """``how`` the states got here, how many replies it split and files it wrote, whether
        its ring was page-locked, how many writer processes, and where its time went
        (:attr:`seconds`)."""
        # microseconds: a step of a tiny test's sample takes less than a millisecond
        seconds = {step: round(s, 6) for step, s in sorted(self.seconds.items())}
        return {"how": how, "replies": self.replies, "written": self.written,
                "pinned": self.pinned, "writers": self.writers, "ring_bytes": self._ring.size,
                "seconds": seconds}  # fmt: skip

    def finished(self, wait: bool) -> list[Report]:
        """The files finished since the last call, each with the problem that kept it from
        being written (None: in place); with ``wait``, once every file handed over is, and
        every announced sample was fetched."""
        self._hand_out()
        if wait:
            while self._copying or self._processes.out:
                self._hand_out(wait=True)
            self.check_fetched()
        done, self._done = self._done, []
        return done


def _span(layers: list[Any], cuda: bool) -> int:
    """The ring bytes one sample takes: its layers, and on a GPU their largest magnitudes
    (float32)."""
    states = sum(aligned(t.numel() * t.element_size()) for t in layers)
    return states + (aligned(4 * len(layers)) if cuda else 0)


def _close(processes: WriterProcesses, ring: HostRing) -> None:
    """When a :class:`WorkerFiles` goes (or its process ends): the processes leave, the ring
    is given back."""
    processes.close()
    ring.release()


# ---- run in the worker through collective_rpc ----------------------------------------------


def install_in_worker(worker: Any, layers: list[int]) -> bool:
    """Make rank 0's ``_get_captured_states`` reply through a :class:`WorkerFiles`."""
    if getattr(worker, "rank", 0) != 0:
        return False
    fetch = worker._get_captured_states
    writer = WorkerFiles(layers)
    writer.start(on_cuda(worker))
    answer = functools.partial(writer.answer, fetch)
    patches.apply("worker_writes_files", [Patch(worker, "_get_captured_states", answer)])
    setattr(worker, _STATE, writer)
    return True


def on_cuda(worker: Any) -> bool:
    """Whether vLLM's ``worker`` runs on a CUDA device (its ``device``, set by vLLM's
    ``init_device``; absent or None: not)."""
    device = getattr(worker, "device", None)
    return device is not None and device.type == "cuda"


def expect_in_worker(worker: Any, batch: list[Expected]) -> None:
    """Announce ``batch`` to the worker's :class:`WorkerFiles`, where installed."""
    writer = getattr(worker, _STATE, None)
    if writer is not None:
        writer.expect(batch)


def finished_in_worker(worker: Any, wait: bool) -> list[Report] | None:
    """The files the worker's :class:`WorkerFiles` finished (None where not installed)."""
    writer = getattr(worker, _STATE, None)
    return None if writer is None else writer.finished(wait)


def state(worker: Any) -> dict[str, Any] | None:
    """Run in a vLLM worker: how many replies it split and files it wrote, whether its host
    copies were page-locked, and where its time went (:attr:`WorkerFiles.seconds`); ``None``
    where the hand-off is not installed."""
    writer = getattr(worker, _STATE, None)
    return None if writer is None else writer.describe("worker")
