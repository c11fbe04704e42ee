"""Start the generator's vLLM workers with ``spawn`` on a GPU, never ``fork``.

vLLM's ``MultiprocExecutor`` forks its workers unless ``VLLM_WORKER_MULTIPROC_METHOD`` says
otherwise, and switches to ``spawn`` by itself only when ``torch.cuda.is_initialized()``. A
parent that merely *asked* CUDA something (``torch.cuda.is_available()``, a device count
without NVML: transformers, speculators and vLLM's own config code do) has started the CUDA
driver without that flag, and torch marks every later fork as poisoned: the worker dies with
``RuntimeError: Cannot re-initialize CUDA in forked subprocess``. vLLM's ``LLM`` never meets
this, since its engine core runs in a process of its own; speculators' generator builds the
executor in the caller's process. Here the executor the generator builds starts its workers
with ``spawn`` during its construction, whatever the process's setting (a fork cannot work
here), which is back in place afterwards; the ``vllm.general_plugins`` entry point re-applies
specshim in the spawned workers.
"""

from __future__ import annotations

import os
from typing import Any

from specshim.adapters.executor.extraction_executor import NAME as SEAM
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.kit import module, wrap
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"


def probe() -> Probe:
    if not module("vllm.platforms").current_platform.is_cuda_alike():
        return not_needed("vLLM runs on no CUDA device: a fork cannot inherit a CUDA driver")
    if os.environ.get(METHOD_ENV) == "spawn":
        return not_needed(f"{METHOD_ENV}=spawn is set")
    return needed("the generator's workers would fork after CUDA was queried in this process")


def _init(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    chosen = os.environ.get(METHOD_ENV)
    os.environ[METHOD_ENV] = "spawn"
    try:
        return wrapped(*args, **kwargs)
    finally:
        if chosen is None:
            os.environ.pop(METHOD_ENV, None)
        else:
            os.environ[METHOD_ENV] = chosen


def patches() -> list[Patch]:
    return [wrap(installed_executor_class(), "__init__", _init)]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut(
    "0.3.0",
    raises="Exception",
    text="WorkerProc initialization failed",
    runner="v2",
    accelerator="gpu",
    releases="<0.27",
)
#: CUDA vLLM 0.33 and 0.34 (with the torch 2.14 they pin) start the forked workers. vLLM's
#: switch to spawn is the same code in 0.26 and 0.34, so the change is torch's or in what the
#: caller asks CUDA first; not established, and 0.27-0.32 (torch 2.13) are not recorded. Spawn
#: stays: it works on every release.
HARMLESS_WITH_TORCH_2_14 = LeftOut(
    "0.3.0",
    harmless="the forked workers start on CUDA vLLM 0.33 and 0.34 with torch 2.14",
    runner="v2",
    accelerator="gpu",
    releases=">=0.33",
)


ADAPTER = Adapter(
    name="worker_start_method",
    targets=("SpecshimExtractionExecutor.__init__",),
    waits_for=(GENERATOR,),
    requires=(SEAM,),
    why="on a GPU the generator's executor forks workers after CUDA was queried, which fails",
    upstream="vllm/utils/system_utils.py _maybe_force_spawn (asks torch.cuda.is_initialized only)",
    remove_when="speculators' generator is no longer used (0.5+)",
    # The worker dies at start: the generator sees vLLM's summary, the worker's log the cause
    # (tests/gpu/test_cuda_extraction.py::test_forked_worker_cannot_use_cuda reads it).
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
        HARMLESS_WITH_TORCH_2_14,
        HARMLESS_WITH_TORCH_2_14.also(speculators="0.4.0.1"),
    ),
    probe=probe,
    patches=patches,
)
