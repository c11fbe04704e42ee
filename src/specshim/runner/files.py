"""Atomic writes: a file either holds its whole content or does not exist.

:class:`Ledger` records, after each atomic write, what a file was written from (a caller's
fingerprint) and which file it was (size and modification time), so that a rerun can tell a
file it may keep from one it must write again.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from specshim import console

#: Writer threads of :class:`BackgroundWriter`.
WRITER_THREADS = 4


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through ``write(file)`` into a temporary file beside ``path``, fsync it, then
    rename it into place. ``write`` may write to ``file`` or open ``file.name`` (the temporary
    file's path) itself: the fsync is of the file, whichever descriptor wrote it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_beside(path)
    except OSError as exc:  # no room for the folder or the file's inode either
        raise disk_full(path.parent, exc) or exc from None
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        # decided before the partial file is gone and frees room; a Ctrl-C stays what it is
        full = disk_full(path.parent, exc) if isinstance(exc, Exception) else None
        Path(tmp).unlink(missing_ok=True)
        if full:
            raise full from exc
        raise


def _new_beside(path: Path) -> Path:
    """A new empty file beside ``path``, ``.<name>.<random>.tmp`` (what :func:`remove_partials`
    clears), with the permissions of any new file: 0666 less the user's umask. (``tempfile``
    makes its files 0600, which would leave every output unreadable to the user's group.)"""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:  # another writer drew the same name
            continue
        return tmp


#: Free bytes under which a failed write is taken for a full disk: ``torch.save`` says
#: "unexpected pos 1408 vs 1320" where the disk ran out, not ENOSPC (seen with torch 2.13).
FULL_BELOW = 1 << 20


class DiskFull(OSError):
    """A write that failed because the disk under it is full; the message says which folder,
    how much is free and what to do."""


def disk_full(folder: Path, exc: BaseException | None = None) -> DiskFull | None:
    """``exc``, raised while writing into ``folder``, as :class:`DiskFull` when the disk there
    is full (ENOSPC, or less than :data:`FULL_BELOW` free), else None. Without ``exc`` (a
    write that failed elsewhere, unseen), the free space alone decides."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # the folder itself is gone: the original error says more
        return None
    if getattr(exc, "errno", None) != errno.ENOSPC and free >= FULL_BELOW:
        return None
    return DiskFull(
        f"no space left in {folder} ({size(free)} free): free some space there and run the "
        "same command again (the files already written are kept), or start over elsewhere",
    )


def room_short(folder: Path, need: int) -> str | None:
    """None when ``need`` bytes fit on ``folder``'s disk, else how much is free there, in words
    (for a command's refusal before it starts writing)."""
    free = shutil.disk_usage(folder).free
    return None if need <= free else f"{size(free)} are free there"


def size(nbytes: int) -> str:
    """``nbytes`` for people: ``12.0kB``, ``1.91GB`` (tqdm's units of 1,024)."""
    from tqdm import tqdm

    return tqdm.format_sizeof(nbytes, "B", 1024)


def save_torch(path: Path, obj: Any) -> None:
    """``torch.save`` atomically. It is given the temporary file's path, not a Python file: it
    then writes the tensors' bytes from C++ without the GIL, where through a Python file every
    chunk waits for the GIL (a third of the speed beside a busy thread, as vLLM's worker is)."""
    import torch

    write_atomic(path, lambda f: torch.save(obj, f.name))


def save_json(path: Path, obj: Any) -> None:
    """``obj`` as indented, key-sorted JSON, written atomically."""
    write_atomic(path, lambda f: f.write(json.dumps(obj, indent=2, sort_keys=True).encode()))


def refusal(option: str, folder: Path, names: list[str]) -> str:
    """The one line that refuses to replace or remove ``names``, files in ``folder`` (given
    as ``option``) that specshim did not write there: ``--overwrite`` says yes."""
    return (
        f"{option} {folder} holds files specshim did not write there that this run would "
        f"replace or remove: {console.listed(names)}; nothing was changed: pass --overwrite "
        f"to let it, or pick another {option}"
    )


def partials(directory: Path) -> list[Path]:
    """The temporary files in ``directory`` that writes killed midway left (and any file
    named as they are: ``.NAME.XXXX.tmp``)."""
    return list(directory.glob(".*.tmp"))


def partial_target(name: str) -> str:
    """The name of the file the temporary file ``name`` (:func:`write_atomic`'s
    ``.NAME.XXXX.tmp``) was to become."""
    return name[1:].removesuffix(".tmp").rsplit(".", 1)[0]


def remove_partials(directory: Path) -> int:
    """Delete temporary files left by a process that was killed mid-write; return how many."""
    stale = partials(directory)
    for path in stale:
        path.unlink()
    return len(stale)


#: The size and time of a claim's entry (:meth:`Ledger.claim`), which no file has.
CLAIM = -1


@dataclass(frozen=True)
class Entry:
    """One finished file: its name, the caller's fingerprint of what it was written from, and
    the size and modification time it had right after it was written."""

    file: str
    fingerprint: str
    size: int
    mtime_ns: int

    @classmethod
    def parse(cls, line: bytes) -> Entry | None:
        """The entry a ledger line holds, or None for a line that is not one of ours: torn
        by a kill, not JSON, nested too deep to parse, or with a field of the wrong type (a
        list where the file name belongs, a string where the size does)."""
        try:
            fields = json.loads(line)
        except (ValueError, RecursionError):
            return None
        types = {"file": str, "fingerprint": str, "size": int, "mtime_ns": int}
        if not (isinstance(fields, dict) and fields.keys() == types.keys()):
            return None
        if not all(type(fields[name]) is kind for name, kind in types.items()):
            return None
        return cls(**fields)

    def still_there(self, directory: Path) -> bool:
        """True when ``directory/file`` is still the very file that was written.

        A file truncated, emptied, replaced or rewritten since has another size or time; so does
        an older file left where a rename was lost to a power failure. A file corrupted in
        place with its size and time kept (bit rot) is not detected.
        """
        try:
            stat = (directory / self.file).stat()
        except OSError:
            return False
        return (stat.st_size, stat.st_mtime_ns) == (self.size, self.mtime_ns)

    @property
    def claimed(self) -> bool:
        """A claim (:meth:`Ledger.claim`): the file was about to be written, and no recording
        of it came after (killed in between); whatever bears its name is the run's."""
        return self.size == CLAIM


#: Bytes kept allocated past the ledger's end, so that its lines still fit once the samples'
#: files have filled the disk (the message then says "the files already written are kept"):
#: about 900 lines, more than a run finishes between two recordings of its files
#: (``extract.RECORD_EVERY`` prompts and the writers' queues). Without it, a full disk met
#: while recording left every file since the last recording unrecorded (in CI: all of a run).
LEDGER_ROOM = 128 << 10

_FALLOC_FL_KEEP_SIZE = 1


@functools.cache
def _fallocate() -> Any:
    """The C library's ``fallocate`` with 64-bit offsets (``fallocate64``, where a 32-bit
    build's ``fallocate`` takes 32-bit ones), or None where there is none (not Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return function


def keep_room(fd: int, offset: int, length: int) -> None:
    """Allocate ``length`` bytes of the open file ``fd`` from ``offset`` on, without changing
    its size (Linux's ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``): appends there need no new
    blocks. Where the system or the filesystem cannot, or the disk is full, nothing: what was
    kept before stays kept."""
    if (fallocate := _fallocate()) is not None:
        fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length)


class Ledger:
    """An append-only log (one JSON object a line) of files written whole, beside them.

    An entry is appended only after its file was renamed into place, so a file without an
    entry (killed in between) is never trusted. A line torn by a kill mid-append, or that is
    not an entry at all (:meth:`Entry.parse`), is ignored,
    and later entries for a file replace earlier ones. :meth:`keep` rewrites the log
    atomically with only the entries the caller still trusts, so it does not grow with reruns.
    The ledger keeps :data:`LEDGER_ROOM` allocated past its end, so that a disk the samples'
    files filled still takes its lines; an append the full disk cut short all the same raises
    :class:`DiskFull`, and the next append starts on a line of its own, so that the torn line
    does not swallow it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._appending = threading.Lock()  # BackgroundWriter's threads record concurrently
        self._torn = False  # an append failed part-way: the log may not end with a newline

    def entries(self) -> dict[str, Entry]:
        """The latest whole entry for each file name."""
        found: dict[str, Entry] = {}
        if not self.path.exists():
            return found
        for line in self.path.read_bytes().splitlines():
            if (entry := Entry.parse(line)) is not None:
                found[entry.file] = entry
        return found

    def not_written(self, names: Iterable[str]) -> list[str]:
        """The files of ``names`` beside the ledger that are not as it records them written
        there (the very file, or one it claimed and a kill left unrecorded)."""
        folder, recorded = self.path.parent, self.entries()
        return [
            name
            for name in names
            if (folder / name).exists()
            and not (
                name in recorded and (recorded[name].claimed or recorded[name].still_there(folder))
            )
        ]

    def keep(self, entries: Iterable[Entry]) -> None:
        """Replace the log, atomically, by ``entries``."""
        data = "".join(json.dumps(asdict(e)) + "\n" for e in entries).encode()

        def write(f: BinaryIO) -> None:
            f.write(data)
            f.flush()
            keep_room(f.fileno(), len(data), LEDGER_ROOM)

        write_atomic(self.path, write)

    def claim(self, name: str, fingerprint: str) -> None:
        """Append a claim on the file ``name`` before it is written (by another process, whose
        end a kill may part from its recording): until recorded, it is the run's
        (:attr:`Entry.claimed`)."""
        self._append(Entry(name, fingerprint, CLAIM, CLAIM))

    def record(self, path: Path, fingerprint: str) -> None:
        """Append the entry for ``path``, just written whole from what ``fingerprint`` names."""
        stat = path.stat()
        self._append(Entry(path.name, fingerprint, stat.st_size, stat.st_mtime_ns))

    def _append(self, entry: Entry) -> None:
        line = json.dumps(asdict(entry)) + "\n"
        with self._appending:  # _torn too: another thread's append may just have torn
            try:
                with self.path.open("ab") as f:
                    f.write((("\n" if self._torn else "") + line).encode())
                    f.flush()
                    keep_room(f.fileno(), f.tell(), LEDGER_ROOM)
            except OSError as exc:  # the disk filled up under the ledger (seen in CI)
                self._torn = True
                raise disk_full(self.path.parent, exc) or exc from None
            self._torn = False


class WriteError(RuntimeError):
    """A file :class:`BackgroundWriter` was handed could not be written."""


class BackgroundWriter:
    """``save_torch`` on background threads, so that writing (fsync included, two thirds of a
    write's time) overlaps the next batch's extraction.

    Several threads, since one file's fsync leaves the disk waiting: four threads wrote about
    twice as fast as one on a GPU machine's disk. Files
    are written in any order; each is whole or absent. At most ``depth`` records wait to be
    written, which bounds memory. The first failure is raised by the next ``submit`` or by
    ``close`` (a failed write as :class:`WriteError`, what a ``make`` function raised as it
    is), and nothing more is written after it; ``close`` (also on leaving a ``with`` block, even
    by an exception) waits for every submitted write, so whatever was handed over is on disk,
    complete, before the caller goes on. With a ``ledger``, each write that was given a
    fingerprint is recorded there once the file is in place.
    """

    def __init__(
        self, depth: int = 32, ledger: Ledger | None = None, threads: int = WRITER_THREADS
    ) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="specshim-writer")
        self._slots = threading.BoundedSemaphore(depth)
        self._ledger = ledger
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()

    def _write(self, path: Path, obj: Any, fingerprint: str | None) -> None:
        try:
            if self._error is None:
                record = obj() if callable(obj) else obj
                try:
                    save_torch(path, record)
                    if self._ledger is not None and fingerprint is not None:
                        self._ledger.record(path, fingerprint)
                except Exception as exc:  # a failed write, whatever raised it
                    raise WriteError(f"writing extracted samples failed: {exc}") from exc
        except BaseException as exc:  # noqa: BLE001 handed to the caller's thread
            with self._error_lock:
                self._error = self._error or exc
        finally:
            self._slots.release()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, path: Path, obj: Any, fingerprint: str | None = None) -> None:
        """Write ``obj`` to ``path``; ``obj`` may be a function of no arguments that returns
        what to write, called on a writer thread: checks that may refuse a record run there,
        off the caller's thread."""
        self._raise()
        self._slots.acquire()  # waits while ``depth`` records are pending
        self._pool.submit(self._write, path, obj, fingerprint)

    def _finish(self) -> None:
        """Let the threads write what they were handed, then end them. A Ctrl-C meanwhile
        (the one that stops the run often lands here) is raised only once they have: the
        caller counts what is on disk right after."""
        interrupted = False
        while True:
            try:
                self._pool.shutdown(wait=True)
                break
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    def close(self) -> None:
        """Wait for every submitted write, then raise the first failure, if any."""
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
