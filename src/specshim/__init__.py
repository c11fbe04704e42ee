"""specshim: run speculators' EAGLE-3 data generation and training on newer vLLM releases.

    import specshim
    report = specshim.apply()      # patch what the installed vLLM needs, nothing more
    ...                            # use speculators as usual
    specshim.revert()              # put every original back

Importing this package imports neither torch, vLLM, transformers nor speculators, and not even
the adapter registry: the applier loads on the first call, so `import specshim` costs about as
much as importing a small stdlib module.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself is not imported: it would double the cost of the import
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from specshim.applier import AdapterError, Report, State

__all__ = ["AdapterError", "Report", "State", "__version__", "apply", "revert", "status"]


def apply(
    *,
    only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    strict: bool | None = None,
) -> Report:
    """Apply every needed adapter, all-or-nothing (see :func:`specshim.applier.apply`)."""
    from specshim import applier

    return applier.apply(only=only, exclude=exclude, strict=strict)


def revert() -> Report:
    """Undo every applied patch, the commands' own (:mod:`specshim.patches`) first, then the
    adapters', restoring each original object by identity."""
    from specshim import applier, patches

    patches.revert()
    return applier.revert()


def status() -> Report:
    """The current state of every adapter, without changing anything."""
    from specshim import applier

    return applier.status()


def __getattr__(name: str) -> Any:
    if name in ("AdapterError", "Report", "State"):
        from specshim import applier

        return getattr(applier, name)
    if name == "__version__":  # the installed distribution's, so there is one source of truth
        from importlib import metadata

        try:
            return metadata.version("specshim")
        except metadata.PackageNotFoundError:  # run from a source tree on PYTHONPATH
            return "unknown (not installed)"
    raise AttributeError(f"module 'specshim' has no attribute {name!r}")
