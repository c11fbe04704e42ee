"""Room for samples in one shared host buffer, taken in turn and given back in any order.

The worker writer (:mod:`specshim.runner.in_worker.writer`) copies each finished sample's
states into this ring and its writer processes map the same memory and write the files from
it. One buffer, page-locked once (page-locking is costly,
too costly for every sample), reused for the whole run; the memory is
:class:`HostBuffer`'s: a file in ``/dev/shm`` another process can map.

Room is taken at the head and comes back when the oldest taken span is given back: spans given
back out of order wait for the ones before them. So a slow sample holds the room after it,
which bounds the states waiting in host memory to the ring's size.
"""

from __future__ import annotations

import collections
import fcntl
import itertools
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def sweep(directory: Path) -> None:
    """Remove the buffers in ``directory`` that no process holds any more (their worker was
    killed: a buffer is a gigabyte of memory until its file goes). A live
    buffer's process holds a shared ``flock`` on it from before its file has its name; that
    works across containers sharing ``/dev/shm``, where a process id would not."""
    for path in directory.glob(f"{BUFFER_PREFIX}*"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: in use
        else:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


class HostBuffer:
    """One file in :data:`SHARED_MEMORY`, mapped, reused and replaced by a larger one when
    more is asked for; another process maps the same file by its path. This process holds a
    shared ``flock`` on it while it lives, so that a buffer left by a killed worker is told
    from one in use and removed by the next (:func:`sweep`).

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
        self._held: int | None = None  # the descriptor holding the flock

    def hold(self, nbytes: int, cuda: bool) -> Any:
        """The buffer, at least ``nbytes`` long (grown by half at least, to whole MiB)."""
        if nbytes <= self.size:
            return self.memory
        size = aligned(max(nbytes, self.size * 3 // 2, 1)) + (1 << 20) - 1
        size -= size % (1 << 20)
        self.release()
        sweep(self.directory)
        name = f"{BUFFER_PREFIX}{os.getpid()}-{next(_BUFFERS_MADE)}"
        making = self.directory / f".{name}"  # named once held: sweep never sees it unheld
        fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.posix_fallocate(fd, 0, size)
            path = making.rename(self.directory / name)
        except OSError:
            os.close(fd)
            making.unlink(missing_ok=True)
            raise
        self._held = fd
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
        if self._held is not None:
            os.close(self._held)
        self.memory, self.path, self.size, self.pinned, self._held = None, None, 0, False, None


@dataclass
class HostRing:
    """Spans of :attr:`buffer`, each ``[start, end)``, taken by :meth:`take` in turn."""

    buffer: HostBuffer = field(default_factory=HostBuffer)
    head: int = 0
    #: The spans taken, oldest first, each ``[start, end, given back]``.
    spans: collections.deque[list[Any]] = field(default_factory=collections.deque)

    @property
    def size(self) -> int:
        """The ring's bytes (0 until :meth:`hold`)."""
        return self.buffer.size

    @property
    def memory(self) -> Any:
        """The buffer as a uint8 tensor."""
        return self.buffer.memory

    def hold(self, nbytes: int, cuda: bool) -> None:
        """Make the ring at least ``nbytes`` long (page-locked where ``cuda``); only while
        nothing is taken, since growing replaces the memory."""
        if self.spans:
            raise RuntimeError(f"host ring: cannot grow with {len(self.spans)} spans taken")
        self.buffer.hold(nbytes, cuda)
        self.head = 0

    def take(self, nbytes: int) -> int | None:
        """The start of ``nbytes`` free bytes, now taken; None when there is no such room
        until spans are given back (or ever, when ``nbytes`` exceeds the ring)."""
        if not self.spans:
            self.head = 0
        tail = self.spans[0][0] if self.spans else self.size
        if self.spans and self.head == tail:  # full: the head caught up with the oldest span
            return None
        if self.head >= tail or not self.spans:  # free: [head, size) and [0, tail)
            if self.head + nbytes <= self.size:
                start = self.head
            elif self.spans and nbytes <= tail:
                start = 0
            else:
                return None
        elif self.head + nbytes <= tail:  # free: [head, tail)
            start = self.head
        else:
            return None
        self.spans.append([start, start + nbytes, False])
        self.head = start + nbytes
        return start

    def give_back(self, start: int) -> None:
        """The span taken at ``start`` is free again (once every older one is too)."""
        for span in self.spans:
            if span[0] == start and not span[2]:
                span[2] = True
                break
        else:
            raise RuntimeError(f"host ring: no span taken at {start}")
        while self.spans and self.spans[0][2]:
            self.spans.popleft()

    def release(self) -> None:
        """Give the memory back (unmapped here, its file removed)."""
        self.spans.clear()
        self.buffer.release()
