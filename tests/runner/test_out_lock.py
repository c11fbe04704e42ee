"""One command at a time in a folder (``specshim.runner.out_lock``), with real processes.

The holder is a real process holding the lock as a command does; the second is the real
``specshim`` command line, which stops before it reads its inputs (they need not exist).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specshim.runner import out_lock

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from specshim.runner import out_lock\n"
    "reads = sys.argv[2:] == ['--data']\n"
    "with out_lock.held(Path(sys.argv[1]), 'train' if reads else 'extract', shared=reads):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


def hold(folder: Path, *reads: str) -> subprocess.Popen[str]:
    """A process that holds ``folder`` as ``specshim extract`` does its --out, or with
    ``"--data"`` as ``specshim train`` does its --data; it holds it once this returns."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), *reads], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


@pytest.fixture
def holder(tmp_path: Path):
    """A process that holds ``tmp_path/out`` as ``specshim extract`` does."""
    out = tmp_path / "out"
    process = hold(out)
    yield process, out
    process.kill()
    process.wait()


def specshim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specshim.cli", *args], capture_output=True, text=True, timeout=120
    )


VOCAB_SIZES = ("--draft-vocab-size", "8", "--target-vocab-size", "64")
#: Every command that writes into a folder, given that folder (``{}``) and inputs that need
#: not exist: it stops on the lock before it reads them.
COMMANDS = {
    "extract": ["extract", "--model", "m", "--data", "d.jsonl", "--out", "{}"],
    "train": ["train", "--data", "d", "--verifier", "v", "--out", "{}"],
    "convert": ["convert", "--data", "d", "--out", "{}"],
    "vocab --out": ["vocab", "--data", "d", *VOCAB_SIZES, "--out", "{}"],
    "vocab into --data": ["vocab", "--data", "{}", *VOCAB_SIZES],
    "run": ["run", "--workdir", "{}"],
    "eval": ["eval", "--verifier", "v", "--draft", "d", "--out", "{}"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_second_command_into_a_held_folder_is_one_line_and_exit_2(holder, command) -> None:
    process, out = holder
    args = [str(out) if a == "{}" else a for a in COMMANDS[command]]
    option = args[args.index(str(out)) - 1]
    result = specshim(*args)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"specshim {args[0]}: {option} {out} is in use by specshim extract (pid {process.pid}, "
        "since "
    ), lines[0]
    assert lines[0].endswith("): wait for it to end, or pick another folder")
    assert [p.name for p in out.iterdir()] == [out_lock.LOCK_FILE]  # nothing else touched


def test_a_killed_holder_leaves_no_lock_and_an_ended_one_no_file(holder) -> None:
    process, out = holder
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert (out / out_lock.LOCK_FILE).exists()  # the file outlives it, the lock does not
    with out_lock.held(out, "extract"):
        text = (out / out_lock.LOCK_FILE).read_text()
        assert text.startswith(f"specshim extract (pid {os.getpid()}, since ")
    assert list(out.iterdir()) == []


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    """A link planted where the lock goes (a shared folder) must not make specshim write into
    the file it points to, which may be anyone's."""
    out, precious = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    precious.write_text("mine\n")
    (out / out_lock.LOCK_FILE).symlink_to(precious)
    refused = pytest.raises(ValueError, match=r"\.specshim\.lock there is a symbolic link, not ")
    with refused, out_lock.held(out, "vocab"):
        pass
    assert precious.read_text() == "mine\n"


def test_a_folder_made_for_the_lock_goes_again_when_left_empty(tmp_path: Path) -> None:
    """A command refused before it writes leaves no folder behind; one that wrote keeps it."""
    with out_lock.held(tmp_path / "new", "extract"):
        assert (tmp_path / "new").is_dir()
    assert not (tmp_path / "new").exists()
    with out_lock.held(tmp_path / "used", "extract"):
        (tmp_path / "used" / "data_0.pt").write_bytes(b"x")
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["data_0.pt"]


def test_the_lock_file_is_no_file_of_the_folder_for_train_or_convert(tmp_path: Path) -> None:
    """A run killed leaves the (unlocked) lock file: train and convert still take the folder
    as new, not as one holding files they did not write."""
    from specshim.runner import convert
    from specshim.runner.train import options
    from specshim.runner.train import out as train_out

    out = tmp_path / "out"
    out.mkdir()
    (out / out_lock.LOCK_FILE).write_text("specshim extract (pid 1, since then)\n")
    settings = options.Settings("d", "v", "d", 8, 1, 1, 0.1, 0, "float32")
    train_out.check_out(out, settings, resume=False, overwrite=False)
    convert._check_out(out, {"source": "d"})


#: The commands that read a folder for their whole run, given it (``{}``) and a new --out.
READERS = {
    "train": ["train", "--data", "{}", "--verifier", "v", "--out", "{out}"],
    "convert": ["convert", "--data", "{}", "--out", "{out}"],
}
#: ... and those reading it beside another input (``{other}``): (arguments, the option).
MORE_READERS = {
    **{command: (arguments, "--data") for command, arguments in READERS.items()},
    "train --vocab": (
        ["train", "--data", "{other}", "--vocab", "{}", "--verifier", "v", "--out", "{out}"],
        "--vocab",
    ),
    "eval": (["eval", "--verifier", "v", "--draft", "{training}", "--data", "{}", "--out",
              "{out}"], "--data"),
}  # fmt: skip


def test_eval_of_an_exported_draft_does_not_hold_the_data_it_never_reads(holder) -> None:
    """Only a training folder's export reads --data: an exported draft's eval goes on (here to
    the verifier it cannot find) while an extraction writes there."""
    _process, data = holder
    exported = data.parent / "exported"
    exported.mkdir()
    result = specshim("eval", "--verifier", "v", "--draft", str(exported), "--data", str(data))
    assert "is in use" not in result.stderr, result.stderr


@pytest.mark.parametrize("reader", MORE_READERS)
def test_reading_data_an_extraction_is_writing_stops_at_once(holder, tmp_path, reader) -> None:
    """``extract --out D`` running: ``train --data D`` (or ``--vocab D``, ``convert``, ``eval
    --data D``) is one line and exit 2 before it reads D, and leaves no --out behind."""
    process, data = holder
    out, (arguments, option) = tmp_path / "new", MORE_READERS[reader]
    training = tmp_path / "draft"  # speculators' training output, which eval exports first
    (training / "checkpoints").mkdir(parents=True)
    given = {"{}": str(data), "{out}": str(out), "{other}": str(tmp_path / "other"),
             "{training}": str(training)}  # fmt: skip
    result = specshim(*[given.get(a, a) for a in arguments])
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    command = arguments[0]
    assert result.stderr.startswith(
        f"specshim {command}: {option} {data} is in use by specshim extract (pid {process.pid}, "
    ), result.stderr
    assert len(result.stderr.splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("command", READERS)
def test_reading_into_the_same_folder_is_one_line_not_a_lock_on_itself(tmp_path, command) -> None:
    folder = tmp_path / "hs"
    folder.mkdir()
    result = specshim(*[str(folder) if a in ("{}", "{out}") else a for a in READERS[command]])
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "is the --data folder" in result.stderr or "is --data itself" in result.stderr


def test_readers_share_a_folder_and_keep_every_writer_out(tmp_path: Path) -> None:
    """Two trains read one --data together; while either does, a command writing there
    (extract, vocab) stops with one line naming a reader; the last reader out removes the
    lock file, and the folder is a writer's again."""
    data = tmp_path / "hs"
    data.mkdir()
    reader = hold(data, "--data")
    try:
        with out_lock.held(data, "train", "--data", shared=True):  # a second reader
            pass
        assert (data / out_lock.LOCK_FILE).exists()  # the other reads on
        for command in (COMMANDS["extract"], COMMANDS["vocab into --data"]):
            result = specshim(*[str(data) if a == "{}" else a for a in command])
            assert result.returncode == 2, result.stderr
            assert f"{data} is in use by specshim train (pid " in result.stderr, result.stderr
            assert len(result.stderr.splitlines()) == 1
    finally:
        reader.send_signal(signal.SIGINT)  # an ending run: its with block's exit runs
        reader.wait()
    assert list(data.iterdir()) == []
    with out_lock.held(data, "extract"):
        pass
    with out_lock.held(tmp_path / "missing", "train", "--data", shared=True):
        assert not (tmp_path / "missing").exists()  # a reader makes no folder


def test_evals_of_sibling_drafts_each_get_a_folder_of_their_own(tmp_path: Path) -> None:
    """``eval`` without --out writes eval-NAME beside the draft NAME (inside a training
    folder: eval-served): another draft of the same folder is not stopped by it, nor could
    it write over its results."""
    drafts = tmp_path / "drafts"
    drafts.mkdir()
    process = hold(drafts / "eval-a")
    try:
        taken = specshim("eval", "--verifier", "v", "--draft", str(drafts / "a"))
        other = specshim("eval", "--verifier", "v", "--draft", str(drafts / "b"))
    finally:
        process.kill()
        process.wait()
    assert taken.returncode == 2, taken.stderr
    assert f"--out {drafts / 'eval-a'} is in use by specshim extract" in taken.stderr
    assert other.returncode == 1 and "in use" not in other.stderr, other.stderr
    assert not (drafts / "eval-b").exists()  # refused (no verifier v): nothing left behind


@pytest.mark.parametrize(("draft", "cwd"), [(".", "a"), ("..", "a/prompts")])
def test_eval_of_a_draft_given_as_dot_or_dot_dot_is_named_by_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    draft: str, cwd: str,
) -> None:  # fmt: skip
    """``--draft .`` from inside the draft ``a`` (or ``..`` from below it) writes eval-a
    beside it, as ``--draft a`` does: not ``eval-`` inside the draft, nor ``eval-..``."""
    from specshim import cli

    (tmp_path / cwd).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / cwd)
    process = hold(tmp_path / "eval-a")
    try:
        code = cli.main(["eval", "--verifier", "v", "--draft", draft])
    finally:
        process.kill()
        process.wait()
    assert code == 2 and f"--out {tmp_path / 'eval-a'} is in use" in capsys.readouterr().err


def unwritable_lock_file(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``folder``'s lock file as another user's run leaves it: read-only to this user
    (chmod 0444). Root passes over permissions: there, opening it to write is refused by a
    fake ``os.open``, as the kernel refuses another user."""
    lock = folder / out_lock.LOCK_FILE
    lock.touch()
    lock.chmod(0o444)
    if os.geteuid() == 0:
        real = os.open

        def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if Path(path) == lock and flags & (os.O_RDWR | os.O_WRONLY):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
    return lock


def test_a_reader_locks_another_users_lock_file_read_only_fake_eacces_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group-writable --data another user's run left its lock file in: train reads it,
    holding the lock shared all the same (a writer stops on it); a writer there is told which
    file it cannot open."""
    data = tmp_path / "hs"
    data.mkdir()
    unwritable_lock_file(data, monkeypatch)
    refused = rf"^--out {data}: cannot open \.specshim\.lock there "
    with pytest.raises(ValueError, match=refused), out_lock.held(data, "extract"):
        pass
    with out_lock.held(data, "train", "--data", shared=True):
        result = specshim(*[str(data) if a == "{}" else a for a in COMMANDS["extract"]])
        assert result.returncode == 2 and f"--out {data} is in use by" in result.stderr
    assert list(data.iterdir()) == []  # the last reader out removed it


def test_the_lock_file_is_made_as_any_file_less_the_umask(tmp_path: Path) -> None:
    """Group-writable under umask 002, so that the group's readers and writers lock it."""
    umask = os.umask(0o002)
    try:
        with out_lock.held(tmp_path / "out", "extract"):
            mode = (tmp_path / "out" / out_lock.LOCK_FILE).stat().st_mode & 0o777
    finally:
        os.umask(umask)
    assert mode == 0o664


def test_a_writer_refused_by_readers_is_not_named_an_ended_reader(tmp_path: Path) -> None:
    """Each reader writes over the holder line: once the newest ends, the refusal names no
    pid that has ended."""
    data = tmp_path / "hs"
    data.mkdir()
    first = hold(data, "--data")
    try:
        newest = hold(data, "--data")
        newest.send_signal(signal.SIGINT)  # ends; the first reads on
        newest.wait(timeout=60)
        assert f"(pid {newest.pid}," in (data / out_lock.LOCK_FILE).read_text()
        result = specshim(*[str(data) if a == "{}" else a for a in COMMANDS["extract"]])
    finally:
        first.kill()
        first.wait()
    assert result.returncode == 2, result.stderr
    assert f"--out {data} is in use by specshim readers (train or convert)" in result.stderr
    assert str(newest.pid) not in result.stderr


def test_reading_a_folder_this_process_holds_needs_no_second_lock(tmp_path: Path) -> None:
    """``specshim run`` holds its workdir and its train step reads the vocabulary there: a
    shared hold inside this process's own hold is that hold; another process is still kept
    out, and the folder is free once the outer hold ends."""
    work = tmp_path / "work"
    with out_lock.held(work, "run", "--workdir"):
        with out_lock.held(work, "train", "--vocab", shared=True):
            (work / "d2t.npy").write_bytes(b"x")
        assert work.resolve() in out_lock.HELD_HERE  # the inner hold leaves the outer one
        result = specshim(*[str(work) if a == "{}" else a for a in COMMANDS["vocab --out"]])
        assert result.returncode == 2 and "in use by specshim run" in result.stderr
    assert not out_lock.HELD_HERE
    with out_lock.held(work, "vocab"):  # free again
        pass
