"""Other libraries' messages go to the output folder's log, not the terminal; the end says where.

vLLM's own processes are tested with the real vLLM in tests/e2e (test_train.py, extract's log);
here the records of this process, and what vLLM is told, with Python's ``logging`` only.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from specshim.runner import library_log


@pytest.mark.usefixtures("quiet")
def test_a_failed_command_names_the_log_even_with_quiet(tmp_path, capsys, monkeypatch) -> None:
    """A library's record and a warning go to the file, not stderr; the command's failure
    ends with the file's name, as a warning: ``--quiet`` keeps it."""
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    with pytest.raises(RuntimeError), library_log.kept(tmp_path) as log:
        (tmp_path / "data_0.pt").write_text("what the command wrote before it failed")
        logging.getLogger("somelib").warning("the reason it failed")
        warnings.warn("an old call", FutureWarning, stacklevel=1)
        told = json.loads(Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read_text())
        raise RuntimeError("vLLM stopped")
    said = log.read_text()
    assert "WARNING somelib: the reason it failed" in said and "FutureWarning: an old call" in said
    assert told["handlers"]["file"]["filename"] == str(log)
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ  # as it was before
    assert (
        capsys.readouterr().err == f"specshim: what vLLM and the other libraries said is in {log}\n"
    )


@pytest.mark.usefixtures("quiet")
def test_nothing_said_nothing_written(tmp_path, capsys) -> None:
    with library_log.kept(tmp_path) as log:
        pass
    assert not log.exists() and capsys.readouterr().err == ""


def test_where_the_user_chose_vllms_log_it_stays(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    with library_log.kept(tmp_path):
        assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ


def test_the_log_is_never_one_of_the_folders_files(tmp_path) -> None:
    """``train --out`` must be empty and ``run --workdir`` specshim's: the log of a refused
    or earlier run does not make it another's."""
    from specshim.runner import out_lock

    (tmp_path / library_log.FILE).write_text("x")
    assert out_lock.contents(tmp_path) == []


@pytest.mark.usefixtures("quiet")
def test_a_command_refused_before_writing_shows_the_last_lines_and_leaves_nothing(
    tmp_path, capsys
) -> None:
    with pytest.raises(ValueError), library_log.kept(tmp_path) as log:
        for retry in range(1, 8):
            logging.getLogger("somelib").warning("retry %d: no network", retry)
        raise ValueError("--model m: not found")
    assert not log.exists()
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "specshim: what the libraries said last:" and len(said) == 6, said
    assert [line.split(" WARNING ")[1] for line in said[1:]] == [
        f"somelib: retry {retry}: no network" for retry in range(3, 8)
    ]


def test_verbose_shows_them_live_too(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    with library_log.kept(tmp_path, verbose=True) as log:
        logging.getLogger("somelib").warning("a note")
        told = json.loads(Path(os.environ["VLLM_LOGGING_CONFIG_PATH"]).read_text())
    assert "WARNING somelib: a note" in log.read_text()
    assert "WARNING somelib: a note" in capsys.readouterr().err
    assert told["loggers"]["vllm"]["handlers"] == ["file", "stderr"]


@pytest.mark.usefixtures("quiet")
def test_a_refused_command_leaves_a_folder_of_the_users_as_it_was(tmp_path, capsys) -> None:
    """The user's own file beside it does not make the log of a refused command one to keep:
    the folder is left as it was, the log's last lines shown."""
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(ValueError), library_log.kept(tmp_path) as log:
        logging.getLogger("somelib").warning("no network")
        raise ValueError("--model m: not found")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"] and not log.exists()
    assert "WARNING somelib: no network" in capsys.readouterr().err


@pytest.mark.usefixtures("quiet")
def test_a_failed_command_that_changed_a_file_there_keeps_the_log(tmp_path, capsys) -> None:
    (tmp_path / "data_0.pt").write_text("an earlier run's")
    with pytest.raises(RuntimeError), library_log.kept(tmp_path) as log:
        logging.getLogger("somelib").warning("why it stopped")
        (tmp_path / "data_0.pt").write_text("written again, then the command failed")
        raise RuntimeError("vLLM stopped")
    assert "why it stopped" in log.read_text()
    assert (
        capsys.readouterr().err == f"specshim: what vLLM and the other libraries said is in {log}\n"
    )


def _folder(log: Path) -> None:
    log.mkdir()


def _link(log: Path) -> None:
    (log.parent / "elsewhere.txt").write_text("not specshim's")
    log.symlink_to("elsewhere.txt")


def _pipe(log: Path) -> None:
    os.mkfifo(log)  # opened for writing, it waits for a reader: the command would hang


def _read_only(log: Path) -> None:
    log.write_text("an earlier run's\n")
    log.chmod(0o444)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_folder, "is a folder, not specshim's log: move it away, and run again"),
        (_link, "is a symbolic link, not specshim's log: remove it, and run again"),
        (_pipe, "cannot be written (No such device or address): make it writable or remove it"),
        pytest.param(
            _read_only,
            "cannot be written (Permission denied): make it writable or remove it",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file"),
        ),
    ],
)
def test_a_log_that_cannot_be_appended_to_is_refused_up_front(tmp_path, make, said) -> None:
    """One line naming it (the command shows a ``ValueError`` as its one line), before the
    command runs: not a library's call failing with a traceback, not a link's target written."""
    log = tmp_path / library_log.FILE
    make(log)
    with pytest.raises(ValueError) as refused, library_log.kept(tmp_path):
        pass
    assert str(refused.value).startswith(f"{log} {said}")
    if log.is_symlink():
        assert (tmp_path / "elsewhere.txt").read_text() == "not specshim's"


def test_the_log_is_made_as_any_new_file_and_goes_when_nothing_was_said(tmp_path) -> None:
    """Made up front to check it can be written, with the umask's permissions; removed again
    when this run wrote nothing into it."""
    old = os.umask(0o027)
    try:
        with library_log.kept(tmp_path) as log:
            mode = log.stat().st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o640 and not log.exists()


def test_the_log_is_no_file_of_the_folder_for_convert(tmp_path) -> None:
    """A refused command's log left by an earlier version, or by a run killed: ``convert``
    still takes the folder as new (one rule, :func:`specshim.runner.out_lock.contents`)."""
    from specshim.runner import convert

    (tmp_path / library_log.FILE).write_text("x")
    convert._check_out(tmp_path, {"source": "d"})


@pytest.mark.parametrize("configured_by", ["specshim", "vllm"])
def test_a_full_disk_under_the_log_is_no_traceback(configured_by, capsys) -> None:
    """/dev/full answers every write with ENOSPC, as a full disk does: a record and the
    handler's close neither raise nor print logging's "--- Logging error ---" traceback (the
    command's own line says the disk is full), in specshim's handler and in the one vLLM's
    processes build from :func:`library_log.vllm_config`."""
    import logging.config

    full = Path("/dev/full")
    if configured_by == "specshim":
        handler = library_log._handlers(full, verbose=False)[0]
    else:
        config = library_log.vllm_config(full, verbose=False)
        config["loggers"] = {}
        logging.config.dictConfig(config)
        handler = logging._handlers["file"]  # type: ignore[attr-defined]
    logger = logging.getLogger("specshim-test-full-disk")
    logger.addHandler(handler)
    try:
        logger.warning("a line the disk has no room for")
    finally:
        logger.removeHandler(handler)
    handler.close()
    assert "Logging error" not in capsys.readouterr().err


DESCRIPTORS = """
import logging, os, subprocess, sys
from pathlib import Path
from specshim import console
from specshim.runner import library_log
console.configure(quiet=True)
with library_log.kept(Path(sys.argv[1])):
    os.write(1, b"written to descriptor 1\\n")
    os.write(2, b"written to descriptor 2\\n")
    child = "import sys; print('a child on stdout'); print('a child on stderr', file=sys.stderr)"
    subprocess.run([sys.executable, "-c", child], check=True)
    print("a library on sys.stderr", file=sys.stderr)
    torch_like = logging.getLogger("a_library_with_its_own_handler")
    torch_like.addHandler(logging.StreamHandler(sys.stderr))
    torch_like.propagate = False
    torch_like.warning("its own handler's record")
    print("a library's print")
    print("the command's result", file=console.result())
    console.LOGGER.warning("specshim's own line")
print("after")
"""


def test_what_is_written_to_the_descriptors_goes_to_the_log(tmp_path) -> None:
    """What libraries (``print`` too, and a handler of their own on ``sys.stderr``) and
    started processes write to stdout and stderr lands in the log; the command's result
    (:func:`console.result`) and specshim's own lines stay on the terminal, as after."""
    done = subprocess.run(
        [sys.executable, "-c", DESCRIPTORS, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the command's result\nafter\n"
    assert done.stderr == "specshim: specshim's own line\n"
    log = (tmp_path / library_log.FILE).read_text()
    said = ("descriptor 1", "descriptor 2", "a child on stdout", "a child on stderr",
            "a library on sys.stderr", "its own handler's record", "a library's print")  # fmt: skip
    assert [line for line in said if line not in log] == []


def test_verbose_shows_what_the_descriptors_get_on_stderr_and_keeps_stdout_for_the_result(
    tmp_path,
) -> None:
    """``--verbose``: what libraries and processes write reaches the terminal, on stderr even
    where they wrote to stdout (vLLM's logger does), so that stdout is still only the result."""
    verbose = DESCRIPTORS.replace("kept(Path(sys.argv[1]))", "kept(Path(sys.argv[1]), True)")
    done = subprocess.run(
        [sys.executable, "-c", verbose, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the command's result\nafter\n"
    said = ("descriptor 1", "descriptor 2", "a child on stdout", "a child on stderr",
            "a library on sys.stderr", "its own handler's record", "own line", "print")  # fmt: skip
    assert [line for line in said if line not in done.stderr] == []


@pytest.mark.usefixtures("quiet")
def test_a_failed_command_shows_the_error_that_ended_the_first_traceback(tmp_path, capsys) -> None:
    """A library's crash (vLLM's engine core failing to load the model) puts its cause far
    above the last lines: the failed command shows that error too, and leaves no log."""
    with pytest.raises(RuntimeError), library_log.kept(tmp_path) as log:
        logging.getLogger("vllm_like").error(
            "Traceback (most recent call last):\n  File x\n    y\nKeyError: 'layers.0.bogus'\n\n"
            "The above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\n  File z\nRuntimeError: load failed"
        )
        for line in range(8):
            logging.getLogger("vllm_like").error("shutting down %d", line)
        raise RuntimeError("Engine core initialization failed. See root cause above.")
    assert not log.exists()
    said = capsys.readouterr().err.splitlines()
    assert said[-1] == "specshim: the first error they met: KeyError: 'layers.0.bogus'", said


CLOSED_STDOUT = """
import sys
from pathlib import Path
from specshim import console
from specshim.runner import library_log
console.configure(quiet=True)
with library_log.kept(Path(sys.argv[1])):
    console.LOGGER.warning("ran")
"""


def test_a_command_started_without_stdout_still_runs(tmp_path) -> None:
    """``specshim train ... >&-``: no descriptor 1 to set aside, and the command runs."""
    done = subprocess.run(
        ["sh", "-c", 'exec "$0" -c "$1" "$2" >&-', sys.executable, CLOSED_STDOUT, str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stderr) == (0, "specshim: ran\n"), done.stderr


CLOSED_VERBOSE = """
import os, sys
from pathlib import Path
from specshim import console
from specshim.runner import library_log
console.configure(quiet=True)
with library_log.kept(Path(sys.argv[1]), verbose=True):
    with open(Path(sys.argv[1]) / "output.txt", "w") as output:
        os.write(1, b"a library on descriptor 1\\n")
        output.write("the command's file\\n")
    console.LOGGER.warning("ran")
"""


@pytest.mark.parametrize("closed", [">&-", "2>&-"])
def test_verbose_without_stdout_or_stderr_runs_and_writes_no_stray_output_into_files(
    tmp_path, closed
) -> None:
    """``--verbose`` started without stdout: descriptor 1 still points at stderr meanwhile, so
    a file the command opens never gets its number (and a library's writes); without stderr
    the command still ends cleanly."""
    done = subprocess.run(
        ["sh", "-c", f'exec "$0" -c "$1" "$2" {closed}', sys.executable, CLOSED_VERBOSE,
         str(tmp_path)], capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "output.txt").read_text() == "the command's file\n"
    if closed == ">&-":
        assert done.stderr == "a library on descriptor 1\nspecshim: ran\n"


CRASH = """
import ctypes, sys
from pathlib import Path
from specshim.runner import library_log
with library_log.kept(Path(sys.argv[1])):
    ctypes.string_at(0)  # a library's segmentation fault
"""


def test_a_crash_inside_shows_its_traceback_on_the_terminal(tmp_path) -> None:
    """A segmentation fault while descriptor 2 points at the log: faulthandler's traceback
    reaches the terminal (stderr as the command found it), where the user looks."""
    done = subprocess.run(
        [sys.executable, "-c", CRASH, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "Fatal Python error: Segmentation fault" in done.stderr, done.stderr
    assert "ctypes" in done.stderr or "string_at" in done.stderr or "<string>" in done.stderr
