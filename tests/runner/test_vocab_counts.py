"""``specshim vocab`` on token counts speculators' mapping cannot take: one line naming
``token_freq.pt`` before speculators is reached (before: an IndexError or TypeError traceback
from speculators' ``build_vocab_mappings_from_distribution``, and negative counts taken)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specshim.runner import stored, vocab


def counts(tmp_path: Path, freq: dict) -> Path:
    data = tmp_path / "hs"
    data.mkdir()
    torch.save(freq, data / "token_freq.pt")
    return data


@pytest.mark.parametrize(
    ("freq", "expected"),
    [
        ({3: "5"}, "holds 3: '5' (expected token id: count, whole numbers)"),
        ({"a": 5}, "holds 'a': 5 (expected token id: count, whole numbers)"),
        ({3: -2}, "holds 3: -2 (expected token id: count, whole numbers)"),
        ({3: 1.5}, "holds 3: 1.5 (expected token id: count, whole numbers)"),
    ],
)
def test_counts_that_are_not_whole_numbers_name_the_file(tmp_path, freq, expected) -> None:
    data = counts(tmp_path, freq)
    with pytest.raises(stored.BadFile, match=r"token_freq\.pt") as refused:
        vocab.build(data, 2, 16, tmp_path / "v")
    assert expected in str(refused.value)
    assert not (tmp_path / "v" / "d2t.npy").exists()


@pytest.mark.parametrize(("freq", "token"), [({3: 1, 99: 2}, 99), ({-1: 4, 2: 1}, -1)])
def test_a_token_outside_the_target_vocabulary_is_one_line(tmp_path, freq, token) -> None:
    data = counts(tmp_path, freq)
    with pytest.raises(ValueError, match=f"counts token id {token}, outside a target vocabulary"):
        vocab.build(data, 2, 16, tmp_path / "v")


def test_whole_counts_in_the_vocabulary_pass_the_check(tmp_path) -> None:
    fix = "extract again"
    vocab.check_counts({0: 1, 15: 0, 7: torch.tensor(3)}, tmp_path / "token_freq.pt", 16, fix)
