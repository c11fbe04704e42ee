"""The engine backend's feed (:class:`specshim.runner.extraction.backends.feed.EngineFeed`): batches
sent to vLLM's engine as they come, the engine stepped only until no more than two steps of tokens
wait, so the caller's work between batches overlaps the engine's.

vLLM's engine is a fake here (``FakeEngineForTheFeed``): what is tested is the feed's
accounting (what waits when ``add`` returns, what ``drain`` leaves, the token ids checked);
the real engine runs the feed end to end in tests/e2e/test_engine_loop.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specshim.runner.extraction.backends.feed import EngineFeed
from specshim.runner.in_worker.protocol import Expected

pytestmark = pytest.mark.vllm  # the feed builds the real vLLM's requests


@dataclass
class Finished:
    """The part of vLLM's ``RequestOutput`` the feed reads."""

    request_id: str
    prompt_token_ids: list[int]
    finished: bool = True


class FakeEngineForTheFeed:
    """vLLM's ``LLMEngine`` as the feed uses it, a fake: ``step`` finishes the oldest requests
    within ``step_tokens``; ``ran`` changes the token ids it reports (a tokenizer's BOS)."""

    def __init__(self, step_tokens: int, ran: dict[str, list[int]] | None = None) -> None:
        self.step_tokens = step_tokens
        self.waiting: list[tuple[str, list[int]]] = []
        self.steps = 0
        self.ran = ran or {}

    def add_request(self, request_id: str, prompt: dict, params: object) -> None:
        self.waiting.append((request_id, prompt["prompt_token_ids"]))

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def step(self) -> list[Finished]:
        self.steps += 1
        done, budget = [], self.step_tokens
        while self.waiting and len(self.waiting[0][1]) <= budget:
            request, ids = self.waiting.pop(0)
            budget -= len(ids)
            done.append(Finished(request, self.ran.get(request, ids)))
        return done


def announced(count: int, start: int = 0) -> tuple[list[list[int]], list[Expected]]:
    prompts = [[i] * 4 for i in range(start, start + count)]
    expected = [
        Expected(f"data_{i}.pt", ids, [1] * 4, f"line {i + 1} (data_{i}.pt)")
        for i, ids in zip(range(start, start + count), prompts, strict=True)
    ]
    return prompts, expected


def test_a_batch_returns_with_up_to_two_steps_still_waiting_in_the_engine() -> None:
    """8 prompts of 4 tokens, steps of 8 tokens: ``add`` returns once 16 tokens (two steps)
    wait, so the next batch joins them before the engine runs dry; ``drain`` runs the rest."""
    engine = FakeEngineForTheFeed(step_tokens=8)
    feed = EngineFeed(engine, ahead_tokens=16)
    feed.add(*announced(8))
    assert engine.steps == 2 and len(feed.running) == 4  # 16 tokens wait
    feed.add(*announced(4, start=8))
    assert engine.steps == 4 and set(feed.running) == {f"specshim-{i}" for i in range(8, 12)}
    feed.drain()
    assert feed.running == {} and engine.waiting == [] and engine.steps == 6


def test_each_finished_sample_is_handed_on_in_the_order_vllm_finished_it() -> None:
    """The native backend's hook: each announcement with vLLM's output, once its ids are
    checked (a sample whose ids differ is never handed on)."""
    engine = FakeEngineForTheFeed(step_tokens=8)
    seen: list[tuple[str, str]] = []
    feed = EngineFeed(engine, 4, on_finished=lambda e, out: seen.append((e.path, out.request_id)))
    feed.add(*announced(3))
    assert seen == [("data_0.pt", "specshim-0"), ("data_1.pt", "specshim-1")]
    feed.drain()
    assert seen[2:] == [("data_2.pt", "specshim-2")]


def test_a_prompt_vllm_ran_with_other_ids_is_one_line() -> None:
    engine = FakeEngineForTheFeed(step_tokens=8, ran={"specshim-2": [1, 2, 2, 2, 2]})
    feed = EngineFeed(engine, ahead_tokens=0)
    with pytest.raises(RuntimeError) as error:
        feed.add(*announced(4))
    assert str(error.value) == (
        "line 3 (data_2.pt): vLLM ran other input ids than the row's (5 vs 4 tokens): "
        "refusing to write misaligned data"
    )


def test_a_request_the_feed_did_not_send_is_an_error() -> None:
    engine = FakeEngineForTheFeed(step_tokens=8)
    feed = EngineFeed(engine, ahead_tokens=0)
    engine.add_request("7", {"prompt_token_ids": [5]}, None)  # someone else's request
    with pytest.raises(RuntimeError, match=r"vLLM finished request '7', which specshim did not"):
        feed.add(*announced(1))


def test_a_request_vllm_dropped_is_an_error_not_a_wait_for_ever() -> None:
    engine = FakeEngineForTheFeed(step_tokens=8)
    feed = EngineFeed(engine, ahead_tokens=100)
    feed.add(*announced(3))
    engine.waiting.pop(1)  # gone without a finished output
    with pytest.raises(RuntimeError) as error:
        feed.drain()
    assert str(error.value) == (
        "engine feed: vLLM has no request left, yet 1 sent never finished, the first "
        "line 2 (data_1.pt)"
    )


def test_an_announcement_reaches_the_worker_whole_through_vllms_own_copies() -> None:
    """What vLLM does to a request's ``SamplingParams`` between ``add_request`` and the worker
    (real vLLM classes): a deep copy, MessagePack to the engine core, pickle to the worker.
    The ids and mask travel as bytes (a list costs vLLM a Python step per integer, at each of
    those) and come back as the row's lists."""
    import pickle

    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from specshim.runner.in_worker.protocol import announcement, announcing

    expected = Expected("/out/data_7.pt", [2**40, 0, 151_643, 5], [0, 1, 1, 0], "line 8")
    params = announcing(expected)
    sent = MsgpackEncoder().encode(params.clone())
    in_worker = pickle.loads(pickle.dumps(MsgpackDecoder(type(params)).decode(sent)))
    assert announcement(in_worker) == expected
    said = in_worker.extra_args["specshim_sample"]
    assert isinstance(said["input_ids"], bytes) and isinstance(said["loss_mask"], bytes)
    assert announcement(type(params)(max_tokens=1)) is None
