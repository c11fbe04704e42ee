"""Writer processes: sample files written from shared host memory, outside the worker's GIL.

Written on threads, ``torch.save`` would hold the GIL of vLLM's worker process, whose engine
loop needs it for every step it launches. Here each file is written by a process of its own: the
worker copies a sample's states into a :class:`specshim.runner.in_worker.ring.HostRing` and sends
a :class:`WriteJob` (where the states lie in it, the token ids, the file); the process maps
the same memory, checks the sample (:func:`specshim.runner.in_worker.checks.sample_problem`), writes
``data_{i}.pt`` atomically (:func:`specshim.runner.files.save_torch`) and answers with a
:class:`Written`. The tensors it saves are views of the shared memory with storages of their
own size (``torch.frombuffer``), so the file holds what the states were, bit for bit, and
nothing else. The files carry no CRC-32 (``torch.save``'s ``compute_crc32`` off, in these
processes only): computing it is a large share of a file's CPU, and ``torch.load`` has never
checked it (PyTorch builds miniz with ``MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS``); Python's
``zipfile`` reading an entry to its end does, and would call it corrupt.

A process that refused a sample writes nothing more (its later jobs come back ``skipped``),
and the worker hands out no more jobs: the other processes finish the ones they hold (up to
:data:`DEPTH` each), and the run stops on the refusal once ``extract`` next asks for the
finished files. A process that dies answers for the jobs it held with a problem naming it. The
processes leave when the worker closes their socket (or dies): they finish the file at hand
first, and leave without answering for it where the socket is gone. They ignore Ctrl-C: the
worker decides when to stop, and resume rewrites whatever it had not reported.

Run as ``python -m specshim.runner.in_worker.writer_processes FD``: FD is the process's end of its
socket pair with the worker.
"""

from __future__ import annotations

import math
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from specshim.runner import dataset, files
from specshim.runner.in_worker.checks import sample_problem
from specshim.runner.in_worker.protocol import Expected

#: Processes a worker starts: half the machine's cores, from one to eight.
WRITER_PROCESSES = max(1, min(8, (os.cpu_count() or 2) // 2))
#: Jobs one process holds at once; the rest wait in the worker for the least busy process.
#: The worker hands jobs out only when the engine calls it (once a step, on its own thread),
#: so between two steps the processes can write no more than they hold: enough for a step of
#: speculators' 32 requests with room to spare (with many short prompts a step can hold more:
#: those wait a step); the ring still bounds the bytes waiting. A job's token ids travel
#: through the socket (about 6 bytes a token): 16 jobs of long prompts can fill its buffer, and then
#: the worker waits for the process to take one, as it waits for ring room: only where the writers
#: are behind anyway.
DEPTH = 16
#: How long a process may take to start (import torch) before the worker gives up on it.
START_SECONDS = 300
#: What a process sends once it can take jobs.
READY = "ready"


@dataclass(frozen=True)
class WriteJob:
    """One sample to write: its file, and where its states lie in the ring."""

    key: int  # the ring span's start: unique while the job is out
    expected: Expected
    layer_ids: list[int]
    ring: tuple[str, int]  # the ring's file and size
    dtype: str  # "bfloat16"
    #: Each layer's ``(offset, shape)`` in the ring.
    places: list[tuple[int, tuple[int, ...]]]
    #: Offset of the layers' float32 largest magnitudes in the ring, where the worker computed
    #: them on the GPU; None: the process reads the states for its checks.
    largest_at: int | None = None


@dataclass(frozen=True)
class Written:
    """A process's answer for one job."""

    key: int
    path: str
    problem: str | None  # None: the file is in place
    skipped: bool = False  # not tried: this process had refused a sample before
    seconds: dict[str, float] = field(default_factory=dict)  # check, save, save_cpu


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    connection: Connection
    held: dict[int, str] = field(default_factory=dict)  # key -> path of the jobs out


class WriterProcesses:
    """The worker's side: start the processes, hand out jobs, collect their answers."""

    def __init__(self, count: int = WRITER_PROCESSES) -> None:
        if count < 1:
            raise ValueError(f"writer processes: expected at least 1, got {count}")
        self.count = count
        self._processes: list[_Process] = []
        self._lost_answers: list[Written] = []

    @property
    def out(self) -> int:
        """Jobs handed out and not answered yet."""
        return sum(len(p.held) for p in self._processes)

    def start(self) -> None:
        """Start the processes and return once each can take jobs. Each imports torch, which
        takes seconds, so the worker starts them when it is installed, in the engine's start,
        not at its first sample. A process that exits first, or takes longer than
        :data:`START_SECONDS`, is an error naming it."""
        if self._processes:
            return
        import specshim

        package_root = str(Path(specshim.__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        for _ in range(self.count):
            ours, theirs = socket.socketpair()
            popen = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            theirs.close()
            self._processes.append(_Process(popen, Connection(ours.detach())))
        for process in self._processes:
            try:
                if not process.connection.poll(START_SECONDS):
                    problem = f"did not start within {START_SECONDS} s"
                    process.popen.kill()
                elif (said := process.connection.recv()) == READY:
                    continue
                else:
                    problem = f"said {said!r} where {READY!r} was expected"
            except (EOFError, OSError):
                problem = (f"exited with code {process.popen.wait()} before it could take "
                           "samples (its error is above it, on stderr)")  # fmt: skip
            self.close()
            raise RuntimeError(f"worker writer: writer process {process.popen.pid} {problem}")

    def submit(self, job: WriteJob) -> bool:
        """Hand ``job`` to the least busy process; False when every one holds :data:`DEPTH`."""
        alive = [p for p in self._processes if p.popen.returncode is None]
        if not alive:
            raise RuntimeError("worker writer: every writer process has exited")
        process = min(alive, key=lambda p: len(p.held))
        if len(process.held) >= DEPTH:
            return False
        process.held[job.key] = job.expected.path
        try:
            process.connection.send(job)
        except OSError:  # it died since: answered at the next answers()
            self._lost_answers.extend(self._lost(process))
        return True

    def answers(self, timeout: float | None = 0) -> list[Written]:
        """The answers that came within ``timeout`` seconds (0: those already here; None: at
        least one, where jobs are out)."""
        holding = {p.connection: p for p in self._processes if p.held}
        found, self._lost_answers = self._lost_answers, []
        if found:
            timeout = 0
        for ready in wait(list(holding), timeout) if holding else []:
            process = holding[ready]  # type: ignore[index]
            try:
                while process.connection.poll():
                    answer: Written = process.connection.recv()
                    process.held.pop(answer.key)
                    found.append(answer)
            except (EOFError, OSError):
                found.extend(self._lost(process))
        return found

    def _lost(self, process: _Process) -> list[Written]:
        """``process`` died: an answer naming it for each job it held."""
        code = process.popen.wait()
        lost = [
            Written(key, path, f"writer process {process.popen.pid} exited with code {code} "
                               "before writing it")
            for key, path in process.held.items()
        ]  # fmt: skip
        process.held.clear()
        return lost

    def close(self) -> None:
        """Close the sockets; the processes leave once their file at hand is written."""
        for process in self._processes:
            process.connection.close()
        for process in self._processes:
            try:
                process.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.popen.kill()
        self._processes.clear()


# ---- the process's side ----------------------------------------------------------------------


def write(job: WriteJob, rings: dict[str, mmap.mmap]) -> Written:
    """Check ``job``'s sample and write its file from the ring (mapped once per ring file in
    ``rings``); the answer."""
    import torch

    seconds: dict[str, float] = {}
    path, size = job.ring
    if path not in rings:
        rings.clear()  # the worker grew the ring: the old one is no longer used
        with open(path, "r+b") as f:
            rings[path] = mmap.mmap(f.fileno(), size)
    memory = rings[path]
    dtype = getattr(torch, job.dtype)
    layers = [
        torch.frombuffer(memory, dtype=dtype, count=math.prod(shape), offset=offset).view(shape)
        for offset, shape in job.places
    ]
    largest = None
    if job.largest_at is not None:
        largest = torch.frombuffer(memory, dtype=torch.float32, count=len(layers),
                                   offset=job.largest_at)  # fmt: skip
    e = job.expected
    start = time.perf_counter()
    problem = sample_problem(e.where, job.layer_ids, layers, len(e.input_ids), largest)
    seconds["check"] = time.perf_counter() - start
    if problem is None:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            files.save_torch(Path(e.path), dataset.record(e.input_ids, layers, e.loss_mask))
        except Exception as exc:  # noqa: BLE001 a failed write, told to the worker
            problem = f"writing extracted samples failed: {exc}"
        seconds["save"] = time.perf_counter() - start
        seconds["save_cpu"] = time.thread_time() - cpu
    return Written(job.key, e.path, problem, seconds=seconds)


def serve(connection: Connection) -> None:
    """Write each job that comes until the worker closes the socket."""
    import torch
    from torch.utils.serialization import config

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    config.save.compute_crc32 = False  # see the module's docstring
    connection.send(READY)
    rings: dict[str, mmap.mmap] = {}
    refused = False
    while True:
        try:
            job: WriteJob = connection.recv()
        except (EOFError, OSError):
            return
        if refused:
            answer = Written(job.key, job.expected.path, None, skipped=True)
        else:
            try:
                answer = write(job, rings)
            except Exception as exc:  # noqa: BLE001 told to the worker, which stops the run
                answer = Written(job.key, job.expected.path,
                                 f"writer process {os.getpid()} failed: {exc!r}")  # fmt: skip
            refused = answer.problem is not None
        try:
            connection.send(answer)
        except OSError:  # the worker closed the socket while this file was written: it left
            return


if __name__ == "__main__":  # under its own name, so that what it sends unpickles in the worker
    from specshim.runner.in_worker import writer_processes

    writer_processes.serve(Connection(int(sys.argv[1])))
