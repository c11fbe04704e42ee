"""Room for samples in one shared host buffer, taken in turn and given back in any order.

The worker writer (:mod:`specshim.runner.worker_writer`) copies each finished sample's states
into this ring and its writer processes (:mod:`specshim.runner.writer_processes`) map the
same memory and write the files from it. One buffer, page-locked once (page-locking is costly,
too costly for every sample), reused for the whole run; the memory is
:class:`specshim.runner.handoff.HostBuffer`'s: a file in ``/dev/shm`` another process can map.

Room is taken at the head and comes back when the oldest taken span is given back: spans given
back out of order wait for the ones before them. So a slow sample holds the room after it,
which bounds the states waiting in host memory to the ring's size.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from specshim.runner.handoff import HostBuffer


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
