"""``python -m specshim.cli``: the ``specshim`` command."""

from specshim.cli import run

run()
