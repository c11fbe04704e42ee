"""The adapter-writing kit: read the installed code (signatures, source, imports) without
guessing, and build :class:`~specshim.adapters.model.Patch` records with wrapt.

Probes read source through its syntax tree (``ast``: :func:`syntax`, :func:`calls_with_keyword`,
:func:`imported_names`), so comments, strings and line breaks do not mislead them; patches wrap
with ``wrapt.FunctionWrapper`` and proxy with ``wrapt.ObjectProxy``, so the wrapped objects keep
their signatures and identity checks.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wrapt

from specshim.adapters.model import Patch


def module(name: str) -> Any:
    """The already-imported module ``name`` (adapters only run once it is imported)."""
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)


def parameters(func: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The parameters of ``func`` as the installed code declares them."""
    return dict(inspect.signature(func).parameters)


def source(func: Callable[..., Any]) -> str:
    """The source of ``func``, unwrapped to the function its decorators wrap."""
    return inspect.getsource(inspect.unwrap(func))


def syntax(func: Callable[..., Any]) -> ast.Module:
    """The syntax tree of ``func``'s source (a method's, dedented)."""
    return ast.parse(textwrap.dedent(source(func)))


def called_name(call: ast.Call) -> str | None:
    """The name a call calls: ``f`` for ``f(...)`` and for ``obj.attr.f(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def calls_with_keyword(func: Callable[..., Any], callee: str, keyword: str) -> bool:
    """Does ``func`` call ``callee(...)`` (or ``anything.callee(...)``) passing ``keyword=``?"""
    return any(
        isinstance(node, ast.Call)
        and called_name(node) == callee
        and any(k.arg == keyword for k in node.keywords)
        for node in ast.walk(syntax(func))
    )


def wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> Patch:
    """A patch that replaces ``owner.name`` with ``wrapt.FunctionWrapper(original, wrapper)``.

    ``wrapper(wrapped, instance, args, kwargs)`` follows wrapt's convention; the wrapped
    object keeps its signature and ``__wrapped__`` for introspection. The original is found
    as wrapt finds it (``wrapt.resolve_path``): on a class, the raw attribute from the
    ``vars()`` of the class along its MRO that defines it, so a ``staticmethod`` or
    ``classmethod`` is wrapped as the descriptor it is, not as the function ``getattr`` binds.
    """
    _parent, _name, original = wrapt.resolve_path(owner, name)
    return Patch(owner, name, wrapt.FunctionWrapper(original, wrapper))


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


#: The files and folders :func:`module_file` looked at: what a probe's outcome depends on
#: besides the modules imported (``specshim report`` keeps an outcome while they stay the same).
LOOKED_AT: set[Path] = set()


def module_file(name: str) -> Path | None:
    """The source file of module ``name``, found on disk without importing anything, or None.

    Only the top-level package is looked up: ``find_spec`` of a submodule would import its
    parent packages (vLLM's take seconds, and speculators' ``data_generation/__init__``
    imports the generator).
    """
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    found = next((c for c in (path.with_suffix(".py"), path / "__init__.py") if c.is_file()), None)
    LOOKED_AT.update({path.parent, found} if found else {path.parent})
    return found


def module_source(name: str) -> str | None:
    """The source of module ``name`` read from disk without importing it (:func:`module_file`),
    or None: for probes that must decide before the module is importable (its imports are what
    broke)."""
    path = module_file(name)
    return None if path is None else path.read_text(encoding="utf-8")


def imported_names(source_text: str, from_module: str) -> list[str]:
    """The names ``source_text`` imports with ``from from_module import ...``."""
    return [
        alias.name
        for node in ast.walk(ast.parse(source_text))
        if isinstance(node, ast.ImportFrom) and node.module == from_module
        for alias in node.names
    ]


class Proxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """``obj`` with some attributes replaced, for a module's view of another module.

    Placed in a consumer's namespace (``Patch(consumer, "torch", Proxy(torch, ...))``) it
    changes what that one module sees, and nothing else; everything else, ``isinstance``
    included, is ``obj``'s (``wrapt.ObjectProxy``).
    """

    def __init__(self, obj: Any, **overrides: Any) -> None:
        super().__init__(obj)
        self._self_overrides = overrides

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_self_") and name in self._self_overrides:
            return self._self_overrides[name]
        return super().__getattr__(name)

    def __repr__(self) -> str:
        return f"<specshim proxy of {self.__wrapped__!r} overriding {sorted(self._self_overrides)}>"
