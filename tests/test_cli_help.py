"""The command line's own help: ``specshim`` alone lists the commands, each command says what it
does and shows an example, and no help text quotes a benchmark figure (figures live in
docs/benchmarks.md, where they are dated and reproducible; a help text outlives them)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from test_docs import HISTORY, MEASUREMENT

from specshim import cli


def commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_specshim_alone_prints_the_commands_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specshim.cli"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: specshim")
    for name in commands():
        assert f"\n    {name} " in done.stdout, name


def test_the_top_help_is_plain_text() -> None:
    """The description is the module docstring: no reST markup shows through."""
    shown = cli.parser().format_help()
    assert "``" not in shown and ":class:" not in shown


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_has_a_description_and_an_example(name: str) -> None:
    command = commands()[name]
    assert command.description and len(command.description) > 40, name
    assert command.epilog and f"specshim {name}" in command.epilog, name
    assert "example:" in command.format_help()


@pytest.mark.parametrize("name", ["", *sorted(commands())])
def test_no_help_text_quotes_a_benchmark_figure(name: str) -> None:
    parser = commands()[name] if name else cli.parser()
    shown = " ".join(parser.format_help().split())
    quoted = [m.group(0) for pattern in (HISTORY, MEASUREMENT) for m in pattern.finditer(shown)]
    assert quoted == [], shown  # the patterns are tested in test_docs.py


def test_every_option_fits_about_one_line() -> None:
    """An option's help is a line; the rules behind it are in docs/, not in --help."""
    for name, command in commands().items():
        for action in command._actions:
            if action.help and action.option_strings:
                assert len(action.help) <= 100, (name, action.dest, action.help)
