"""Hand the captured hidden states from vLLM's worker to the caller without pickling them.

speculators' generator fetches each batch's states with
``collective_rpc("_get_captured_states")``: the worker's tensors are copied to the host,
pickled through vLLM's message queue and unpickled in the caller. On a GPU that RPC takes
most of an extraction's time, holding it to a small fraction of vLLM's prefill. :func:`use` switches
one generator's worker to another reply, of the same shape:

``ipc``
    CUDA IPC handles (``torch.multiprocessing``'s own reduction): the caller maps the worker's
    GPU memory without a copy, and the generator's ``.clone().cpu()`` reads it from the GPU,
    one sample and layer at a time. The worker keeps one batch of states more on the GPU.
``shm``
    Shared host memory: the worker copies the whole batch into one file in ``/dev/shm``
    (page-locked on a CUDA device, so the copy is one DMA burst), and replies with offsets;
    the caller maps the same file once and the generator's copies are host memory copies.
    Nothing stays on the GPU, and it works on the CPU and without CUDA IPC.

On a GPU both are several times faster than the RPC (docs/benchmarks.md); what is left is the
generator's own per-sample copies in the caller, which the ``worker`` hand-off
(:mod:`specshim.runner.worker_writer`) avoids for extract.
On vLLM's CPU worker (128-wide model) the RPC is a few percent of the time, and ``shm`` saves
part of it.
Either way the tensors are the worker's own, so the data is bit for bit what the RPC path
delivers (tests/e2e/test_extraction.py on vLLM's CPU worker, tests/gpu on a GPU).

Contract: the worker keeps what it shared until its next ``_get_captured_states``; the
generator has cloned every sample by then (both speculators releases do). Scoped to one
generator and to the worker that replies (rank 0): nothing is patched, that worker object gets
an instance attribute. ``specshim extract`` picks one with :func:`choose`; a user of the
generator opts in with ``handoff.use(generator, "shm")``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: ``specshim extract --handoff``: these, and ``worker`` (:mod:`specshim.runner.worker_writer`:
#: the states stay in the worker, which writes the files); ``auto`` picks ``worker`` on one
#: CUDA device (the fastest there: docs/benchmarks.md) and ``rpc``
#: (speculators' own way) elsewhere.
CHOICES = ("auto", "rpc", "ipc", "shm", "worker")
#: The hand-offs :func:`use` offers a caller of the generator (``worker`` writes extract's files).
FOR_GENERATOR = ("rpc", "ipc", "shm")
#: Where the ``shm`` buffers live: a tmpfs, so "writing" them is filling memory.
SHARED_MEMORY = Path("/dev/shm")
#: Each buffer's name: the worker's process id, then a counter (a grown buffer is a new file).
BUFFER_PREFIX = "specshim-states-"
#: Every tensor starts at a multiple of this many bytes in the buffer (any dtype's alignment).
ALIGNMENT = 64

#: The worker attribute holding what it shared by CUDA IPC last, alive until the next fetch.
_KEPT = "_specshim_shared_states"
#: The worker attribute holding its :class:`WorkerHandoff`.
_STATE = "_specshim_handoff"


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


def _tensors(states: Any) -> list[Any]:
    """The tensors of a reply, in :func:`each_tensor`'s order."""
    found: list[Any] = []
    each_tensor(states, found.append)
    return found


# ---- ipc: CUDA IPC handles ------------------------------------------------------------------


class _SharedCudaTensor:
    """Pickles as a CUDA IPC handle; unpickles as a tensor on the worker's memory."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(self.tensor)


def shareable(states: Any) -> Any:
    """``states`` with every tensor replaced by its CUDA IPC handle."""
    return each_tensor(states, _SharedCudaTensor)


# ---- shm: one shared host buffer ------------------------------------------------------------


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT`."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _map(path: Path, size: int) -> Any:
    """A uint8 tensor over the first ``size`` bytes of the file at ``path``, mapped shared."""
    import torch

    with path.open("r+b") as f:
        memory = mmap.mmap(f.fileno(), size)
    return torch.frombuffer(memory, dtype=torch.uint8)


#: Numbers the buffers of this process (a worker may hold more than one: the ``shm`` hand-off's
#: and the worker writer's ring).
_BUFFERS_MADE = itertools.count()


class HostBuffer:
    """The worker's side of ``shm``: one file in :data:`SHARED_MEMORY`, mapped, reused for
    every batch and replaced by a larger one when a batch needs more.

    Its pages are reserved when it is made (``posix_fallocate``), so a full ``/dev/shm`` (64 MB
    in a default Docker container) is an ``OSError`` here, not a bus error mid-copy. On a CUDA
    device it is page-locked (``cudaHostRegister``), which makes the device-to-host copy one
    DMA burst; where that fails the copy is merely slower. The caller unlinks the file once it
    has mapped it (:func:`_host_view`), so nothing is left in ``/dev/shm`` after the run.
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
            self.path.unlink(missing_ok=True)  # the caller may not have mapped it
        self.memory, self.path, self.size, self.pinned = None, None, 0, False

    def fill(self, states: Any) -> Any:
        """Copy every tensor of ``states`` into the buffer; the reply that names them."""
        tensors = _tensors(states)
        cuda = any(t.is_cuda for t in tensors)
        memory = self.hold(sum(aligned(t.numel() * t.element_size()) for t in tensors), cuda)
        views: dict[int, _HostView] = {}
        offset = 0
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            place = memory[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
            place.copy_(tensor, non_blocking=cuda)
            views[id(tensor)] = _HostView(
                str(self.path), self.size, offset, tensor.dtype, tuple(tensor.shape)
            )
            offset += aligned(nbytes)
        if cuda:
            import torch

            torch.cuda.current_stream().synchronize()
        return each_tensor(states, lambda t: views[id(t)])


#: The caller's mappings of the workers' buffers: file name -> uint8 tensor.
_MAPPED: dict[str, Any] = {}


def _host_view(path: str, size: int, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """Unpickled in the caller: the tensor at ``offset`` of the worker's buffer ``path``.

    The first view of a buffer maps it and unlinks its file (both processes hold the memory
    now); a worker's grown buffer replaces the mapping of its previous one.
    """
    memory = _MAPPED.get(path)
    if memory is None:
        worker = Path(path).name.rsplit("-", 1)[0]
        for old in [p for p in _MAPPED if Path(p).name.rsplit("-", 1)[0] == worker]:
            del _MAPPED[old]
        memory = _MAPPED[path] = _map(Path(path), size)
        Path(path).unlink(missing_ok=True)
    nbytes = math.prod(shape) * dtype.itemsize
    return memory[offset : offset + nbytes].view(dtype).view(shape)


def forget() -> None:
    """Drop this process's mappings of the workers' buffers (once their generator is shut
    down: what it returned are copies)."""
    _MAPPED.clear()


class _HostView:
    """Pickles as the place of a tensor in a worker's :class:`HostBuffer`."""

    def __init__(
        self, path: str, size: int, offset: int, dtype: Any, shape: tuple[int, ...]
    ) -> None:
        self.place = (path, size, offset, dtype, shape)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_host_view, self.place)


def remove_stale_buffers(directory: Path = SHARED_MEMORY) -> int:
    """Delete buffers whose worker is gone (a run killed between a worker's copy and the
    caller's mapping leaves one); return how many."""
    removed = 0
    for path in directory.glob(f"{BUFFER_PREFIX}*"):
        pid = path.name.removeprefix(BUFFER_PREFIX).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# ---- installing a hand-off in the worker ----------------------------------------------------


@dataclass
class WorkerHandoff:
    """What the hand-off did in one worker; :func:`state` reads it there."""

    how: str
    replies: int = 0
    #: ``shm`` replies sent the RPC way, since ``/dev/shm`` had no room (logged in the worker).
    fallbacks: int = 0
    buffer: HostBuffer = field(default_factory=HostBuffer)

    def reply(self, states: Any) -> Any:
        """``states`` as the caller will receive them."""
        self.replies += 1
        if self.how == "ipc":
            return shareable(states)
        try:
            return self.buffer.fill(states)
        except OSError as exc:  # /dev/shm full: this batch the RPC way, correct but slower
            self.fallbacks += 1
            logger.warning("specshim: shared-memory hand-off unavailable (%s); using the RPC", exc)
            return states


def _install(worker: Any, how: str) -> bool:
    """Run in each vLLM worker: make ``_get_captured_states`` reply the ``how`` way. Only the
    worker whose reply the generator reads (rank 0) changes; the others' replies are dropped."""
    if getattr(worker, "rank", 0) != 0:
        return False
    fetch = worker._get_captured_states
    handoff = WorkerHandoff(how)

    def handed_off() -> Any:
        states = fetch()
        if how == "ipc":  # the caller maps them: alive until the next fetch (module docstring)
            setattr(worker, _KEPT, states)
        return handoff.reply(states)  # shm: copied to the host before this returns

    worker._get_captured_states = handed_off
    setattr(worker, _STATE, handoff)
    return True


def state(worker: Any) -> dict[str, Any] | None:
    """Run in a vLLM worker (``collective_rpc(handoff.state)``): how its replies were handed
    off, how many, how many fell back to the RPC, the buffer's size and whether it is
    page-locked; ``None`` where :func:`use` changed nothing."""
    handoff = getattr(worker, _STATE, None)
    if handoff is None:
        return None
    return {
        "how": handoff.how,
        "replies": handoff.replies,
        "fallbacks": handoff.fallbacks,
        "buffer_bytes": handoff.buffer.size,
        "pinned": handoff.buffer.pinned,
    }


def choose(handoff: str, tensor_parallel_size: int = 1) -> str:
    """``rpc``, ``ipc``, ``shm`` or ``worker`` for the option ``handoff``; a name outside
    :data:`CHOICES`, or ``ipc`` where torch sees no CUDA device, is refused with one line
    (``ValueError``).

    ``auto`` keeps the RPC path under tensor parallelism (not yet measured there; ask for
    another to try it) and on the CPU. Asks torch, not vLLM, so that it runs
    before vLLM's settings are chosen.
    """
    from specshim import hardware

    if handoff not in CHOICES:
        raise ValueError(f"--handoff must be one of {', '.join(CHOICES)}, got {handoff!r}")
    on_cuda = hardware.detect().kind == "cuda"
    if handoff == "ipc" and not on_cuda:
        raise ValueError("--handoff ipc needs vLLM on a CUDA device; use rpc or shm here")
    if handoff == "auto":
        return "worker" if on_cuda and tensor_parallel_size == 1 else "rpc"
    return handoff


def use(generator: Any, how: str) -> None:
    """Switch ``generator``'s worker to the ``how`` hand-off (``rpc``: speculators' own, left
    as it is). See the module docstring for the contract."""
    if how == "rpc":
        return
    if how not in FOR_GENERATOR:
        raise ValueError(f"hand-off must be one of {', '.join(FOR_GENERATOR)}, got {how!r}")
    if how == "shm":
        with contextlib.suppress(OSError):
            remove_stale_buffers()
    generator.executor.collective_rpc(_install, args=(how,))
