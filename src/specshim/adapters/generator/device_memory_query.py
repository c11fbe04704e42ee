"""Ask for free memory on the device vLLM actually uses, not on CUDA.

The generator sizes the KV cache from free device memory: 0.3.0 calls
``torch.cuda.mem_get_info()``, 0.4 ``speculators.utils.util.mem_get_info()``, which returns
``(0, 0)`` when torch sees no accelerator. On vLLM's CPU platform the first raises and the
second yields a zero-block KV cache (``AssertionError`` in ``Scheduler``). On the CPU the
memory vLLM may use for the KV cache is ``VLLM_CPU_KVCACHE_SPACE``; that is what is reported.
"""

from __future__ import annotations

import os

from specshim.adapters.kit import Proxy, module, source
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, needed, not_needed
from specshim.adapters.targets import GENERATOR, generator_class

GiB = 1 << 30
#: vLLM's own default when VLLM_CPU_KVCACHE_SPACE is unset or 0 (vllm/platforms/cpu.py).
DEFAULT_CPU_KVCACHE_GIB = 4


def _on_cpu_platform() -> bool:
    return bool(module("vllm.platforms").current_platform.is_cpu())


def cpu_kv_cache_bytes() -> int:
    gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 0) or DEFAULT_CPU_KVCACHE_GIB
    return int(gib * GiB)


def free_memory() -> tuple[int, int]:
    """``(free, total)`` bytes for the KV cache on vLLM's current platform."""
    if _on_cpu_platform():
        import psutil

        return cpu_kv_cache_bytes(), psutil.virtual_memory().total
    import torch

    return torch.cuda.mem_get_info()


def probe() -> Probe:
    if not _on_cpu_platform():
        return not_needed("vLLM runs on a GPU; CUDA's free memory is the right answer")
    if "mem_get_info" in vars(module(GENERATOR)):
        return needed("speculators' mem_get_info() returns (0, 0) without a torch accelerator")
    if "torch.cuda.mem_get_info" in source(generator_class().__init__):
        return needed("the generator calls torch.cuda.mem_get_info() on vLLM's CPU platform")
    return not_needed("the generator does not query device memory")


def patches() -> list[Patch]:
    generator = module(GENERATOR)
    if "mem_get_info" in vars(generator):
        return [Patch(generator, "mem_get_info", free_memory)]
    torch = vars(generator)["torch"]
    # Only the generator's view of torch changes: torch.cuda.mem_get_info asks vLLM's platform.
    return [
        Patch(generator, "torch", Proxy(torch, cuda=Proxy(torch.cuda, mem_get_info=free_memory)))
    ]


ADAPTER = Adapter(
    name="device_memory_query",
    targets=(f"{GENERATOR}.mem_get_info", f"{GENERATOR}.torch"),
    waits_for=(GENERATOR,),
    why="the generator asks CUDA for free memory, which is wrong or zero on vLLM's CPU platform",
    upstream="speculators 0.4.0 speculators/utils/util.py mem_get_info (CUDA-only)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        LeftOut("0.3.0", raises="AssertionError", text="Torch not compiled with CUDA enabled"),
        LeftOut("0.4.0.1", raises="AssertionError", text="num_gpu_blocks > 0"),
    ),
    probe=probe,
    patches=patches,
)
