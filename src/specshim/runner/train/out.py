"""``--out`` of ``specshim train``: one run a folder. A folder that is not empty is refused
unless the run in it is resumed (its recorded settings must match) or overwritten; the
run's files, the recorded settings and the log's JSON."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import files, out_lock
from specshim.runner.train.checkpoints import set_aside_incomplete, trained_epochs
from specshim.runner.train.options import Settings

LOG_FILE = "train_log.json"
SETTINGS_FILE = "train_settings.json"
#: Where ``overwrite`` moves the earlier run before deleting it (a kill midway leaves only it).
TRASH = ".overwritten"
#: What a run writes into ``--out``, with what ``specshim eval`` adds there (``served*``: the
#: exports of its checkpoints; ``eval-served*``, or ``eval`` before: their results): all of it
#: is the run's, to overwrite.
RUN_FILES = ("checkpoints", LOG_FILE, SETTINGS_FILE, TRASH, "eval")


def _contents(out: Path) -> list[Path]:
    """What ``out`` holds, less the lock of the command writing there (``out_lock``)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; expected a folder (new, or a run to resume)")
    return out_lock.contents(out) if out.is_dir() else []


def _is_run_file(path: Path) -> bool:
    name = path.name
    return name in RUN_FILES or name.startswith(("served", "eval-served")) or name.endswith(".tmp")


def check_out(out: Path, settings: Settings, resume: bool, overwrite: bool) -> None:
    """Refuse to mix two runs in one ``--out``, before anything is written.

    A folder that is not empty needs ``resume`` (its recorded settings must match) or
    ``overwrite`` (it must hold nothing but a run's files, which are all that is removed).
    """
    contents = _contents(out)
    if not contents:
        return
    if overwrite:
        foreign = [p.name for p in contents if not _is_run_file(p)]
        if foreign:
            raise ValueError(
                f"--overwrite: --out {out} holds files a training run does not write: "
                f"{console.listed(foreign)}; nothing was removed: pick a new --out"
            )
    elif not resume:
        raise ValueError(
            f"--out {out} is not empty: pass --resume to continue the run in it or "
            f"--overwrite to start over, or pick a new --out"
        )
    elif not (out / SETTINGS_FILE).exists():
        note(f"--resume: {out} records no settings ({SETTINGS_FILE}); they cannot be checked")
    else:
        differences = settings.differences(run_file(out / SETTINGS_FILE))
        if differences:
            raise ValueError(
                f"--resume: the run in {out} had other settings: {'; '.join(differences)}; "
                f"pass the same, or --overwrite to start over, or pick a new --out"
            )


def run_file(path: Path) -> dict[str, Any]:
    """A JSON object this module wrote into ``--out``; anything else is one line naming it."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); expected the JSON a run writes") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a {type(data).__name__}; expected the JSON object a run writes"
        )
    return data


def remove_run(out: Path) -> None:
    """``overwrite``: move the earlier run's files into ``out/.overwritten``, then delete that.

    A kill midway leaves only run files (the trash among them), which the next ``overwrite``
    removes too; nothing else in ``out`` is touched (``check_out`` refused any). A folder in it
    that another command holds (``eval``'s export or results) stops it first, with
    ``out_lock.OutInUse``; the others are held while they are moved.
    """
    with contextlib.ExitStack() as holding:
        for path in _contents(out):
            if (path / out_lock.LOCK_FILE).exists():
                holding.enter_context(out_lock.held(path, "train", "--overwrite:"))
        trash = out / TRASH
        shutil.rmtree(trash, ignore_errors=True)  # an earlier overwrite's, killed midway
        trash.mkdir()
        for path in _contents(out):
            if path != trash:
                path.rename(trash / path.name)
        shutil.rmtree(trash)


def make_out(out: Path) -> None:
    """Create ``out`` (and its parents), or say in one line why it cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be created: {exc.strerror}") from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable")


def note(text: str) -> None:
    """Print ``[specshim train] text`` on stderr."""
    console.status("specshim train", text)


def prepare_out(out: Path, settings: Settings, resume: bool, overwrite: bool, epochs: int) -> None:
    """On one process: clear or set up ``out`` as ``check_out`` allowed, record the settings."""
    if overwrite and _contents(out):
        remove_run(out)
        note(f"--overwrite: removed the earlier run in {out}")
    if resume:
        for line in set_aside_incomplete(out / "checkpoints"):
            note(line)
        done = trained_epochs(out / "checkpoints")
        if done:
            left = f"epoch {epochs}" if done + 1 == epochs else f"epochs {done + 1} to {epochs}"
            note(
                f"resuming from {out / 'checkpoints' / str(done - 1)} "
                f"({done} of {epochs} epochs done; training {left})"
            )
        else:
            note(f"--resume: no checkpoint in {out}; starting from epoch 1")
    files.save_json(out / SETTINGS_FILE, asdict(settings))
