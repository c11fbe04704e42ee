"""Snapshots of the upstream facts the adapters rely on, and the diff between two of them.

A *fact* is one thing read from the installed vLLM: a signature, whether an attribute exists,
a dataclass's fields, a marker in a docstring or source. Each adapter declares the facts its
probe reads (``Adapter.facts``, :class:`specshim.adapters.model.Fact`); :data:`READERS`
gathers them, with the adapters that read each. ``specshim snapshot`` records them all as
JSON (``vllm-<version>.json``, shipped in ``specshim/data/contracts``); ``specshim triage``
snapshots the installed vLLM, diffs it against the nearest recorded snapshot and says which
facts moved, which adapters read them, and which moved facts no adapter covers: a new nightly
triaged in a minute.

The names speculators' legacy generator and worker import from vLLM are facts too (read from
their source with ``ast``, without importing speculators), so a module that moved (vLLM 0.33's
KV planner) shows up as an import that no longer resolves.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim import data as shipped_data
from specshim import versions
from specshim.adapters import registry
from specshim.adapters.model import Fact, facts
from specshim.adapters.targets import KV_UTILS

SCHEMA = 1

#: What specshim relies on beyond its adapters' facts: its vLLM plugin's entry-point group.
OWN_FACTS = facts("exists", "vllm.plugins:DEFAULT_PLUGINS_GROUP")


def _readers() -> dict[Fact, tuple[str, ...]]:
    """Every fact a snapshot records, with the adapters whose probes read it (each adapter
    declares its own: ``Adapter.facts``), in registry order."""
    found: dict[Fact, tuple[str, ...]] = {fact: () for fact in OWN_FACTS}
    for adapter in registry.ADAPTERS:
        for fact in adapter.facts:
            found[fact] = (*found.get(fact, ()), adapter.name)
    return found


#: Fact -> the adapters that read it.
READERS = _readers()
FACTS = tuple(READERS)


#: Modules speculators imports names from, and the adapters that keep those names resolving.
IMPORT_OWNERS: dict[str, tuple[str, ...]] = {KV_UTILS: ("kv_cache_planner_moved",)}


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _describe(value: Any) -> Any:
    """A stable rendering: objects without a useful repr are shown by their attributes."""
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    text = repr(value)
    if " at 0x" in text and hasattr(value, "__dict__"):
        inner = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(value).items()))
        return f"{type(value).__name__}({inner})"
    return text


def _read(fact: Fact) -> Any:
    """The fact's value, or ``None`` when its target does not exist."""
    try:
        obj = _resolve(fact.target)
    except (ImportError, AttributeError):
        return None
    readers: dict[str, Callable[[Any], Any]] = {
        "exists": lambda _: True,
        "signature": lambda o: re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(o))),
        "fields": lambda o: (
            sorted(f.name for f in dataclasses.fields(o))
            + sorted(k for k, v in getattr(o, "__annotations__", {}).items() if "InitVar" in str(v))
        ),
        "doc": lambda o: fact.marker in (o.__doc__ or ""),
        "source": lambda o: fact.marker in inspect.getsource(o),
        "returns": lambda o: _describe(o()),
    }
    return readers[fact.kind](obj)


def consumer_imports(speculators_root: Path | None = None) -> list[str]:
    """``module:name`` for every vLLM name speculators' generator and worker import."""
    if speculators_root is None:
        spec = importlib.util.find_spec("speculators")
        if spec is None or not spec.submodule_search_locations:
            return []
        speculators_root = Path(next(iter(spec.submodule_search_locations)))
    names = []
    for path in sorted((speculators_root / "data_generation").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
                names += [f"{node.module}:{alias.name}" for alias in node.names]
    return sorted(set(names))


@dataclass(frozen=True)
class Decisions:
    """What every probe decided with one speculators release, and whether its generator
    imported after ``specshim.apply()`` (``import_error`` is None when it did)."""

    speculators: str
    states: dict[str, str]
    import_error: str | None


def decisions(speculators_path: Path) -> Decisions:
    """Every adapter's state on this vLLM with the speculators found at ``speculators_path``.

    The real probes, run by ``specshim report`` in a fresh process (applying adapters and
    importing speculators' generator must not touch the caller), so a snapshot records what
    each probe decided on that installation, not what we expect it to.
    """
    path = os.pathsep.join(filter(None, [str(speculators_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("SPECSHIM_APPLY", None)
    command = [sys.executable, "-W", "ignore", "-m", "specshim.cli", "report", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"specshim report failed:\n{done.stderr[-3000:]}") from exc
    by_name = {item["name"]: item["version"] for item in data["installed"]}
    if by_name.get("speculators") is None:
        raise ValueError(f"{speculators_path}: expected a folder holding speculators/")
    states = {a["name"]: a["state"] for a in data["adapters"]}
    return Decisions(by_name["speculators"], states, data["import_error"])


def snapshot(speculators_paths: list[Path] | None = None) -> dict[str, Any]:
    """Every fact about the installed vLLM, whether the imports of every speculators in
    ``speculators_paths`` (else the installed one) resolve, and what every probe decided."""
    installed = versions.vllm()
    facts = {fact.key: _read(fact) for fact in FACTS}
    paths = speculators_paths or []
    roots: list[Path | None] = [path / "speculators" for path in paths] or [None]
    found = sorted({name for root in roots for name in consumer_imports(root)})
    imports = {name: _read(Fact("exists", name)) for name in found}
    decided = [decisions(path) for path in paths]
    return {
        "schema": SCHEMA,
        "vllm": installed.version,
        "distribution": installed.distribution,
        "transformers": versions.installed("transformers").version,
        "facts": facts,
        "speculators_imports": imports,
        "decisions": {d.speculators: d.states for d in decided},
        "generator_import": {d.speculators: d.import_error for d in decided},
    }


def shipped() -> Path:
    """The folder of snapshots shipped with specshim (``specshim/data/contracts``): what
    ``specshim triage`` compares with unless told otherwise, in a checkout and an installed
    wheel alike."""
    return shipped_data.path("contracts")


def save(path: Path, data: dict[str, Any]) -> None:
    """Write a snapshot as sorted, indented JSON (diffs stay readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load(path: Path) -> dict[str, Any]:
    """Read a snapshot; a file that is not one is a ``ValueError`` naming it."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: expected a specshim snapshot (JSON), {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: expected a specshim snapshot (schema {SCHEMA})")
    return data


@dataclass(frozen=True)
class Change:
    """One fact whose value differs between two snapshots, and who reads it."""

    key: str
    before: Any
    after: Any
    adapters: tuple[str, ...]

    def line(self) -> str:
        """``key: before -> after  [adapters]`` (``NO ADAPTER`` when none reads it)."""
        owners = ", ".join(self.adapters) or "NO ADAPTER"
        return f"{self.key}: {self.before!r} -> {self.after!r}  [{owners}]"


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """The facts and speculators imports that differ between two snapshots."""
    owners = {fact.key: readers for fact, readers in READERS.items()}
    for snapshot in (old, new):
        for name in snapshot.get("speculators_imports", {}):
            owners[name] = IMPORT_OWNERS.get(name.partition(":")[0], ())
    changes = []
    for section in ("facts", "speculators_imports"):
        before, after = old.get(section, {}), new.get(section, {})
        # an import only one side recorded means another speculators was scanned, not a move
        keys = set(before) | set(after) if section == "facts" else set(before) & set(after)
        for key in sorted(keys):
            if before.get(key) != after.get(key):
                label = key if section == "facts" else f"import:{key}"
                changes.append(Change(label, before.get(key), after.get(key), owners.get(key, ())))
    return changes


#: The states in which an adapter's probe ran on this installation and decided.
DECIDED = frozenset({"applied", "not needed", "not applicable"})


@dataclass(frozen=True)
class Unhandled:
    """A moved fact, and an adapter reading it whose probe did not decide on this
    installation (its state and why)."""

    change: Change
    adapter: str
    state: str
    reason: str

    def line(self) -> str:
        """The moved fact, with the adapter that did not decide and its state."""
        return f"{self.change.key}  [{self.adapter}: {self.state}: {self.reason}]"


def unhandled(changes: list[Change], states: dict[str, tuple[str, str]]) -> list[Unhandled]:
    """The moved facts no adapter was shown to handle on this installation.

    Naming an adapter is not enough: a fact that moved counts as covered only when every
    adapter reading it ran its probe on the installed code and decided (``DECIDED``). An
    unknown shape, a failure, a rollback, or a probe that never ran (disabled, waiting for a
    module) means nobody has looked at the new shape. ``states`` maps each adapter to its
    (state, reason), as ``specshim report`` gives them.
    """
    return [
        Unhandled(change, name, *states.get(name, ("not reported", "")))
        for change in changes
        for name in change.adapters
        if states.get(name, ("",))[0] not in DECIDED
    ]


def nearest(snapshots: list[Path], version: str) -> Path:
    """The recorded snapshot whose vLLM version is closest to ``version``."""
    target = versions.base(version)

    def distance(path: Path) -> tuple[int, int, int]:
        v = versions.base(load(path)["vllm"])
        return (
            abs(v.major - target.major),
            abs(v.minor - target.minor),
            abs(v.micro - target.micro),
        )

    if not snapshots:
        raise FileNotFoundError("no recorded snapshots (vllm-*.json) to compare with")
    return min(snapshots, key=distance)
