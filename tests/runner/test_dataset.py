"""Input rows: token ids, chats with assistant loss masks, and bad rows named by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specshim.runner import dataset

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models["llama"])


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


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
        ({"messages": [{"role": "user"}]}, "line 2: every turn needs 'role' and 'content'"),
        ({"messages": []}, "line 2: 'messages' must be a non-empty list"),
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
