"""Hand the captured hidden states from vLLM's worker to the caller through CUDA IPC.

speculators' generator fetches each batch's states with
``collective_rpc("_get_captured_states")``: the worker's GPU tensors are copied to the host,
pickled through vLLM's message queue and unpickled in the caller. Measured on an H200 (1.1 B
Llama, CUDA vLLM 0.26.0), that RPC took 9.1 of 10.5 s, holding extraction to 0.045 of vLLM's
prefill. With :func:`share_through_cuda_ipc` the worker replies with CUDA IPC handles instead
(``torch.multiprocessing``'s own reduction), the caller maps the worker's memory without a
copy, and the generator's slicing and ``.cpu()`` read it straight from the GPU. The tensors
are the worker's own, so the data is bit for bit what the RPC path delivers.

Each worker keeps the batch it shared alive until its next ``_get_captured_states``; the
generator has copied every sample to the host before it asks again. Opt-in and scoped to one
generator: nothing is patched, the worker objects of that generator get an instance attribute.
"""

from __future__ import annotations

from typing import Any

#: The worker attribute that holds the last shared batch (so its memory stays mapped).
_KEPT = "_specshim_shared_states"


class _SharedCudaTensor:
    """Pickles as a CUDA IPC handle; unpickles as a tensor on the worker's memory."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(self.tensor)


def _install(worker: Any) -> bool:
    """Run in each vLLM worker: make ``_get_captured_states`` reply with IPC handles."""
    fetch = worker._get_captured_states

    def shared() -> list[_SharedCudaTensor] | None:
        states = fetch()
        setattr(worker, _KEPT, states)
        if states is None:
            return None
        return [_SharedCudaTensor(t) for t in states]

    worker._get_captured_states = shared
    return True


#: How the states may leave the worker: ``auto`` is IPC where vLLM runs on a CUDA device.
CHOICES = ("auto", "rpc", "ipc")


def _on_cuda() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def use_ipc(handoff: str) -> bool:
    """Decide, before vLLM starts, whether ``handoff`` means the IPC path here.

    Raises ``ValueError`` (one line) for a name not in :data:`CHOICES`, or for ``"ipc"`` where
    vLLM does not run on a CUDA device: there is no IPC handle to share, and the RPC path stays
    (on the CPU it is near the engine's speed).
    """
    if handoff not in CHOICES:
        raise ValueError(f"--handoff must be one of {', '.join(CHOICES)}, got {handoff!r}")
    if handoff == "rpc":
        return False
    if _on_cuda():
        return True
    if handoff == "ipc":
        raise ValueError("--handoff ipc needs vLLM on a CUDA device; use auto or rpc here")
    return False


def share_through_cuda_ipc(generator: Any) -> None:
    """Switch ``generator``'s workers to the IPC hand-off (see the module docstring)."""
    generator.executor.collective_rpc(_install)
