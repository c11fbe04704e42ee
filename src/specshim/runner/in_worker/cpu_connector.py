"""vLLM's hidden-states connector on vLLM's CPU backend: its CUDA calls (a copy stream,
events, pinned memory) get a CPU stand-in in the worker, without which the first write fails
(``pin_memory=True requires a CUDA or other accelerator backend``). Mixed into the native
backend's workers only (``worker_extension_cls``).
"""

from __future__ import annotations

import contextlib
from typing import Any

#: vLLM's writer of the native path, in the worker.
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


class _CompletedEvent:
    """``torch.cuda.Event`` on the CPU: the copy it marks ran synchronously."""

    def record(self, stream: Any = None) -> None:
        """Nothing to record: the copy is already done."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""


class _CpuStream:
    """``torch.cuda.Stream`` on the CPU: one ordered stream of work, the caller's."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for."""


class _CpuCuda:
    """What the connector takes from ``torch.cuda``, for vLLM's CPU backend."""

    Event = _CompletedEvent
    Stream = _CpuStream

    @staticmethod
    def stream(stream: Any) -> contextlib.nullcontext[None]:
        """The caller's stream is the only one."""
        return contextlib.nullcontext()


def _cpu_torch() -> Any:
    """``torch`` for the connector module on the CPU: its own ``cuda`` stand-in, and
    ``empty_like`` without ``pin_memory``; everything else is torch itself."""
    import torch

    from specshim.adapters.kit import Proxy

    class CpuTorch(Proxy):
        cuda = _CpuCuda

        def empty_like(self, tensor: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return torch.empty_like(tensor, **kwargs)

    return CpuTorch(torch)


class CpuConnectorExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``) by :class:`NativeGenerator`."""

    def specshim_cpu_connector(self) -> bool:
        """On vLLM's CPU backend, give the connector module the CPU stand-in; True if it did.

        The connector reads ``torch`` from its module's globals at each write, so replacing
        that one name covers every CUDA call it makes, and only in this engine's workers.
        """
        import importlib

        from vllm.platforms import current_platform

        from specshim import patches
        from specshim.adapters.model import Patch

        if not current_platform.is_cpu():
            return False
        connector = importlib.import_module(CONNECTOR)
        patches.apply("cpu_connector", [Patch(connector, "torch", _cpu_torch())])
        return True
