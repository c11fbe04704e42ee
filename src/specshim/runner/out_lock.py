"""One command at a time in an output folder.

Two runs writing into one folder both end "successfully" with a folder that holds parts of
each. Every command that writes into a folder (``extract``, ``train``, ``convert``, ``vocab``,
``eval``, ``run``) holds :data:`LOCK_FILE` in it, locked with ``flock``, for as long as it
runs; a second command into that folder stops at once with one line naming the holder (its
command, pid and start). ``train`` and ``convert`` hold their ``--data`` with the same lock,
shared: readers go together, writers neither beside them nor beside each other. The lock is
the operating system's: a killed run (even by SIGKILL) holds it no longer. A run that ends
(the last reader, of readers) removes the file; a killed one leaves it, unlocked, and every
command passes over it (it is never one of the folder's files to keep, refuse or remove).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".specshim.lock"
#: What the libraries said while a command ran there (:mod:`specshim.runner.library_log`).
LIBRARIES_LOG = "libraries.log"


def contents(folder: Path) -> list[Path]:
    """What ``folder`` (an existing folder) holds, sorted, less :data:`LOCK_FILE` and
    :data:`LIBRARIES_LOG`: the command that runs there writes them, they are never one of the
    folder's files."""
    return sorted(p for p in folder.iterdir() if p.name not in (LOCK_FILE, LIBRARIES_LOG))


#: The folders this process holds now (resolved): reading one of them again (``specshim
#: run``'s train reads the vocabulary in the folder the run holds) needs no lock of its own.
HELD_HERE: set[Path] = set()


class OutInUse(Exception):
    """Another command holds the folder; the message is the one line to show."""


def _open_locked(path: Path, folder: str, kind: int) -> int:
    """A descriptor of ``path`` locked by this process (``kind``: ``LOCK_EX`` or ``LOCK_SH``).
    The last holder removes the file as it ends: a lock taken on a file no longer at ``path``
    is let go and taken again on the new one, so that a writer never holds ``path`` beside
    another process."""
    while True:
        fd = _open(path, shared=kind == fcntl.LOCK_SH)
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
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


def _open(path: Path, shared: bool) -> int:
    """``path`` opened (never a link's file), made with the permissions of any new file (0666
    less the umask), so that the user's group can lock it too. A reader that may not write a
    file another user made opens it read-only: ``flock`` needs no more, only the holder line
    is not written."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except PermissionError:
        if not shared:
            raise
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def _holder(fd: int) -> str:
    """Who holds the lock, as the refusal names it: the holder line, unless the pid it names
    has ended. Then readers hold it still: each reader writes over the line, the last of them
    may have ended first."""
    line = os.read(fd, 400).decode(errors="replace").strip()
    pid = re.search(r"\(pid (\d+),", line)
    if pid and not _running(int(pid[1])):
        return "specshim readers (train or convert)"
    return line or "another specshim run"


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _last(fd: int) -> bool:
    """Whether this process's shared lock on ``fd`` is the only one left. (Not: the lock is
    let go, as Linux converts a lock by letting it go first; the caller is ending anyway.)"""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def held(out: Path, command: str, option: str = "--out", *, shared: bool = False) -> Iterator[None]:
    """Inside, this process alone writes into ``out`` (created if need be; removed again on
    the way out if it was created here and is left empty); or, ``shared``, reads it beside
    other readers while no command writes there. A folder that is missing, or that this user
    cannot write into, is read unlocked (the command names the one, nothing of the user's
    writes into the other); one this process holds already is read under that hold.
    ``command`` (``"extract"``) and ``option`` name the holder and the folder in the other
    run's message; a folder that is a file or cannot be written is ``ValueError``, one line."""
    folder = f"{option} {out}"
    if out.exists() and not out.is_dir():
        raise ValueError(f"{folder} is a file (expected a folder)")
    if shared and (not os.access(out, os.W_OK | os.X_OK) or out.resolve() in HELD_HERE):
        yield
        return
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = _open_locked(out / LOCK_FILE, folder, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # someone's link: writing the lock would write its target
            raise ValueError(
                f"{folder}: {LOCK_FILE} there is a symbolic link, not specshim's lock file: "
                "remove it and run again"
            ) from exc
        if os.path.lexists(out / LOCK_FILE):
            raise ValueError(
                f"{folder}: cannot open {LOCK_FILE} there ({exc.strerror}): its owner can make "
                "it group-writable (chmod g+rw), or remove it while no run uses the folder"
            ) from exc
        raise ValueError(f"{folder}: cannot write there ({exc.strerror})") from exc
    since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with contextlib.suppress(OSError):  # the message only; a full disk still locks
        os.ftruncate(fd, 0)
        os.write(fd, f"specshim {command} (pid {os.getpid()}, since {since})\n".encode())
    key = out.resolve()
    outermost = key not in HELD_HERE
    HELD_HERE.add(key)
    try:
        yield
    finally:
        if outermost:
            HELD_HERE.discard(key)
        if not shared or _last(fd):  # before the lock goes: see _open_locked
            (out / LOCK_FILE).unlink(missing_ok=True)
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):  # not empty: the command wrote there
                out.rmdir()
