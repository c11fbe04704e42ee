"""How specshim speaks besides a command's result: its progress and notes go through the
logger ``specshim`` (``logging``), and an error from elsewhere (vLLM, torch, datasets) is quoted
in one line.

stdout belongs to the commands' results (``specshim.cli`` and the built-in demo,
``runner/pipeline.py``). Everything else is a ``logging`` record of ``specshim`` or a logger
under it, so that a program using specshim silences, filters or redirects it as it does any
library's; the command line (:func:`configure`) writes them to stderr as ``specshim: text``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from typing import TextIO

#: specshim's own logger: every module's logger (``logging.getLogger(__name__)``) is under it.
LOGGER = logging.getLogger("specshim")
#: How the command line writes a record on stderr.
FORMAT = "specshim: %(message)s"
#: Set (to anything but empty), the command line writes specshim's debug records too, its
#: phase marks (:func:`phase`) among them.
DEBUG_ENV = "SPECSHIM_DEBUG"
#: How a phase mark begins (:func:`phase`); what follows is its name, `` at `` and the clock.
PHASE = "phase "


#: The head of a pydantic ``ValidationError`` (vLLM's configs): its first line says only how
#: many errors, for which class; what is wrong follows, up to `` [type=``.
VALIDATION_HEAD = re.compile(r"\d+ validation errors? for \w+")


#: Where :func:`terminal` and :func:`result` point while :func:`speaking_to` is in force.
_terminal: TextIO | None = None
_result: TextIO | None = None


def terminal() -> TextIO:
    """Where specshim's own lines and progress bars go: ``sys.stderr`` as it is now (a test's
    capture too), or the terminal that :func:`speaking_to` named while a command sends every
    other write to stderr into its log."""
    return _terminal or sys.stderr


def result() -> TextIO | None:
    """Where a command's result goes: ``sys.stdout`` as it is now (None where the command was
    started without it), or the terminal's stdout that :func:`speaking_to` named while every
    other write to stdout goes into the command's log."""
    return _result or sys.stdout


@contextlib.contextmanager
def speaking_to(own: TextIO | None, results: TextIO | None) -> Iterator[None]:
    """Inside, :func:`terminal` is ``own`` and :func:`result` is ``results`` (None: as they
    were)."""
    global _terminal, _result
    saved = _terminal, _result
    _terminal, _result = own or _terminal, results or _result
    try:
        yield
    finally:
        _terminal, _result = saved


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to :func:`terminal` as it is when the record comes (a redirect
    made after :func:`configure`, a test's capture), flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = terminal()
        super().emit(record)


def configure(quiet: bool = False) -> None:
    """Write specshim's records on stderr as ``specshim: text``: progress and notes (INFO) too,
    or only warnings and errors when ``quiet``; every record, debug too, where :data:`DEBUG_ENV`
    is set. The command line calls it once per command; calling it again replaces what it set,
    never adds a second handler."""
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT))
    LOGGER.handlers = [h for h in LOGGER.handlers if not isinstance(h, _Stderr)] + [handler]
    level = logging.WARNING if quiet else logging.INFO
    LOGGER.setLevel(logging.DEBUG if os.environ.get(DEBUG_ENV) else level)
    LOGGER.propagate = False  # the root logger's handlers, if any, would print it twice


def status(label: str, text: str) -> None:
    """A progress line, at INFO on specshim's logger: ``text`` after what it is about, the
    ``label`` without a leading "specshim" (the format says that): ``specshim: train: ...``."""
    about = label.removeprefix("specshim").strip()
    LOGGER.info("%s: %s" if about else "%s%s", about, text)


def phase(name: str) -> None:
    """Mark that a command reached the boundary ``name`` ("config read", "engine started"):
    at DEBUG, ``phase NAME at SECONDS``, the seconds of ``time.monotonic``, one clock for
    every process of the machine, so that whoever started the command sees how far into its
    run each phase ended (``benchmarks/start_cost.py``). Below DEBUG it costs a level check."""
    if LOGGER.isEnabledFor(logging.DEBUG):
        LOGGER.debug("%s%s at %.6f", PHASE, name, time.monotonic())


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name where it has none; for a
    pydantic validation error (vLLM refusing its config) the first error with it, on one
    line: "1 validation error for VllmConfig" alone named nothing to change."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if VALIDATION_HEAD.fullmatch(lines[0]):
        said = []
        for line in lines[1:]:
            said.append(line.split(" [type=")[0])
            if " [type=" in line:
                break
        return f"{lines[0]}: {' '.join(said)}" if said else lines[0]
    return lines[0]


def listed(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names`` and how many more: ``a, b, c and 12 more``, so that
    a line naming files stays one line however many there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")
