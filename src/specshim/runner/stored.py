"""Reading back a file specshim or speculators wrote: what it holds, or one line naming it.

A sample, ``token_freq.pt`` or a checkpoint file that was truncated, damaged or replaced
makes torch or safetensors raise whatever they meet first (a 40-line ``UnpicklingError``,
"incomplete metadata, file not fully covered"), often steps into a run. Every command that
reads such a file loads it here, so that the user gets :class:`BadFile`: the path, what it
should hold and the first sentence of why it does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specshim import console


class BadFile(ValueError):
    """A file that cannot be read as what it should hold; the message is the one line to show.

    ``path`` is the file and ``problem`` what is wrong with it, for callers that list several;
    the message ends with ``fix``, what to do, where given.
    """

    def __init__(self, path: Path, problem: str, fix: str = "") -> None:
        super().__init__(f"{path}: {problem}" + (f": {fix}" if fix else ""))
        self.path = path
        self.problem = problem


def _why(exc: BaseException) -> str:
    """The first sentence of ``exc``'s first line: torch's own go on with advice that does
    not apply (re-running ``torch.load`` with ``weights_only=False``, a miniz internal)."""
    return console.first_line(exc).split(". ")[0].rstrip(".")


def _unreadable(path: Path, holds: str, exc: BaseException, fix: str) -> BadFile:
    """``exc``, met loading ``path``, as :class:`BadFile`."""
    if isinstance(exc, FileNotFoundError):
        return BadFile(path, "missing", fix)
    return BadFile(path, f"could not be loaded as {holds} ({_why(exc)})", fix)


def load_torch(path: Path, holds: str, *, mmap: bool = False, fix: str = "") -> Any:
    """``torch.load(path)`` of tensors and plain containers only, onto the CPU; with ``mmap``
    the tensors' bytes are read only when used (a cheap check of a large file). A file that
    cannot be loaded raises :class:`BadFile` saying it should hold ``holds``, then ``fix``
    (what to do) where given."""
    import torch

    try:
        return torch.load(path, weights_only=True, mmap=mmap, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 whatever torch meets in a damaged file
        raise _unreadable(path, holds, exc, fix) from None


def check_safetensors(path: Path, holds: str, *, fix: str = "") -> None:
    """Raise :class:`BadFile` (as :func:`load_torch` does) unless ``path`` is a safetensors
    file whose header reads and whose size covers every tensor it lists (a truncated write
    does not); the tensors themselves are not read."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except Exception as exc:  # noqa: BLE001 safetensors' errors have no common base
        raise _unreadable(path, holds, exc, fix) from None
