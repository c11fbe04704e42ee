"""``specshim extract --backend generator``: speculators' own generator, patched by specshim,
and how its states leave vLLM's worker (``--handoff``).

``rpc`` is speculators' own: ``collective_rpc("_get_captured_states")`` pickles the worker's
states to the caller, which writes the files. ``worker`` keeps them in the worker, which writes
the files itself (:mod:`specshim.runner.in_worker.writer`); this process announces each batch
and records what the worker reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specshim.runner.extraction.backends.base import Started
from specshim.runner.in_worker.protocol import Expected, Report, rank0
from specshim.runner.in_worker.writer import expect_in_worker, finished_in_worker, install_in_worker

if TYPE_CHECKING:
    from specshim.runner.extraction.backends.base import Launch

#: ``specshim extract --handoff``; ``auto`` picks ``worker`` on one CUDA device and ``rpc``
#: elsewhere.
CHOICES = ("auto", "rpc", "worker")
#: The hand-off that reaches the caller, as speculators' generator itself hands states over.
FOR_GENERATOR = ("rpc",)


def choose(handoff: str, tensor_parallel_size: int = 1) -> str:
    """``rpc`` or ``worker`` for the option ``handoff``; a name outside :data:`CHOICES` is
    refused with one line (``ValueError``).

    ``auto`` keeps the RPC path under tensor parallelism and on the CPU. Asks torch, not
    vLLM, so that it runs before vLLM's settings are chosen.
    """
    from specshim import hardware

    if handoff not in CHOICES:
        raise ValueError(f"--handoff must be one of {', '.join(CHOICES)}, got {handoff!r}")
    if handoff == "auto":
        on_cuda = hardware.detect().kind == "cuda"
        return "worker" if on_cuda and tensor_parallel_size == 1 else "rpc"
    return handoff


class WorkerFilesClient:
    """The caller's handle on the worker's writer: announce batches, collect finished files."""

    def __init__(self, generator: Any, layers: list[int]) -> None:
        self.generator = generator
        if not any(generator.executor.collective_rpc(install_in_worker, args=(layers,))):
            raise RuntimeError("worker writer: no vLLM worker of rank 0 took the hand-off")

    def expect(self, batch: list[Expected]) -> None:
        """Announce ``batch`` to the worker, before the ``generate`` that extracts it."""
        self.generator.executor.collective_rpc(expect_in_worker, args=(batch,))

    def finished(self, wait: bool = False) -> list[Report]:
        """:meth:`~specshim.runner.in_worker.writer.WorkerFiles.finished` of the worker."""
        return rank0(self.generator.executor.collective_rpc(finished_in_worker, args=(wait,))) or []


@dataclass
class GeneratorBackend(Started):
    """speculators' ``VllmHiddenStatesGenerator``, its states handed over the ``how`` way:
    ``rpc`` (this process writes the files) or ``worker`` (vLLM's worker writes them)."""

    why: str
    how: str = "rpc"
    name: str = "generator"
    generator: Any = None
    _files: WorkerFilesClient | None = None

    @property
    def handoff(self) -> str:
        """The hand-off, as ``--handoff`` names it."""
        return self.how

    def start(self, launch: Launch) -> Any:
        """speculators' generator, with the engine steps and memory fraction asked for."""
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        engine = launch.engine
        with engine.for_speculators():
            self.generator = VllmHiddenStatesGenerator(
                launch.model,
                layer_ids=launch.layers,
                max_model_len=launch.max_model_len,
                tensor_parallel_size=launch.tensor_parallel_size,
                **engine.memory(),
            )
        return self.generator

    def worker_files(self) -> WorkerFilesClient | None:
        """With the ``worker`` hand-off, the worker's writer (installed at the first call:
        its writer processes start then)."""
        if self.how != "worker":
            return None
        if self._files is None:
            self._files = WorkerFilesClient(self.generator, self.generator.layer_ids)
        return self._files

    def close(self) -> None:
        """Shut down vLLM's executor."""
        self.generator.executor.shutdown()
        del self.generator.executor
