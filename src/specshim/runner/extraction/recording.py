"""The extraction loop: batches to the backend, each file checked and recorded in the ledger
once it is in place, by this process or by vLLM's worker; Ctrl-C and SIGTERM end it in one
line, with what was written kept for the rerun."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files
from specshim.runner.extraction import options, resume
from specshim.runner.extraction.backends.base import Backend, WorkerFiles
from specshim.runner.in_worker.checks import sample_problem
from specshim.runner.in_worker.protocol import Expected, Report
from specshim.runner.progress import Progress


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, raised as Ctrl-C) during extraction; its message is the one line
    to show."""


def _checked_ids(
    result: dict[str, Any], sample: dataset.Sample, limit: int, layers: list[int]
) -> list[Any]:
    """The generator's per-layer states for ``sample``, once it returned the row's token ids
    and one state per token in every layer (the states themselves may have no columns: the
    ``worker`` hand-off checks those in the worker)."""
    ids = sample.input_ids[:limit]
    where = f"line {sample.line} ({resume.sample_file(sample)})"
    got = result["input_ids"].tolist()
    if got != ids:
        raise options.ExtractionError(
            f"{where}: the generator returned other input ids than the row's "
            f"({len(got)} vs {len(ids)} tokens): refusing to write misaligned data"
        )
    states = result["hidden_states"]
    if len(states) != len(layers):
        raise options.ExtractionError(
            f"{where}: {len(states)} layers of states for {len(layers)} ids"
        )
    for layer, state in zip(layers, states, strict=True):
        if state.shape[0] != len(ids):
            raise options.ExtractionError(
                f"{where}, layer {layer}: states for {state.shape[0]} tokens, the row has "
                f"{len(ids)}; refusing to write them"
            )
    return list(states)


def _checked(
    result: dict[str, Any], sample: dataset.Sample, limit: int, layers: list[int]
) -> dict[str, Any]:
    """The sample's record, once its states are what the row asks for: the same token ids,
    one state per token in every layer, finite, and not all zero (a layer vLLM did not
    really run, as with hybrid targets: speculators #613). Called on a writer thread, just
    before the file is written (:meth:`files.BackgroundWriter.submit`)."""
    states = _checked_ids(result, sample, limit, layers)
    where = f"line {sample.line} ({resume.sample_file(sample)})"
    if problem := sample_problem(where, layers, states, len(states[0])):
        raise options.ExtractionError(problem)
    return dataset.record(result["input_ids"], states, sample.loss_mask[:limit])


def run(
    backend: Backend,
    out: Path,
    todo: list[dataset.Sample],
    prints: list[str],
    samples: list[dataset.Sample],
    batch_size: int,
    limit: int,
    progress: bool,
) -> Progress:
    """Extract ``todo`` in batches; each file is recorded in the ledger once it is in place.

    Ctrl-C lets the writer finish what it was handed, then raises :class:`Interrupted`.
    """
    bar = Progress(total=len(todo), visible=progress)
    ledger = files.Ledger(out / resume.LEDGER)
    with _noting_ctrl_c() as pressed:
        try:
            with _writer(backend, ledger, out, prints, batch_size, limit) as writer:
                # timed from here, once vLLM and the writer have started (the worker hand-off
                # starts its writer processes in _writer: seconds, a cost of starting)
                bar.restart()
                for start in range(0, len(todo), batch_size):
                    batch = todo[start : start + batch_size]
                    writer.announce(batch)
                    writer.take(batch, backend.submit([s.input_ids for s in batch]))
                    bar.update(len(batch), sum(min(len(s.input_ids), limit) for s in batch))
            bar.update(0, 0)  # the last file is in place: the throughput counts the writing
        except Exception:
            if not pressed:
                raise
            raise _interrupted(ledger, len(samples) - len(todo), len(samples)) from None
        except KeyboardInterrupt:
            raise _interrupted(ledger, len(samples) - len(todo), len(samples)) from None
        finally:
            bar.finish()
    return bar


@dataclass
class _CallerWrites:
    """The states reach this process; :class:`files.BackgroundWriter` checks and writes them."""

    generator: Any
    writer: files.BackgroundWriter
    out: Path
    prints: list[str]
    limit: int

    def announce(self, batch: list[dataset.Sample]) -> None:
        """Nothing to tell anyone before the batch."""

    def take(self, batch: list[dataset.Sample], results: list[dict[str, Any]]) -> None:
        for sample, result in zip(batch, results, strict=True):
            check = functools.partial(
                _checked, result, sample, self.limit, self.generator.layer_ids
            )  # on a writer thread: the checks would hold this loop up
            self.writer.submit(
                self.out / resume.sample_file(sample), check, self.prints[sample.index]
            )


#: Prompts between two askings of the worker for the files it finished (and at the end): each
#: asking is an RPC to vLLM's worker, between two engine steps, so asking after every small
#: batch slows the engine (docs/benchmarks.md). A file not yet recorded when the run dies is
#: written again on resume; a sample the worker refused stops the run at the next asking, at
#: most this many prompts and a batch later.
RECORD_EVERY = 128


@dataclass
class _WorkerWrites:
    """vLLM's worker checks and writes the files (the generator backend's ``worker`` hand-off,
    :mod:`specshim.runner.in_worker.writer`, the native backend's connector,
    :mod:`specshim.runner.in_worker.connector`, or the engine backend's capture); this process
    checks what the generator returned and records the files the worker finished, every
    :data:`RECORD_EVERY` prompts and at the end."""

    generator: Any
    client: WorkerFiles
    ledger: files.Ledger
    out: Path
    prints: list[str]
    limit: int
    _pending: dict[str, dataset.Sample] = field(default_factory=dict)
    #: Files announced whose samples' generator results were not checked yet: the worker may
    #: write one before the check refuses it (other input ids than the row's), or before a
    #: failing run gets to check it; a run on its way out does not record those.
    _unchecked: set[str] = field(default_factory=set)
    _unasked: int = 0  # prompts taken since the worker was last asked for finished files

    def announce(self, batch: list[dataset.Sample]) -> None:
        expected = []
        for sample in batch:
            path = str(self.out / resume.sample_file(sample))
            self._pending[path] = sample
            self._unchecked.add(path)
            expected.append(Expected(
                path, sample.input_ids[: self.limit], sample.loss_mask[: self.limit],
                f"line {sample.line} ({resume.sample_file(sample)})",
            ))  # fmt: skip
        self.client.expect(expected)

    def take(self, batch: list[dataset.Sample], results: list[dict[str, Any]]) -> None:
        for sample, result in zip(batch, results, strict=True):
            _checked_ids(result, sample, self.limit, self.generator.layer_ids)
            self._unchecked.discard(str(self.out / resume.sample_file(sample)))
        self._unasked += len(batch)
        if self._unasked >= RECORD_EVERY:
            self._unasked = 0
            self.record(self.client.finished())

    def record(self, finished: list[Report], failed_ok: bool = False) -> None:
        """Record each file the worker put in place, then raise its first problem as this
        run's error (with ``failed_ok``, on the way out of a run already failing, passed
        over): the files finished beside a refused sample are kept for the rerun."""
        problems = []
        for path, problem in finished:
            sample = self._pending.pop(path)
            if problem is not None:
                problems.append(problem)
            elif path not in self._unchecked:
                self.ledger.record(Path(path), self.prints[sample.index])
        if problems and not failed_ok:
            raise options.ExtractionError(problems[0])

    def close(self) -> None:
        """Record every file the worker finished; an announced sample it never reported (vLLM
        ended its request before it ran: aborted) is this run's error, not a missing file in a
        run that says it succeeded."""
        self.record(self.client.finished(wait=True))
        if self._pending:
            sample = next(iter(self._pending.values()))
            raise options.ExtractionError(
                f"vLLM's worker never reported {len(self._pending)} announced samples, the "
                f"first line {sample.line} ({resume.sample_file(sample)}): run the same command to "
                "extract them"
            )


@contextlib.contextmanager
def _writer(
    backend: Backend,
    ledger: files.Ledger,
    out: Path,
    prints: list[str],
    batch_size: int,
    limit: int,
) -> Iterator[_CallerWrites | _WorkerWrites]:
    """Who writes the files: vLLM's worker where ``backend`` has it write them, else this
    process; on the way out, what was handed over is written (and recorded) before the caller
    goes on."""
    generator = backend.generator
    client = backend.worker_files()
    if client is None:
        with files.BackgroundWriter(depth=2 * batch_size, ledger=ledger) as background:
            yield _CallerWrites(generator, background, out, prints, limit)
        return
    writes = _WorkerWrites(generator, client, ledger, out, prints, limit)
    try:
        yield writes
    except BaseException:  # an error or Ctrl-C: keep the files the worker finished
        # First those finished already, then the rest: waiting also checks that every
        # announced sample was fetched, which a failed run's were not, and raises, dropping
        # the files it would have named (up to RECORD_EVERY prompts' worth, written again on
        # resume).
        for wait in (False, True):
            with contextlib.suppress(Exception):
                writes.record(client.finished(wait=wait), failed_ok=True)
        raise
    writes.close()


def _interrupted(ledger: files.Ledger, resumed: int, count: int) -> Interrupted:
    """The :class:`Interrupted` to raise after Ctrl-C, once the writer has finished: the
    samples done are those the ledger records (what a rerun keeps)."""
    done = len(ledger.entries())
    return Interrupted(
        f"interrupted after {done - resumed} samples ({done} of {count} done); "
        "run the same command to resume"
    )


@contextlib.contextmanager
def _noting_ctrl_c() -> Iterator[list[int]]:
    """Note each SIGINT, and each SIGTERM where a handler raises it (``specshim``'s command
    line raises it as ``KeyboardInterrupt``), then let the handler before act.

    Ctrl-C reaches vLLM's workers too, as a scheduler's SIGTERM to the whole job does, and a
    worker that exits first makes the generator's call fail with vLLM's own error
    ("cancelled") instead of ``KeyboardInterrupt``: an error after a noted signal is the
    interruption. Only the main thread can take signals; elsewhere nothing is noted.
    """
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    handlers: dict[int, Callable[[int, Any], Any]] = {}
    for noted in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(noted)
        if callable(handler):  # not the default action or ignored: nothing to note then
            handlers[noted] = handler

    def note(signum: int, frame: Any) -> None:
        pressed.append(signum)
        handlers[signum](signum, frame)

    for signum in handlers:
        signal.signal(signum, note)
    try:
        yield pressed
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
