"""The progress of a run over samples: a tqdm line with tokens per second, and the throughput
its summary reports.

Throughput has one definition, shared by the line and the summary: tokens counted so far
divided by the time from the start to the last update. Time after the last update (shutting
the engine down) does not count, so the summary reads what the line last showed; extract
updates once more, by nothing, when its last file is in place, so that the writes still
pending after the last batch count. The counts are kept whether or not the line is drawn.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, TextIO

from specshim import console

if TYPE_CHECKING:
    from tqdm import tqdm


def hidden(visible: bool = True) -> bool | None:
    """tqdm's ``disable`` for a bar of specshim's: hidden when not ``visible`` or with
    ``--quiet`` (specshim's logger set above INFO: :func:`specshim.console.configure`), else
    tqdm's ``None``: drawn only where its stream is a terminal, as users of tqdm expect."""
    return True if not visible or console.LOGGER.level > logging.INFO else None


class Progress:
    """``update(samples, tokens)`` after each batch, ``finish()`` at the end."""

    def __init__(
        self,
        total: int,
        label: str = "extract",
        stream: TextIO | None = None,
        visible: bool = True,
        started: float | None = None,
    ) -> None:
        self.total = total
        self.done = 0
        self.tokens = 0
        self.started = time.perf_counter() if started is None else started
        self.updated: float | None = None
        self._label, self._stream, self._visible = label, stream, visible
        self._bar: tqdm | None = None  # drawn from the first update: a run that fails to
        # start leaves its error, not an empty bar, as the last line

    def restart(self) -> None:
        """Count the time from now (before the first update: what came before was starting)."""
        self.started = time.perf_counter()

    def update(self, samples: int, tokens: int) -> None:
        """Count ``samples`` and ``tokens`` more as done now; the bar is drawn from the first
        update on."""
        self.done += samples
        self.tokens += tokens
        self.updated = time.perf_counter()
        if self._bar is None:
            from tqdm import tqdm  # here: the command line's parser imports this module

            self._bar = tqdm(
                total=self.total,
                desc=f"[{self._label}]",
                file=self._stream or console.terminal(),
                disable=hidden(self._visible),
                bar_format="{desc} {n_fmt}/{total_fmt} samples{postfix}, ETA {remaining}",
            )
        self._bar.set_postfix_str(f"{self.tokens_per_second:,.0f} tok/s", refresh=False)
        self._bar.update(samples)

    @property
    def elapsed(self) -> float:
        """Seconds from the start to the last update (0 before the first)."""
        return self.updated - self.started if self.updated is not None else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Tokens counted over :attr:`elapsed` (0 before the first update)."""
        return self.tokens / self.elapsed if self.elapsed else 0.0

    def finish(self) -> None:
        """Close the bar, leaving its last state on the terminal."""
        if self._bar is not None:
            self._bar.close()
