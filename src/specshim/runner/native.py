"""``specshim extract --backend native``: vLLM's own hidden-state extraction behind the
interface ``extract`` uses from speculators' generator.

vLLM 0.18 and later extract hidden states themselves: the ``extract_hidden_states``
speculative method caches the chosen layers' states and its ``ExampleHiddenStatesConnector``
writes each finished request's states to a safetensors file (speculators >= 0.5 generates its
data this way). :class:`NativeGenerator` drives that path through vLLM's ``LLM`` and hands
``extract`` the same records speculators' generator returns (``input_ids``, one
``[tokens, hidden]`` tensor per layer), so resume, the guards, the writer and the files are
those of the generator backend.

Where the installed vLLM allows it (:func:`writes_in_worker`), the files are written by vLLM's
worker: ``extract`` announces each sample (:meth:`NativeFiles.expect`), the request carries its
file and loss mask to specshim's subclass of the connector
(:mod:`specshim.runner.native_connector`), whose writer threads write ``data_{i}.pt``
themselves, and ``generate`` returns states without columns, as the ``worker`` hand-off of the
generator backend does (:mod:`specshim.runner.worker_writer`); the announced requests go to
vLLM's engine through the engine backend's feed (:class:`specshim.runner.engine_feed.EngineFeed`),
so the engine does not run dry between ``extract``'s batches. Elsewhere, and for requests not
announced, ``LLM.generate`` runs them and the caller reads vLLM's safetensors files back, and
``extract`` writes them.

Layer ids: ``extract`` speaks speculators 0.3/0.4's numbering (id ``k``: the output of
decoder layer ``k``); vLLM's numbers the state entering layer ``k``, so it is asked for
``k + 1`` (:mod:`specshim.runner.layer_ids`).

On vLLM's CPU backend two things are needed, both scoped to this engine: its engine core runs
in its own process (in the caller's, the connector writes a request's file only at the next
engine step, which never comes once ``generate`` returned, and the caller waits on the file's
lock forever), and the connector's CUDA calls (a copy stream, events, pinned memory) get a CPU
stand-in in the worker (:meth:`CpuConnectorExtension.specshim_cpu_connector`), without which
the first write fails: ``pin_memory=True requires a CUDA or other accelerator backend``.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import engine_feed, files, remote_code
from specshim.runner.engine_feed import EngineFeed
from specshim.runner.in_worker.protocol import WRITTEN, Announcements, Expected, Report, columnless
from specshim.runner.layer_ids import vllm_ids

#: Where ``specshim extract``'s hidden states come from: speculators' generator (patched by
#: specshim), vLLM's own ``extract_hidden_states`` path (this module, vLLM >= 0.18),
#: speculators' capture inside vLLM's own engine loop (:mod:`specshim.runner.engine_loop`),
#: or ``auto``, one of them from the matrix and the installed vLLM
#: (:func:`specshim.report.choose_backend`). The samples are the same each way.
BACKENDS = ("auto", "generator", "native", "engine")

#: vLLM's writer of the native path, in the worker.
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
#: specshim's subclass of it, which writes announced samples as ``data_{i}.pt`` itself.
OWN_CONNECTOR = ("specshim.runner.native_connector", "SpecshimHiddenStatesConnector")
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


def per_layer(states: Any) -> list[Any]:
    """The connector's ``[tokens, layers, hidden]`` states as one tensor per layer."""
    return [states[:, i] for i in range(states.shape[1])]


def writes_in_worker(tensor_parallel_size: int = 1) -> bool:
    """Whether specshim's connector can write the files in vLLM's worker here: the installed
    vLLM's connector has what it overrides (:data:`OWN_CONNECTOR_NEEDS`, in vLLM 0.22.1 and
    0.25.1 to 0.32.0; beyond one rank, :data:`ONE_RANK_WRITES` too: 0.25.1 on), read from its
    source without importing it. Elsewhere the caller reads vLLM's own files back."""
    from specshim.adapters import kit  # wrapt: not at import, where the CLI builds its parser

    source = kit.module_source(CONNECTOR) or ""
    needs = OWN_CONNECTOR_NEEDS + ((ONE_RANK_WRITES,) if tensor_parallel_size > 1 else ())
    return all(needed in source for needed in needs)


class _CompletedEvent:
    """``torch.cuda.Event`` on the CPU: the copy it marks ran synchronously."""

    def record(self, stream: Any = None) -> None:
        """Nothing to record: the copy is already done."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""


class _CpuStream:
    """``torch.cuda.Stream`` on the CPU: one ordered stream of work, the caller's."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for."""


class _CpuCuda:
    """What the connector takes from ``torch.cuda``, for vLLM's CPU backend."""

    Event = _CompletedEvent
    Stream = _CpuStream

    @staticmethod
    def stream(stream: Any) -> contextlib.nullcontext[None]:
        """The caller's stream is the only one."""
        return contextlib.nullcontext()


def _cpu_torch() -> Any:
    """``torch`` for the connector module on the CPU: its own ``cuda`` stand-in, and
    ``empty_like`` without ``pin_memory``; everything else is torch itself."""
    import torch

    from specshim.adapters.kit import Proxy

    class CpuTorch(Proxy):
        cuda = _CpuCuda

        def empty_like(self, tensor: Any, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return torch.empty_like(tensor, **kwargs)

    return CpuTorch(torch)


class CpuConnectorExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``) by :class:`NativeGenerator`."""

    def specshim_cpu_connector(self) -> bool:
        """On vLLM's CPU backend, give the connector module the CPU stand-in; True if it did.

        The connector reads ``torch`` from its module's globals at each write, so replacing
        that one name covers every CUDA call it makes, and only in this engine's workers.
        """
        import importlib

        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        connector = importlib.import_module(CONNECTOR)
        connector.torch = _cpu_torch()  # type: ignore[attr-defined]
        return True


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


def llm_options(
    model: str, max_model_len: int, tensor_parallel_size: int, worker_extension_cls: str
) -> dict[str, Any]:
    """``LLM(...)``'s arguments shared by the backends that run vLLM's ``LLM``, vLLM set up as
    speculators' generator sets it up: eager (speculators' forward is Python), no prefix
    caching (every token's states must be computed), a memory fraction of 0.8; the worker
    mixes in ``worker_extension_cls``."""
    return {
        "model": model,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "gpu_memory_utilization": 0.8,
        "worker_extension_cls": worker_extension_cls,
    }


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
    extension = f"{__name__}.CpuConnectorExtension"
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
    :class:`specshim.runner.worker_writer.WorkerFilesClient`).

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


class LLMGenerator:
    """speculators' generator's interface over vLLM's ``LLM``, for the backends that run it.

    ``model_path``, ``layer_ids``, ``tensor_parallel_size`` and ``vllm_config`` are what
    speculators' ``DataGenerationConfig.from_generator`` reads; ``generate`` (each backend's)
    cuts every sequence to ``max_model_len - 1`` tokens (:meth:`cut`) as the generator does.
    """

    def __init__(
        self,
        model: str,
        layer_ids: list[int],
        max_model_len: int,
        tensor_parallel_size: int,
        options: dict[str, Any],
        trust_remote_code: bool = False,
    ) -> None:
        from vllm import LLM

        self.model_path = model
        self.layer_ids = layer_ids
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len
        self.llm = LLM(**options, **remote_code.vllm_options(trust_remote_code))
        self.vllm_config = self.llm.llm_engine.vllm_config

    def cut(self, token_ids: list[list[int]]) -> list[list[int]]:
        """Each sequence as the generator runs it: at most ``max_model_len - 1`` tokens."""
        return [ids[: self.max_model_len - 1] for ids in token_ids]

    def shutdown(self) -> None:
        """Stop vLLM's engine and its processes."""
        self.llm.llm_engine.engine_core.shutdown()


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
        ahead = engine_feed.ahead_tokens(self.vllm_config.scheduler_config)
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
