"""Where other libraries' messages go while a command runs: into :data:`FILE` in the command's
output folder, and live on stderr too only with ``--verbose``; stderr keeps specshim's own lines
(:mod:`specshim.console`) and stdout the command's result.

vLLM is told through its own setting: ``VLLM_LOGGING_CONFIG_PATH`` names a ``logging``
configuration written for the run whose handlers append to the file, so vLLM's engine and
worker processes, which read it as they start, write there too (a user's own
``VLLM_CONFIGURE_LOGGING`` or ``VLLM_LOGGING_CONFIG_PATH`` is left as it is). In this process,
what other libraries log (speculators, vLLM before it configures itself) reaches the file
through the root logger, Python warnings through ``logging.captureWarnings``, loguru's records
(speculators' model loading) through a sink; transformers' progress bars are off unless
``verbose``. So does everything else written to stdout's and stderr's file descriptors
(torch's C++ warnings and its own log handler, the progress bar of vLLM's weight loading,
everything vLLM's worker processes, which inherit the descriptors, print before vLLM sets up
their log), except the command's result (``sys.stdout``) and specshim's own lines and bars
(:func:`specshim.console.terminal`), which stay on the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from specshim import console
from specshim.runner import out_lock

#: The log's name in the output folder (never one of the folder's files).
FILE = out_lock.LIBRARIES_LOG
#: How many of its last lines a failed command that wrote nothing else shows.
LAST_LINES = 5
#: How Python begins a traceback.
TRACEBACK = "Traceback (most recent call last):"
#: One line a record, whichever library and process wrote it.
FORMAT = "%(asctime)s pid=%(process)d %(levelname)s %(name)s: %(message)s"
#: vLLM's settings that say where its log goes: one set by the user is kept.
VLLM_SETTINGS = ("VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")


class LogFile(logging.FileHandler):
    """``logging.FileHandler`` for the libraries' log, which a full or failing disk never turns
    into a traceback or the command's error: the log is a by-product, and the command's own
    one line says what went wrong (a full disk among it). vLLM's processes use it too
    (:func:`vllm_config`)."""

    def handleError(self, record: logging.LogRecord) -> None:
        """logging's report of a failed write, left out where the disk failed it."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)

    def flush(self) -> None:
        """As logging's, with a failing disk left to the command to name."""
        with contextlib.suppress(OSError):
            super().flush()

    def close(self) -> None:
        """As logging's, with a failing disk left to the command to name."""
        with contextlib.suppress(OSError):
            super().close()


def _handlers(log: Path, verbose: bool) -> list[logging.Handler]:
    """A handler appending to ``log`` (opened at the first record), and one on stderr when
    ``verbose``, both writing :data:`FORMAT`."""
    handlers: list[logging.Handler] = [LogFile(log, delay=True, encoding="utf-8")]
    if verbose:
        handlers.append(logging.StreamHandler(sys.stderr))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(FORMAT))
    return handlers


def vllm_config(log: Path, verbose: bool) -> dict[str, Any]:
    """The ``logging`` configuration vLLM applies in each of its processes: its logger's
    records appended to ``log`` (and on stderr when ``verbose``), at ``VLLM_LOGGING_LEVEL``."""
    handlers: dict[str, Any] = {
        "file": {"class": f"{__name__}.LogFile", "filename": str(log), "delay": True,
                 "encoding": "utf-8", "formatter": "line"},
    }  # fmt: skip
    if verbose:
        handlers["stderr"] = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
                              "formatter": "line"}  # fmt: skip
    return {
        "version": 1,
        "disable_existing_loggers": False,  # specshim's own logger keeps its handler
        "formatters": {"line": {"format": FORMAT}},
        "handlers": handlers,
        "loggers": {
            "vllm": {
                "handlers": list(handlers),
                "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
                "propagate": False,
            }
        },
    }


@contextlib.contextmanager
def _settings(log: Path, verbose: bool) -> Iterator[None]:
    """Inside, ``VLLM_LOGGING_CONFIG_PATH`` names :func:`vllm_config` (unless the user chose
    where vLLM's log goes) and, unless ``verbose``, transformers' and the hub's progress bars
    are off (``HF_HUB_DISABLE_PROGRESS_BARS``, read as they are imported, unless the user
    set it); the environment and vLLM's logger are as they were after."""
    logger = logging.getLogger("vllm")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    with tempfile.TemporaryDirectory(prefix="specshim-log-") as folder:
        config = Path(folder) / "vllm_logging.json"
        config.write_text(json.dumps(vllm_config(log, verbose)))
        chosen = {} if any(name in os.environ for name in VLLM_SETTINGS) else {
            "VLLM_LOGGING_CONFIG_PATH": str(config)}  # fmt: skip
        if not verbose:
            chosen["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        chosen = {name: value for name, value in chosen.items() if name not in os.environ}
        os.environ.update(chosen)
        try:
            yield
        finally:
            for name in chosen:
                del os.environ[name]
            for handler in logger.handlers:
                if handler not in saved[0]:
                    handler.close()
            logger.handlers, logger.level, logger.propagate = saved


@contextlib.contextmanager
def _descriptors_to(log: Path, verbose: bool) -> Iterator[None]:
    """Inside, file descriptors 1 and 2 append to ``log``: whatever libraries and the processes
    started meanwhile write there, by any means (``print`` too), lands in the log. Two writers
    keep the terminal: the command's result (:func:`console.result`) goes to a copy of
    descriptor 1 as it was, and specshim's own lines and bars (:func:`console.terminal`) to a
    copy of descriptor 2 as it was. With ``verbose`` the libraries speak on the terminal:
    descriptor 1 goes to 2 instead (vLLM's logger and its workers write to stdout, which holds
    only the result). Streams that are not those descriptors (a test's capture) stay as they
    are."""
    stdout, stderr = sys.stdout, sys.stderr
    with contextlib.ExitStack() as stack:
        if verbose:
            results, own = _kept_aside(stack, 1, 2, stdout), None
        else:
            target = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
            stack.callback(os.close, target)
            results = _kept_aside(stack, 1, target, stdout)
            own = _kept_aside(stack, 2, target, stderr)
        results = results if _descriptor(stdout) == 1 else None
        own = own if _descriptor(stderr) == 2 else None
        stack.enter_context(console.speaking_to(own, results))
        if own:
            stack.enter_context(_fatal_errors_to(own))
        for stream in (stdout, stderr):
            if stream is not None:
                stack.callback(stream.flush)  # what libraries left in it goes to the log
        yield


def _kept_aside(stack: contextlib.ExitStack, fd: int, target: int, stream: Any) -> TextIO | None:
    """Point descriptor ``fd`` at ``target`` until ``stack`` closes, then back; return a
    line-buffered text stream, like ``stream``, on a copy of what ``fd`` was (None where the
    command was started without ``fd``, ``>&-``). A ``target`` the command was started without
    leaves ``fd`` alone."""
    if stream is not None:
        stream.flush()
    try:
        os.fstat(target)
    except OSError:
        return None
    try:
        saved = os.dup(fd)
    except OSError:  # started without it: it points at target meanwhile (else the next file
        os.dup2(target, fd)  # opened would take its number, and what is written to it)
        stack.callback(os.close, fd)
        return None
    stack.callback(os.close, saved)
    stack.callback(os.dup2, saved, fd)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    aside = open(os.dup(saved), "w", encoding=encoding, errors="backslashreplace", buffering=1)  # noqa: SIM115 closed by stack
    stack.callback(aside.close)
    os.dup2(target, fd)
    return aside


@contextlib.contextmanager
def _fatal_errors_to(terminal: TextIO) -> Iterator[None]:
    """Inside, a crash of this process (a segmentation fault in a library) prints its Python
    traceback on ``terminal`` (``faulthandler``), not into the log, which nothing would name;
    faulthandler is as it was after."""
    was = faulthandler.is_enabled()
    faulthandler.enable(terminal)
    try:
        yield
    finally:
        if was:
            faulthandler.enable(sys.__stderr__ or sys.stderr)
        else:
            faulthandler.disable()


def _descriptor(stream: Any) -> int | None:
    """The file descriptor ``stream`` writes to, or None (an in-memory stream)."""
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _loguru_to(handlers: list[logging.Handler]) -> Iterator[None]:
    """Inside, loguru's records (where loguru is installed) go to ``handlers`` instead of its
    default sink on stderr, which is back after."""
    try:
        from loguru import logger
    except ImportError:
        yield
        return
    logger.remove()
    sinks = [logger.add(handler, format="{message}", level="INFO") for handler in handlers]
    try:
        yield
    finally:
        for sink in sinks:
            logger.remove(sink)
        if sys.stderr is not None:  # started without stderr (2>&-): loguru had no sink there
            logger.add(sys.stderr)


@contextlib.contextmanager
def kept(folder: Path, verbose: bool = False) -> Iterator[Path]:
    """Inside, other libraries' messages go to ``folder``/:data:`FILE` (yielded), and on
    stderr too when ``verbose``. At the end one line says where the log is (at INFO; as a
    warning when the command failed, for the user to read why); nothing where this run wrote
    nothing there (an earlier run's log is appended to, not replaced). A command that failed
    having changed nothing else there shows the log's last lines instead and removes it: a
    refused command leaves nothing behind. A log that cannot be appended to (a folder, a
    symbolic link, not writable, a named pipe) is ``ValueError``, one line, before the command
    starts."""
    log = folder / FILE
    if folder.exists() and not folder.is_dir():  # the command refuses it with its own line
        yield log
        return
    new = not log.exists() and not log.is_symlink()
    _open(log)
    before = log.stat().st_size
    found = _state(folder)
    handlers = _handlers(log, verbose)
    root = logging.getLogger()
    saved = list(root.handlers)
    root.handlers = saved + handlers
    logging.captureWarnings(True)
    failed = True
    try:
        with _settings(log, verbose), _loguru_to(handlers), _descriptors_to(log, verbose):
            yield log
        failed = False
    finally:
        logging.captureWarnings(False)
        root.handlers = saved
        for handler in handlers:
            handler.close()
        if log.is_file() and log.stat().st_size > before:
            _tell(log, failed, alone=new and _state(folder) == found)
        elif new:  # nothing said: the file made up front goes
            log.unlink(missing_ok=True)


def _open(log: Path) -> None:
    """Make ``log`` (and its folder) if need be, as any new file (0666 less the umask), or
    check an earlier one can be appended to; never through a symbolic link, whose target is
    not specshim's to write. ``ValueError``, one line naming ``log``, where it cannot."""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        os.close(os.open(log, flags, 0o666))  # non-blocking: a named pipe would wait for a reader
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            what = "is a symbolic link, not specshim's log: remove it"
        elif exc.errno == errno.EISDIR:
            what = "is a folder, not specshim's log: move it away"
        else:
            what = f"cannot be written ({exc.strerror}): make it writable or remove it"
        raise ValueError(f"{log} {what}, and run again") from None


def _state(folder: Path) -> dict[str, tuple[int, int]]:
    """What ``folder`` holds besides the lock and the log (:func:`out_lock.contents`): each
    entry's name, size and modification time, to tell whether a command changed any."""
    return {p.name: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in out_lock.contents(folder)}


def _tell(log: Path, failed: bool, alone: bool) -> None:
    """Say where ``log`` is, or (a failed command that changed nothing else beside it,
    ``alone``, and the log too is this command's) its last lines, and the error that ended its
    first traceback (the cause, which a crash's last lines rarely hold), removing it."""
    if not failed:
        console.LOGGER.info("what vLLM and the other libraries said is in %s", log)
    elif alone:
        said = log.read_text(errors="replace").splitlines()
        log.unlink()
        console.LOGGER.warning(
            "what the libraries said last:\n  %s", "\n  ".join(said[-LAST_LINES:])
        )
        if (cause := _first_error(said)) and cause not in said[-LAST_LINES:]:
            console.LOGGER.warning("the first error they met: %s", cause)
    else:
        console.LOGGER.warning("what vLLM and the other libraries said is in %s", log)


def _first_error(lines: list[str]) -> str | None:
    """The line that ends the first Python traceback in ``lines`` (``KeyError: ...``), or None."""
    try:
        start = next(i for i, line in enumerate(lines) if line.endswith(TRACEBACK))
    except StopIteration:
        return None
    return next((line for line in lines[start + 1 :] if line and not line[0].isspace()), None)
