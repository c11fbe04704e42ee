"""``specshim extract --backend native``: vLLM's own hidden-state extraction (the
``extract_hidden_states`` speculative method and its ``ExampleHiddenStatesConnector``, vLLM >=
0.18) behind the interface ``extract`` uses from speculators' generator.

Where the installed vLLM allows it (:func:`writes_in_worker`), vLLM's worker writes the files:
each announced request carries its sample to specshim's connector
(:mod:`specshim.runner.in_worker.connector`), the requests go to vLLM's engine through the
:class:`~specshim.runner.extraction.backends.feed.EngineFeed`, and ``generate`` returns states
without columns. Elsewhere, and for requests not announced, ``LLM.generate`` runs them and
this process reads vLLM's safetensors files back. vLLM is asked for the layers by its own
numbering (:mod:`specshim.runner.layer_ids`). On vLLM's CPU backend the engine core runs in
its own process (in the caller's, the connector writes a request's file only at the next
engine step, which never comes once ``generate`` returned) and the connector's CUDA calls get a
CPU stand-in (:mod:`specshim.runner.in_worker.cpu_connector`).
"""

from __future__ import annotations

import collections
import fcntl
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specshim import console
from specshim.runner import files
from specshim.runner.extraction.backends import feed
from specshim.runner.extraction.backends.base import Started
from specshim.runner.extraction.backends.feed import EngineFeed
from specshim.runner.extraction.backends.llm import LLMGenerator, llm_options
from specshim.runner.in_worker.cpu_connector import CONNECTOR
from specshim.runner.in_worker.protocol import (
    WRITTEN,
    Announcements,
    Expected,
    Report,
    columnless,
    per_layer,
)
from specshim.runner.layer_ids import vllm_ids

if TYPE_CHECKING:
    from specshim.runner.extraction.backends.base import Launch

#: Who writes the native backend's files (the summary names it): vLLM's worker, through
#: specshim's connector, where the installed vLLM allows it; else this process, from the
#: connector's own files.
NATIVE_IN_WORKER = "vLLM's worker, through specshim's hidden-states connector"
NATIVE_READ_BACK = "the files of vLLM's hidden-states connector"
#: specshim's subclass of it, which writes announced samples as ``data_{i}.pt`` itself.
OWN_CONNECTOR = ("specshim.runner.in_worker.connector", "SpecshimHiddenStatesConnector")
#: States (bytes) that may wait in vLLM's host memory for its connector's writer threads
#: (:class:`NativeFiles`); beyond that, announcing waits for the oldest files.
PENDING_BYTES = 4 << 30
#: What :func:`writes_in_worker` needs in vLLM's connector module: the write step the subclass
#: replaces, called through the instance, and the scheduler's file names it reads.
OWN_CONNECTOR_NEEDS = (
    "def _write_tensors(",
    "self._write_tensors, tensors,",
    "self._request_filenames[new_req.req_id] = ",
)
#: ... and, under tensor parallelism, that only rank 0 takes the lock and writes (0.25.1 on;
#: in 0.22.1 every rank does, and another rank's lock file would truncate rank 0's outcome).
ONE_RANK_WRITES = "self._is_tp_rank_zero"


def writes_in_worker(tensor_parallel_size: int = 1) -> bool:
    """Whether specshim's connector can write the files in vLLM's worker here: the installed
    vLLM's connector has what it overrides (:data:`OWN_CONNECTOR_NEEDS`, in vLLM 0.22.1 and
    0.25.1 to 0.32.0; beyond one rank, :data:`ONE_RANK_WRITES` too: 0.25.1 on), read from its
    source without importing it. Elsewhere the caller reads vLLM's own files back."""
    from specshim.adapters import kit  # wrapt: not at import, where the CLI builds its parser

    source = kit.module_source(CONNECTOR) or ""
    needs = OWN_CONNECTOR_NEEDS + ((ONE_RANK_WRITES,) if tensor_parallel_size > 1 else ())
    return all(needed in source for needed in needs)


#: vLLM's config module, and what 0.22's says where the example connector meets chunked
#: prefill.
VLLM_CONFIG = "vllm.config.vllm"
CHUNKED_PREFILL_REFUSAL = "ExampleHiddenStatesConnector does not support chunked prefill"


def _connector_refuses_chunked_prefill() -> bool:
    """Whether the installed vLLM refuses its own hidden-states connector beside chunked
    prefill (vLLM 0.22's ``VllmConfig`` raises; 0.28 and 0.32 have no such check), read from
    ``vllm/config/vllm.py``: then the native path turns chunked prefill off, which it does not
    need (each prompt is prefilled whole, as speculators' generator does)."""
    from specshim.adapters import kit  # wrapt: not at import, where the CLI builds its parser

    return CHUNKED_PREFILL_REFUSAL in (kit.module_source(VLLM_CONFIG) or "")


def engine_options(
    model: str,
    layer_ids: list[int],
    max_model_len: int,
    tensor_parallel_size: int,
    work: Path,
    own_connector: bool = False,
) -> dict[str, Any]:
    """``LLM(...)``'s arguments for the native path: ``layer_ids`` in speculators 0.3/0.4's
    numbering, the connector's files under ``work`` (specshim's connector with
    ``own_connector``), vLLM set up by :func:`llm_options`."""
    module, name = OWN_CONNECTOR
    connector = (
        {"kv_connector": name, "kv_connector_module_path": module}
        if own_connector
        else {"kv_connector": "ExampleHiddenStatesConnector"}
    )
    extension = "specshim.runner.in_worker.cpu_connector.CpuConnectorExtension"
    return {
        **llm_options(model, max_model_len, tensor_parallel_size, extension),
        **({"enable_chunked_prefill": False} if _connector_refuses_chunked_prefill() else {}),
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {"eagle_aux_hidden_state_layer_ids": vllm_ids(layer_ids)}
            },
        },
        "kv_transfer_config": {
            **connector,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(work)},
        },
    }


@dataclass
class _Writing:
    """One announced sample vLLM's worker is writing: its announcement and the lock file the
    connector holds until it is done."""

    expected: Expected
    lock: str


class NativeFiles(Announcements):
    """The caller's side of specshim's connector: announce samples before the ``generate``
    that extracts them, collect the files the worker finished (the interface of
    :class:`specshim.runner.extraction.backends.generator.WorkerFilesClient`).

    ``generate`` returns before the worker's files are written, and vLLM's connector keeps
    each finished request's states in host memory until its writer threads save them, with
    no bound of its own: :meth:`expect` waits for the oldest files while more than
    :data:`PENDING_BYTES` of states (``bytes_per_token`` each
    token) would be waiting, as the ``worker`` hand-off does."""

    def __init__(self, bytes_per_token: int, feed: EngineFeed) -> None:
        super().__init__()
        self.bytes_per_token = bytes_per_token
        self.feed = feed
        self._writing: collections.deque[_Writing] = collections.deque()
        self._done: list[Report] = []

    def _bytes(self, samples: Iterable[Expected]) -> int:
        return sum(len(e.input_ids) for e in samples) * self.bytes_per_token

    def expect(self, batch: list[Expected]) -> None:
        """The next ``generate`` is for ``batch``, in input order; first, room for it."""
        waiting = self._bytes(w.expected for w in self._writing)
        while self._writing and waiting + self._bytes(batch) > PENDING_BYTES:
            oldest = self._writing.popleft()
            if outcome := _settled(oldest, wait=True):
                self._done.append(outcome)
            waiting -= self._bytes([oldest.expected])
        super().expect(batch)

    def writing(self, expected: Expected, path: str) -> None:
        """vLLM's worker is writing ``expected``; ``path`` is the connector's name for it."""
        self._writing.append(_Writing(expected, path + ".lock"))

    def finished(self, wait: bool = False) -> list[Report]:
        """The files finished since the last call, each with the problem that kept it from
        being written (None: in place); with ``wait``, once every announced file is (every
        request sent has run first)."""
        if wait:
            self.feed.drain()
        still: collections.deque[_Writing] = collections.deque()
        for writing in self._writing:
            if (outcome := _settled(writing, wait)) is None:
                still.append(writing)
            else:
                self._done.append(outcome)
        self._writing = still
        done, self._done = self._done, []
        return done


def _settled(writing: _Writing, wait: bool) -> Report | None:
    """The file and the problem that kept it from being written (None: in place) once the
    connector is done with ``writing`` (its lock file is then removed), else None; ``wait``:
    block until it is done."""
    expected = writing.expected
    try:
        with open(writing.lock, "rb") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            said = lock.read().decode()
        os.unlink(writing.lock)
    except FileNotFoundError:  # the connector never made it (vLLM's log says why)
        said = ""
    if said == WRITTEN:
        return expected.path, None
    if said:
        return expected.path, said
    # the connector could not even say what happened: a full disk, or its log says
    full = files.disk_full(Path(expected.path).parent)
    return expected.path, str(full) if full else (
        f"{expected.where}: vLLM's worker wrote no file for it: its log above says why"
    )


def _states_path(output: Any) -> str:
    """Where vLLM's connector says it writes a finished request's states."""
    told = output.kv_transfer_params or {}
    if "hidden_states_path" not in told:
        raise RuntimeError(
            f"vLLM returned no hidden-states file for request {output.request_id} "
            "(expected kv_transfer_params['hidden_states_path'] from its connector)"
        )
    return str(told["hidden_states_path"])


class NativeGenerator(LLMGenerator):
    """vLLM's ``extract_hidden_states`` path with speculators' generator's interface.

    ``generate(token_ids)`` returns one record per sequence (``input_ids`` and
    ``hidden_states``, a list of ``[tokens, hidden]`` per layer in ``layer_ids``' order). The
    connector's files go to ``work`` and are removed once read. ``files`` is the handle on the
    worker's writes where the installed vLLM allows them (:func:`writes_in_worker`), else
    None: for the samples announced there, ``generate`` returns states without columns
    (``[tokens, 0]``) and the worker writes the files.
    """

    def __init__(
        self,
        model: str,
        layer_ids: list[int],
        max_model_len: int,
        tensor_parallel_size: int,
        work: Path,
        steps: dict[str, int] | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # module docstring: why
        own = writes_in_worker(tensor_parallel_size)
        options = engine_options(model, layer_ids, max_model_len, tensor_parallel_size, work, own)
        # steps: max_num_seqs, max_num_batched_tokens
        super().__init__(model, layer_ids, max_model_len, tensor_parallel_size,
                         options | (steps or {}), trust_remote_code)  # fmt: skip
        model_config = self.vllm_config.model_config
        state_bytes = getattr(model_config.dtype, "itemsize", 2)  # a torch.dtype once resolved
        per_token = model_config.get_hidden_size() * len(layer_ids) * state_bytes
        ahead = feed.ahead_tokens(self.vllm_config.scheduler_config)
        self.feed = EngineFeed(self.llm.llm_engine, ahead, self._writing)
        self.files = NativeFiles(per_token, self.feed) if own else None
        self.llm.collective_rpc("specshim_cpu_connector")

    def generate(self, token_ids: list[list[int]]) -> list[dict[str, Any]]:
        """One prefill per sequence; each one's token ids and its states. Announced samples go
        to the :class:`EngineFeed` and come back without columns at once (the worker writes
        their files, reported through :attr:`files`; the token ids are checked as they run);
        others run to the end here, their states read back from the connector's files."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        cut = self.cut(token_ids)
        if self.files is not None and (announced := self.files.take_for(cut)):
            self.feed.add(cut, announced)
            return [columnless(ids, len(self.layer_ids)) for ids in cut]
        self.feed.drain()  # LLM.generate runs the engine until idle: none of the feed's left
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in cut]
        outputs = self.llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
        return [self._read_back(o.request_id, _states_path(o)) for o in outputs]

    def _writing(self, expected: Expected, output: Any) -> None:
        """An announced request finished: vLLM's worker is writing its file."""
        assert self.files is not None  # only announced requests go to the feed
        self.files.writing(expected, _states_path(output))

    def _read_back(self, request_id: str, path: str) -> dict[str, Any]:
        """The record of one request from the file vLLM's connector wrote, which is removed."""
        import importlib

        import torch

        connector = importlib.import_module(CONNECTOR)
        try:
            saved = connector.load_hidden_states(path)  # waits until the file is whole
        except Exception as exc:  # noqa: BLE001 the connector's write failed; it logged why
            raise files.disk_full(Path(path).parent, exc) or RuntimeError(
                f"vLLM's hidden-states connector left no readable file for request "
                f"{request_id} ({console.first_line(exc)}): its log above says why"
            ) from None
        connector.cleanup_hidden_states(path)
        return {
            # the tokens vLLM says it ran: extract's guard compares them with the row
            "input_ids": saved["token_ids"].to(torch.long),
            "hidden_states": per_layer(saved["hidden_states"]),
        }


@dataclass
class NativeBackend(Started):
    """The native backend: :class:`NativeGenerator`, its connector's files under ``--out``
    (removed at the end)."""

    why: str
    name: str = "native"
    generator: Any = None

    @property
    def handoff(self) -> str:
        """Who writes the files: vLLM's worker, or this process from the connector's files."""
        started = self.generator is not None and self.generator.files is not None
        return NATIVE_IN_WORKER if started else NATIVE_READ_BACK

    def start(self, launch: Launch) -> Any:
        """vLLM's ``LLM`` on its ``extract_hidden_states`` path."""
        self.work = launch.out / ".specshim-native"
        self.generator = NativeGenerator(
            launch.model, launch.layers, launch.max_model_len, launch.tensor_parallel_size,
            self.work, launch.engine.options(), launch.trust_remote_code,
        )  # fmt: skip
        return self.generator

    def worker_files(self) -> NativeFiles | None:
        """The worker's writes, where the installed vLLM lets specshim's connector write."""
        return self.generator.files  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop vLLM's engine and remove the connector's files."""
        self.generator.shutdown()
        shutil.rmtree(self.work, ignore_errors=True)
