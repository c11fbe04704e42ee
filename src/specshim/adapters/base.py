"""What an adapter is: one upstream change, a probe that reads the installed code, and patches.

An adapter never patches anything itself. Its ``patches()`` returns :class:`Patch` records and
the engine applies and reverts them, so every adapter gets the same all-or-nothing and
identity-restoring behaviour for free.
"""

from __future__ import annotations

import ast
import enum
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MISSING = object()


class Decision(enum.Enum):
    """What a probe concluded about the installed code."""

    NEEDED = "needed"
    NOT_NEEDED = "not needed"
    NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Probe:
    decision: Decision
    reason: str


def needed(reason: str) -> Probe:
    return Probe(Decision.NEEDED, reason)


def not_needed(reason: str) -> Probe:
    return Probe(Decision.NOT_NEEDED, reason)


def not_applicable(reason: str) -> Probe:
    return Probe(Decision.NOT_APPLICABLE, reason)


class UnknownShape(Exception):
    """The installed code has a shape no adapter was written for.

    Raised by probes and patches; the engine adds the adapter's name, so the message
    reads "adapter X expected ... but found ...".
    """

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"expected {expected}, found {found}")
        self.expected = expected
        self.found = found


@dataclass
class Patch:
    """Set ``owner.name = new`` and remember exactly what was there, to put it back.

    ``revert`` restores the very object that was in ``owner.__dict__`` (identity, not
    equality), or deletes the attribute when the owner only inherited it. An owner that is a
    dict (``sys.modules``) gets the same treatment for its item ``name``.
    """

    owner: Any
    name: str
    new: Any
    _original: Any = field(default=_MISSING, init=False, repr=False)
    _applied: bool = field(default=False, init=False, repr=False)

    def _namespace(self) -> dict[str, Any]:
        return self.owner if isinstance(self.owner, dict) else vars(self.owner)

    def _set(self, value: Any) -> None:
        if isinstance(self.owner, dict):
            self.owner[self.name] = value
        else:
            setattr(self.owner, self.name, value)

    def apply(self) -> None:
        self._original = self._namespace().get(self.name, _MISSING)
        self._set(self.new)
        self._applied = True

    def revert(self) -> None:
        if not self._applied:
            return
        if self._original is not _MISSING:
            self._set(self._original)
        elif isinstance(self.owner, dict):
            del self.owner[self.name]
        else:
            delattr(self.owner, self.name)
        self._applied = False

    @property
    def original(self) -> Any:
        """What the attribute resolved to before the patch (inherited values included)."""
        if self._original is not _MISSING:
            return self._original
        return getattr(self.owner, self.name)


@dataclass(frozen=True)
class Adapter:
    """One upstream change and how to bridge it.

    ``waits_for`` lists modules that must be imported before the probe may run; the engine
    defers the adapter with a post-import hook until they are. ``requires`` names adapters
    that must be applied first (the engine adds them to the selection).

    Each adapter says how this project shows it is needed: ``evidence``, the pytest node ids
    (or a test function, for all its cases) that fail or get wrong data without it, or, where
    no test here can, ``unobservable``: why, and what would show it. Exactly one of the two
    (tests/test_patch_notes.py checks it, and that every id is a collected test); the patch
    notes quote them.
    """

    name: str
    targets: tuple[str, ...]
    waits_for: tuple[str, ...]
    why: str
    upstream: str
    remove_when: str
    probe: Callable[[], Probe]
    patches: Callable[[], list[Patch]]
    requires: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    unobservable: str = ""

    @property
    def distribution_roots(self) -> tuple[str, ...]:
        """Top-level packages this adapter needs installed, e.g. ``("speculators",)``."""
        return tuple(dict.fromkeys(m.split(".")[0] for m in self.waits_for))


def module(name: str) -> Any:
    """The already-imported module ``name`` (adapters only run once it is imported)."""
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)


def parameters(func: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The parameters of ``func`` as the installed code declares them."""
    return dict(inspect.signature(func).parameters)


def source(func: Callable[..., Any]) -> str:
    return inspect.getsource(inspect.unwrap(func))


def calls_with_keyword(func: Callable[..., Any], callee: str, keyword: str) -> bool:
    """Does the source of ``func`` call ``callee(...)`` passing ``keyword=``?"""
    pattern = rf"{re.escape(callee)}\((?:[^()]|\([^()]*\))*?\b{re.escape(keyword)}\s*="
    return re.search(pattern, source(func), re.DOTALL) is not None


def wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> Patch:
    """A patch that replaces ``owner.name`` with ``wrapt.FunctionWrapper(original, wrapper)``.

    ``wrapper(wrapped, instance, args, kwargs)`` follows wrapt's convention; the wrapped
    object keeps its signature and ``__wrapped__`` for introspection.
    """
    import wrapt

    return Patch(owner, name, wrapt.FunctionWrapper(getattr(owner, name), wrapper))


def with_keywords(
    owner: Any,
    name: str,
    *,
    force: dict[str, Any] | None = None,
    default: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
) -> Patch:
    """A patch that makes every call of ``owner.name`` drop, default or force keywords.

    Most constructor changes upstream are a keyword that appeared, became required or went
    away; this one wrapper bridges all of them.
    """
    forced, defaults = dict(force or {}), dict(default or {})

    def call(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
        for keyword in drop:
            kwargs.pop(keyword, None)
        for keyword, value in defaults.items():
            kwargs.setdefault(keyword, value)
        kwargs.update(forced)
        return wrapped(*args, **kwargs)

    return wrap(owner, name, call)


def module_source(name: str) -> str | None:
    """The source of module ``name`` read from disk without importing it, or None.

    For probes that must decide before the module is importable (its imports are what broke).
    Only the top-level package is looked up: ``find_spec`` of a submodule would import its
    parent packages, and speculators' ``data_generation/__init__`` imports the generator.
    """
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    return None


def imported_names(source_text: str, from_module: str) -> list[str]:
    """The names ``source_text`` imports with ``from from_module import ...``."""
    return [
        alias.name
        for node in ast.walk(ast.parse(source_text))
        if isinstance(node, ast.ImportFrom) and node.module == from_module
        for alias in node.names
    ]


def generator_class() -> Any:
    from specshim.adapters.targets import GENERATOR

    return module(GENERATOR).VllmHiddenStatesGenerator


class Proxy:
    """``obj`` with some attributes replaced, for a module's view of another module.

    Placed in a consumer's namespace (``Patch(consumer, "torch", Proxy(torch, ...))``) it
    changes what that one module sees, and nothing else.
    """

    def __init__(self, obj: Any, **overrides: Any) -> None:
        self._obj = obj
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._obj, name)

    def __repr__(self) -> str:
        return f"<specshim proxy of {self._obj!r} overriding {sorted(self._overrides)}>"
