"""Input rows: token ids, chats with assistant loss masks, and bad rows named by line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specshim.runner import dataset

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models["llama"])


def line(row: object) -> bytes:
    """One JSONL line: bytes and text as given (to write broken lines), anything else as JSON."""
    if isinstance(row, bytes):
        return row + b"\n"
    return (row if isinstance(row, str) else json.dumps(row)).encode() + b"\n"


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"".join(line(r) for r in rows))
    return path


def chat(*roles: object, content: object = "hi") -> dict[str, object]:
    return {"messages": [{"role": role, "content": content} for role in roles]}


def test_token_ids_rows_keep_order_and_mask_everything(tmp_path, tokenizer) -> None:
    path = write(tmp_path, {"input_ids": [5, 6, 7]}, {"input_ids": [8, 9], "loss_mask": [0, 1]})
    samples = list(dataset.read(path, tokenizer))
    assert [(s.index, s.input_ids, s.loss_mask) for s in samples] == [
        (0, [5, 6, 7], [1, 1, 1]),
        (1, [8, 9], [0, 1]),
    ]


def test_samples_name_their_line_in_the_input(tmp_path, tokenizer) -> None:
    path = write(tmp_path, {"input_ids": [5]}, "", "{bad", {"input_ids": [6]})
    samples = list(dataset.read(path, tokenizer, skip_bad=True))
    assert [(s.index, s.line) for s in samples] == [(0, 1), (1, 4)]


def test_chat_masks_exactly_the_assistant_tokens(tmp_path, tokenizer) -> None:
    turns = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "four"}]
    (sample,) = dataset.read(write(tmp_path, {"messages": turns}), tokenizer)
    rendered = tokenizer.apply_chat_template(turns, tokenize=False)
    assert sample.input_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assistant = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert tokenizer.decode(assistant) == "<|assistant|>four<|end|>"
    assert 0 < sum(sample.loss_mask) < len(sample.loss_mask)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("{not json", "line 2: not valid JSON"),
        ({"text": "hi"}, "line 2: expected 'input_ids' or one of"),
        ({"input_ids": [1, 99999]}, "line 2: token ids [99999] are outside the vocabulary"),
        ({"input_ids": [1, 2], "loss_mask": [1]}, "line 2: 'loss_mask' has 1 entries for 2"),
        ({"messages": [{"role": "user"}]}, "line 2: messages[0] must be an object with 'role'"),
        ({"messages": []}, "line 2: 'messages' must be a non-empty list"),
        ({"input_ids": [1, 2], "loss_mask": 3}, "line 2: 'loss_mask' must be a list of 0/1 "),
        ({"input_ids": [1, 2], "loss_mask": None}, "list of 0/1 integers (or left out"),
        (
            {"input_ids": [1, 2], "loss_mask": ["1", "0"]},
            'line 2: loss_mask[0] is "1": expected 0 or 1',
        ),
        ({"input_ids": [1, 2], "loss_mask": [1, 2]}, "line 2: loss_mask[1] is 2: expected 0 or 1"),
        ({"input_ids": [1, 2], "loss_mask": [-1, 1]}, "line 2: loss_mask[0] is -1: expected"),
        ({"input_ids": [1, 2], "loss_mask": [1, 0.5]}, "line 2: loss_mask[1] is 0.5: expected"),
        ({"input_ids": [1, 2], "loss_mask": [True, 1]}, "line 2: loss_mask[0] is true: expected"),
        ({"input_ids": [1, 2], "loss_mask": [0, 0]}, "line 2: 'loss_mask' is all 0: nothing"),
        ({"input_ids": [5, True]}, "line 2: input_ids[1] is true: expected an integer token id"),
        (b'{"input_ids": [5]}\xff', "line 2: not valid UTF-8 (byte 0xff at byte 19 of the line"),
        (chat("user", "gpt"), 'line 2: messages[1].role "gpt" is not a known role'),
        (chat("user", 3), "line 2: messages[1].role must be a string"),
        (chat("user", "assistant", content=None), "line 2: messages[0].content must be a str"),
        (chat("user", "assistant", content=["hi"]), "messages[0].content must be a string"),
        (chat("system", "user"), "line 2: 'messages' has no assistant turn: nothing for the dr"),
    ],
)
def test_bad_row_is_named_by_line(tmp_path, tokenizer, row, problem) -> None:
    path = write(tmp_path, {"input_ids": [5]}, row, {"input_ids": [6]})
    with pytest.raises(dataset.BadRow) as caught:
        list(dataset.read(path, tokenizer))
    assert problem in str(caught.value) and caught.value.line == 2
    skipped: list[dataset.BadRow] = []
    kept = list(dataset.read(path, tokenizer, skip_bad=True, skipped=skipped))
    assert [s.input_ids for s in kept] == [[5], [6]] and [s.index for s in kept] == [0, 1]
    assert len(skipped) == 1


def test_a_byte_order_mark_at_the_start_is_not_part_of_the_first_row(tmp_path, tokenizer) -> None:
    """Windows tools save UTF-8 with a byte-order mark; only the file's start may hold one, and
    a bad byte after it is still named by its place in the line as written."""
    path = write(
        tmp_path, b"\xef\xbb\xbf" + line({"input_ids": [5, 6]}).strip(), chat("user", "assistant")
    )
    samples = list(dataset.read(path, tokenizer))
    assert len(samples) == 2 and samples[0].input_ids == [5, 6]
    path = write(tmp_path, b'\xef\xbb\xbf{"input_ids": [5]}\xff')
    with pytest.raises(dataset.BadRow, match=r"line 1: not valid UTF-8 \(byte 0xff at byte 22 "):
        list(dataset.read(path, tokenizer))
    path = write(tmp_path, {"input_ids": [5]}, b'\xef\xbb\xbf{"input_ids": [6]}')
    with pytest.raises(dataset.BadRow, match="line 2: not valid JSON"):
        list(dataset.read(path, tokenizer))


def test_sharegpt_roles_are_named_with_their_chat_name(tmp_path, tokenizer) -> None:
    with pytest.raises(
        dataset.BadRow, match=r"role \"human\" is not a known role .*; write 'user' for 'human'"
    ):
        list(dataset.read(write(tmp_path, chat("human", "assistant")), tokenizer))


def with_template(tokenizer: object, template: str) -> object:
    """A copy of the real tokenizer with another real chat template."""
    changed = copy.deepcopy(tokenizer)
    changed.chat_template = template
    return changed


def test_template_that_renders_no_assistant_tokens_is_a_bad_row(tmp_path, tokenizer) -> None:
    drops_assistant = (
        "{% for m in messages %}{% if m['role'] != 'assistant' %}"
        "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    )
    path = write(tmp_path, chat("user", "assistant"))
    with pytest.raises(dataset.BadRow, match="line 1: the chat template rendered no tokens for"):
        list(dataset.read(path, with_template(tokenizer, drops_assistant)))


def test_template_that_refuses_a_conversation_is_a_bad_row(tmp_path, tokenizer) -> None:
    no_system = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('system messages are not supported') }}{% endif %}"
        "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    )
    path = write(tmp_path, chat("user", "assistant"), chat("system", "user", "assistant"))
    skipped: list[dataset.BadRow] = []
    kept = list(dataset.read(path, with_template(tokenizer, no_system), True, skipped))
    assert [s.line for s in kept] == [1] and [b.line for b in skipped] == [2]
    assert "chat template refused the conversation: system messages are not supported" in str(
        skipped[0]
    )


def test_missing_file_says_what_was_expected(tmp_path, tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match="expected JSONL or a dataset"):
        list(dataset.read(tmp_path / "nope.jsonl", tokenizer))


def test_saved_datasets_directory_is_read(tmp_path, tokenizer) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"input_ids": [5, 6]}, {"input_ids": [7]}]).save_to_disk(
        tmp_path / "ds"
    )
    samples = list(dataset.read(tmp_path / "ds", tokenizer))
    assert [(s.line, s.input_ids) for s in samples] == [(1, [5, 6]), (2, [7])]
