"""The applier: probe each adapter, apply the needed ones all-or-nothing, revert exactly.

(Not vLLM's engine, which ``specshim extract --backend engine`` names: this module applies
specshim's adapters to vLLM and speculators.)

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
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import CodeType, ModuleType
from typing import Any

from specshim.adapters import registry
from specshim.adapters.model import Adapter, Decision, Patch, Probe, UnknownShape

APPLY_ENV = "SPECSHIM_APPLY"
DISABLE_ENV = "SPECSHIM_DISABLE"
STRICT_ENV = "SPECSHIM_STRICT"


class State(enum.Enum):
    """Where an adapter stands after ``apply``; its ``value`` is what ``report`` prints."""

    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    NOT_APPLICABLE = "not applicable"
    WAITING = "waiting for import"
    DISABLED = "disabled"
    UNKNOWN_SHAPE = "unknown shape"
    FAILED = "failed"
    #: not in force because another adapter (named in the reason) failed: undone with its
    #: group, never tried, or needing an adapter that is not in force
    ROLLED_BACK = "rolled back"
    NOT_SELECTED = "not selected"


#: States in which an adapter that was selected is not in force: speculators would run without it.
BROKEN = frozenset({State.UNKNOWN_SHAPE, State.FAILED, State.ROLLED_BACK})


class AdapterError(RuntimeError):
    """A needed adapter could not be applied; everything applied with it was rolled back.

    ``adapter`` is the name of the adapter that failed (or met the unknown shape).
    """

    def __init__(self, adapter: str, message: str) -> None:
        super().__init__(adapter, message)  # both in args: the error pickles across processes
        self.adapter = adapter
        self.message = message

    def __str__(self) -> str:
        return self.message


class ShapeWarning(UserWarning):
    """An adapter met an upstream shape it does not know (an error with SPECSHIM_STRICT=1)."""


class HookWarning(UserWarning):
    """A needed adapter could not be applied when the module it waited for was imported: the
    import went on without it and the rest of its group (``status()`` names them), since
    raising would break every import of vLLM or speculators. With SPECSHIM_STRICT=1 the
    importer gets the :class:`AdapterError` instead."""


@dataclass(frozen=True)
class AdapterStatus:
    """One adapter's state and reason, with its why, upstream, removal condition and targets."""

    name: str
    state: State
    reason: str
    why: str
    upstream: str
    remove_when: str
    targets: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """The status as ``report --json`` writes it."""
        return {
            "name": self.name,
            "state": self.state.value,
            "reason": self.reason,
            "why": self.why,
            "upstream": self.upstream,
            "remove_when": self.remove_when,
            "targets": list(self.targets),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterStatus:
        """The status :meth:`to_dict` wrote."""
        return cls(**{**data, "state": State(data["state"]), "targets": tuple(data["targets"])})


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
        """Names of the adapters in force, in registry order."""
        return tuple(a.name for a in self.adapters if a.state is State.APPLIED)

    @property
    def broken(self) -> tuple[AdapterStatus, ...]:
        """Adapters that were selected but are not in force (failed, unknown shape, rolled
        back): speculators runs without them, so the result cannot be trusted."""
        return tuple(a for a in self.adapters if a.state in BROKEN)

    @property
    def ok(self) -> bool:
        """True when no selected adapter is out of force (see :attr:`broken`)."""
        return not self.broken

    def to_dict(self) -> dict[str, object]:
        """The report as JSON-ready data."""
        return {"changed": self.changed, "adapters": [a.to_dict() for a in self.adapters]}


def _env_list(name: str) -> set[str]:
    return {item.strip() for item in os.environ.get(name, "").split(",") if item.strip()}


#: The spellings an on/off environment variable takes, in any case (empty or unset is off).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def _env_flag(name: str) -> bool:
    """The on/off environment variable ``name``; any other value is a ``ValueError`` naming
    it, since a misspelt "ture" silently meaning off would hide what the user asked for."""
    value = os.environ.get(name, "")
    if value.strip().lower() in TRUE_WORDS:
        return True
    if value.strip().lower() in FALSE_WORDS:
        return False
    raise ValueError(
        f"{name}={value!r}: expected {', '.join(TRUE_WORDS)} (on) or "
        f"{', '.join(w for w in FALSE_WORDS if w)}, empty (off), in any case"
    )


def _names(value: str | Iterable[str] | None, what: str) -> list[str] | None:
    """``value`` as a list of adapter names: a single string is one name, not its letters."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable):
        raise TypeError(f"{what}= takes an adapter name or names, got {value!r}")
    names = list(value)
    wrong = [name for name in names if not isinstance(name, str)]
    if wrong:
        raise TypeError(f"{what}= takes adapter names (strings), got {wrong[0]!r} in {names!r}")
    return names


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


class Applier:
    """A set of adapters and what applying them did: which are in force (with their patches),
    each one's outcome, which wait for a module to be imported, strict or not.

    :func:`apply`, :func:`revert` and :func:`status` (``specshim.apply()`` and friends) act on
    :data:`default`, the applier of every adapter in the registry. Another applier is made the
    same way over other adapters (the tests' fakes) and can stand in for it; its state is an
    object to query, as pluggy's ``PluginManager`` is, not a module's globals. ``installed``
    says whether a distribution's top-level package can be imported."""

    def __init__(
        self, adapters: Iterable[Adapter], installed: Callable[[str], bool] = _installed
    ) -> None:
        self.adapters = tuple(adapters)
        self.installed = installed
        self.lock = threading.RLock()
        self.applied: dict[str, list[Patch]] = {}
        self.outcome: dict[str, tuple[State, str]] = {}
        self.waiting: set[str] = set()
        self.hooked_modules: set[str] = set()
        self.strict = False

    def names(self) -> list[str]:
        """Every adapter's name, in the order they apply."""
        return [a.name for a in self.adapters]

    def get(self, name: str) -> Adapter:
        """The adapter called ``name``; ``KeyError`` naming the known ones otherwise."""
        return registry.get(name, among=self.adapters)

    def _check_names(self, names: Iterable[str], what: str) -> None:
        known = self.names()
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"{what}: unknown adapter name(s) {unknown}; known adapters: {known}")

    def _selection(
        self, only: Iterable[str] | None, exclude: Iterable[str] | None
    ) -> list[Adapter]:
        """The adapters to consider, in registry order, with their ``requires`` pulled in."""
        if only is not None:
            self._check_names(only, "only")
        if exclude is not None:
            self._check_names(exclude, "exclude")
        chosen = set(self.names() if only is None else only)
        pending = list(chosen)
        while pending:
            for dependency in self.get(pending.pop()).requires:
                if dependency not in chosen:
                    chosen.add(dependency)
                    pending.append(dependency)
        chosen -= set(exclude or ())
        # An adapter whose requirement was excluded cannot work: leave it out too.
        while dropped := {n for n in chosen if not set(self.get(n).requires) <= chosen}:
            chosen -= dropped
        return [a for a in self.adapters if a.name in chosen]

    def _culprit(self, adapter: Adapter, exc: UnknownShape) -> str:
        """The adapter whose probe met the unknown shape. A probe may run other adapters' probes
        (``extraction_executor`` asks its dependents), and the innermost probe frame in the
        traceback is the one whose expectation failed. Probes sharing one code object (made by
        one factory) cannot be told apart by their frames: then it is ``adapter`` itself."""
        owners: dict[CodeType, list[str]] = {}
        for candidate in self.adapters:
            code = getattr(candidate.probe, "__code__", None)
            if code is not None:
                owners.setdefault(code, []).append(candidate.name)
        frames = [f.f_code for f, _ in traceback.walk_tb(exc.__traceback__) if f.f_code in owners]
        innermost = owners[frames[-1]] if frames else []
        return innermost[0] if len(innermost) == 1 else adapter.name

    def _blocker(self, adapter: Adapter) -> str | None:
        """The first adapter ``adapter`` requires that is not in force, with why, or None."""
        for name in adapter.requires:
            state, reason = self.outcome.get(name, (None, ""))
            if state in BROKEN:
                return f"it needs {name!r}, which is {state.value}: {reason}"
        return None

    def _decide(self, adapter: Adapter, strict: bool) -> Probe | None:
        """Run ``adapter``'s probe. An unknown shape is recorded on the adapter and raised in
        strict mode (naming the adapter whose probe met it); otherwise warned about: None."""
        try:
            return adapter.probe()
        except UnknownShape as exc:
            culprit = self._culprit(adapter, exc)
            message = f"adapter {culprit!r} {exc}"
            if culprit != adapter.name:
                message += f" (asked by {adapter.name!r})"
            self.outcome[adapter.name] = (State.UNKNOWN_SHAPE, message)
            if strict:
                raise AdapterError(culprit, f"{message} (SPECSHIM_STRICT=1)") from exc
            warnings.warn(message, ShapeWarning, stacklevel=4)
            return None

    def _patch(self, adapter: Adapter, probe: Probe) -> None:
        """Apply ``adapter``'s patches; on a failure undo them and raise, naming the adapter."""
        patches: list[Patch] = []
        try:
            patches = adapter.patches()
            for patch in patches:
                patch.apply()
        except Exception as exc:
            for patch in reversed(patches):
                patch.revert()
            message = f"adapter {adapter.name!r} failed to apply: {exc}"
            self.outcome[adapter.name] = (State.FAILED, message)
            raise AdapterError(adapter.name, message) from exc
        self.applied[adapter.name] = patches
        self.outcome[adapter.name] = (State.APPLIED, probe.reason)

    def _roll_back(
        self, adapters: list[Adapter], tried: list[str], done: list[str], exc: AdapterError
    ) -> None:
        """Undo the group's applied adapters, newest first, and mark them and the untried ones
        rolled back, naming the cause; what the group's probes decided otherwise stays. The
        culprit, when the probe of another met its shape first, gets its own state."""
        for name in reversed(done):
            for patch in reversed(self.applied.pop(name)):
                patch.revert()
            self.outcome[name] = (State.ROLLED_BACK, f"undone: {exc}")
        shape = isinstance(exc.__cause__, UnknownShape)
        for adapter in adapters:
            if adapter.name == exc.adapter and adapter.name not in tried:
                state = State.UNKNOWN_SHAPE if shape else State.FAILED
                self.outcome[adapter.name] = (state, str(exc))
            elif adapter.name not in tried:
                self.outcome[adapter.name] = (State.ROLLED_BACK, f"not tried: {exc}")

    def _apply_group(self, adapters: list[Adapter], strict: bool) -> None:
        """Probe and patch ``adapters`` (all importable now); on a failure undo the whole group
        and raise :class:`AdapterError`. An unknown shape is that failure in strict mode;
        otherwise it is warned about and only the adapters it concerns stay out."""
        tried: list[str] = []
        done: list[str] = []
        try:
            for adapter in adapters:
                tried.append(adapter.name)
                probe = self._decide(adapter, strict)
                if probe is None:
                    continue
                if probe.decision is not Decision.NEEDED:
                    state = {
                        Decision.NOT_NEEDED: State.NOT_NEEDED,
                        Decision.NOT_APPLICABLE: State.NOT_APPLICABLE,
                    }[probe.decision]
                    self.outcome[adapter.name] = (state, probe.reason)
                elif blocker := self._blocker(adapter):
                    self.outcome[adapter.name] = (State.ROLLED_BACK, f"not applied: {blocker}")
                else:
                    self._patch(adapter, probe)
                    done.append(adapter.name)
        except AdapterError as exc:
            self._roll_back(adapters, tried, done, exc)
            raise

    def _rearm(self, loaded: ModuleType, adapters: list[Adapter]) -> None:
        """After a strict failure inside ``loaded``'s import: its adapters wait again and the hook
        is registered again, so importing it a second time meets the same check instead of
        running unpatched. The module leaves ``sys.modules`` first (importlib drops a module whose
        import raised anyway; wrapt would otherwise call the hook at once)."""
        import wrapt

        self.waiting |= {a.name for a in adapters}
        sys.modules.pop(loaded.__name__, None)
        wrapt.register_post_import_hook(self._on_import, loaded.__name__)

    def _on_import(self, loaded: ModuleType) -> None:
        """Post-import hook: apply every waiting adapter whose modules are all imported now.

        A failure fails the import in strict mode (the importer gets the :class:`AdapterError`);
        otherwise it is warned about and kept in the report (``self.status()`` shows it, ``ok`` is
        False), since raising would break every import of vLLM or speculators.
        """
        with self.lock:
            ready = [
                a for a in self.adapters if a.name in self.waiting and _ready(a, loaded.__name__)
            ]
            if not ready:
                return
            self.waiting -= {a.name for a in ready}
            try:
                self._apply_group(ready, self.strict)
            except AdapterError as exc:
                if self.strict:
                    self._rearm(loaded, ready)
                    raise
                warnings.warn(str(exc), HookWarning, stacklevel=2)

    def _wait_for(self, adapter: Adapter) -> None:
        import wrapt

        self.waiting.add(adapter.name)
        for module_name in adapter.waits_for:
            if module_name not in sys.modules and module_name not in self.hooked_modules:
                wrapt.register_post_import_hook(self._on_import, module_name)
                self.hooked_modules.add(module_name)

    def _undo(self) -> None:
        """Revert every applied patch, newest first, and forget every outcome and wait."""
        for adapter in reversed(self.adapters):
            for patch in reversed(self.applied.pop(adapter.name, [])):
                patch.revert()
        self.waiting.clear()
        self.outcome.clear()

    def apply(
        self,
        *,
        only: str | Iterable[str] | None = None,
        exclude: str | Iterable[str] | None = None,
        strict: bool | None = None,
    ) -> Report:
        """Apply every needed adapter (or ``only`` those, minus ``exclude``), all-or-nothing.

        ``only`` and ``exclude`` take adapter names; a single string is one name. Safe to call
        again: with the same selection what is applied stays applied and the report says nothing
        changed; with a selection that leaves out an applied (or waiting) adapter, everything is
        reverted first and the new selection applied (patches may stack on one attribute, so
        they come off newest first), so what is applied is always what ``SPECSHIM_APPLY`` records
        for the workers. Raises :class:`AdapterError` naming the adapter when a needed one cannot
        be applied, :class:`TypeError` or :class:`ValueError` for a bad name.
        """
        only = _names(only, "only")
        disabled = _env_list(DISABLE_ENV)
        self._check_names(disabled, DISABLE_ENV)
        exclude = sorted(set(_names(exclude, "exclude") or ()) | disabled)
        strict = _env_flag(STRICT_ENV) if strict is None else strict
        with self.lock:
            self.strict = strict
            before = dict(self.outcome)
            selected = self._selection(only, exclude)
            if (set(self.applied) | self.waiting) - {a.name for a in selected}:
                self._undo()
            now: list[Adapter] = []
            for adapter in selected:
                if adapter.name in self.applied or adapter.name in self.waiting:
                    continue
                missing = [r for r in adapter.distribution_roots if not self.installed(r)]
                if missing:
                    self.outcome[adapter.name] = (
                        State.NOT_APPLICABLE,
                        f"{', '.join(missing)} not installed",
                    )
                elif _ready(adapter):
                    now.append(adapter)
                else:
                    self._wait_for(adapter)
                    waiting_on = [m for m in adapter.waits_for if not _imported(m)]
                    self.outcome[adapter.name] = (
                        State.WAITING,
                        f"until {waiting_on[0]} is imported",
                    )
            for name in sorted(set(self.names()) - {a.name for a in selected}):
                reason = "SPECSHIM_DISABLE or exclude" if name in exclude else "not in only="
                if name not in self.applied:
                    self.outcome[name] = (State.DISABLED, reason)
            # recorded first: what is applied (or waiting) now is this selection even when the
            # group below fails, and the workers must not go on applying an earlier one
            os.environ[APPLY_ENV] = json.dumps({"only": only, "exclude": exclude, "strict": strict})
            self._apply_group(now, strict)
            return self._report(changed=self.outcome != before)

    def revert(self) -> Report:
        """Undo every applied patch, newest first, restoring each original object by identity."""
        with self.lock:
            before = dict(self.outcome)
            self._undo()
            os.environ.pop(APPLY_ENV, None)
            return self._report(changed=bool(before))

    def status(self) -> Report:
        """The current state of every adapter, without changing anything."""
        with self.lock:
            return self._report(changed=False)

    def _report(self, changed: bool) -> Report:
        statuses = []
        for adapter in self.adapters:
            state, reason = self.outcome.get(
                adapter.name, (State.NOT_SELECTED, "self.apply() not called")
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


#: The applier of every adapter in the registry: what ``specshim.apply()`` drives.
default = Applier(registry.ADAPTERS)


def apply(
    *,
    only: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    strict: bool | None = None,
) -> Report:
    """:meth:`Applier.apply` on :data:`default`."""
    return default.apply(only=only, exclude=exclude, strict=strict)


def revert() -> Report:
    """:meth:`Applier.revert` on :data:`default`."""
    return default.revert()


def status() -> Report:
    """:meth:`Applier.status` on :data:`default`."""
    return default.status()


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
