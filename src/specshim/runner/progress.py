"""A one-line progress display: samples, tokens per second and ETA, then a summary.

Throughput has one definition, shared by the line and the summary: tokens counted so far
divided by the time from the start to the last update. Time after the last update (shutting
the engine down, writing the final files) does not count, so the summary reads what the line
last showed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


@dataclass
class Progress:
    total: int
    label: str = "extract"
    stream: TextIO = sys.stderr
    visible: bool = True  # counts either way; draws only when visible
    done: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    updated: float | None = None

    def update(self, samples: int, tokens: int) -> None:
        self.done += samples
        self.tokens += tokens
        self.updated = time.perf_counter()
        if self.visible:
            self.stream.write(f"\r[{self.label}] {self.line()}")
            self.stream.flush()

    @property
    def elapsed(self) -> float:
        """Seconds from the start to the last update (0 before the first)."""
        return self.updated - self.started if self.updated is not None else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.elapsed if self.elapsed else 0.0

    def line(self) -> str:
        rate = self.done / self.elapsed if self.elapsed else 0.0
        eta = (self.total - self.done) / rate if rate else float("inf")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return (
            f"{self.done}/{self.total} samples  {self.tokens_per_second:,.0f} tok/s  ETA {eta_text}"
        )

    def finish(self) -> None:
        if self.visible:
            self.stream.write("\n")
            self.stream.flush()
