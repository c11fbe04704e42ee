"""Simulated upstream changes, applied live to the installed vLLM in a test's own process.

No vLLM release made these changes; they stand for the next nightly that does. Each one edits
the real vLLM class in place (the real function still runs underneath), so every probe, every
recorded fact and speculators' generator meet the changed code exactly as they would meet a
new release. Run them before speculators' generator is imported: it binds the classes at import.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


def _resign(owner: type, name: str, parameters: list[inspect.Parameter]) -> Any:
    """Replace ``owner.name`` by a wrapper that declares ``parameters`` instead of the
    original's (``inspect.signature`` reads ``__signature__``); returns the original."""
    original = vars(owner)[name]

    @functools.wraps(original)
    def changed(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    changed.__signature__ = inspect.signature(original).replace(parameters=parameters)
    setattr(owner, name, changed)
    return original


def rename_rpc_reply_rank() -> None:
    """``MultiprocExecutor.collective_rpc(unique_reply_rank=)`` renamed ``reply_rank=``: the
    shape rpc_reply_shape reads to decide what the reply is, and knows no answer for."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    old = inspect.signature(MultiprocExecutor.collective_rpc).parameters.values()
    renamed = [p.replace(name="reply_rank") if p.name == "unique_reply_rank" else p for p in old]
    _resign(MultiprocExecutor, "collective_rpc", renamed)


def require_request_parameter() -> None:
    """``Request.__init__`` gains a new required keyword-only parameter ``tenant``."""
    from vllm.v1.request import Request

    old = list(inspect.signature(Request.__init__).parameters.values())
    tenant = inspect.Parameter("tenant", inspect.Parameter.KEYWORD_ONLY)
    _resign(Request, "__init__", [*old, tenant])
