"""worker_start_method's wrapper: the executor starts under ``spawn``, and the process's own
setting is back afterwards. The wrapped constructor is a stand-in that records what it saw
(the real executor needs a CUDA device to show the break: tests/gpu)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from specshim.adapters.executor import worker_start_method

ENV = worker_start_method.METHOD_ENV


def seen_by_fake_executor_init(monkeypatch: pytest.MonkeyPatch, before: str | None) -> str:
    if before is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, before)
    seen: list[str | None] = []

    def fake_executor_init(*_args: Any, **_kwargs: Any) -> None:
        seen.append(os.environ.get(ENV))

    worker_start_method._init(fake_executor_init, None, (), {})
    assert os.environ.get(ENV) == before, "the process's own setting must come back"
    return seen[0] or ""


@pytest.mark.parametrize("before", [None, "fork", "spawn"])
def test_the_executor_starts_its_workers_with_spawn(monkeypatch, before) -> None:
    assert seen_by_fake_executor_init(monkeypatch, before) == "spawn"
