"""Who extracts, chosen once into a :class:`Backend` and passed on.

``generator``: speculators' own generator, patched by specshim (:mod:`.generator`);
``native``: vLLM's own ``extract_hidden_states`` path (:mod:`.native`, vLLM >= 0.18);
``engine``: speculators' capture inside vLLM's own engine loop (:mod:`.engine`); ``auto``: one
of them from the matrix and the installed vLLM (:func:`specshim.report.choose_backend`). The
samples are the same each way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from specshim import console
from specshim.runner.extraction import options
from specshim.runner.extraction.backends import generator as generator_backend
from specshim.runner.extraction.backends.base import Backend, Launch

#: ``specshim extract --backend``.
BACKENDS = ("auto", "generator", "native", "engine")
#: The backends that run vLLM's ``LLM`` and whose files vLLM's worker writes.
IN_WORKER = ("native", "engine")


def checked_handoff(backend: str, handoff: str, tensor_parallel_size: int) -> str:
    """Refuse a ``--backend`` outside :data:`BACKENDS`, or a generator's hand-off with a
    backend that writes in vLLM's worker (dropped silently, the user would measure a hand-off
    that never ran); the hand-off ``--handoff`` means here."""
    if backend not in BACKENDS:
        raise options.ExtractionError(
            f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if handoff in generator_backend.FOR_GENERATOR and backend in IN_WORKER:
        raise options.ExtractionError(
            f"--handoff {handoff} is how speculators' generator hands its states over; the "
            f"{backend} backend writes in vLLM's worker: leave --handoff out, or ask for "
            "--backend generator"
        )
    try:
        return generator_backend.choose(handoff, tensor_parallel_size)
    except ValueError as exc:
        raise options.ExtractionError(str(exc)) from None


def engine_unfit(tensor_parallel_size: int) -> str | None:
    """Why ``--backend auto`` may not take the engine backend for these options, or None: it
    is measured on one GPU only."""
    if tensor_parallel_size > 1:
        return (f"--tensor-parallel-size {tensor_parallel_size}: it is measured on one GPU "
                "only")  # fmt: skip
    return None


def choose_name(
    backend: str, tensor_parallel_size: int = 1, handoff: str = "auto"
) -> tuple[str, str]:
    """The backend to run and why: as asked, or for ``auto`` what the matrix and the
    installed vLLM support, the engine backend only where :func:`engine_unfit` allows (told
    on stderr before vLLM starts, and in the summary). ``native`` where vLLM cannot run it
    here is refused before vLLM starts, saying why. ``--handoff rpc`` is how speculators'
    generator hands its states to this process, so with ``auto`` it chooses the generator."""
    from specshim import report

    if backend == "native" and not (native := report.native_here()).available:
        raise options.ExtractionError(f"--backend native: {native.detail}")
    if backend != "auto":
        return backend, "asked for"
    if handoff in generator_backend.FOR_GENERATOR:
        choice = report.BackendChoice(
            "generator", f"--handoff {handoff} asked for, a hand-off of speculators' generator"
        )
    else:
        choice = report.choose_backend(engine_unfit(tensor_parallel_size))
    why = f"auto: {choice.reason}"
    console.status("specshim", f"extraction backend: {choice.backend} ({why})")
    return choice.backend, why


def choose(backend: str, tensor_parallel_size: int, asked_handoff: str, handoff: str) -> Backend:
    """The one :class:`Backend` this run uses (:func:`choose_name`); ``handoff``: the
    generator's, as :func:`checked_handoff` gave it."""
    name, why = choose_name(backend, tensor_parallel_size, asked_handoff)
    if name == "native":
        from specshim.runner.extraction.backends.native import NativeBackend

        return NativeBackend(why)
    if name == "engine":
        from specshim.runner.extraction.backends.engine import EngineBackend

        return EngineBackend(why)
    return generator_backend.GeneratorBackend(why, handoff)


@contextlib.contextmanager
def running(backend: Backend, launch: Launch) -> Iterator[Any]:
    """``backend`` started (its generator), with vLLM shut down on the way out: the
    generator's own ``__del__`` would do it at interpreter exit, when its logger is already
    gone. A start that fails is one line; vLLM's log above it has the details. vLLM runs the
    model's own code only with ``trust_remote_code``. vLLM's executor leaves this process's
    torch on one thread, and so it stays: OpenMP threads here would compete with vLLM's
    worker and the writers."""
    try:
        generator = backend.start(launch)
    except Exception as exc:  # whatever vLLM raised: the user gets its first line
        raise options.ExtractionError(
            f"vLLM could not start {launch.model}: {console.first_line(exc)}"
        ) from exc
    try:
        yield generator
    finally:
        backend.close()
