"""What the commands' parsers share: the help formatter, a subcommand with ``--quiet`` and an
example, and the options several commands take.
"""

from __future__ import annotations

import argparse


class DefaultsShown(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with defaults shown, except where there is none to show (a required
    option, a flag, or a default of ``None`` whose meaning the help text states); the
    description and the examples after the options are printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    description: str,
    example: str,
) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` says what it does, shows its options' defaults
    (:class:`DefaultsShown`) and ends with an example; ``--quiet`` on every one."""
    command = commands.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=f"example:\n{example}",
        formatter_class=DefaultsShown,
    )
    command.add_argument(
        "-q", "--quiet", action="store_true", help="no progress lines on stderr, only problems"
    )
    return command


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError as exc:
        message = f"--layers takes comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(message) from exc


def _add_layers(command: argparse.ArgumentParser, help_text: str) -> None:
    """``--layers`` (comma-separated ids, default None), with what they mean to ``command``."""
    command.add_argument("--layers", type=_layers, default=None, help=help_text)


def _add_trust_remote_code(command: argparse.ArgumentParser) -> None:
    """The one switch for a model's own Python code (:mod:`specshim.runner.remote_code`), on
    every command that reads a model."""
    from specshim.runner import remote_code

    command.add_argument(
        remote_code.FLAG,
        action="store_true",
        help="run the Python code the model carries (auto_map in its config), here and in vLLM",
    )


def _add_verbose(command: argparse.ArgumentParser, folder: str) -> None:
    """``--verbose``: the libraries' log (:mod:`specshim.runner.library_log`) on stderr too."""
    command.add_argument(
        "--verbose",
        action="store_true",
        help=f"vLLM's and the other libraries' log on stderr too (it is always in "
        f"{folder}/libraries.log)",
    )
