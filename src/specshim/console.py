"""Status lines on stderr, the one place in the library that prints them, and the one line
an error from elsewhere (vLLM, torch, datasets) is quoted as.

stdout belongs to the commands' own output (``cli.py`` and the built-in demo,
``runner/pipeline.py``); what a user watches while vLLM starts or a model trains goes to
stderr, flushed at once, as ``[label] text``.
"""

from __future__ import annotations

import re
import sys

#: The head of a pydantic ``ValidationError`` (vLLM's configs): its first line says only how
#: many errors, for which class; what is wrong follows, up to `` [type=``.
VALIDATION_HEAD = re.compile(r"\d+ validation errors? for \w+")


def status(label: str, text: str) -> None:
    """Print ``[label] text`` on stderr now."""
    print(f"[{label}] {text}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name where it has none; for a
    pydantic validation error (vLLM refusing its config) the first error with it, on one
    line: "1 validation error for VllmConfig" alone named nothing to change."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if VALIDATION_HEAD.fullmatch(lines[0]):
        said = []
        for line in lines[1:]:
            said.append(line.split(" [type=")[0])
            if " [type=" in line:
                break
        return f"{lines[0]}: {' '.join(said)}" if said else lines[0]
    return lines[0]


def listed(names: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names`` and how many more: ``a, b, c and 12 more``, so that
    a line naming files stays one line however many there are."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")
