"""Hand the captured hidden states from vLLM's worker to the caller through CUDA IPC.

speculators' generator fetches each batch's states with
``collective_rpc("_get_captured_states")``: the worker's GPU tensors are copied to the host,
pickled through vLLM's message queue and unpickled in the caller. Measured on an H200 (1.1 B
Llama, CUDA vLLM 0.26.0), that RPC took 9.1 of 10.5 s, holding extraction to 0.045 of vLLM's
prefill. With :func:`share_through_cuda_ipc` the worker replies with CUDA IPC handles instead
(``torch.multiprocessing``'s own reduction), the caller maps the worker's memory without a
copy, and the generator's slicing and ``.cpu()`` read it straight from the GPU. The tensors
are the worker's own, so the data is bit for bit what the RPC path delivers. Measured on the
H200 (16 x 2048 Llama, 512 x 512 tokens, docs/benchmarks.md section 6): the generator 5.7 times
faster, ``specshim extract``'s 512 files equal the RPC path's tensor for tensor.

Each worker keeps the batch it shared alive until its next ``_get_captured_states``; the
generator has copied every sample to the host before it asks again. Scoped to one generator:
nothing is patched, the worker objects of that generator get an instance attribute.
``specshim extract`` uses it on one CUDA device (:func:`choose`); a user of the generator
opts in with :func:`share_through_cuda_ipc`.
"""

from __future__ import annotations

from typing import Any

#: The worker attribute that holds the last batch it shared. Kept until the next fetch (the
#: generator has copied every sample to the host by then), so the caller's mapping never
#: depends on torch's bookkeeping of freed IPC blocks; costs one batch of states on the GPU.
_KEPT = "_specshim_shared_states"


class _SharedCudaTensor:
    """Pickles as a CUDA IPC handle; unpickles as a tensor on the worker's memory."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(self.tensor)


def shareable(states: Any) -> Any:
    """``states`` in the shape the generator expects, every tensor replaced by its IPC handle.

    speculators 0.3.0's worker replies with one tensor per layer (a list), 0.4.x with a dict
    of request id to that list; ``None`` means nothing was captured. Another shape raises
    ``TypeError`` naming it, since the generator could not read a reply of that shape either.
    """
    if states is None:
        return None
    if isinstance(states, list):
        return [_SharedCudaTensor(t) for t in states]
    if isinstance(states, dict):
        return {key: shareable(layers) for key, layers in states.items()}
    raise TypeError(
        "CUDA IPC hand-off: expected the worker's captured states as a list of per-layer "
        f"tensors or a dict of request id to such a list, found {type(states).__name__}"
    )


def _install(worker: Any) -> bool:
    """Run in each vLLM worker: make ``_get_captured_states`` reply with IPC handles."""
    fetch = worker._get_captured_states

    def shared() -> Any:
        states = fetch()
        setattr(worker, _KEPT, states)
        return shareable(states)

    worker._get_captured_states = shared
    return True


#: How the states may leave the worker: ``auto`` picks ``ipc`` on one CUDA device (measured on
#: the H200: 5.7 times the RPC path's speed, the same files bit for bit) and ``rpc``
#: (speculators' own way) elsewhere; on the CPU the RPC path is near the engine's speed.
CHOICES = ("auto", "rpc", "ipc")


def choose(handoff: str, tensor_parallel_size: int = 1) -> str:
    """``rpc`` or ``ipc`` for the option ``handoff``; a name outside :data:`CHOICES`, or
    ``ipc`` where torch sees no CUDA device, is refused with one line (``ValueError``).

    ``auto`` keeps the RPC path under tensor parallelism: every rank's worker would share
    its memory with this process, which is not yet measured (ask for ``ipc`` to try it).
    Asks torch, not vLLM, so that it runs before vLLM's settings are chosen.
    """
    from specshim import hardware

    if handoff not in CHOICES:
        raise ValueError(f"--handoff must be one of {', '.join(CHOICES)}, got {handoff!r}")
    on_cuda = hardware.detect().kind == "cuda"
    if handoff == "ipc" and not on_cuda:
        raise ValueError("--handoff ipc needs vLLM on a CUDA device; use rpc here")
    if handoff == "auto":
        return "ipc" if on_cuda and tensor_parallel_size == 1 else "rpc"
    return handoff


def share_through_cuda_ipc(generator: Any) -> None:
    """Switch ``generator``'s workers to the IPC hand-off (see the module docstring)."""
    generator.executor.collective_rpc(_install)
