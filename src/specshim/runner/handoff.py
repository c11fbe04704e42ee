"""How the states leave vLLM's worker under the generator backend (``--handoff``), and the
shared host buffer the ``worker`` hand-off's ring lives in.

``rpc`` is speculators' own: ``collective_rpc("_get_captured_states")`` pickles the worker's
states to the caller. ``worker`` keeps them in the worker, which writes the files itself
(:mod:`specshim.runner.worker_writer`). :func:`choose` turns the option into one of them.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: ``specshim extract --handoff``; ``auto`` picks ``worker`` on one CUDA device and ``rpc``
#: elsewhere.
CHOICES = ("auto", "rpc", "worker")
#: The hand-off that reaches the caller, as speculators' generator itself hands states over.
FOR_GENERATOR = ("rpc",)
#: Where the buffers live: a tmpfs another process can map.
SHARED_MEMORY = Path("/dev/shm")
#: Each buffer's name: the worker's process id, then a counter (a grown buffer is a new file).
BUFFER_PREFIX = "specshim-states-"
#: Every tensor starts at a multiple of this many bytes in the buffer (any dtype's alignment).
ALIGNMENT = 64


def each_tensor(states: Any, change: Callable[[Any], Any]) -> Any:
    """``states`` in the shape the generator expects, every tensor replaced by ``change(t)``.

    speculators 0.3.0's worker replies with one tensor per layer (a list), 0.4.x with a dict
    of request id to that list; ``None`` means nothing was captured. Another shape raises
    ``TypeError`` naming it, since the generator could not read a reply of that shape either.
    """
    if states is None:
        return None
    if isinstance(states, list):
        return [change(t) for t in states]
    if isinstance(states, dict):
        return {key: each_tensor(layers, change) for key, layers in states.items()}
    raise TypeError(
        "state hand-off: expected the worker's captured states as a list of per-layer "
        f"tensors or a dict of request id to such a list, found {type(states).__name__}"
    )


# ---- one shared host buffer ------------------------------------------------------------------


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT`."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _map(path: Path, size: int) -> Any:
    """A uint8 tensor over the first ``size`` bytes of the file at ``path``, mapped shared."""
    import torch

    with path.open("r+b") as f:
        memory = mmap.mmap(f.fileno(), size)
    return torch.frombuffer(memory, dtype=torch.uint8)


#: Numbers the buffers of this process (a grown buffer is a new file).
_BUFFERS_MADE = itertools.count()


class HostBuffer:
    """One file in :data:`SHARED_MEMORY`, mapped, reused and replaced by a larger one when
    more is asked for; another process maps the same file by its path.

    Its pages are reserved when it is made (``posix_fallocate``), so a full ``/dev/shm`` (64 MB
    in a default Docker container) is an ``OSError`` here, not a bus error mid-copy. On a CUDA
    device it is page-locked (``cudaHostRegister``), which makes the device-to-host copy one
    DMA burst; where that fails the copy is merely slower.
    """

    def __init__(self, directory: Path = SHARED_MEMORY) -> None:
        self.directory = directory
        self.path: Path | None = None
        self.size = 0
        self.pinned = False
        self.memory: Any = None

    def hold(self, nbytes: int, cuda: bool) -> Any:
        """The buffer, at least ``nbytes`` long (grown by half at least, to whole MiB)."""
        if nbytes <= self.size:
            return self.memory
        size = aligned(max(nbytes, self.size * 3 // 2, 1)) + (1 << 20) - 1
        size -= size % (1 << 20)
        self.release()
        path = self.directory / f"{BUFFER_PREFIX}{os.getpid()}-{next(_BUFFERS_MADE)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            os.close(fd)
            path.unlink()
            raise
        os.close(fd)
        self.memory, self.path, self.size = _map(path, size), path, size
        self.pinned = cuda and self._pin()
        return self.memory

    def _pin(self) -> bool:
        import torch

        register = getattr(torch.cuda.cudart(), "cudaHostRegister", None)
        return register is not None and int(register(self.memory.data_ptr(), self.size, 0)) == 0

    def release(self) -> None:
        """Unmap the buffer (unregistered first where page-locked) and remove its file."""
        if self.pinned:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self.memory.data_ptr())
        if self.path is not None:
            self.path.unlink(missing_ok=True)
        self.memory, self.path, self.size, self.pinned = None, None, 0, False


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
