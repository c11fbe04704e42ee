"""What every backend is: the :class:`Backend` protocol, what it starts vLLM with, and the
part the three share (:class:`Started`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from specshim.runner.extraction import options
from specshim.runner.in_worker.protocol import Expected, Report


@dataclass(frozen=True)
class Launch:
    """What every backend starts vLLM with."""

    model: str
    layers: list[int]
    max_model_len: int
    tensor_parallel_size: int
    out: Path
    engine: options.EngineSettings
    trust_remote_code: bool = False


class WorkerFiles(Protocol):
    """The caller's handle on the files vLLM's worker writes: announce, then collect."""

    def expect(self, batch: list[Expected]) -> None:
        """The next ``generate`` is for ``batch``, in input order."""

    def finished(self, wait: bool = False) -> list[Report]:
        """The files finished since the last call; with ``wait``, once every one is."""


class Backend(Protocol):
    """One way to extract: :meth:`start` vLLM, :meth:`submit` each batch, ask vLLM's worker
    for the :meth:`finished` files where it writes them (:meth:`worker_files`), :meth:`close`.
    ``generator`` has speculators' generator's interface once started (``generate``,
    ``layer_ids``, ``vllm_config``); ``handoff`` says how the states left vLLM's worker."""

    name: str
    why: str
    generator: Any

    @property
    def handoff(self) -> str:
        """How the states leave vLLM's worker, as the summary says it."""

    def start(self, launch: Launch) -> Any:
        """Start vLLM; the generator."""

    def worker_files(self) -> WorkerFiles | None:
        """The files vLLM's worker writes, or None where this process writes them."""

    def submit(self, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """One record per prompt (its token ids and per-layer states)."""

    def finished(self, wait: bool = False) -> list[Report]:
        """The files vLLM's worker finished since the last call."""

    def recomputed(self) -> int:
        """Prompts vLLM preempted part-way and computed again."""

    def close(self) -> None:
        """Shut vLLM down."""


class Started:
    """What the backends share once vLLM runs: ``submit`` is the generator's ``generate``,
    ``finished`` asks :meth:`worker_files`; nothing recomputed unless a backend says so."""

    generator: Any = None

    def worker_files(self) -> WorkerFiles | None:
        """None: this process writes the files (a backend whose worker writes says so)."""
        return None

    def submit(self, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """One record per prompt, from the generator."""
        return self.generator.generate(prompts)  # type: ignore[no-any-return]

    def finished(self, wait: bool = False) -> list[Report]:
        """The files vLLM's worker finished since the last call (none where it writes none)."""
        files = self.worker_files()
        return [] if files is None else files.finished(wait)

    def recomputed(self) -> int:
        """Prompts vLLM preempted part-way and computed again (the engine backend counts)."""
        return 0
