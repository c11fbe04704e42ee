"""Atomic writes: a file either holds its whole content or does not exist."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
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
