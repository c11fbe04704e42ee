"""The engine backend's capture in vLLM's worker: each step's states cut per request, a
prompt's chunks joined across steps (chunked prefill, preemption), and each whole prompt
handed to the writer (:class:`specshim.runner.in_worker.writer.WorkerFiles`) or kept for the
caller.

What it relies on: a scheduler output's ``scheduled_new_reqs`` (request id, prompt token ids,
sampling parameters), ``num_scheduled_tokens`` and each request's ``num_computed_tokens``
(where its tokens of the step begin: a request vLLM preempted, its KV cache taken back for
others, computes its prompt again from there, and what was captured of it before is cut back
to it), and the runner's row order: the V1 runner's ``input_batch.req_ids``, or under Model
Runner V2 the step the ``worker_batch_order_v2`` adapter remembers. Anything else is an error
naming what was expected and what was found. Only tensor-parallel rank 0 captures and writes
(every rank holds the full states after the all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specshim.adapters.worker.worker_batch_order_v2 import STEP
from specshim.runner.in_worker.checks import misaligned
from specshim.runner.in_worker.protocol import KEPT, Expected, Report, announcement
from specshim.runner.in_worker.writer import WorkerFiles


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
