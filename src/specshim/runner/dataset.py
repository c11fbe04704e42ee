"""Input rows for extraction: token ids, chat conversations, or a saved ``datasets`` dataset.

Every row becomes a :class:`Sample` with its input ids and a loss mask (1 where the draft
should learn: assistant tokens for conversations, every token for raw ids). A bad row raises
:class:`BadRow` with its line number, the field and what was expected, unless the caller
skips bad rows. Nothing is coerced: a value that is not plainly what the row format asks for
(0/1 integers in a loss mask, integer token ids, string roles and contents, UTF-8 text) is a
bad row, since a silently reinterpreted row trains the draft on something the user never wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BadRow(ValueError):
    """A row of the input that cannot be a sample: its file, its 1-based line and what is wrong
    with it, as one message."""

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


def record(input_ids: Any, hidden_states: list[Any], loss_mask: Any) -> dict[str, Any]:
    """One sample as speculators 0.3/0.4 store it (``data_{i}.pt``): token ids and loss mask
    as ``long`` tensors (from lists or tensors), and one ``[tokens, hidden]`` tensor per layer,
    each with a storage of its own (``torch.save`` writes a view's whole storage: a layer cut
    from stacked states would carry all of them). Every path that writes a sample builds it
    here."""
    import torch

    return {
        "input_ids": torch.as_tensor(input_ids, dtype=torch.long),
        "hidden_states": [h if _own_storage(h) else h.clone() for h in hidden_states],
        "loss_mask": torch.as_tensor(loss_mask, dtype=torch.long),
    }


def _own_storage(tensor: Any) -> bool:
    """Whether ``tensor`` is contiguous and the whole of its storage."""
    whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    return bool(tensor.is_contiguous() and whole)


ROLE_KEYS = ("messages", "conversations")

#: The roles chat templates render: the OpenAI chat format's system/user/assistant/tool, its
#: ``developer`` (o-series, gpt-oss), and Llama 3.1's ``ipython`` (tool output). Anything else
#: is a typo or another format; templates would render it as text, or drop it, silently.
KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool", "ipython")
EXPECTED_ROLE = f"expected one of {', '.join(KNOWN_ROLES)}"

#: ShareGPT's names (speculators' preprocessing maps them), named in the error as a hint.
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant"}


def _shown(value: Any) -> str:
    """``value`` as the user wrote it in JSON (``null``, ``true``, ``"1"``), kept short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value: Any) -> bool:
    """An integer and not a boolean (``bool`` is a subclass of ``int`` in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_entries(field: str, values: list[Any], ok: Callable[[Any], bool], expected: str) -> None:
    """Raise for the first entry of ``values`` that is not ``ok``, naming it as ``field[i]``."""
    for position, value in enumerate(values):
        if not ok(value):
            raise ValueError(f"{field}[{position}] is {_shown(value)}: expected {expected}")


def _check_turn(field: str, turn: Any) -> None:
    """A turn is ``{"role": <known role>, "content": <string>}``."""
    if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
        raise ValueError(f"{field} must be an object with 'role' and 'content', got {_shown(turn)}")
    role, content = turn["role"], turn["content"]
    if not isinstance(role, str):
        raise ValueError(f"{field}.role must be a string ({EXPECTED_ROLE}), got {_shown(role)}")
    if role not in KNOWN_ROLES:
        hint = f"; write {SHAREGPT_ROLES[role]!r} for {role!r}" if role in SHAREGPT_ROLES else ""
        raise ValueError(f"{field}.role {_shown(role)} is not a known role ({EXPECTED_ROLE}){hint}")
    if not isinstance(content, str):
        raise ValueError(f"{field}.content must be a string, got {_shown(content)}")


def _conversation(row: dict[str, Any]) -> list[dict[str, str]] | None:
    """The row's turns, checked, or None when the row is not a conversation.

    A conversation without an assistant turn is refused: its loss mask would be all zero, so
    the draft has nothing to learn from it.
    """
    for key in ROLE_KEYS:
        if key in row:
            turns = row[key]
            if not isinstance(turns, list) or not turns:
                raise ValueError(f"{key!r} must be a non-empty list of {{role, content}}")
            for position, turn in enumerate(turns):
                _check_turn(f"{key}[{position}]", turn)
            if not any(turn["role"] == "assistant" for turn in turns):
                raise ValueError(
                    f"{key!r} has no assistant turn: nothing for the draft to learn"
                    " (expected at least one turn with role 'assistant')"
                )
            return turns
    return None


def _render(tokenizer: Any, turns: list[dict[str, str]]) -> str:
    """The chat template's text for ``turns``; a template that refuses them is a bad row."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(turns, tokenize=False)
    except TemplateError as exc:
        raise ValueError(f"the chat template refused the conversation: {exc}") from exc


def chat_sample(tokenizer: Any, turns: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Apply the chat template; mask in the tokens each assistant turn adds.

    A template that renders no tokens for the assistant turns leaves nothing to learn: refused.
    """
    ids: list[int] = []
    mask: list[int] = []
    for end in range(1, len(turns) + 1):
        prefix = tokenizer(_render(tokenizer, turns[:end]), add_special_tokens=False)["input_ids"]
        if prefix[: len(ids)] != ids:
            raise ValueError("the chat template does not render turns as a growing prefix")
        added = prefix[len(ids) :]
        mask += [int(turns[end - 1]["role"] == "assistant")] * len(added)
        ids = prefix
    if not any(mask):
        raise ValueError("the chat template rendered no tokens for the assistant turns")
    return ids, mask


def _token_ids(row: dict[str, Any], vocab_size: int) -> list[int]:
    """``input_ids``: a non-empty list of integers (no booleans) inside the vocabulary."""
    ids = row["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise ValueError(f"'input_ids' must be a non-empty list of integers, got {_shown(ids)}")
    _check_entries("input_ids", ids, _is_int, "an integer token id")
    if bad := [t for t in ids if not 0 <= t < vocab_size]:
        raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    return ids


def _loss_mask(row: dict[str, Any], length: int) -> list[int]:
    """``loss_mask``: absent (learn every token) or ``length`` integers, each 0 or 1.

    Nothing is coerced: strings, other numbers, ``null`` and JSON ``true``/``false`` are refused,
    since a mask that is not plainly 0/1 is more likely a mistake (a shifted column, a
    probability) than a mask; speculators and Hugging Face's ``assistant_masks`` write 0/1
    integers. An all-zero mask is refused too: the row would teach the draft nothing.
    """
    if "loss_mask" not in row:
        return [1] * length
    mask = row["loss_mask"]
    if not isinstance(mask, list):
        raise ValueError(
            "'loss_mask' must be a list of 0/1 integers (or left out to learn every token),"
            f" got {_shown(mask)}"
        )
    if len(mask) != length:
        raise ValueError(f"'loss_mask' has {len(mask)} entries for {length} input ids")
    _check_entries("loss_mask", mask, lambda m: _is_int(m) and m in (0, 1), "0 or 1")
    if not any(mask):
        raise ValueError("'loss_mask' is all 0: nothing for the draft to learn")
    return mask


def _row_sample(row: Any, tokenizer: Any, vocab_size: int) -> tuple[list[int], list[int]]:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    turns = _conversation(row)
    if turns is not None:
        return chat_sample(tokenizer, turns)
    if "input_ids" not in row:
        raise ValueError(f"expected 'input_ids' or one of {ROLE_KEYS}, got keys {sorted(row)}")
    ids = _token_ids(row, vocab_size)
    return ids, _loss_mask(row, len(ids))


def _parse(source: Path, number: int, raw: bytes) -> Any:
    """One JSONL line's value, or a :class:`BadRow` saying why it is not UTF-8 JSON.

    Lines are decoded one at a time so that one bad byte names its line and can be skipped,
    instead of aborting the whole file. The first may start with a UTF-8 byte-order mark, as
    files saved by Windows tools do: it is not part of the row.
    """
    try:
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        start = exc.start + len(raw) - len(exc.object)  # exc.object: the line past the mark
        where = f"byte {raw[start]:#04x} at byte {start + 1} of the line"
        return BadRow(source, number, f"not valid UTF-8 ({where}; expected UTF-8 JSON)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return BadRow(source, number, f"not valid JSON ({exc.msg})")


def _records(source: Path) -> Iterator[tuple[int, Any]]:
    if source.is_dir():
        from datasets import load_from_disk

        for number, row in enumerate(load_from_disk(str(source)), start=1):
            yield number, dict(row)
        return
    with source.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield number, _parse(source, number, raw)


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
