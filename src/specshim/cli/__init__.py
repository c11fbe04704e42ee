"""specshim: run speculators 0.3/0.4 (EAGLE-3 draft training) on newer vLLM releases.

Each command's --help has an example; the docs are in docs/ of the source repository.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from specshim import console
from specshim.cli.data import _add_convert, _add_extract, _add_vocab
from specshim.cli.draft import _add_eval, _add_run, _add_train
from specshim.cli.installation import _add_report, _add_snapshot, _add_triage
from specshim.runner import distributed, files, out_lock

#: The commands in the order ``specshim --help`` lists them: each ``_add_<name>`` (beside its
#: handler, in this package's modules) declares one command's options.
COMMANDS = (
    _add_report,
    _add_extract,
    _add_convert,
    _add_vocab,
    _add_train,
    _add_snapshot,
    _add_triage,
    _add_eval,
    _add_run,
)


ROOT_EXAMPLE = """\
example:
  specshim report                                    # is this vLLM + speculators tested?
  specshim extract --model M --data chats.jsonl --out hs/
  specshim vocab --data hs/ --draft-vocab-size 32000 --model M
  specshim train --data hs/ --verifier M --out draft/
  specshim eval --verifier M --draft draft/ --data hs/
"""


def parser() -> argparse.ArgumentParser:
    import specshim

    root = argparse.ArgumentParser(
        prog="specshim",
        description=__doc__,
        epilog=ROOT_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"specshim {specshim.__version__}")
    commands = root.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return root


#: The exit status of a folder another command holds (:mod:`specshim.runner.out_lock`):
#: argparse's for a command that cannot run as given, apart from bad input's 1.
IN_USE = 2


def _written_folder(args: argparse.Namespace) -> tuple[str, Path] | None:
    """The option and folder ``args.command`` writes into, where one command at a time may:
    ``train`` under torchrun locks it in its first process only (all of them write there)."""
    if args.command in ("extract", "convert") or (args.command == "train" and distributed.first()):
        return "--out", args.out
    if args.command == "vocab":
        return ("--out", args.out) if args.out else ("--data", args.data)
    if args.command == "run":
        return "--workdir", args.workdir
    return None


@contextlib.contextmanager
def _holding(args: argparse.Namespace) -> Iterator[None]:
    """Inside, the command holds the folder it writes into (:func:`out_lock.held`)."""
    folder = _written_folder(args)
    if folder is None:
        yield
        return
    option, path = folder
    with out_lock.held(path, args.command, option):
        yield


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """Inside, SIGTERM (``kill``'s and a scheduler's stop) is raised as ``KeyboardInterrupt``,
    as Ctrl-C is, so that it gets the same clean-up (vLLM's processes shut down, what was
    written recorded) and one line; Python's default for it ends the process at once, and
    vLLM's workers outlive it. Yields the SIGTERMs received, for the exit status."""
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:  # `specshim` alone: what there is to run
        parser().print_help()
        return 0
    console.configure(args.quiet)
    console.phase("command started")
    from specshim import hardware  # not at the top: --version needs none of its imports

    hardware.keep_forks_able_to_use_cuda()  # before the commands' imports ask torch
    if args.command == "vocab" and args.target_vocab_size is None and args.model is None:
        parser().error("vocab needs --target-vocab-size or --model")
    with _sigterm_as_ctrl_c() as terminated:
        try:
            with _holding(args):
                return args.handler(args)
        except out_lock.OutInUse as exc:
            print(f"specshim {args.command}: {exc}", file=sys.stderr)
            return IN_USE
        except (FileNotFoundError, files.DiskFull, ValueError, RuntimeError) as exc:
            print(f"specshim {args.command}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line (what was saved)
            print(f"specshim {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def run() -> NoReturn:
    """The ``specshim`` command: :func:`main`, then the process ends without the interpreter's
    teardown. After vLLM, that teardown (freeing every module of torch, vLLM and transformers)
    takes seconds and does nothing a user sees: each file was written and closed by then. What
    an exit does besides is done first: thread pools stopped and other threads joined, the exit
    handlers (``atexit``: vLLM's shutdown, the writer processes' end, ``logging``'s flush) run,
    every output buffer flushed."""
    code = main()
    import atexit
    import ctypes
    import threading

    # as the interpreter's exit does: thread pools told to stop, other threads joined, then the
    # exit handlers
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by its reader: nobody to tell
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # what C code wrote to stdout, buffered by the C library
    os._exit(code)
