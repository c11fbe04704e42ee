"""Give speculators 0.3.0 the ``collective_rpc(unique_reply_rank=...)`` reply shape it indexes.

Up to vLLM 0.11.0 ``MultiprocExecutor.collective_rpc`` wrapped the one reply it collected in a
one-element list; from 0.11.1 it returns the reply itself. speculators 0.3.0 does ``reply[0]``.
The worker's own reply is a *list of per-layer tensors*, so on new vLLM ``[0]`` silently picks
layer 0's tensor, and the next line fails (``Boolean value of Tensor ... is ambiguous``) or,
worse, slices a single tensor as if it were the layers. The shape is decided by the executor's
contract (its docstring and signature), never by ``isinstance(reply, list)``: the reply itself
is a list. Only the worker methods the generator itself calls this way are re-wrapped; the
executor's own calls (``execute_model`` uses ``unique_reply_rank`` too) keep the new contract.
"""

from __future__ import annotations

import ast
import itertools
from typing import Any

from specshim.adapters.executor.extraction_executor import NAME as SEAM
from specshim.adapters.executor.extraction_executor import installed_executor_class
from specshim.adapters.kit import module, parameters, syntax, wrap
from specshim.adapters.model import (
    Adapter,
    LeftOut,
    Patch,
    Probe,
    UnknownShape,
    facts,
    needed,
    not_needed,
)
from specshim.adapters.targets import EXECUTOR, GENERATOR, generator_class


def _rpc_reply(statement: ast.stmt) -> tuple[str, str] | None:
    """``x = self.executor.collective_rpc("method", ..., unique_reply_rank=...)``: (x, method)."""
    if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)):
        return None
    call, targets = statement.value, statement.targets
    if not (len(targets) == 1 and isinstance(targets[0], ast.Name)):
        return None
    if ast.unparse(call.func) != "self.executor.collective_rpc" or not call.args:
        return None
    method = call.args[0]
    if not (isinstance(method, ast.Constant) and isinstance(method.value, str)):
        return None
    if not any(k.arg == "unique_reply_rank" for k in call.keywords):
        return None
    return targets[0].id, method.value


def _indexes_first(statement: ast.stmt, name: str) -> bool:
    """``y = name[0]``."""
    return (
        isinstance(statement, ast.Assign)
        and isinstance(statement.value, ast.Subscript)
        and isinstance(statement.value.value, ast.Name)
        and statement.value.value.id == name
        and isinstance(statement.value.slice, ast.Constant)
        and statement.value.slice.value == 0
    )


def indexed_methods() -> set[str]:
    """Worker methods whose unique reply the generator indexes with ``[0]``: a
    ``collective_rpc(..., unique_reply_rank=...)`` reply assigned, and the next statement
    taking its ``[0]``."""
    blocks = (
        block
        for node in ast.walk(syntax(generator_class().generate))
        for field in ("body", "orelse", "finalbody")
        if isinstance(block := getattr(node, field, None), list)
    )
    return {
        reply[1]
        for block in blocks
        for first, second in itertools.pairwise(block)
        if (reply := _rpc_reply(first)) and _indexes_first(second, reply[0])
    }


def executor_returns_bare_reply(executor: Any) -> bool:
    """The executor's own contract: does ``unique_reply_rank`` give the bare reply?"""
    rpc = executor.collective_rpc
    params = parameters(rpc)
    if "unique_reply_rank" not in params:
        raise UnknownShape(
            "MultiprocExecutor.collective_rpc(..., unique_reply_rank=)",
            f"collective_rpc{tuple(params)}",
        )
    doc = rpc.__doc__ or ""
    return "Returns single result if unique_reply_rank" in doc or "kv_output_aggregator" in params


def probe() -> Probe:
    if not indexed_methods():
        return not_needed("the generator uses the reply of _get_captured_states as it comes")
    executor = vars(module(GENERATOR))["MultiprocExecutor"]
    if not executor_returns_bare_reply(executor):
        return not_needed(
            "collective_rpc wraps the unique reply in a list, as the generator expects"
        )
    return needed("collective_rpc returns the bare reply; the generator indexes it with [0]")


def _rpc_for(methods: set[str]) -> Any:
    def _rpc(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
        reply = wrapped(*args, **kwargs)
        method = args[0] if args else kwargs.get("method")
        if method in methods and kwargs.get("unique_reply_rank") is not None:
            return [reply]
        return reply

    return _rpc


def patches() -> list[Patch]:
    return [wrap(installed_executor_class(), "collective_rpc", _rpc_for(indexed_methods()))]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="RuntimeError", text="Boolean value of Tensor with more than one")


ADAPTER = Adapter(
    name="rpc_reply_shape",
    targets=("SpecshimExtractionExecutor.collective_rpc",),
    waits_for=(GENERATOR,),
    requires=(SEAM,),
    why="collective_rpc(unique_reply_rank=) returns the bare reply since vLLM 0.11.1; "
    "speculators 0.3.0's [0] then turns four layers into one tensor",
    upstream="vLLM 0.11.1 MultiprocExecutor.collective_rpc (kv_output_aggregator, bare reply)",
    remove_when="speculators 0.3.0 is no longer supported (0.4 expects the bare reply)",
    left_out=(
        WITHOUT,
        WITHOUT.also(vllm="0.11.1.post2"),
        WITHOUT.also(runner="v2", accelerator="gpu"),
    ),
    facts=(
        *facts("signature", f"{EXECUTOR}.collective_rpc"),
        *facts(
            "doc",
            f"{EXECUTOR}.collective_rpc",
            marker="Returns single result if unique_reply_rank",
        ),
    ),
    probe=probe,
    patches=patches,
)
