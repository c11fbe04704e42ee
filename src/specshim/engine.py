"""The patch engine: probe each adapter, apply the needed ones all-or-nothing, revert exactly.

Adapters whose modules are not imported yet wait on a ``wrapt`` post-import hook and are
applied, as a group and again all-or-nothing, the moment their last module finishes
importing. ``apply`` records its selection in ``SPECSHIM_APPLY`` so that the
``vllm.general_plugins`` entry point re-applies the same selection in every process vLLM
spawns (workers do not inherit patches under ``spawn``).
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import sys
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType

from specshim.adapters import registry
from specshim.adapters.base import Adapter, Decision, Patch, UnknownShape

APPLY_ENV = "SPECSHIM_APPLY"
DISABLE_ENV = "SPECSHIM_DISABLE"
STRICT_ENV = "SPECSHIM_STRICT"


class State(enum.Enum):
    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    NOT_APPLICABLE = "not applicable"
    WAITING = "waiting for import"
    DISABLED = "disabled"
    UNKNOWN_SHAPE = "unknown shape"
    FAILED = "failed"
    NOT_SELECTED = "not selected"


class AdapterError(RuntimeError):
    """A needed adapter could not be applied; everything applied with it was rolled back."""


class ShapeWarning(UserWarning):
    """An adapter met an upstream shape it does not know (an error with SPECSHIM_STRICT=1)."""


@dataclass(frozen=True)
class AdapterStatus:
    name: str
    state: State
    reason: str
    why: str
    upstream: str
    remove_when: str
    targets: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state.value,
            "reason": self.reason,
            "why": self.why,
            "upstream": self.upstream,
            "remove_when": self.remove_when,
            "targets": list(self.targets),
        }


@dataclass(frozen=True)
class Report:
    """The outcome of ``apply`` (or the current state, from ``status``)."""

    adapters: tuple[AdapterStatus, ...]
    changed: bool = False

    def __getitem__(self, name: str) -> AdapterStatus:
        for status in self.adapters:
            if status.name == name:
                return status
        raise KeyError(f"no adapter named {name!r}; known: {[a.name for a in self.adapters]}")

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.adapters if a.state is State.APPLIED)

    @property
    def ok(self) -> bool:
        return not any(a.state is State.FAILED for a in self.adapters)

    def to_dict(self) -> dict[str, object]:
        return {"changed": self.changed, "adapters": [a.to_dict() for a in self.adapters]}


@dataclass
class _Engine:
    lock: threading.RLock = field(default_factory=threading.RLock)
    applied: dict[str, list[Patch]] = field(default_factory=dict)
    outcome: dict[str, tuple[State, str]] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)
    hooked_modules: set[str] = field(default_factory=set)
    strict: bool = False


_engine = _Engine()


def _env_list(name: str) -> set[str]:
    return {item.strip() for item in os.environ.get(name, "").split(",") if item.strip()}


def _check_names(names: Iterable[str], what: str) -> None:
    known = registry.names()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown adapter name(s) {unknown}; known adapters: {known}")


def _selection(only: Iterable[str] | None, exclude: Iterable[str] | None) -> list[Adapter]:
    """The adapters to consider, in registry order, with their ``requires`` pulled in."""
    if only is not None:
        _check_names(only, "only")
    if exclude is not None:
        _check_names(exclude, "exclude")
    chosen = set(registry.names() if only is None else only)
    pending = list(chosen)
    while pending:
        for dependency in registry.get(pending.pop()).requires:
            if dependency not in chosen:
                chosen.add(dependency)
                pending.append(dependency)
    chosen -= set(exclude or ())
    # An adapter whose requirement was excluded cannot work: leave it out too.
    while dropped := {n for n in chosen if not set(registry.get(n).requires) <= chosen}:
        chosen -= dropped
    return [a for a in registry.ADAPTERS if a.name in chosen]


def _installed(root: str) -> bool:
    return root in sys.modules or importlib.util.find_spec(root) is not None


def _imported(name: str, just_loaded: str | None = None) -> bool:
    """Is ``name`` imported and done executing? A module whose import is still running (a
    post-import hook of one of its own imports fires) is in ``sys.modules`` but not ready.
    ``just_loaded`` is the module whose post-import hook is running: executed, though
    importlib only clears its ``_initializing`` flag after the hooks."""
    loaded = sys.modules.get(name)
    if loaded is None:
        return False
    return name == just_loaded or not getattr(loaded.__spec__, "_initializing", False)


def _ready(adapter: Adapter, just_loaded: str | None = None) -> bool:
    return all(_imported(m, just_loaded) for m in adapter.waits_for)


def _apply_group(adapters: list[Adapter], strict: bool) -> None:
    """Probe and patch ``adapters`` (all importable now); on a failure undo the whole group."""
    done: list[str] = []
    try:
        for adapter in adapters:
            if any(_engine.outcome.get(d, (None,))[0] is State.FAILED for d in adapter.requires):
                raise AdapterError(f"adapter {adapter.name!r}: a required adapter failed")
            try:
                probe = adapter.probe()
            except UnknownShape as exc:
                message = f"adapter {adapter.name!r} {exc}"
                if strict:
                    raise AdapterError(message) from exc
                warnings.warn(message, ShapeWarning, stacklevel=3)
                _engine.outcome[adapter.name] = (State.UNKNOWN_SHAPE, str(exc))
                continue
            if probe.decision is not Decision.NEEDED:
                state = {
                    Decision.NOT_NEEDED: State.NOT_NEEDED,
                    Decision.NOT_APPLICABLE: State.NOT_APPLICABLE,
                }[probe.decision]
                _engine.outcome[adapter.name] = (state, probe.reason)
                continue
            patches: list[Patch] = []
            try:
                patches = adapter.patches()
                for patch in patches:
                    patch.apply()
            except Exception as exc:
                for patch in reversed(patches):
                    patch.revert()
                raise AdapterError(f"adapter {adapter.name!r} failed to apply: {exc}") from exc
            _engine.applied[adapter.name] = patches
            _engine.outcome[adapter.name] = (State.APPLIED, probe.reason)
            done.append(adapter.name)
    except AdapterError as exc:
        for name in reversed(done):
            for patch in reversed(_engine.applied.pop(name)):
                patch.revert()
        for adapter in adapters:
            _engine.outcome[adapter.name] = (State.FAILED, str(exc))
        raise


def _on_import(loaded: ModuleType) -> None:
    """Post-import hook: apply every waiting adapter whose modules are all imported now."""
    with _engine.lock:
        ready = [
            a for a in registry.ADAPTERS if a.name in _engine.waiting and _ready(a, loaded.__name__)
        ]
        if not ready:
            return
        _engine.waiting -= {a.name for a in ready}
        try:
            _apply_group(ready, _engine.strict)
        except AdapterError as exc:
            # Raising inside an import would break the user's import of vLLM or speculators;
            # the failure is kept in the report (status() shows it) and warned about here.
            warnings.warn(str(exc), ShapeWarning, stacklevel=2)


def _wait_for(adapter: Adapter) -> None:
    import wrapt

    _engine.waiting.add(adapter.name)
    for module_name in adapter.waits_for:
        if module_name not in sys.modules and module_name not in _engine.hooked_modules:
            wrapt.register_post_import_hook(_on_import, module_name)
            _engine.hooked_modules.add(module_name)


def apply(
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    strict: bool | None = None,
) -> Report:
    """Apply every needed adapter (or ``only`` those, minus ``exclude``), all-or-nothing.

    Safe to call again: what is applied stays applied and the report says nothing changed.
    Raises :class:`AdapterError` naming the adapter when a needed one cannot be applied.
    """
    only = None if only is None else list(only)
    exclude = sorted(set(exclude or ()) | _env_list(DISABLE_ENV))
    strict = os.environ.get(STRICT_ENV, "") == "1" if strict is None else strict
    with _engine.lock:
        _engine.strict = strict
        before = dict(_engine.outcome)
        selected = _selection(only, exclude)
        now: list[Adapter] = []
        for adapter in selected:
            if adapter.name in _engine.applied or adapter.name in _engine.waiting:
                continue
            missing = [r for r in adapter.distribution_roots if not _installed(r)]
            if missing:
                _engine.outcome[adapter.name] = (
                    State.NOT_APPLICABLE,
                    f"{', '.join(missing)} not installed",
                )
            elif _ready(adapter):
                now.append(adapter)
            else:
                _wait_for(adapter)
                waiting_on = [m for m in adapter.waits_for if not _imported(m)]
                _engine.outcome[adapter.name] = (
                    State.WAITING,
                    f"until {waiting_on[0]} is imported",
                )
        for name in sorted(set(registry.names()) - {a.name for a in selected}):
            reason = "SPECSHIM_DISABLE or exclude" if name in exclude else "not in only="
            if name not in _engine.applied:
                _engine.outcome[name] = (State.DISABLED, reason)
        _apply_group(now, strict)
        os.environ[APPLY_ENV] = json.dumps({"only": only, "exclude": exclude, "strict": strict})
        return _report(changed=_engine.outcome != before)


def apply_from_environment() -> Report | None:
    """Re-apply the selection a parent process recorded in ``SPECSHIM_APPLY``, if any."""
    recorded = os.environ.get(APPLY_ENV)
    if not recorded:
        return None
    try:
        selection = json.loads(recorded)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{APPLY_ENV} must hold the JSON written by specshim.apply(), got {recorded!r}"
        ) from exc
    return apply(only=selection["only"], exclude=selection["exclude"], strict=selection["strict"])


def revert() -> Report:
    """Undo every applied patch, newest first, restoring each original object by identity."""
    with _engine.lock:
        before = dict(_engine.outcome)
        for adapter in reversed(registry.ADAPTERS):
            for patch in reversed(_engine.applied.pop(adapter.name, [])):
                patch.revert()
        _engine.waiting.clear()
        _engine.outcome.clear()
        os.environ.pop(APPLY_ENV, None)
        return _report(changed=bool(before))


def status() -> Report:
    """The current state of every adapter, without changing anything."""
    with _engine.lock:
        return _report(changed=False)


def _report(changed: bool) -> Report:
    statuses = []
    for adapter in registry.ADAPTERS:
        state, reason = _engine.outcome.get(
            adapter.name, (State.NOT_SELECTED, "apply() not called")
        )
        statuses.append(
            AdapterStatus(
                name=adapter.name,
                state=state,
                reason=reason,
                why=adapter.why,
                upstream=adapter.upstream,
                remove_when=adapter.remove_when,
                targets=adapter.targets,
            )
        )
    return Report(adapters=tuple(statuses), changed=changed)
