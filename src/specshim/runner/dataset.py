"""Input rows for extraction: token ids, chat conversations, or a saved ``datasets`` dataset.

Every row becomes a :class:`Sample` with its input ids and a loss mask (1 where the draft
should learn: assistant tokens for conversations, every token for raw ids). A bad row raises
:class:`BadRow` with its line number and what was wrong, unless the caller skips bad rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BadRow(ValueError):
    def __init__(self, source: Path, line: int, problem: str) -> None:
        super().__init__(f"{source}, line {line}: {problem}")
        self.line = line


@dataclass(frozen=True)
class Sample:
    """One good row.

    ``index`` is the 0-based position among the good samples (output files are named
    ``data_{index}.pt``); ``line`` is where the row sits in the user's input: the 1-based line
    of a JSONL file, or the 1-based row number of a saved ``datasets`` dataset, so messages can
    point at the row the user wrote.
    """

    index: int
    line: int
    input_ids: list[int]
    loss_mask: list[int]


ROLE_KEYS = ("messages", "conversations")


def _conversation(row: dict[str, Any]) -> list[dict[str, str]] | None:
    for key in ROLE_KEYS:
        if key in row:
            turns = row[key]
            if not isinstance(turns, list) or not turns:
                raise ValueError(f"{key!r} must be a non-empty list of {{role, content}}")
            for turn in turns:
                if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                    raise ValueError(f"every turn needs 'role' and 'content', got {turn!r}")
            return turns
    return None


def chat_sample(tokenizer: Any, turns: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Apply the chat template; mask in the tokens each assistant turn adds."""
    ids: list[int] = []
    mask: list[int] = []
    for end in range(1, len(turns) + 1):
        rendered = tokenizer.apply_chat_template(turns[:end], tokenize=False)
        prefix = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if prefix[: len(ids)] != ids:
            raise ValueError("the chat template does not render turns as a growing prefix")
        added = prefix[len(ids) :]
        mask += [int(turns[end - 1]["role"] == "assistant")] * len(added)
        ids = prefix
    return ids, mask


def _row_sample(row: Any, tokenizer: Any, vocab_size: int) -> tuple[list[int], list[int]]:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    turns = _conversation(row)
    if turns is not None:
        return chat_sample(tokenizer, turns)
    if "input_ids" not in row:
        raise ValueError(f"expected 'input_ids' or one of {ROLE_KEYS}, got keys {sorted(row)}")
    ids = row["input_ids"]
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise ValueError("'input_ids' must be a non-empty list of integers")
    if bad := [t for t in ids if not 0 <= t < vocab_size]:
        raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    mask = row.get("loss_mask", [1] * len(ids))
    if len(mask) != len(ids):
        raise ValueError(f"'loss_mask' has {len(mask)} entries for {len(ids)} input ids")
    return ids, [int(bool(m)) for m in mask]


def _records(source: Path) -> Iterator[tuple[int, Any]]:
    if source.is_dir():
        from datasets import load_from_disk

        for number, row in enumerate(load_from_disk(str(source)), start=1):
            yield number, dict(row)
        return
    with source.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, BadRow(source, number, f"not valid JSON ({exc.msg})")


def read(
    source: Path, tokenizer: Any, skip_bad: bool = False, skipped: list[BadRow] | None = None
) -> Iterator[Sample]:
    """The samples of ``source`` in order; bad rows raise, or are collected in ``skipped``."""
    if not source.exists():
        raise FileNotFoundError(f"data file {source} does not exist (expected JSONL or a dataset)")
    index = 0
    for number, record in _records(source):
        try:
            if isinstance(record, BadRow):
                raise record
            ids, mask = _row_sample(record, tokenizer, len(tokenizer))
        except BadRow as exc:
            error = exc
        except ValueError as exc:
            error = BadRow(source, number, str(exc))
        else:
            yield Sample(index, number, ids, mask)
            index += 1
            continue
        if not skip_bad:
            raise error
        if skipped is not None:
            skipped.append(error)
