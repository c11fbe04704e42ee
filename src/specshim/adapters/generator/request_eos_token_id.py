"""Build ``Request`` without ``eos_token_id``, which vLLM 0.17 removed.

The generator passes ``eos_token_id=tokenizer.eos_token_id``; from 0.17 that is a
``TypeError`` (the EOS now lives in ``SamplingParams``). Extraction samples one token and
throws it away, so the EOS plays no part; the argument is dropped, not moved.

This adapter owns the generator's ``Request(...)`` call, so its probe also refuses a
``Request`` that requires a parameter the generator does not pass: no answer is known for
that, and the generator would fail at its first batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from specshim.adapters.kit import calls_with_keyword, module, parameters, with_keywords
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
from specshim.adapters.targets import GENERATOR, generator_class


def required(func: Callable[..., Any]) -> list[str]:
    """The parameters of ``func`` a caller must pass (no default; not ``self``, ``*args``)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, p in parameters(func).items()
        if name != "self" and p.kind in named and p.default is inspect.Parameter.empty
    ]


def probe() -> Probe:
    request = vars(module(GENERATOR))["Request"]
    generate = generator_class().generate
    if unpassed := [
        n for n in required(request.__init__) if not calls_with_keyword(generate, "Request", n)
    ]:
        raise UnknownShape(
            "Request(...) requiring only parameters the generator passes",
            f"Request also requires {', '.join(unpassed)}",
        )
    if not calls_with_keyword(generate, "Request", "eos_token_id"):
        return not_needed("the generator does not pass eos_token_id")
    if "eos_token_id" in parameters(request.__init__):
        return not_needed("Request still accepts eos_token_id (vLLM before 0.17)")
    return needed("Request no longer accepts eos_token_id; the generator passes it")


def patches() -> list[Patch]:
    return [with_keywords(module(GENERATOR), "Request", drop=("eos_token_id",))]


#: What the generator raises without this adapter, wherever ``left_out`` lists.
WITHOUT = LeftOut("0.3.0", raises="TypeError", text="unexpected keyword argument 'eos_token_id'")


ADAPTER = Adapter(
    name="request_eos_token_id",
    targets=(f"{GENERATOR}.Request",),
    waits_for=(GENERATOR,),
    why="Request(eos_token_id=) was removed in vLLM 0.17",
    upstream="vLLM 0.17.0 vllm/v1/request.py (eos_token_id moved to SamplingParams)",
    remove_when="speculators' generator is no longer used (0.5+)",
    left_out=(
        WITHOUT,
        WITHOUT.also(speculators="0.4.0.1"),
    ),
    facts=facts("signature", "vllm.v1.request:Request.__init__"),
    probe=probe,
    patches=patches,
)
