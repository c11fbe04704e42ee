"""``specshim extract --backend engine``: speculators' capture inside vLLM's own engine loop.

speculators' generator steps the engine one call at a time (schedule, execute, fetch, each
waiting for the last). Here vLLM's own ``LLMEngine`` runs the prompts, fed by
:class:`~specshim.runner.extraction.backends.feed.EngineFeed` so that it never runs dry
between the caller's batches; in vLLM's worker speculators' own capture (with specshim's
adapters applied) takes each step's states, and specshim's capture
(:mod:`specshim.runner.in_worker.capture`) cuts them per request, joins a prompt's chunks and
writes each whole prompt's file. The caller announces each sample in its request's
``SamplingParams`` and records the files the worker reports. Requests not announced
(``extract --verify``'s) have their states kept in the worker and fetched through the RPC.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specshim.runner.extraction.backends import feed
from specshim.runner.extraction.backends.base import Started
from specshim.runner.extraction.backends.feed import EngineFeed
from specshim.runner.extraction.backends.llm import LLMGenerator, llm_options
from specshim.runner.in_worker.protocol import KEPT, Announcements, Report, columnless, rank0

if TYPE_CHECKING:
    from specshim.runner.extraction.backends.base import Launch

#: The class mixed into vLLM's worker: speculators' capture, each step through specshim's.
WORKER_EXTENSION = "specshim.runner.in_worker.capture_extension.EngineCapture"
#: Who writes the engine backend's files (the summary names it).
ENGINE_IN_WORKER = "vLLM's worker, inside vLLM's engine loop"


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


class EngineGenerator(LLMGenerator):
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
        options = llm_options(model, max_model_len, tensor_parallel_size, WORKER_EXTENSION)
        # steps: max_num_seqs, max_num_batched_tokens
        super().__init__(model, layer_ids, max_model_len, tensor_parallel_size,
                         options | (steps or {}), trust_remote_code)  # fmt: skip
        if not any(self.llm.collective_rpc("specshim_engine_install", args=(layer_ids,))):
            raise RuntimeError("engine capture: no vLLM worker of rank 0 took the capture")
        ahead = feed.ahead_tokens(self.vllm_config.scheduler_config)
        self.feed = EngineFeed(self.llm.llm_engine, ahead)
        self.files = EngineFiles(self.llm, self.feed)
        self._calls = 0

    def shutdown(self) -> None:
        """Undo the worker's capture patches (where the worker runs in this process, they
        would keep its weights and KV cache alive), then stop vLLM's engine. An engine that
        died cannot answer: it is stopped all the same."""
        with contextlib.suppress(Exception):
            self.llm.collective_rpc("specshim_engine_uninstall")
        super().shutdown()

    def recomputed(self) -> int:
        """How many prompts vLLM preempted part-way, for KV cache room, and computed again
        (:attr:`specshim.runner.in_worker.capture.StepCapture.recomputed`)."""
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


@dataclass
class EngineBackend(Started):
    """The engine backend: :class:`EngineGenerator`, vLLM's worker writing the files."""

    why: str
    name: str = "engine"
    generator: Any = None
    handoff: str = ENGINE_IN_WORKER

    def start(self, launch: Launch) -> Any:
        """vLLM's ``LLM`` with speculators' capture in its worker."""
        self.work = launch.out / ".specshim-native"
        self.generator = EngineGenerator(
            launch.model, launch.layers, launch.max_model_len, launch.tensor_parallel_size,
            launch.engine.options(), launch.trust_remote_code,
        )  # fmt: skip
        return self.generator

    def worker_files(self) -> EngineFiles:
        """The worker's writes."""
        return self.generator.files  # type: ignore[no-any-return]

    def recomputed(self) -> int:
        """:meth:`EngineGenerator.recomputed`."""
        return self.generator.recomputed()  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop vLLM's engine and its processes."""
        self.generator.shutdown()
        shutil.rmtree(self.work, ignore_errors=True)
