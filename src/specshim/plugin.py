"""The ``vllm.general_plugins`` entry point: re-apply specshim in every process vLLM starts.

Worker processes started with ``spawn`` inherit no patches. vLLM calls this function in the
engine core and in every worker (and may call it more than once per process); it applies
exactly the selection the parent's ``specshim.apply()`` recorded in ``SPECSHIM_APPLY``, and
does nothing in processes where specshim was never applied.
"""

from __future__ import annotations


def register() -> None:
    """vLLM's ``general_plugins`` entry point: re-apply the parent's selection in this process."""
    from specshim.applier import apply_from_environment

    apply_from_environment()
