"""One command at a time in an output folder.

Two runs writing into one folder both end "successfully" with a folder that holds parts of
each. Every command that writes into a folder (``extract``, ``train``, ``convert``, ``vocab``,
``run``) holds :data:`LOCK_FILE` in it, locked with ``flock``, for as long as it runs; a
second command into that folder stops at once with one line naming the holder (its command,
pid and start). The lock is the operating system's: a run that is killed, even with SIGKILL,
holds it no longer, so a folder is never left locked. A run that ends removes the file; one
that was killed leaves it, unlocked, and every command passes over it (it is never one of
the folder's files to keep, refuse or remove).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".specshim.lock"


def contents(folder: Path) -> list[Path]:
    """What ``folder`` (an existing folder) holds, sorted, less :data:`LOCK_FILE`: the lock is
    never one of the folder's files."""
    return sorted(p for p in folder.iterdir() if p.name != LOCK_FILE)


class OutInUse(Exception):
    """Another command holds the folder; the message is the one line to show."""


def _open_locked(path: Path, folder: str) -> int:
    """A descriptor of ``path`` locked by this process. The holder removes the file as it
    ends: a lock taken on a file no longer at ``path`` is let go and taken again on the
    new one, so that two processes never both hold ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # not a link's file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 400).decode(errors="replace").strip() or "another specshim run"
            os.close(fd)
            raise OutInUse(
                f"{folder} is in use by {holder}: wait for it to end, or pick another folder"
            ) from None
        try:
            if os.fstat(fd).st_ino == path.stat().st_ino:
                return fd
        except FileNotFoundError:  # removed by its holder between the open and the lock
            pass
        os.close(fd)


@contextlib.contextmanager
def held(out: Path, command: str, option: str = "--out") -> Iterator[None]:
    """Inside, this process alone writes into ``out`` (created if need be; removed again on
    the way out if it was created here and is left empty). ``command`` (``"extract"``) and
    ``option`` name the holder and the folder in the other run's message; a folder that is
    a file or cannot be written is ``ValueError``, one line."""
    folder = f"{option} {out}"
    if out.exists() and not out.is_dir():
        raise ValueError(f"{folder} is a file (expected a folder)")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = _open_locked(out / LOCK_FILE, folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # someone's link: writing the lock would write its target
            raise ValueError(
                f"{folder}: {LOCK_FILE} there is a symbolic link, not specshim's lock file: "
                "remove it and run again"
            ) from exc
        raise ValueError(f"{folder}: cannot write there ({exc.strerror})") from exc
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with contextlib.suppress(OSError):  # the message only; a full disk still locks
        os.ftruncate(fd, 0)
        os.write(fd, f"specshim {command} (pid {os.getpid()}, since {since})\n".encode())
    try:
        yield
    finally:
        (out / LOCK_FILE).unlink(missing_ok=True)  # before the lock goes: see _open_locked
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):  # not empty: the command wrote there
                out.rmdir()
