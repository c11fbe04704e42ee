"""What the calling process and vLLM's worker tell each other about the files the worker writes.

- The caller **announces** each sample before it runs (:class:`Expected`: its file, its row's
  token ids and loss mask, where it came from): to the ``worker`` hand-off through an RPC, to
  the engine backend's capture and the native backend's connector in its request's
  ``SamplingParams`` (:func:`announcing`, read back by :func:`announcement`).
- For an announced sample the generator's interface returns states **without columns**
  (:func:`columnless`): the caller checks their token counts, the worker writes the states.
- The worker **reports** each file: a :data:`Report`, the file and the problem that kept it
  from being written (None: in place), through an RPC answered by tensor-parallel rank 0
  (:func:`rank0`), or, from the native connector, :data:`WRITTEN` or the problem in the
  request's lock file.

Light on imports (torch and vLLM only inside functions): a writer process imports it first.
"""

from __future__ import annotations

import collections
from array import array
from dataclasses import dataclass
from typing import Any

#: The ``SamplingParams.extra_args`` key of a sample's announcement. Not under
#: ``kv_transfer_params``: vLLM warns for each such request where no connector runs.
ANNOUNCED = "specshim_sample"
#: The ``SamplingParams.extra_args`` key of a request whose states the worker keeps for the
#: caller (not announced: ``extract --verify``'s).
KEPT = "specshim_kept"
#: What the native connector writes in a request's lock file once the sample's file is in
#: place (else the problem that kept it from being written).
WRITTEN = "written"
#: One file the worker finished: its path, and the problem that kept it from being written
#: (None: in place).
Report = tuple[str, str | None]


@dataclass(frozen=True)
class Expected:
    """One announced sample: where its file goes and what it is made of."""

    path: str
    input_ids: list[int]
    loss_mask: list[int]
    where: str  # "line 7 (data_6.pt)", for messages


def announcing(expected: Expected) -> Any:
    """One prefill whose request carries ``expected`` to vLLM's worker (:func:`announcement`).

    The ids and the mask travel as bytes: vLLM checks every integer of ``extra_args``,
    deep-copies each request's ``SamplingParams`` and serializes it twice on its way to the
    worker, a Python step per integer, on the caller's thread that also steps the engine
    (``benchmarks/announcement.py`` compares the two)."""
    from vllm import SamplingParams

    said = {
        "file": expected.path,
        "input_ids": array("q", expected.input_ids).tobytes(),
        "loss_mask": bytes(expected.loss_mask),  # 0 or 1 each (dataset checks it)
        "where": expected.where,
    }
    return SamplingParams(max_tokens=1, extra_args={ANNOUNCED: said})


def announcement(sampling_params: Any) -> Expected | None:
    """What :func:`announcing` put in a request's ``sampling_params``, or None."""
    said = (getattr(sampling_params, "extra_args", None) or {}).get(ANNOUNCED)
    if said is None:
        return None
    ids = array("q")
    ids.frombytes(said["input_ids"])
    return Expected(said["file"], ids.tolist(), list(said["loss_mask"]), said["where"])


class Announcements:
    """The samples the caller announced for the next ``generate``, in input order."""

    def __init__(self) -> None:
        self._queue: collections.deque[Expected] = collections.deque()

    def expect(self, batch: list[Expected]) -> None:
        """The next ``generate`` is for ``batch``, in input order."""
        self._queue.extend(batch)

    def take_for(self, prompts: list[list[int]]) -> list[Expected]:
        """The announcements for ``prompts``, the next ``generate``'s (none if nothing is
        announced); announcements that are not those prompts, in order, are an error (each
        file would get another prompt's states)."""
        if not self._queue:
            return []
        taken = list(self._queue)
        self._queue.clear()
        if [e.input_ids for e in taken] != prompts:
            raise RuntimeError(
                f"{len(taken)} samples announced are not the {len(prompts)} prompts generate "
                "was given, in order (each file would get another prompt's states)"
            )
        return taken


def columnless(token_ids: list[int], layers: int) -> dict[str, Any]:
    """An announced request's record: its token ids, and per layer ``[tokens, 0]`` states
    (vLLM's worker writes the states)."""
    import torch

    ids = torch.tensor(token_ids, dtype=torch.long)
    return {"input_ids": ids, "hidden_states": [torch.empty((len(ids), 0))] * layers}


def columnless_like(tensor: Any) -> Any:
    """An empty ``[rows, 0]`` host tensor of ``tensor``'s dtype: one layer of an announced
    sample's states as the generator receives it."""
    import torch

    return torch.empty((tensor.shape[0], 0), dtype=tensor.dtype)


def per_layer(states: Any) -> list[Any]:
    """The connector's ``[tokens, layers, hidden]`` states as one tensor per layer."""
    return [states[:, i] for i in range(states.shape[1])]


def rank0(replies: list[Any]) -> Any:
    """The reply of the one worker that captures and writes (tensor-parallel rank 0; the
    others answer None)."""
    return next((r for r in replies if r is not None), None)
