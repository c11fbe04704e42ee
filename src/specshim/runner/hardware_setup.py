"""Settings each accelerator needs before vLLM starts, chosen once and printed."""

from __future__ import annotations

import os
import sys

from specshim import hardware
from specshim.testbed import cpu


def prepare_for_vllm(tensor_parallel_size: int = 1) -> hardware.Accelerator:
    accelerator = hardware.detect()
    if accelerator.kind == "cpu":
        chosen = cpu.configure()
        if binding := cpu.bind_threads(tensor_parallel_size):
            chosen["VLLM_CPU_OMP_THREADS_BIND"] = binding
    else:
        chosen = {}
        if "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ:
            # CUDA cannot be re-initialised in a forked child.
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = chosen["VLLM_WORKER_MULTIPROC_METHOD"] = (
                "spawn"
            )
    settings = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "none"
    print(f"[specshim] {accelerator.describe()}; settings chosen: {settings}", file=sys.stderr)
    return accelerator
