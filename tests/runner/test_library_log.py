"""Other libraries' messages go to the output folder's log, not the terminal; the end says where.

vLLM's own processes are tested with the real vLLM in tests/e2e (test_train.py, extract's log);
here the records of this process, and what vLLM is told, with Python's ``logging`` only.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import pytest

from specshim.runner import library_log


@pytest.mark.usefixtures("quiet")
def test_a_failed_command_names_the_log_even_with_quiet(tmp_path, capsys, monkeypatch) -> None:
    """A library's record and a warning go to the file, not stderr; the command's failure
    ends with the file's name, as a warning: ``--quiet`` keeps it."""
    (tmp_path / "data_0.pt").write_text("what the command wrote before it failed")
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    with pytest.raises(RuntimeError), library_log.kept(tmp_path) as log:
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
