"""Training checkpoints with a file missing or damaged are set aside before resuming, never
loaded, and the line saying so names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from specshim.runner.train.checkpoints import CHECKPOINT_FILES, set_aside_incomplete, trained_epochs

torch = pytest.importorskip("torch")

MODEL, OPTIMIZER, SCHEDULER = CHECKPOINT_FILES


def checkpoint(root: Path, epoch: int, names: tuple[str, ...] = CHECKPOINT_FILES) -> Path:
    """The files of one epoch's checkpoint as speculators writes them (``names`` of them)."""
    from safetensors.torch import save_file

    path = root / str(epoch)
    path.mkdir(parents=True)
    weights = {"fc.weight": torch.randn(64, 64)}
    for name in names:
        if name == MODEL:
            save_file(weights, path / name)
        elif name == OPTIMIZER:
            torch.save(
                {"state": {0: {"exp_avg": torch.zeros(64, 64)}}, "param_groups": []}, path / name
            )
        else:
            torch.save({"last_epoch": epoch}, path / name)
    return path


def truncate(path: Path) -> None:
    """What a kill mid-write or a copy cut short leaves: the file's first half."""
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])


def test_only_incomplete_epochs_are_set_aside(tmp_path: Path) -> None:
    checkpoint(tmp_path, 0)
    checkpoint(tmp_path, 1, CHECKPOINT_FILES[:2])  # killed before the scheduler state
    truncate(checkpoint(tmp_path, 2) / SCHEDULER)  # killed mid-write
    moved = set_aside_incomplete(tmp_path)
    assert len(moved) == 2
    assert "as incomplete-1" in moved[0] and f"{SCHEDULER} missing" in moved[0]
    assert "as incomplete-2" in moved[1] and f"{SCHEDULER} could not be loaded" in moved[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "incomplete-1", "incomplete-2"]
    assert set_aside_incomplete(tmp_path) == []  # nothing left to move


@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        (MODEL, "could not be loaded as the draft's weights (Error while deserializing header"),
        (OPTIMIZER, "could not be loaded as the optimizer's state ("),
    ],
)
def test_a_damaged_model_or_optimizer_file_is_not_trusted(tmp_path: Path, damaged, said) -> None:
    """Every file of a checkpoint is checked, not only the scheduler's (speculators would load
    the truncated model on resume: 'incomplete metadata, file not fully covered')."""
    checkpoint(tmp_path, 0)
    truncate(checkpoint(tmp_path, 1) / damaged)
    assert trained_epochs(tmp_path) == 1
    (moved,) = set_aside_incomplete(tmp_path)
    assert f"{tmp_path / '1'} as incomplete-1 ({damaged} {said}" in moved, moved
    assert "\n" not in moved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "incomplete-1"]
