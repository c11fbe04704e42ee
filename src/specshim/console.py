"""Status lines on stderr, the one place in the library that prints them, and the one line
an error from elsewhere (vLLM, torch, datasets) is quoted as.

stdout belongs to the commands' own output (``cli.py`` and the built-in demo,
``runner/pipeline.py``); what a user watches while vLLM starts or a model trains goes to
stderr, flushed at once, as ``[label] text``.
"""

from __future__ import annotations

import sys


def status(label: str, text: str) -> None:
    """Print ``[label] text`` on stderr now."""
    print(f"[{label}] {text}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name where it has none."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
