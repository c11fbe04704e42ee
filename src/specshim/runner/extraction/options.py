"""``specshim extract``'s options and inputs, checked before vLLM starts: the numbers, the
model, the layer ids, ``--max-model-len``, ``--out`` and its free space; each refusal is one
:class:`ExtractionError` line."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files, remote_code
from specshim.runner.layer_ids import ascending


class ExtractionError(RuntimeError):
    """Bad input or options for ``specshim extract``: its message is the one line to show."""


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
        from speculators.data_generation import vllm_hidden_states_generator as module

        from specshim import patches
        from specshim.adapters.model import Patch

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
        with patches.scoped("engine_steps", [Patch(module, k, v) for k, v in given.items()]):
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


def text_config(config: Any) -> Any:
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
    text = text_config(config)
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


def truncated_rows(samples: list[dataset.Sample], limit: int, truncate: bool, data: Path) -> int:
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
