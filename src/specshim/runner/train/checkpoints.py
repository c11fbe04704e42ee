"""The checkpoints of a run, as speculators' checkpointer writes them: one folder an epoch,
complete once its last file reads; which epochs are done, and setting aside a half-written one."""

from __future__ import annotations

from pathlib import Path

from specshim.runner import stored

#: speculators writes a checkpoint's files in this order; the last one marks it complete.
CHECKPOINT_FILES = ("model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt")


def epochs(checkpoints: Path) -> list[Path]:
    """The epoch directories under ``checkpoints``, in training order."""
    return sorted((p for p in checkpoints.glob("*") if p.name.isdigit()), key=lambda p: int(p.name))


def checkpoint_problem(epoch_dir: Path) -> str | None:
    """The first of a checkpoint's files that is missing or does not read, and why, or None.

    Each is read as cheaply as it is checked: the model's safetensors header (and that the
    file is as long as it says), the optimizer's state memory-mapped, the scheduler's whole.
    """
    model, optimizer, scheduler = (epoch_dir / name for name in CHECKPOINT_FILES)
    try:
        stored.check_safetensors(model, "the draft's weights")
        stored.load_torch(optimizer, "the optimizer's state", mmap=True)
        stored.load_torch(scheduler, "the scheduler's state")
    except stored.BadFile as exc:
        return f"{exc.path.name} {exc.problem}"
    return None


def is_complete(epoch_dir: Path) -> bool:
    """Are all of a checkpoint's files there and readable (:func:`checkpoint_problem`)?"""
    return checkpoint_problem(epoch_dir) is None


def set_aside_incomplete(checkpoints: Path) -> list[str]:
    """Rename epoch directories that a kill left half-written (or whose files were damaged
    since), so resuming skips them; return one line for each, naming the file at fault.

    speculators' checkpointer resumes from the highest-numbered directory, complete or not;
    a directory with a file missing or unreadable (:func:`checkpoint_problem`) is renamed to
    ``incomplete-<epoch>`` (kept for inspection, ignored by speculators) and that epoch is
    trained again.
    """
    moved = []
    for epoch_dir in epochs(checkpoints):
        if problem := checkpoint_problem(epoch_dir):
            target = checkpoints / f"incomplete-{epoch_dir.name}"
            while target.exists():
                target = target.with_name(target.name + "-again")
            epoch_dir.rename(target)
            moved.append(f"set aside checkpoint {epoch_dir} as {target.name} ({problem})")
    return moved


def trained_epochs(checkpoints: Path) -> int:
    """How many epochs the complete checkpoints hold (speculators resumes after the last)."""
    complete = [int(p.name) for p in epochs(checkpoints) if is_complete(p)]
    return max(complete) + 1 if complete else 0
