"""What a training run reports: the log of its steps (``train_log.json``) and its summary line,
read from speculators' per-step metrics; the tokens each batch holds; the progress bar."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import progress
from specshim.runner.train.out import run_file


@dataclass
class TrainResult:
    """The training log of one ``--out``: one loss (and its epoch) a step, every run appended.

    ``step_seconds`` holds the time between consecutive steps within each run (timing only).
    ``already_trained`` is set, and nothing else, when a resume found every requested epoch
    done.
    """

    losses: list[float] = field(default_factory=list)
    step_epochs: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0
    checkpoint: Path | None = None
    tokens_per_step: int = 0
    already_trained: int = 0

    @property
    def steps(self) -> int:
        """How many steps the log holds, of every run (one loss each)."""
        return len(self.losses)

    @property
    def median_step_seconds(self) -> float:
        """The median step time after the first (which pays for compilation and warm-up)."""
        later = sorted(self.step_seconds[1:]) or self.step_seconds
        return later[len(later) // 2] if later else 0.0

    @classmethod
    def load(cls, path: Path) -> TrainResult:
        """The log at ``path`` (empty if there is none); a log without epochs keeps them all."""
        if not path.exists():
            return cls()

        log = run_file(path)
        losses = [float(x) for x in log.get("losses", [])]
        return cls(
            losses=losses,
            step_epochs=[int(e) for e in log.get("step_epochs", [-1] * len(losses))],
            step_seconds=[float(x) for x in log.get("step_seconds", [])],
            seconds=float(log.get("seconds", 0.0)),
            tokens_per_step=int(log.get("tokens_per_step", 0)),
        )

    def before(self, epoch: int) -> TrainResult:
        """The steps of the epochs before ``epoch``: what a resume after them continues."""
        kept = [i for i, e in enumerate(self.step_epochs) if e < epoch]
        return TrainResult(
            losses=[self.losses[i] for i in kept],
            step_epochs=[self.step_epochs[i] for i in kept],
            step_seconds=self.step_seconds,
            seconds=self.seconds,
            tokens_per_step=self.tokens_per_step,
        )

    def then(self, later: TrainResult) -> TrainResult:
        """This log followed by a later run's."""
        return TrainResult(
            losses=self.losses + later.losses,
            step_epochs=self.step_epochs + later.step_epochs,
            step_seconds=self.step_seconds + later.step_seconds,
            seconds=self.seconds + later.seconds,
            checkpoint=later.checkpoint,
            tokens_per_step=later.tokens_per_step,
        )

    def to_dict(self) -> dict[str, Any]:
        """The log as ``train_log.json`` holds it: the fields :meth:`load` reads, with the
        checkpoints' folder, the step count, steps per second over all runs and the median step
        time."""
        return {
            "losses": self.losses,
            "step_epochs": self.step_epochs,
            "step_seconds": self.step_seconds,
            "steps": self.steps,
            "seconds": self.seconds,
            "steps_per_second": self.steps / self.seconds if self.seconds else 0.0,
            "median_step_seconds": self.median_step_seconds,
            "tokens_per_step": self.tokens_per_step,
            "checkpoint": str(self.checkpoint),
        }

    def text(self) -> str:
        """What ``specshim train`` prints: that the run was already trained, that no step ran,
        or the steps and their speed, the first loss beside the mean of the last five, and the
        checkpoints' folder."""
        if self.already_trained:
            plural = "s" if self.already_trained != 1 else ""
            return (
                f"already trained to {self.already_trained} epoch{plural}; nothing to do "
                f"(checkpoints: {self.checkpoint}; pass a larger --epochs to train on)"
            )
        if not self.losses:
            return "no training steps ran"
        first, last = self.losses[0], sum(self.losses[-5:]) / len(self.losses[-5:])
        return (
            f"steps: {self.steps} in {self.seconds:.1f} s "
            f"({self.steps / self.seconds:.2f} steps/s; median step "
            f"{self.median_step_seconds * 1000:.1f} ms)\n"
            f"loss: first {first:.4f}, mean of last 5 {last:.4f}\n"
            f"checkpoint: {self.checkpoint}"
        )


def _train_metrics(record: logging.LogRecord) -> dict[str, Any] | None:
    """The message of one of speculators' per-step records (``{"train": {...}, "epoch": e}``)."""
    message = record.msg
    if isinstance(message, dict) and isinstance(message.get("train"), dict):
        return message
    return None


class MetricCollector(logging.Handler):
    """Reads the per-step metrics speculators logs (``{"train": {"loss": ...}}``), and when.

    Attached to ``speculators.metrics`` by ``train`` and by benchmarks/training_ratio.py, which
    times speculators' trainer driven directly with the same clock.
    """

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.epochs: list[int] = []
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the loss, epoch (-1 when it names none) and time of a per-step record with a
        loss; ignore any other record."""
        message = _train_metrics(record)
        if message is not None and message["train"].get("loss") is not None:
            self.losses.append(float(message["train"]["loss"]))
            self.epochs.append(int(message.get("epoch", -1)))
            self.times.append(record.created)

    def step_seconds(self) -> list[float]:
        """The time between consecutive steps' metrics (each after speculators' ``.item()``)."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


class TokenCounter:
    """Counts the tokens of every batch the loader hands out (its ``lengths``, packed)."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, collate: Callable[[list[Any]], dict[str, Any]]) -> Callable[..., Any]:
        """``collate``, adding the sum of each batch's ``lengths`` to ``count`` as it returns."""

        def counting(batch: list[Any]) -> dict[str, Any]:
            collated = collate(batch)
            self.count += int(collated["lengths"].sum())
            return collated

        return counting


class ProgressBar(logging.Handler):
    """One tqdm bar an epoch on stderr: steps, loss and tokens/s from speculators' metrics.

    speculators draws its own bar only where its ``local_rank`` is 0, which on the CPU (a
    device there) is never, and without loss or throughput. tokens/s counts the steps after an
    epoch's first (the loader collates a batch just before its step, so the tokens counted at
    step k's metrics are exactly those of steps 1..k).
    """

    def __init__(self, epochs: int, steps_per_epoch: int, tokens: TokenCounter) -> None:
        super().__init__()
        self.epochs, self.steps_per_epoch, self.tokens = epochs, steps_per_epoch, tokens
        self.bar: Any = None
        self.epoch = -1
        self.first_tokens, self.first_time = 0, 0.0

    def emit(self, record: logging.LogRecord) -> None:
        """Advance the bar one step for a per-step record, starting a new bar when its epoch
        changes; show its loss, and tokens/s from the epoch's second step on."""
        message = _train_metrics(record)
        if message is None:
            return
        epoch = int(message.get("epoch", 0))
        if epoch != self.epoch:
            self._start(epoch)
        postfix = f"loss {float(message['train'].get('loss', math.nan)):.4f}"
        seconds = time.perf_counter() - self.first_time
        if self.bar.n and seconds > 0:
            postfix += f", {(self.tokens.count - self.first_tokens) / seconds:,.0f} tok/s"
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update()

    def _start(self, epoch: int) -> None:
        from tqdm import tqdm

        self.close_bar()
        self.epoch = epoch
        self.first_tokens, self.first_time = self.tokens.count, time.perf_counter()
        self.bar = tqdm(
            total=self.steps_per_epoch,
            desc=f"[specshim train] epoch {epoch + 1}/{self.epochs}",
            unit="step",
            file=console.terminal(),
            disable=progress.hidden(),
        )

    def close_bar(self) -> None:
        """Close the current epoch's bar, if one is open."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """Close the open bar, then the handler."""
        self.close_bar()
        super().close()
