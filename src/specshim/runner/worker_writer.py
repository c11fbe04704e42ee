"""The ``worker`` hand-off: vLLM's worker writes each sample's file itself.

With the other hand-offs (:mod:`specshim.runner.handoff`) every state still reaches the caller,
where speculators' generator slices it per request and copies it to the host one sample and
layer at a time (``.clone().cpu()``, pageable): on the H200 that loop was what held
``specshim extract`` below vLLM's prefill (docs/benchmarks.md section 6). Here the states stay
in the worker. Before each ``generate`` the caller tells the worker what the batch is
(:meth:`WorkerFiles.expect`: each sample's file, token ids and loss mask); when the generator
fetches the captured states, the worker takes the announced samples the reply holds, splits
the states per request exactly as the generator would, copies them into page-locked host memory
on a side stream, and its writer threads check each sample (:func:`state_problem`) and write
``data_{i}.pt`` atomically (fsynced, renamed into place: :func:`specshim.runner.files.save_torch`).
The generator receives states of the same shapes with no columns (``[tokens, 0]``), so its own
loop costs nothing; the caller checks their token counts and records each file in the ledger
once the worker says it is in place (:meth:`WorkerFiles.finished`). The files hold the tensors
the generator would have returned, bit for bit (tests/e2e/test_runner.py on the CPU, tests/gpu
on the H200). Measured on the H200 with the disk out of the way: 1.5 times the ``ipc``
hand-off's speed, 0.30 of vLLM's prefill; :attr:`WorkerFiles.seconds` says where the time goes
(docs/benchmarks.md section 6, run 7: not in the writers' CPU, which the checks computed on
the GPU lowered without changing the rate).

How the worker splits a reply is each speculators release's own: 0.3.0 replies one tensor per
layer, the call's requests concatenated in input order (the generator slices them by prompt
length); 0.4.x a dict of request id to that list, the ids being ``req_{call}_{i}``
(:func:`positions`). A reply of another shape, or other ids, is an error naming what was
expected and what was found. A fetch the caller did not announce (``extract --verify``'s single
requests) is answered as speculators' RPC answers it, states and all.

Resume is unchanged: a file enters the ledger only once the worker has reported it in place,
so a run stopped by an error or Ctrl-C leaves the files it had not reported yet unrecorded, and
the next run writes them again (a temporary file cut short by the stop is removed at its start).

Only ``specshim extract`` uses this hand-off: what the generator returns while it is on holds
no states. Only the worker whose reply the generator reads (rank 0) writes; under tensor
parallelism every rank holds the full states after the all-reduce.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files
from specshim.runner.handoff import each_tensor

#: The worker attribute holding its :class:`WorkerFiles`.
_STATE = "_specshim_worker_files"
#: States (bytes) that may wait to be written in the worker's host memory; beyond that a
#: fetch waits for the oldest (:meth:`WorkerFiles.reply`).
PENDING_BYTES = 4 << 30


def state_problem(state: Any, tokens: int, extremes: Any = None) -> str | None:
    """What is wrong with one layer's ``[tokens, hidden]`` states, or None.

    One pass of ``aminmax`` (it propagates NaN; Inf is an end): ``isfinite(...).all()`` plus
    ``any()`` cost 11 of 15 s of an extraction on the H200 (docs/benchmarks.md), this about
    a tenth of that on the CPU. ``extremes``: the states' ``(min, max)`` where they are known
    already (the worker computes them on the GPU, beside the copies to the host)."""
    import torch

    if state.shape[0] != tokens:
        return f"states for {state.shape[0]} tokens, the row has {tokens}"
    low, high = torch.aminmax(state) if extremes is None else extremes
    if not (torch.isfinite(low) and torch.isfinite(high)):
        return "states hold NaN or Inf"
    if low == 0 and high == 0:
        return "states are all zero"
    return None


def sample_problem(
    where: str, layer_ids: list[int], states: list[Any], tokens: int, extremes: Any = None
) -> str | None:
    """What keeps one sample's per-layer states (``layer_ids``' order) from being written, as
    the line the user sees (it names ``where`` and the layer), or None. ``extremes``: the
    layers' ``[layers, 2]`` (min, max) where known (:func:`state_problem`)."""
    for place, (layer, state) in enumerate(zip(layer_ids, states, strict=True)):
        known = None if extremes is None else extremes[place]
        if found := state_problem(state, tokens, known):
            return f"{where}, layer {layer}: {found}; refusing to write them"
    return None


#: One sample's per-layer states on the host, and their ``[layers, 2]`` extremes where known.
OnHost = tuple[list[Any], Any]


@dataclass(frozen=True)
class Expected:
    """One announced sample: where its file goes and what it is made of."""

    path: str
    input_ids: list[int]
    loss_mask: list[int]
    where: str  # "line 7 (data_6.pt)", for messages


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
class WorkerFiles:
    """The worker's side: the announced samples not yet fetched, the writer threads, what
    they finished.

    specshim's ``request_batching`` adapter splits one ``generate`` into calls that one
    scheduler step can finish, each with its own fetch; each fetch takes as many announced
    samples, in order, as its reply holds."""

    layers: list[int]
    #: Writer threads: several, since one file's fsync leaves the disk waiting.
    threads: int = files.WRITER_THREADS
    replies: int = 0
    written: int = 0
    pinned: bool = False
    #: Seconds spent, by step. On the worker's own thread: ``fetch`` (speculators'
    #: ``_get_captured_states``), ``split``, ``room`` (waiting for the writers while the pending
    #: bytes are at :data:`PENDING_BYTES`), ``pin`` (allocating page-locked memory), ``copies``
    #: (issuing the copies to it), ``answer`` (all of one fetch's reply: what the caller's
    #: timer around the RPC holds beyond it is the RPC's own; run 7 left 0.55 s of 0.86 s in
    #: none of the steps above). On the writer threads, summed over them: ``copied`` (waiting
    #: for the copies), ``check``, ``save`` (wall) and ``save_cpu`` (the thread's own CPU time;
    #: the rest of ``save`` it waited, for the disk or for the GIL).
    seconds: collections.defaultdict[str, float] = field(
        default_factory=lambda: collections.defaultdict(float)
    )
    _queue: collections.deque[Expected] = field(default_factory=collections.deque)
    _pending: collections.deque[tuple[list[Future[None]], int]] = field(
        default_factory=collections.deque
    )
    _done: list[tuple[str, str | None]] = field(default_factory=list)
    _failed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="specshim-worker-writer")

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
    def _clock(self, step: str, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
        """Add the seconds spent inside to :attr:`seconds` [step]."""
        start = clock()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[step] += clock() - start

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
        return each_tensor(states, _columnless)

    def write(self, batch: list[Expected], per_sample: list[list[Any]]) -> None:
        """Hand the writer threads ``batch``, each sample with its per-layer states (still on
        the device): copied to the host now, checked and written on the threads."""
        if not batch:
            return
        nbytes = sum(t.numel() * t.element_size() for layers in per_sample for t in layers)
        with self._clock("room"):
            self._wait_for_room(nbytes)
        host = self._to_host(per_sample)
        jobs = [self._pool.submit(self._write, e, h) for e, h in zip(batch, host, strict=True)]
        self._pending.append((jobs, nbytes))

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

    def _wait_for_room(self, nbytes: int) -> None:
        """Block the worker while the states being written, with these, would pass
        :data:`PENDING_BYTES` (one fetch's are always let through): bounds the host memory."""
        while self._pending and sum(n for _, n in self._pending) + nbytes > PENDING_BYTES:
            jobs, _ = self._pending.popleft()
            for job in jobs:
                job.result()

    def _to_host(self, per_sample: list[list[Any]]) -> list[Callable[[], OnHost]]:
        """For each sample, a function giving its per-layer states on the host, each its own
        tensor (``torch.save`` writes a view's whole storage), with their extremes where known.
        On a CUDA device the copies go to page-locked memory on a side stream now, with each
        layer's ``(min, max)`` computed there (the writers' checks on the host were the
        largest CPU cost after the writes themselves, docs/benchmarks.md run 7), and the
        function waits for them; on the CPU it clones."""
        import torch

        if not per_sample or not per_sample[0] or not per_sample[0][0].is_cuda:
            return [functools.partial(_cloned, layers) for layers in per_sample]
        with self._clock("pin"):
            copies = [
                [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in layers]
                for layers in per_sample
            ]
            extremes = torch.empty((len(per_sample), len(per_sample[0]), 2), pin_memory=True)
        with self._clock("copies"):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for host, layers in zip(copies, per_sample, strict=True):
                    for place, t in zip(host, layers, strict=True):
                        place.copy_(t, non_blocking=True)
                        t.record_stream(side)  # not reused before the copy is done
                found = torch.stack(
                    [torch.stack(torch.aminmax(t)) for layers in per_sample for t in layers]
                )
                extremes.copy_(found.float().view(extremes.shape), non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        self.pinned = True
        return [
            functools.partial(_when_copied, done, host, extremes[i])
            for i, host in enumerate(copies)
        ]

    def _write(self, expected: Expected, states: Callable[[], OnHost]) -> None:
        """On a writer thread: check the sample's states and write its file; the problem that
        kept it from being written, or None."""
        if self._failed:
            return
        with self._clock("copied"):
            layers, extremes = states()
        with self._clock("check"):
            tokens = len(expected.input_ids)
            problem = sample_problem(expected.where, self.layers, layers, tokens, extremes)
        if problem is None:
            record = dataset.record(expected.input_ids, layers, expected.loss_mask)
            try:
                with self._clock("save"), self._clock("save_cpu", time.thread_time):
                    files.save_torch(Path(expected.path), record)
            except Exception as exc:  # noqa: BLE001 a failed write, told to the caller
                problem = f"writing extracted samples failed: {exc}"
        with self._lock:
            self._failed = self._failed or problem is not None
            self.written += problem is None
            self._done.append((expected.path, problem))

    def describe(self, how: str) -> dict[str, Any]:
        """``how`` the states got here, how many replies it split and files it wrote, whether
        its host copies were page-locked, and where its time went (:attr:`seconds`)."""
        # microseconds: a step of a tiny test's sample takes less than a millisecond
        seconds = {step: round(s, 6) for step, s in sorted(self.seconds.items())}
        return {"how": how, "replies": self.replies, "written": self.written,
                "pinned": self.pinned, "seconds": seconds}  # fmt: skip

    def finished(self, wait: bool) -> list[tuple[str, str | None]]:
        """The files finished since the last call, each with the problem that kept it from
        being written (None: in place); with ``wait``, once every file handed over is, and
        every announced sample was fetched."""
        if wait:
            while self._pending:
                for job in self._pending.popleft()[0]:
                    job.result()
            self.check_fetched()
        with self._lock:
            done, self._done = self._done, []
        return done


def _cloned(layers: list[Any]) -> OnHost:
    return [t.clone() for t in layers], None


def _when_copied(done: Any, host: list[Any], extremes: Any) -> OnHost:
    done.synchronize()
    return host, extremes


def _columnless(tensor: Any) -> Any:
    """An empty ``[rows, 0]`` host tensor of ``tensor``'s dtype: what the generator receives."""
    import torch

    return torch.empty((tensor.shape[0], 0), dtype=tensor.dtype)


# ---- run in the worker through collective_rpc ----------------------------------------------


def _install(worker: Any, layers: list[int]) -> bool:
    """Make rank 0's ``_get_captured_states`` reply through a :class:`WorkerFiles`."""
    if getattr(worker, "rank", 0) != 0:
        return False
    fetch = worker._get_captured_states
    writer = WorkerFiles(layers)
    worker._get_captured_states = functools.partial(writer.answer, fetch)
    setattr(worker, _STATE, writer)
    return True


def _expect(worker: Any, batch: list[Expected]) -> None:
    writer = getattr(worker, _STATE, None)
    if writer is not None:
        writer.expect(batch)


def _finished(worker: Any, wait: bool) -> list[tuple[str, str | None]] | None:
    writer = getattr(worker, _STATE, None)
    return None if writer is None else writer.finished(wait)


def state(worker: Any) -> dict[str, Any] | None:
    """Run in a vLLM worker: how many replies it split and files it wrote, whether its host
    copies were page-locked, and where its time went (:attr:`WorkerFiles.seconds`); ``None``
    where the hand-off is not installed."""
    writer = getattr(worker, _STATE, None)
    return None if writer is None else writer.describe("worker")


# ---- the caller's side -----------------------------------------------------------------------


def _rank0(replies: list[Any]) -> Any:
    """The reply of the one worker that has the hand-off (the others answer None)."""
    return next((r for r in replies if r is not None), None)


class WorkerFilesClient:
    """The caller's handle on the worker's writer: announce batches, collect finished files."""

    def __init__(self, generator: Any, layers: list[int]) -> None:
        self.generator = generator
        if not any(generator.executor.collective_rpc(_install, args=(layers,))):
            raise RuntimeError("worker writer: no vLLM worker of rank 0 took the hand-off")

    def expect(self, batch: list[Expected]) -> None:
        """Announce ``batch`` to the worker, before the ``generate`` that extracts it."""
        self.generator.executor.collective_rpc(_expect, args=(batch,))

    def finished(self, wait: bool = False) -> list[tuple[str, str | None]]:
        """:meth:`WorkerFiles.finished` of the worker that writes."""
        return _rank0(self.generator.executor.collective_rpc(_finished, args=(wait,))) or []
