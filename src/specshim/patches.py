"""The patches the commands make of vLLM and speculators outside the adapters, declared here.

The adapters (:mod:`specshim.adapters`) make speculators run on a newer vLLM; ``specshim
extract`` also changes a few things for its own run: the generator's scheduler limits, a
device name, and inside vLLM's worker the methods its capture and writers hook. Each is
declared in :data:`DECLARED` (what, where, why), so that ``specshim report`` lists them
(:func:`lines`), and each is made through the adapters' :class:`~specshim.adapters.model.Patch`
by :func:`scoped` or :func:`apply`, so that :func:`revert` (called by :func:`specshim.revert`)
puts every original back by identity, newest first. A patch applied to objects with a lifetime
(vLLM's worker) is undone by its owner when done (:func:`undo`): the list holds its objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from specshim.adapters.model import Patch


@dataclass(frozen=True)
class Declared:
    """One patch a command makes: its name, what it replaces, in which process, and why."""

    name: str
    target: str
    where: str
    why: str


CALLER = "the calling process"
WORKER = "vLLM's worker"

#: Every patch the commands make outside the adapters, by name.
DECLARED = {
    d.name: d
    for d in (
        Declared(
            "engine_steps",
            "speculators' vllm_hidden_states_generator.MAX_NUM_SEQS, MIN_MAX_BATCHED_TOKENS",
            CALLER,
            "extract --max-num-seqs/--max-num-batched-tokens, while the generator is made",
        ),
        Declared(
            "device_name_without_device",
            "speculators' config_generator.get_device_name",
            CALLER,
            "data_config.json says CPU ONLY where a CUDA torch has no device",
        ),
        Declared(
            "remote_code_setting",
            "the model loaders speculators' generator and trainer call",
            CALLER,
            "--trust-remote-code (or its absence) reaches every load, while a command runs",
        ),
        Declared(
            "worker_writes_files",
            "the worker's _get_captured_states",
            WORKER,
            "extract --handoff worker: the worker writes the files from the states it fetched",
        ),
        Declared(
            "engine_capture",
            "the model runner's execute_model, the worker's _store_captured_states",
            WORKER,
            "extract --backend engine: each step's states cut per request and written",
        ),
        Declared(
            "cpu_connector",
            "vLLM's example_hidden_states_connector.torch",
            WORKER,
            "extract --backend native on vLLM's CPU backend: a CPU stand-in for its CUDA calls",
        ),
    )
}

#: What is applied in this process: each declared name with its patches, oldest first.
_APPLIED: list[tuple[str, list[Patch]]] = []


def apply(name: str, patches: Sequence[Patch]) -> None:
    """Apply ``patches`` as the declared patch ``name`` until :func:`revert`."""
    if name not in DECLARED:
        raise ValueError(f"patch {name!r} is not declared in specshim.patches.DECLARED")
    done: list[Patch] = []
    try:
        for patch in patches:
            patch.apply()
            done.append(patch)
    except BaseException:
        for patch in reversed(done):
            patch.revert()
        raise
    _APPLIED.append((name, done))


@contextlib.contextmanager
def scoped(name: str, patches: Sequence[Patch]) -> Iterator[None]:
    """Inside, ``patches`` applied as the declared patch ``name``; reverted on the way out."""
    apply(name, patches)
    entry = _APPLIED[-1]
    try:
        yield
    finally:
        _undo(entry)


def undo(name: str) -> None:
    """Undo the newest patch ``name`` still applied (nothing where none is): for one applied
    to objects that must not outlive their use, as vLLM's worker and runner, which
    :data:`_APPLIED` would otherwise keep alive until :func:`revert`."""
    for entry in reversed(_APPLIED):
        if entry[0] == name:
            _undo(entry)
            return


def _undo(entry: tuple[str, list[Patch]]) -> None:
    """Revert ``entry``'s patches and forget it, unless :func:`revert` already did."""
    if any(e is entry for e in _APPLIED):
        _APPLIED[:] = [e for e in _APPLIED if e is not entry]
        for patch in reversed(entry[1]):
            patch.revert()


def applied() -> tuple[str, ...]:
    """The names of the patches applied in this process, oldest first."""
    return tuple(name for name, _ in _APPLIED)


def revert() -> tuple[str, ...]:
    """Undo every patch applied in this process, newest first; the names undone."""
    undone = []
    while _APPLIED:
        name, patches = _APPLIED.pop()
        for patch in reversed(patches):
            patch.revert()
        undone.append(name)
    return tuple(undone)


def lines() -> list[str]:
    """The declared patches as ``specshim report`` lists them, one line each."""
    width = max(len(name) for name in DECLARED)
    return [f"{d.name:<{width}}  {d.where}: {d.target} ({d.why})" for d in DECLARED.values()]
