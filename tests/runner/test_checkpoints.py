"""Half-written training checkpoints are set aside before resuming, never loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from specshim.runner.train import CHECKPOINT_FILES, set_aside_incomplete

torch = pytest.importorskip("torch")


def checkpoint(root: Path, epoch: int, files: tuple[str, ...]) -> Path:
    path = root / str(epoch)
    path.mkdir(parents=True)
    for name in files:
        torch.save({"epoch": epoch}, path / name)
    return path


def test_only_incomplete_epochs_are_set_aside(tmp_path: Path) -> None:
    checkpoint(tmp_path, 0, CHECKPOINT_FILES)
    checkpoint(tmp_path, 1, CHECKPOINT_FILES[:2])  # killed before the scheduler state
    truncated = checkpoint(tmp_path, 2, CHECKPOINT_FILES)
    (truncated / CHECKPOINT_FILES[-1]).write_bytes(b"PK\x03")  # killed mid-write
    moved = set_aside_incomplete(tmp_path)
    assert sorted(p.name for p in moved) == ["incomplete-1", "incomplete-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "incomplete-1", "incomplete-2"]
    assert set_aside_incomplete(tmp_path) == []  # nothing left to move
