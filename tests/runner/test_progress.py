"""Progress counts whether or not it draws: the summary's throughput depends on it."""

import io
import logging
import sys

import pytest

from conftest import Terminal
from specshim.runner.progress import Progress
from specshim.runner.train.metrics import ProgressBar, TokenCounter


def test_hidden_progress_still_counts_tokens() -> None:
    stream = io.StringIO()
    bar = Progress(total=4, stream=stream, visible=False)
    bar.update(2, 300)
    bar.finish()
    assert (bar.done, bar.tokens) == (2, 300)
    assert bar.tokens_per_second > 0
    assert stream.getvalue() == ""


def test_visible_progress_draws_one_line_then_ends_it() -> None:
    stream = Terminal()
    bar = Progress(total=4, stream=stream)
    bar.update(1, 50)
    bar.finish()
    last = stream.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("[extract] 1/4 samples, ") and " tok/s, ETA " in last
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


def test_nothing_is_drawn_before_the_first_update() -> None:
    """A run that fails to start ends with its error line, not an empty bar."""
    stream = io.StringIO()
    bar = Progress(total=4, stream=stream)
    bar.finish()
    del bar
    assert stream.getvalue() == ""


def test_restart_leaves_the_time_spent_starting_out_of_the_throughput(monkeypatch) -> None:
    """extract restarts the clock once vLLM and the writer have started (the worker hand-off's
    writer processes take seconds to start): 100 tokens in the 2 s after, not the 5 s since."""
    from specshim.runner import progress

    now = [10.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    bar = Progress(total=1, visible=False)
    now[0] = 13.0  # three seconds of starting
    bar.restart()
    now[0] = 15.0
    bar.update(1, 100)
    assert bar.elapsed == 2.0 and bar.tokens_per_second == 50.0


def drawn_by_progress(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> str:
    """What extract's (and convert's) bar draws on ``stream`` for one batch."""
    bar = Progress(total=4, stream=stream)
    bar.update(1, 50)
    bar.finish()
    return stream.getvalue()


def drawn_by_training(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``train``'s bar draws on ``stream`` (as stderr) for one of speculators' steps."""
    monkeypatch.setattr(sys, "stderr", stream)
    bar = ProgressBar(epochs=1, steps_per_epoch=2, tokens=TokenCounter())
    step = {"train": {"loss": 0.5}, "epoch": 0}
    bar.emit(logging.LogRecord("speculators.metrics", logging.INFO, "", 0, step, None, None))
    bar.close()
    return stream.getvalue()


@pytest.mark.parametrize("drawn", [drawn_by_progress, drawn_by_training])
def test_a_bar_is_drawn_on_a_terminal(drawn, monkeypatch) -> None:
    assert "1/" in drawn(Terminal(), monkeypatch)


@pytest.mark.parametrize("drawn", [drawn_by_progress, drawn_by_training])
def test_no_bar_where_the_stream_is_not_a_terminal(drawn, monkeypatch) -> None:
    """A log file or a pipe gets no bar (tqdm's ``disable=None``), only the summary."""
    assert drawn(io.StringIO(), monkeypatch) == ""


@pytest.mark.usefixtures("quiet")
@pytest.mark.parametrize("drawn", [drawn_by_progress, drawn_by_training])
def test_no_bar_with_quiet_even_on_a_terminal(drawn, monkeypatch) -> None:
    assert drawn(Terminal(), monkeypatch) == ""
