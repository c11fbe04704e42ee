"""Atomic writes: a file either holds its whole content or does not exist."""

from __future__ import annotations

import json
import os
import queue
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write through ``write(file)`` into a temporary file beside ``path``, then rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_torch(path: Path, obj: Any) -> None:
    import torch

    write_atomic(path, lambda f: torch.save(obj, f))


def save_json(path: Path, obj: Any) -> None:
    write_atomic(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True).encode()))


def remove_partials(directory: Path) -> int:
    """Delete temporary files left by a process that was killed mid-write; return how many."""
    stale = list(directory.glob(".*.tmp"))
    for path in stale:
        path.unlink()
    return len(stale)


class BackgroundWriter:
    """``save_torch`` on one background thread, so that writing (fsync included, two thirds
    of a write's time) overlaps the next batch's extraction.

    At most ``depth`` records wait to be written, which bounds memory. The first failed write
    is raised by the next ``submit`` or by ``close``; ``close`` (also on leaving a ``with``
    block, even by an exception) waits for every submitted write, so whatever was handed over
    is on disk, complete, before the caller goes on.
    """

    def __init__(self, depth: int = 32) -> None:
        self._queue: queue.Queue[tuple[Path, Any] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="specshim-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    save_torch(*item)
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing extracted samples failed: {self._error}") from self._error

    def submit(self, path: Path, obj: Any) -> None:
        self._raise()
        self._queue.put((path, obj))

    def _finish(self) -> None:
        """Let the thread write what it was handed, then end it."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def close(self) -> None:
        self._finish()
        self._raise()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:  # the caller's own error wins; still finish what was handed over
            self._finish()
