"""Use a KV-cache block size that the CPU attention backend accepts.

The generator hard-codes ``VLLM_BLOCK_SIZE = 16``. vLLM's CPU attention backend declares
``MultipleOf(32)``; up to 0.16 it only warned, from 0.2x the worker refuses to start:
``No common block size for 16 (CPU_ATTN: [MultipleOf(32)])``. The constant is raised to the
smallest size the backend accepts. GPU backends accept 16, so on a GPU nothing changes.
"""

from __future__ import annotations

from typing import Any

from specshim.adapters.base import Adapter, Patch, Probe, module, needed, not_needed
from specshim.adapters.targets import GENERATOR

CPU_BACKEND = "vllm.v1.attention.backends.cpu_attn"


def _cpu_kernel_block_sizes() -> list[Any] | None:
    if not module("vllm.platforms").current_platform.is_cpu():
        return None
    backend = module(CPU_BACKEND).CPUAttentionBackend
    if not hasattr(backend, "get_supported_kernel_block_sizes"):
        return None
    return list(backend.get_supported_kernel_block_sizes())


def accepts(size: int, supported: list[Any]) -> bool:
    return any(size % s.base == 0 if hasattr(s, "base") else size == s for s in supported)


def smallest_accepted(size: int, supported: list[Any]) -> int:
    """The smallest multiple of ``size`` the backend accepts (block sizes stay powers of two)."""
    candidate = size
    while not accepts(candidate, supported):
        candidate *= 2
        if candidate > 4096:
            raise ValueError(f"no block size up to 4096 fits {supported}")
    return candidate


def probe() -> Probe:
    supported = _cpu_kernel_block_sizes()
    if supported is None:
        return not_needed("not on vLLM's CPU platform, or the backend declares no block sizes")
    size = vars(module(GENERATOR))["VLLM_BLOCK_SIZE"]
    if accepts(size, supported):
        return not_needed(f"the CPU attention backend accepts block size {size}")
    return needed(f"the CPU attention backend wants {supported}, the generator uses {size}")


def patches() -> list[Patch]:
    generator = module(GENERATOR)
    size = smallest_accepted(vars(generator)["VLLM_BLOCK_SIZE"], _cpu_kernel_block_sizes() or [])
    return [Patch(generator, "VLLM_BLOCK_SIZE", size)]


ADAPTER = Adapter(
    name="attention_block_size",
    targets=(f"{GENERATOR}.VLLM_BLOCK_SIZE",),
    waits_for=(GENERATOR,),
    why="vLLM's CPU attention backend refuses the generator's block size 16",
    upstream="vLLM CPUAttentionBackend.get_supported_kernel_block_sizes -> [MultipleOf(32)]",
    remove_when="speculators' generator is no longer used, or extraction never runs on the CPU",
    probe=probe,
    patches=patches,
)
