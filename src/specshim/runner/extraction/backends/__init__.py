"""Who extracts: speculators' generator, vLLM's native path or speculators' capture in vLLM's
engine loop; chosen once, started and shut down here."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import engine_loop, native
from specshim.runner import handoff as handoffs
from specshim.runner.extraction import options

#: Who writes the native backend's files (the summary names it): vLLM's worker, through
#: specshim's connector, where the installed vLLM allows it; else this process, from the
#: connector's own files (:func:`specshim.runner.native.writes_in_worker`).
NATIVE_IN_WORKER = "vLLM's worker, through specshim's hidden-states connector"


NATIVE_READ_BACK = "the files of vLLM's hidden-states connector"


#: Who writes the engine backend's files (:mod:`specshim.runner.engine_loop`).
ENGINE_IN_WORKER = "vLLM's worker, inside vLLM's engine loop"


def engine_unfit(tensor_parallel_size: int) -> str | None:
    """Why ``--backend auto`` may not take the engine backend for these options, or None: it
    is measured on one GPU only."""
    if tensor_parallel_size > 1:
        return (f"--tensor-parallel-size {tensor_parallel_size}: it is measured on one GPU "
                "only")  # fmt: skip
    return None


def choose(backend: str, tensor_parallel_size: int = 1, handoff: str = "auto") -> tuple[str, str]:
    """The backend to run and why: as asked, or for ``auto`` what the matrix and the
    installed vLLM support, the engine backend only where :func:`_engine_unfit` allows (told
    on stderr before vLLM starts, and in the summary). ``native`` where vLLM cannot run it
    here is refused before vLLM starts, saying why. ``--handoff rpc`` is how
    speculators' generator hands its states to this process, so with ``auto`` it chooses the
    generator (``extract`` refuses them with the backends that write in vLLM's worker):
    dropped silently, the user would measure or debug a hand-off that never ran."""
    from specshim import report

    if backend == "native" and not (native := report.native_here()).available:
        raise options.ExtractionError(f"--backend native: {native.detail}")
    if backend != "auto":
        return backend, "asked for"
    if handoff in handoffs.FOR_GENERATOR:
        choice = report.BackendChoice(
            "generator", f"--handoff {handoff} asked for, a hand-off of speculators' generator"
        )
    else:
        choice = report.choose_backend(engine_unfit(tensor_parallel_size))
    why = f"auto: {choice.reason}"
    console.status("specshim", f"extraction backend: {choice.backend} ({why})")
    return choice.backend, why


@contextlib.contextmanager
def start(
    model: str,
    layers: list[int],
    max_model_len: int,
    tensor_parallel_size: int,
    handoff: str = "rpc",
    backend: str = "generator",
    out: Path | None = None,
    engine: options.EngineSettings = options.EngineSettings(),
    trust_remote_code: bool = False,
) -> Iterator[Any]:
    """speculators' generator (or, with ``backend="native"``, vLLM's own path behind its
    interface; with ``"engine"``, speculators' capture in vLLM's own engine loop), with vLLM
    shut down on the way out. vLLM runs the model's own code only with ``trust_remote_code``
    (speculators' generator takes it from :func:`remote_code.in_speculators`, around this).

    The generator's own ``__del__`` would do it at interpreter exit, when its logger is
    already gone. Its states leave the worker the ``handoff`` way
    (:mod:`specshim.runner.handoff`); the native path's connector writes its files under
    ``out`` and they are removed as they are read. A start that fails is one line; vLLM's
    log above it has the details. vLLM's executor leaves this process's torch on one thread,
    and so it stays: OpenMP threads here would compete with vLLM's worker and the writers.
    """

    def start() -> Any:
        if backend == "native":
            return native.NativeGenerator(
                model, layers, max_model_len, tensor_parallel_size, work, engine.options(),
                trust_remote_code,
            )  # fmt: skip
        if backend == "engine":
            return engine_loop.EngineGenerator(
                model, layers, max_model_len, tensor_parallel_size, engine.options(),
                trust_remote_code,
            )  # fmt: skip
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        with engine.for_speculators():
            return VllmHiddenStatesGenerator(
                model,
                layer_ids=layers,
                max_model_len=max_model_len,
                tensor_parallel_size=tensor_parallel_size,
                **engine.memory(),
            )

    work = (out or Path(".")) / ".specshim-native"
    try:
        generator = start()
    except Exception as exc:  # whatever vLLM raised: the user gets its first line
        raise options.ExtractionError(
            f"vLLM could not start {model}: {console.first_line(exc)}"
        ) from exc
    try:
        yield generator
    finally:
        if backend in ("native", "engine"):
            generator.shutdown()
            shutil.rmtree(work, ignore_errors=True)
        else:
            generator.executor.shutdown()
            del generator.executor
