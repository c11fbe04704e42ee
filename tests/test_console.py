"""``specshim.console``: progress through specshim's logger, written by the command line on
stderr (or not, with ``--quiet``), and how an error from elsewhere is quoted in one line."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, model_validator

from specshim import cli, console


class VllmConfig(BaseModel):
    """A config that refuses itself as vLLM 0.26.0's did on an H100 (Model Runner V2 and the
    native path's speculative method)."""

    max_model_len: int = 0

    @model_validator(mode="after")
    def refuse(self) -> VllmConfig:
        raise ValueError("Model Runner V2 does not yet support: speculative method 'x'")


def test_a_config_refusal_names_what_was_refused() -> None:
    with pytest.raises(ValueError) as refused:
        VllmConfig()
    assert console.first_line(refused.value) == (
        "1 validation error for VllmConfig: Value error, Model Runner V2 does not yet "
        "support: speculative method 'x'"
    )


def test_a_field_refusal_names_the_field() -> None:
    with pytest.raises(ValueError) as refused:
        VllmConfig(max_model_len="many")  # type: ignore[arg-type]
    assert console.first_line(refused.value) == (
        "1 validation error for VllmConfig: max_model_len Input should be a valid integer, "
        "unable to parse string as an integer"
    )


def test_other_errors_are_their_first_line_or_their_type() -> None:
    assert console.first_line(RuntimeError("no room\nmore")) == "no room"
    assert console.first_line(KeyError()) == "KeyError"


@pytest.fixture
def restored_logger() -> Iterator[None]:
    """specshim's logger as it was after the test (the command line configures it)."""
    logger = logging.getLogger("specshim")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers, logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.mark.usefixtures("restored_logger")
def test_progress_is_a_record_of_specshims_logger() -> None:
    """A progress line is a ``logging`` record of the logger ``specshim`` at INFO, so that a
    program using specshim silences or redirects it as any library's; what it is about leads,
    without the "specshim" the format adds."""
    records: list[logging.LogRecord] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger("specshim").handlers = [Kept()]
    logging.getLogger("specshim").setLevel(logging.INFO)
    console.status("specshim train", "epoch 1/3")
    console.status("specshim", "CPU (x86_64)")
    said = [(r.name, r.levelno, r.getMessage()) for r in records]
    assert said == [
        ("specshim", logging.INFO, "train: epoch 1/3"),
        ("specshim", logging.INFO, "CPU (x86_64)"),
    ]


@pytest.mark.usefixtures("restored_logger")
def test_the_command_line_writes_progress_on_stderr_unless_quiet(capsys) -> None:
    """``specshim COMMAND`` writes specshim's records on stderr as ``specshim: text``, once
    however often it is configured; ``--quiet`` (``-q``) keeps only warnings and errors;
    a module's own logger (under ``specshim``) is written the same way; stdout stays the
    command's."""
    assert cli.main(["report", "--no-import"]) in (0, 1)
    capsys.readouterr()
    console.status("specshim run", "step 1/4")
    logging.getLogger("specshim.runner.handoff").warning("a note")
    assert capsys.readouterr() == ("", "specshim: run: step 1/4\nspecshim: a note\n")
    assert cli.main(["report", "--no-import", "-q"]) in (0, 1)
    capsys.readouterr()
    console.status("specshim run", "step 1/4")
    logging.getLogger("specshim.runner.handoff").warning("a note")
    assert capsys.readouterr() == ("", "specshim: a note\n")


def test_no_record_of_specshims_says_specshim_itself() -> None:
    """The command line's format begins every record with ``specshim:``: a message of a
    logger call in the package that begins so too would read ``specshim: specshim: ...``."""
    import ast

    from conftest import ROOT

    doubled = []
    for path in sorted((ROOT / "src" / "specshim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("debug", "info", "warning", "error", "exception")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("specshim:")
            ):
                doubled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert doubled == []


@pytest.mark.usefixtures("restored_logger")
def test_phase_marks_are_written_only_where_asked_for(capsys, monkeypatch) -> None:
    """With ``SPECSHIM_DEBUG`` set, the command line writes each phase mark on stderr as
    ``specshim: phase NAME at SECONDS`` (the machine's monotonic clock, which a benchmark
    that started the command compares with its own); without it, nothing."""
    import time

    monkeypatch.delenv(console.DEBUG_ENV, raising=False)
    assert cli.main(["report", "--no-import"]) in (0, 1)
    capsys.readouterr()
    console.phase("config read")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(console.DEBUG_ENV, "1")
    before = time.monotonic()
    assert cli.main(["report", "--no-import", "-q"]) in (0, 1)
    capsys.readouterr()
    console.phase("config read")
    after = time.monotonic()
    name, at = capsys.readouterr().err.removeprefix("specshim: phase ").split(" at ")
    assert name == "config read" and before <= float(at) <= after
