"""``specshim --version``: the installed distribution's version, as importlib.metadata has it."""

from __future__ import annotations

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
