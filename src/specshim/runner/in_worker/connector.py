"""specshim's hidden-states connector: vLLM's own, writing speculators 0.3/0.4's files itself.

vLLM's ``ExampleHiddenStatesConnector`` copies each finished request's states from the cache
to the host and its writer threads save them as a safetensors file (``hidden_states``
``[tokens, layers, hidden]``, ``token_ids``), which the caller would have to read back and
write again as speculators' ``data_{i}.pt``.

This subclass, loaded by vLLM through ``kv_connector_module_path`` (so only in vLLM's
processes), changes one step: for a request the caller announced in its sampling
parameters' ``extra_args`` (:mod:`specshim.runner.in_worker.protocol`: the sample's file, its
row's token ids and loss mask, where it came from), the writer thread checks the token ids
vLLM ran against the row's and the states, and writes that file
atomically, in the format and with the tensors the caller's path writes
(:func:`specshim.runner.dataset.record`); then it says in the request's lock file what it did
(:data:`specshim.runner.in_worker.protocol.WRITTEN`, or the problem in one line) and releases the
lock, on which the caller waits. Requests not announced (``extract --verify``'s) get vLLM's
safetensors file as before. speculators 0.9's FP8 connector overrides the same step
(``_write_tensors``).

What it relies on, read from vLLM 0.22.1 and 0.25.1 to 0.32.0
(:func:`specshim.runner.extraction.backends.native. writes_in_worker` checks the installed source
before choosing it): ``_write_tensors(tensors, event, filename, lock_fd)`` called through the
instance on a writer thread, the request's file name in ``_request_filenames`` once
``build_connector_meta`` has seen it, and the lock file held until the write is done.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

from specshim import console
from specshim.runner import dataset, files
from specshim.runner.in_worker.checks import misaligned, sample_problem
from specshim.runner.in_worker.protocol import WRITTEN, Expected, announcement, per_layer
from specshim.runner.layer_ids import generator_ids

logger = logging.getLogger(__name__)


class SpecshimHiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's connector; announced requests are written as speculators' ``data_{i}.pt``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: worker side: the connector's file name of each announced request -> announcement
        self._specshim_files: dict[str, Expected] = {}
        speculative = self._vllm_config.speculative_config
        assert speculative is not None  # vLLM's __init__ refuses the connector without it
        config = speculative.draft_model_config.hf_config
        self._specshim_layers = generator_ids(config.eagle_aux_hidden_state_layer_ids)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """vLLM's metadata for this step, with the announcements of its new requests, keyed
        by the file name the connector gave each (the worker sees only that name)."""
        meta = super().build_connector_meta(scheduler_output)
        meta.specshim_files = {  # type: ignore[attr-defined]  # pickled with the rest
            self._request_filenames[new.req_id]: said
            for new in scheduler_output.scheduled_new_reqs
            if (said := announcement(new.sampling_params)) is not None
        }
        return meta

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """Keep the step's announcements on the rank that writes (tensor parallel rank 0)."""
        super().bind_connector_metadata(connector_metadata)
        if get_tensor_model_parallel_rank() == 0:
            self._specshim_files.update(getattr(connector_metadata, "specshim_files", {}))

    def _write_tensors(  # type: ignore[override]  # vLLM calls it through the instance
        self, tensors: dict[str, Any], event: Any, filename: str, lock_fd: int | None
    ) -> None:
        """On a writer thread: an announced request's file, else vLLM's own write."""
        said = self._specshim_files.pop(filename, None)
        if said is not None and lock_fd is None:  # vLLM's lock turned off: nobody would know
            logger.error("%s needs the connector's lock file; not written", said.where)
        if said is None or lock_fd is None:
            super()._write_tensors(tensors, event, filename, lock_fd)
            return
        outcome = ""
        try:
            event.synchronize()
            outcome = self._write_sample(tensors, said)
        except files.DiskFull as exc:  # its line names the folder and what to do
            outcome = str(exc)
            raise
        except Exception as exc:  # told to the caller, which stops the run with it
            failed = console.first_line(exc)
            outcome = f"{said.where}: writing extracted samples failed: {failed}"
            raise
        finally:
            with contextlib.suppress(OSError):  # a full disk: the caller finds it missing, and why
                os.write(lock_fd, outcome.encode())
            os.close(lock_fd)  # releases the lock the caller waits on

    def _write_sample(self, tensors: dict[str, Any], said: Expected) -> str:
        """Check one sample's states and write its file; :data:`WRITTEN` or the
        problem that kept it from being written."""
        token_ids = tensors["token_ids"]
        states = per_layer(tensors["hidden_states"])
        if len(said.loss_mask) != len(token_ids):
            return (
                f"{said.where}: vLLM ran {len(token_ids)} tokens, the loss mask has "
                f"{len(said.loss_mask)}; refusing to write them"
            )
        if problem := misaligned(said.where, token_ids.tolist(), said.input_ids):
            return problem
        if problem := sample_problem(said.where, self._specshim_layers, states, len(token_ids)):
            return problem
        files.save_torch(Path(said.path), dataset.record(token_ids, states, said.loss_mask))
        return WRITTEN
