"""``specshim --version``: the installed distribution's version, as importlib.metadata has it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata

import specshim


def test_version_option_prints_the_installed_version() -> None:
    command = [sys.executable, "-m", "specshim.cli", "--version"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"specshim {metadata.version('specshim')}\n"
    assert specshim.__version__ == metadata.version("specshim")


def test_a_source_tree_without_metadata_still_runs(tmp_path) -> None:
    """A copy of the sources on ``sys.path`` with no distribution metadata anywhere (as with
    ``PYTHONPATH=src`` on a fresh GPU machine): every command builds its parser with the
    version, so it must not raise."""
    shutil.copytree(specshim.__path__[0], tmp_path / "specshim")
    code = "import sys; sys.path.insert(0, sys.argv[1]); from specshim import cli; "
    code += "sys.exit(cli.main(['--version']))"
    command = [sys.executable, "-I", "-S", "-c", code, str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.stdout == "specshim unknown (not installed)\n", result.stderr[-2000:]
