"""Use a KV-cache block size that the CPU attention backend accepts.

The generator hard-codes ``VLLM_BLOCK_SIZE = 16``. vLLM's CPU attention backend declares
``MultipleOf(32)``; up to 0.16 it only warned, from 0.2x the worker refuses to start:
``No common block size for 16 (CPU_ATTN: [MultipleOf(32)])``. The constant is raised to the
smallest size the backend accepts. GPU backends accept 16, so on a GPU nothing changes.

The sizes are read from the backend's source when they are a literal list, as in every release
so far: importing the backend module would be most of ``apply()``'s time (docs/benchmarks.md),
and vLLM imports it in its worker anyway. Any other shape falls back to importing it and asking.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from specshim.adapters.kit import module, module_source
from specshim.adapters.model import Adapter, LeftOut, Patch, Probe, facts, needed, not_needed
from specshim.adapters.targets import GENERATOR

CPU_BACKEND = "vllm.v1.attention.backends.cpu_attn"
DECLARATION = "get_supported_kernel_block_sizes"


@dataclass(frozen=True)
class MultipleOf:
    """vLLM's ``MultipleOf`` as read from source: any multiple of ``base`` is accepted."""

    base: int


def _literal_size(node: ast.expr) -> int | MultipleOf | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "MultipleOf"
        and len(node.args) == 1
        and not node.keywords
    ):
        base = _literal_size(node.args[0])
        return MultipleOf(base) if isinstance(base, int) else None
    return None


def declared_block_sizes(source_text: str) -> list[Any] | None:
    """``CPUAttentionBackend``'s block sizes if its method returns a literal list, else None."""
    for node in ast.walk(ast.parse(source_text)):
        if isinstance(node, ast.ClassDef) and node.name == "CPUAttentionBackend":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == DECLARATION:
                    body = [n for n in item.body if not isinstance(n, ast.Expr)]  # docstring
                    if len(body) != 1 or not isinstance(body[0], ast.Return):
                        return None
                    value = body[0].value
                    if not isinstance(value, ast.List):
                        return None
                    sizes = [_literal_size(element) for element in value.elts]
                    return None if None in sizes else sizes
    return None


def _cpu_kernel_block_sizes() -> list[Any] | None:
    if not module("vllm.platforms").current_platform.is_cpu():
        return None
    text = module_source(CPU_BACKEND)
    declared = declared_block_sizes(text) if text is not None else None
    if declared is not None:
        return declared
    backend = getattr(module(CPU_BACKEND), "CPUAttentionBackend", None)  # 0.11: TorchSDPA...
    if not hasattr(backend, DECLARATION):
        return None
    return list(getattr(backend, DECLARATION)())


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


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="RuntimeError", text="No common block size for 16")


ADAPTER = Adapter(
    name="attention_block_size",
    targets=(f"{GENERATOR}.VLLM_BLOCK_SIZE",),
    waits_for=(GENERATOR,),
    why="vLLM's CPU attention backend refuses the generator's block size 16",
    upstream="vLLM CPUAttentionBackend.get_supported_kernel_block_sizes -> [MultipleOf(32)]",
    remove_when="speculators' generator is no longer used, or extraction never runs on the CPU",
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
    ),
    facts=facts("returns", f"{CPU_BACKEND}:CPUAttentionBackend.{DECLARATION}"),
    probe=probe,
    patches=patches,
)
