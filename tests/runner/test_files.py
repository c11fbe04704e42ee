"""Atomic writes leave either the whole file or nothing."""

import contextlib
import os
import re
import threading
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


def test_background_writer_writes_every_record_whole(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    records = {tmp_path / f"data_{i}.pt": {"x": torch.full((100,), i)} for i in range(40)}
    with files.BackgroundWriter(depth=4) as writer:
        for path, record in records.items():
            writer.submit(path, record)
    for path, record in records.items():
        assert torch.equal(torch.load(path)["x"], record["x"])
    assert files.remove_partials(tmp_path) == 0


def test_background_writer_threads_record_every_file_once(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ledger = files.Ledger(tmp_path / "ledger.jsonl")
    with files.BackgroundWriter(depth=8, ledger=ledger, threads=8) as writer:
        for i in range(64):
            writer.submit(tmp_path / f"data_{i}.pt", {"x": torch.full((1000,), i)}, f"print {i}")
    entries = ledger.entries()
    assert sorted(entries) == sorted(f"data_{i}.pt" for i in range(64))
    assert len(ledger.path.read_text().splitlines()) == 64  # no line torn or lost
    assert all(e.still_there(tmp_path) and e.fingerprint == f"print {e.file[5:-3]}"
               for e in entries.values())  # fmt: skip


def test_background_writer_raises_the_failed_write(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    writer = files.BackgroundWriter()
    writer.submit(tmp_path / "x.pt", {"unpicklable": lambda: None})
    with pytest.raises(RuntimeError, match="writing extracted samples failed"):
        writer.close()
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary


def test_background_writer_finishes_handed_over_writes_when_the_caller_fails(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    with pytest.raises(KeyError), files.BackgroundWriter() as writer:
        for i in range(10):
            writer.submit(tmp_path / f"data_{i}.pt", {"i": i})
        raise KeyError("the generator failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"data_{i}.pt" for i in range(10))


def test_background_writer_makes_records_on_its_threads_and_raises_refusals_as_they_are(
    tmp_path: Path,
) -> None:
    """A function handed over runs on a writer thread; what it raises reaches the caller
    unwrapped (not as a failed write), and nothing is written for that record."""
    pytest.importorskip("torch")
    made_on: list[str] = []

    def record() -> dict[str, int]:
        made_on.append(threading.current_thread().name)
        return {"x": 1}

    def refused() -> dict[str, int]:
        raise ValueError("line 8 (data_1.pt): refusing to write it")

    writer = files.BackgroundWriter()
    writer.submit(tmp_path / "data_0.pt", record)
    writer.submit(tmp_path / "data_1.pt", refused)
    with pytest.raises(ValueError, match=r"^line 8 \(data_1.pt\): refusing to write it$"):
        writer.close()
    assert made_on and made_on[0].startswith("specshim-writer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data_0.pt"]


def test_a_write_on_a_full_disk_says_so_and_leaves_nothing(small_disk) -> None:
    torch = pytest.importorskip("torch")
    disk = small_disk(256)
    files.save_torch(disk / "data_0.pt", {"x": torch.zeros(16 << 10)})  # 64 KiB: fits
    with pytest.raises(files.DiskFull) as raised:
        files.save_torch(disk / "data_1.pt", {"x": torch.zeros(256 << 10)})  # 1 MiB: does not
    assert str(raised.value).startswith(f"no space left in {disk} (")
    assert "run the same command again" in str(raised.value)
    assert [p.name for p in disk.iterdir()] == ["data_0.pt"]  # no partial file left

    # torch.save itself does not say that the disk is full ("iostream error", "unexpected pos"):
    with pytest.raises(RuntimeError) as unguarded:
        torch.save({"x": torch.zeros(256 << 10)}, str(disk / "direct.pt"))
    assert "space" not in str(unguarded.value)
    (disk / "direct.pt").unlink()

    def interrupted(f) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C on a full disk stays a Ctrl-C
        files.write_atomic(disk / "data_3.pt", interrupted)

    writer = files.BackgroundWriter()  # the extraction writer's one line
    writer.submit(disk / "data_2.pt", {"x": torch.zeros(256 << 10)})
    with pytest.raises(files.WriteError, match=r"^writing extracted samples failed: no space"):
        writer.close()


def fill(disk: Path) -> None:
    """Write into ``disk`` until it is full."""
    with contextlib.suppress(OSError), (disk / "filler").open("wb", buffering=0) as filler:
        while True:  # until ENOSPC
            filler.write(b"f" * 4096)


def test_a_ledger_keeps_room_for_its_lines_on_a_disk_the_files_filled(small_disk) -> None:
    """The samples' files can fill the disk before their ledger lines are written (CI, native
    backend: vLLM's connector filled it, and the run recorded none of its files). The room
    the ledger keeps past its end takes 600 lines on the full disk."""
    disk = small_disk(512)
    ledger = files.Ledger(disk / "ledger.jsonl")
    ledger.keep([])  # as a run starts
    names = [f"data_{i}.pt" for i in range(1000)]
    for name in names:
        (disk / name).touch()
    fill(disk)
    for name in names:
        ledger.record(disk / name, f"print of {name}")
    assert sorted(ledger.entries()) == sorted(names)


def test_a_ledger_append_on_a_full_disk_says_so_and_the_next_one_is_kept(small_disk) -> None:
    """Where there was no room to keep (a ledger written by hand here), the append the full
    disk cuts short is one line naming the folder, not ENOSPC's traceback; the line it tore
    (a page's last bytes were free) does not swallow the next append."""
    disk = small_disk(64)
    ledger = files.Ledger(disk / "ledger.jsonl")
    ledger.path.write_bytes(b"x" * 4090)  # 6 bytes short of a page: a torn append
    (disk / "data_0.pt").write_bytes(b"0")
    (disk / "data_1.pt").write_bytes(b"1")
    fill(disk)
    with pytest.raises(files.DiskFull, match=rf"^no space left in {re.escape(str(disk))} \("):
        ledger.record(disk / "data_0.pt", "print 0")
    assert 4090 < ledger.path.stat().st_size < 4096 + 10  # torn: a part of the line is there
    assert ledger.entries() == {}

    (disk / "filler").unlink()  # room made: the same run records the next file
    ledger.record(disk / "data_1.pt", "print 1")
    assert list(ledger.entries()) == ["data_1.pt"]
    assert ledger.entries()["data_1.pt"].still_there(disk)


def test_a_write_that_fails_with_room_left_is_not_called_a_full_disk(tmp_path: Path) -> None:
    def refuse(f) -> None:
        raise OSError("the device went away")

    with pytest.raises(OSError, match="the device went away") as raised:
        files.write_atomic(tmp_path / "x", refuse)
    assert not isinstance(raised.value, files.DiskFull)


@pytest.mark.parametrize(
    "line",
    [
        '{"file": ["data_0.pt"], "fingerprint": "p", "size": 1, "mtime_ns": 1}',  # a list
        '{"file": 7, "fingerprint": "p", "size": 1, "mtime_ns": 1}',  # a number for a name
        '{"file": "data_0.pt", "fingerprint": "p", "size": "1", "mtime_ns": 1}',  # a string
        '{"file": "data_0.pt", "fingerprint": "p", "size": true, "mtime_ns": 1}',  # a boolean
        '{"file": "data_0.pt", "fingerprint": null, "size": 1, "mtime_ns": 1}',
        '{"file": "data_0.pt", "fingerprint": "p", "size": 1}',  # a field missing
        '{"file": "data_0.pt", "fingerprint": "p", "size": 1, "mtime_ns": 1, "x": 0}',
        '["data_0.pt", "p", 1, 1]',
        "[" * 100_000 + "]" * 100_000,  # nested past Python's recursion limit
        '{"file": "data_0.pt", "fingerp',  # torn by a kill
    ],
    ids=["list", "number", "string", "bool", "null", "missing", "extra", "array", "deep", "torn"],
)
def test_a_ledger_line_that_is_not_an_entry_is_not_recorded(tmp_path: Path, line: str) -> None:
    """The line is skipped as a torn one is: the entries before and after it stand (before:
    a list or a number for the name raised TypeError, deep nesting RecursionError, a string or
    null for a size or fingerprint replaced data_0.pt's good entry)."""
    ledger = files.Ledger(tmp_path / "ledger.jsonl")
    for i in range(3):
        files.save_json(tmp_path / f"data_{i}.pt", i)
        ledger.record(tmp_path / f"data_{i}.pt", f"p{i}")
        if i == 1:
            with ledger.path.open("a") as f:
                f.write(line + "\n")
    entries = ledger.entries()
    assert sorted(entries) == ["data_0.pt", "data_1.pt", "data_2.pt"]
    assert [e.fingerprint for e in entries.values()] == ["p0", "p1", "p2"]
    assert all(e.still_there(tmp_path) for e in entries.values())


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_take_the_users_umask(tmp_path: Path, umask: int, mode: int) -> None:
    """A team sharing a machine reads each other's extraction where the umask lets it."""
    torch = pytest.importorskip("torch")
    before = os.umask(umask)
    try:
        files.save_torch(tmp_path / "data_0.pt", {"input_ids": torch.arange(3)})
        files.save_json(tmp_path / "sample_lengths.json", {"0": 3})
    finally:
        os.umask(before)
    for name in ("data_0.pt", "sample_lengths.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
