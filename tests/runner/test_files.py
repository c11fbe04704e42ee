"""Atomic writes leave either the whole file or nothing."""

from pathlib import Path

import pytest

from specshim.runner import files


def test_failed_write_leaves_no_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "data_0.pt"

    def explode(f) -> None:
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(target, explode)
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_whole_file_and_partials_are_cleaned(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    files.save_json(target, {"a": 1})
    files.save_json(target, {"a": 2})
    assert target.read_text() == '{\n  "a": 2\n}'
    (tmp_path / ".data_3.pt.abc.tmp").write_bytes(b"partial")
    assert files.remove_partials(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
