"""The engine backend's side in vLLM's worker: speculators' capture, routed per step to
:class:`specshim.runner.in_worker.capture.StepCapture`.

Its own module because it subclasses speculators' worker extension: only vLLM's worker
processes import it (``worker_extension_cls``), once specshim's adapters are applied there.
"""

from __future__ import annotations

import io
from typing import Any

from speculators.data_generation.custom_worker import HiddenStatesWorkerExtension

from specshim import patches
from specshim.adapters.model import Patch
from specshim.runner.in_worker.capture import StepCapture
from specshim.runner.in_worker.protocol import Report
from specshim.runner.in_worker.writer import WorkerFiles, on_cuda


class EngineCapture(HiddenStatesWorkerExtension):  # type: ignore[misc]  # speculators: untyped
    """Mixed into vLLM's worker by
    :class:`specshim.runner.extraction.backends.engine.EngineGenerator`; its methods run through
    ``LLM.collective_rpc``."""

    def specshim_engine_install(self, layers: list[int]) -> bool:
        """Set up speculators' capture of ``layers`` (every rank runs the same forward); on
        rank 0, route each step's states to a :class:`StepCapture`. True where installed."""
        from vllm.distributed import get_tp_group

        self._setup_hidden_states_capture(layers)
        if get_tp_group().rank_in_group != 0:  # speculators' forward captures nothing here
            return False
        runner = self.model_runner
        writer = WorkerFiles(layers)
        writer.start(on_cuda(self))
        capture = StepCapture(runner, writer)
        execute = runner.execute_model

        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            capture.schedule(scheduler_output)
            return execute(scheduler_output, *args, **kwargs)

        patches.apply("engine_capture", [
            Patch(runner, "execute_model", execute_model),
            Patch(self, "_store_captured_states", capture.store),  # speculators' forward calls it
        ])  # fmt: skip
        self._specshim_capture = capture
        return True

    def specshim_engine_uninstall(self) -> None:
        """Undo :meth:`specshim_engine_install`'s patches: :mod:`specshim.patches` would
        otherwise keep the worker and its runner (weights, KV cache) alive after the engine
        closes, where the worker runs in the calling process (vLLM's CPU backend)."""
        patches.undo("engine_capture")

    def specshim_engine_finished(self, wait: bool) -> list[Report] | None:
        """The files written since the last call (rank 0; None elsewhere)."""
        capture: StepCapture | None = getattr(self, "_specshim_capture", None)
        return None if capture is None else capture.finished(wait)

    def specshim_engine_kept(self, tags: list[str]) -> bytes | None:
        """The states kept for ``tags``, removed from the worker, as ``torch.save``'s bytes
        (vLLM's RPC hands tensors in a reply over as its own raw triples) (rank 0; None
        elsewhere)."""
        import torch

        capture: StepCapture | None = getattr(self, "_specshim_capture", None)
        if capture is None:
            return None
        buffer = io.BytesIO()
        torch.save([capture.kept.pop(t) for t in tags], buffer)
        return buffer.getvalue()

    def specshim_engine_state(self) -> dict[str, Any] | None:
        """Where the writer's time went (:meth:`WorkerFiles.describe`), and how many prompts
        were computed again after a preemption (rank 0; None elsewhere)."""
        capture: StepCapture | None = getattr(self, "_specshim_capture", None)
        if capture is None:
            return None
        return capture.writer.describe("engine") | {"recomputed": capture.recomputed}
