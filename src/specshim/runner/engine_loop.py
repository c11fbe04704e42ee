"""``specshim extract --backend engine``: speculators' capture inside vLLM's own engine loop.

speculators' generator steps the engine one call at a time (schedule, execute, fetch, each
waiting for the last). Here vLLM's own engine runs the prompts (``LLM``'s ``LLMEngine``, fed
by :class:`EngineFeed` so that it never runs dry between the caller's batches), so the engine
schedules and overlaps its steps as it does for any user, and vLLM's worker does what the ``worker``
hand-off does:

- speculators' own capture (``_setup_hidden_states_capture``: its forward, ``hidden + residual``
  of each chosen layer, with specshim's adapters applied) takes each step's states;
- :class:`StepCapture`, in vLLM's worker (:class:`specshim.runner.engine_worker.EngineCapture`
  routes speculators' capture to it), cuts each step's
  rows per request (the runner's row order, the scheduler's token counts), joins a prompt's
  chunks across steps (chunked prefill) and, once a prompt is whole, hands it to the same
  writer the ``worker`` hand-off uses (:class:`specshim.runner.worker_writer.WorkerFiles`:
  page-locked copies on a side stream, checks, ``data_{i}.pt`` written atomically);
- the caller announces each sample in its request's ``SamplingParams``
  (:mod:`specshim.runner.in_worker.protocol`, as the native backend does) and records the
  files the worker reports in place (:class:`EngineFiles`), as with the other worker writes.

Requests not announced (``extract --verify``'s) have their states kept in the worker and
fetched through the RPC. Only tensor-parallel rank 0 captures and writes (every rank holds
the full states after the all-reduce), as in speculators' generator.

What it relies on: a scheduler output's ``scheduled_new_reqs`` (request id, prompt token
ids, sampling parameters), ``num_scheduled_tokens`` and each request's ``num_computed_tokens``
(where its tokens of the step begin: a request vLLM preempted, its KV cache taken back for
others, computes its prompt again from there, and what was captured of it before is cut back
to it), and the runner's row order: the V1
runner's ``input_batch.req_ids``, or under Model Runner V2 the step the
``worker_batch_order_v2`` adapter remembers. Anything else is an error naming what was
expected and what was found.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from specshim.adapters.worker.worker_batch_order_v2 import STEP
from specshim.runner import engine_feed, native
from specshim.runner.engine_feed import EngineFeed
from specshim.runner.in_worker.protocol import (
    Announcements,
    Expected,
    Report,
    announcement,
    columnless,
    rank0,
)
from specshim.runner.samples import misaligned
from specshim.runner.worker_writer import WorkerFiles

#: ``extra_args`` key of a request whose states the worker keeps for the caller (not announced).
KEPT = "specshim_kept"
#: The class mixed into vLLM's worker: speculators' capture, each step through :class:`StepCapture`.
WORKER_EXTENSION = "specshim.runner.engine_worker.EngineCapture"


@dataclass
class _Prompt:
    """One request being captured: its announcement (or the caller's tag, where its states
    are kept), its prompt length, and the per-layer chunks of the steps so far."""

    expected: Expected | None
    tag: str | None
    length: int
    chunks: list[list[Any]] = field(default_factory=list)
    seen: int = 0

    def states(self) -> list[Any]:
        """The prompt's per-layer ``[tokens, hidden]`` states, chunks joined."""
        import torch

        if len(self.chunks) == 1:
            return self.chunks[0]
        return [torch.cat(layer) for layer in zip(*self.chunks, strict=True)]

    def rewind(self, to: int) -> None:
        """Forget the states of the tokens from ``to`` on: vLLM computes them again."""
        kept: list[list[Any]] = []
        seen = 0
        for chunk in self.chunks:
            if seen >= to:
                break
            rows = chunk[0].shape[0]
            kept.append(chunk if seen + rows <= to else [layer[: to - seen] for layer in chunk])
            seen = min(seen + rows, to)
        self.chunks, self.seen = kept, seen

    @property
    def where(self) -> str:
        """The prompt as the user knows it: its row, or the caller's tag."""
        return self.expected.where if self.expected is not None else f"kept as {self.tag}"


def _prompt(new_request: Any) -> _Prompt | None:
    """What to capture for a newly scheduled request: an announced sample, a kept one, or
    None for a request specshim did not send."""
    params = new_request.sampling_params
    expected = announcement(params)  # the row's ids: checked against vLLM's
    tag = ((params.extra_args if params else None) or {}).get(KEPT)
    if expected is None and tag is None:
        return None
    return _Prompt(expected, tag, len(new_request.prompt_token_ids or []))


@dataclass
class StepCapture:
    """The worker's side: requests being captured, the writer, the states kept for the caller."""

    runner: Any
    writer: WorkerFiles
    prompts: dict[str, _Prompt] = field(default_factory=dict)
    kept: dict[str, list[Any]] = field(default_factory=dict)
    scheduled: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    #: Prompts vLLM preempted part-way (their KV cache given to others) and computed again.
    recomputed: int = 0
    #: Requests whose file was reported (its prompt captured whole, or refused), until the
    #: scheduler says they finished: one preempted after its prompt ran (its output still in
    #: flight, under async scheduling) computes the prompt again, and would be written and
    #: reported a second time.
    reported: set[str] = field(default_factory=set)

    def schedule(self, scheduler_output: Any) -> None:
        """Before a step runs: its new requests, how many tokens each request runs, and from
        which of its tokens."""
        # Preempted since the last step: its states so far are computed again, so let go of
        # them now, not when it resumes (each chunk is a view of a whole step's states on the
        # device, held while the KV cache is short). vLLM 0.12+ names them; before, _begin.
        for request in getattr(scheduler_output, "preempted_req_ids", None) or ():
            if (prompt := self.prompts.get(request)) is not None and prompt.seen:
                self._recompute(prompt, 0)
        self.reported -= getattr(scheduler_output, "finished_req_ids", None) or set()
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self.prompts or new.req_id in self.reported:  # resumed (under V2)
                continue
            if (prompt := _prompt(new)) is None:
                continue
            expected, ran = prompt.expected, list(new.prompt_token_ids or [])
            if expected and (problem := misaligned(expected.where, ran, expected.input_ids)):
                self.writer.refuse(expected, problem)  # before a file with the row's ids is
                self.reported.add(new.req_id)  # written from other tokens' states
                continue
            self.prompts[new.req_id] = prompt
        self.scheduled = dict(scheduler_output.num_scheduled_tokens)
        self.starts = _starts(scheduler_output)

    def rows(self) -> list[str]:
        """The step's requests in the order of its rows."""
        batch = getattr(self.runner, "input_batch", None)
        if batch is not None:  # the V1 runner: rows follow its persistent batch
            return list(batch.req_ids)
        step = getattr(self.runner, STEP, None)  # Model Runner V2, remembered by the adapter
        if step is None:
            raise RuntimeError(
                f"engine capture: expected the runner's rows in input_batch (V1) or {STEP} "
                f"(Model Runner V2, worker_batch_order_v2), found neither on "
                f"{type(self.runner).__name__}"
            )
        return list(step.rows)

    def store(self, states: list[Any]) -> None:
        """speculators' forward hands over one step's per-layer states: cut them per request,
        and write (or keep) each prompt that is now whole."""
        whole: list[_Prompt] = []
        start = 0
        for request in self.rows():
            count = self.scheduled.get(request, 0)
            prompt = self.prompts.get(request)
            if prompt is not None and count > 0:
                begin = self._begin(request, prompt)
                if (take := min(count, prompt.length - begin)) > 0:
                    prompt.chunks.append([s[start : start + take] for s in states])
                    prompt.seen = begin + take
                    if prompt.seen == prompt.length:
                        whole.append(self.prompts.pop(request))
                        self.reported.add(request)
            start += count
        if start > states[0].shape[0]:
            raise RuntimeError(
                f"engine capture: the scheduler ran {start} tokens, the step captured "
                f"{states[0].shape[0]}"
            )
        written = [p for p in whole if p.expected is not None]
        self.writer.write([p.expected for p in written], [p.states() for p in written])  # type: ignore[misc]
        for prompt in whole:
            if prompt.tag is not None:
                self.kept[prompt.tag] = [s.cpu() for s in prompt.states()]

    def _begin(self, request: str, prompt: _Prompt) -> int:
        """Where ``request``'s tokens of this step begin in its prompt; what was captured of it
        from there on is forgotten, since vLLM computes it again: a request preempted (its KV
        cache given to others) starts over from 0 without prefix caching, and its states
        joined after the first pass's would put the wrong tokens' states in its file, the run
        reporting success. A start beyond what was captured is an error: those tokens never
        ran here."""
        begin = self.starts.get(request)
        if begin is None:
            raise RuntimeError(
                f"engine capture: the scheduler ran tokens of request {request} "
                f"({prompt.where}) but named no num_computed_tokens for it"
            )
        if begin > prompt.seen:
            raise RuntimeError(
                f"engine capture: request {request} ({prompt.where}) goes on from token "
                f"{begin}, but the states of only {prompt.seen} of its tokens were captured"
            )
        if begin < prompt.seen:
            self._recompute(prompt, begin)
        return begin

    def _recompute(self, prompt: _Prompt, start: int) -> None:
        """vLLM computes ``prompt`` again from token ``start``: forget what came after."""
        prompt.rewind(start)
        self.recomputed += 1

    def finished(self, wait: bool) -> list[Report]:
        """:meth:`WorkerFiles.finished`; with ``wait``, a prompt never completed is an error."""
        if wait and (open_ := [p for p in self.prompts.values() if p.expected is not None]):
            first = open_[0]
            raise RuntimeError(
                f"engine capture: {len(open_)} announced prompts never ran to their end, the "
                f"first {first.expected.where} ({first.seen} of {first.length} tokens)"  # type: ignore[union-attr]
            )
        return self.writer.finished(wait)


def _starts(scheduler_output: Any) -> dict[str, int]:
    """Each scheduled request's tokens computed before this step (its ``num_computed_tokens``:
    a new request's in ``scheduled_new_reqs``, the others' in the batched
    ``scheduled_cached_reqs`` of vLLM 0.9.2 and later); another shape is an error naming it."""
    starts = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    ids = getattr(cached, "req_ids", None)
    computed = getattr(cached, "num_computed_tokens", None)
    if not isinstance(ids, list) or not isinstance(computed, list) or len(ids) != len(computed):
        raise RuntimeError(
            "engine capture: expected the scheduler output's scheduled_cached_reqs with lists "
            f"req_ids and num_computed_tokens of one length (vLLM 0.9.2 and later), found "
            f"{type(cached).__name__}"
        )
    starts.update(zip(ids, computed, strict=True))
    return starts


class EngineFiles(Announcements):
    """The caller's handle on the worker's writes: announce, then collect finished files."""

    def __init__(self, llm: Any, feed: EngineFeed) -> None:
        super().__init__()
        self.llm = llm
        self.feed = feed

    def finished(self, wait: bool = False) -> list[Report]:
        """The files the worker finished since the last call (each with the problem that kept
        it from being written, None: in place); with ``wait``, once every one is (every
        request sent has run first)."""
        if wait:
            self.feed.drain()
        return rank0(self.llm.collective_rpc("specshim_engine_finished", args=(wait,))) or []


class EngineGenerator(native.LLMGenerator):
    """vLLM's ``LLM.generate`` with speculators' capture, behind the generator's interface.

    ``generate(token_ids)`` returns one record per sequence (``input_ids``, and per layer of
    ``layer_ids`` ``[tokens, hidden]`` states); for samples announced through :attr:`files`
    the states come without columns (``[tokens, 0]``): the worker writes their files."""

    def __init__(
        self,
        model: str,
        layer_ids: list[int],
        max_model_len: int,
        tensor_parallel_size: int,
        steps: dict[str, int] | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        options = native.llm_options(model, max_model_len, tensor_parallel_size, WORKER_EXTENSION)
        # steps: max_num_seqs, max_num_batched_tokens
        super().__init__(model, layer_ids, max_model_len, tensor_parallel_size,
                         options | (steps or {}), trust_remote_code)  # fmt: skip
        if not any(self.llm.collective_rpc("specshim_engine_install", args=(layer_ids,))):
            raise RuntimeError("engine capture: no vLLM worker of rank 0 took the capture")
        ahead = engine_feed.ahead_tokens(self.vllm_config.scheduler_config)
        self.feed = EngineFeed(self.llm.llm_engine, ahead)
        self.files = EngineFiles(self.llm, self.feed)
        self._calls = 0

    def recomputed(self) -> int:
        """How many prompts vLLM preempted part-way, for KV cache room, and computed again
        (:attr:`StepCapture.recomputed`)."""
        state = rank0(self.llm.collective_rpc("specshim_engine_state"))
        return int(state["recomputed"]) if state else 0

    def generate(self, token_ids: list[list[int]]) -> list[dict[str, Any]]:
        """One prefill per sequence; each one's token ids and its states. Announced samples
        go to the :class:`EngineFeed` and come back without columns at once (their files are
        reported through :attr:`files`, the token ids checked as they run); others run to the
        end here, their states fetched from the worker."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        cut = self.cut(token_ids)
        if announced := self.files.take_for(cut):
            self.feed.add(cut, announced)
            return [columnless(ids, len(self.layer_ids)) for ids in cut]
        self.feed.drain()  # LLM.generate runs the engine until idle: none of the feed's left
        self._calls += 1
        tags = [f"{self._calls}_{i}" for i in range(len(cut))]
        params = [SamplingParams(max_tokens=1, extra_args={KEPT: tag}) for tag in tags]
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in cut]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        ran = [list(output.prompt_token_ids or []) for output in outputs]
        saved = rank0(self.llm.collective_rpc("specshim_engine_kept", args=(tags,)))
        kept = torch.load(io.BytesIO(saved), weights_only=True)
        return [
            {"input_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": states}
            for ids, states in zip(ran, kept, strict=True)
        ]
