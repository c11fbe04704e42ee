"""Announced samples sent to vLLM's engine as they come, the engine kept busy between calls.

Used by the backends that run vLLM's own ``LLM`` and have vLLM's worker write each announced
sample's file: the engine backend (:mod:`specshim.runner.extraction.backends.engine`) and the native
backend where specshim's connector writes (:mod:`specshim.runner.extraction.backends.native`). Each
prompt is one request, its ``SamplingParams`` carrying the sample's announcement to vLLM's worker
(:mod:`specshim.runner.in_worker.protocol`), where the engine backend's capture or specshim's
connector reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specshim.runner.in_worker.checks import misaligned
from specshim.runner.in_worker.protocol import Expected, announcing

#: Tokens the feed keeps in vLLM's engine, in steps of its ``max_num_batched_tokens``: enough
#: that the scheduler has a full next step while the caller records files and sends more. They
#: count until their outputs come back, so the step running and, under async scheduling (vLLM's
#: default on CUDA), the one scheduled behind it are among them, and two more keep the engine
#: busy while the caller asks for finished files. Read when a feed is made
#: (:func:`ahead_tokens`; the benchmark's ``extract_engine@ahead_steps=N``).
AHEAD_STEPS = 4


def ahead_tokens(scheduler_config: Any) -> int:
    """The tokens a feed keeps waiting in an engine of vLLM's ``scheduler_config``:
    :data:`AHEAD_STEPS` of its steps."""
    return AHEAD_STEPS * scheduler_config.max_num_batched_tokens


class EngineFeed:
    """Announced prompts sent to vLLM's engine as they come, the engine kept busy between calls.

    ``LLM.generate`` runs its prompts and returns once the engine is idle: between two calls
    the GPU waits while the caller records files and sends the next batch, and a batch smaller
    than a step runs in steps that are mostly empty. Here each batch's requests are added to
    vLLM's ``LLMEngine`` directly and the engine is stepped only until no more than
    :data:`AHEAD_STEPS` steps of tokens wait, so the next step is always full and the caller's work
    overlaps the engine's. The files come from vLLM's worker as before; the feed checks that vLLM
    ran each prompt's token ids (what the caller checked in ``LLM.generate``'s outputs) as it
    finishes."""

    def __init__(
        self,
        engine: Any,
        ahead_tokens: int,
        on_finished: Callable[[Expected, Any], None] | None = None,
    ) -> None:
        self.engine = engine
        self.ahead_tokens = ahead_tokens
        #: Called with each sample's announcement and vLLM's ``RequestOutput`` as it finishes.
        self.on_finished = on_finished
        #: Requests sent and not finished: id -> the token ids sent and the sample's announcement.
        self.running: dict[str, tuple[list[int], Expected]] = {}
        self._tokens = 0
        self._sent = 0

    def add(self, prompts: list[list[int]], announced: list[Expected]) -> None:
        """Send one request per prompt, announcing its sample, then step the engine until at
        most :attr:`ahead_tokens` tokens wait."""
        from vllm.inputs import TokensPrompt

        for ids, expected in zip(prompts, announced, strict=True):
            request = f"specshim-{self._sent}"
            self._sent += 1
            prompt = TokensPrompt(prompt_token_ids=ids)
            self.engine.add_request(request, prompt, announcing(expected))
            self.running[request] = (ids, expected)
            self._tokens += len(ids)
        while self._tokens > self.ahead_tokens:
            self._step()

    def drain(self) -> None:
        """Step the engine until every request sent has finished."""
        while self.running:
            self._step()

    def _step(self) -> None:
        if not self.engine.has_unfinished_requests():  # stepping would wait for ever
            _, first = next(iter(self.running.values()))
            raise RuntimeError(
                f"engine feed: vLLM has no request left, yet {len(self.running)} sent never "
                f"finished, the first {first.where}"
            )
        for output in self.engine.step():
            if not output.finished:
                continue
            if output.request_id not in self.running:
                raise RuntimeError(
                    f"engine feed: vLLM finished request {output.request_id!r}, which specshim "
                    f"did not send (it sent specshim-0 to specshim-{self._sent - 1})"
                )
            ids, expected = self.running.pop(output.request_id)
            self._tokens -= len(ids)
            if problem := misaligned(expected.where, list(output.prompt_token_ids or []), ids):
                raise RuntimeError(problem)
            if self.on_finished is not None:
                self.on_finished(expected, output)
