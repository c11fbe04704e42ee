"""``specshim train``: EAGLE-3 draft training through the installed speculators' own trainer.

speculators 0.3/0.4 ship their training loop (``speculators.train.trainer.Trainer``), dataset,
packing sampler and checkpointer in the wheel, but the script that wires them together lives
only in their repository. This module is that wiring, for both releases:

- 0.4.x builds the draft with ``Eagle3DraftModel.from_training_args``;
- 0.3.0 has no ``from_training_args``: the typed ``Eagle3SpeculatorConfig`` is built here, with
  the draft layer config copied from the verifier's, and ``Eagle3DraftModel(config, t2d, d2t)``.

Checkpoints are speculators' own, one per epoch (model, optimizer, scheduler); ``resume``
continues from the last one. The loss of every step is collected from speculators' metric
logger and written to ``train_log.json`` after every checkpoint, so the caller can check that
it goes down.

One ``--out`` holds one run: a folder that is not empty is refused unless the run in it is
resumed (with the settings recorded in ``train_settings.json``, which a resume must match) or
``overwrite`` removes it first. A resume appends to the earlier log, never replaces it, and a
resume of a run already trained to the requested epochs changes nothing.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import random
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import specshim
from specshim import console
from specshim.runner import distributed, extracted, files, out_lock, progress, remote_code, stored

#: What speculators' training reads (speculators/train/data.py, standardize_data_v1).
AUX_LAYERS = 3
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")
LOG_FILE = "train_log.json"
SETTINGS_FILE = "train_settings.json"
#: Where ``overwrite`` moves the earlier run before deleting it (a kill midway leaves only it).
TRASH = ".overwritten"
#: What a run writes into ``--out``, with what ``specshim eval`` adds there (``served*``: the
#: exports of its checkpoints; ``eval-served*``, or ``eval`` before: their results): all of it
#: is the run's, to overwrite.
RUN_FILES = ("checkpoints", LOG_FILE, SETTINGS_FILE, TRASH, "eval")


@dataclass
class TrainResult:
    """The training log of one ``--out``: one loss (and its epoch) a step, every run appended.

    ``step_seconds`` holds the time between consecutive steps within each run (timing only).
    ``already_trained`` is set, and nothing else, when a resume found every requested epoch
    done.
    """

    losses: list[float] = field(default_factory=list)
    step_epochs: list[int] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0
    checkpoint: Path | None = None
    tokens_per_step: int = 0
    already_trained: int = 0

    @property
    def steps(self) -> int:
        """How many steps the log holds, of every run (one loss each)."""
        return len(self.losses)

    @property
    def median_step_seconds(self) -> float:
        """The median step time after the first (which pays for compilation and warm-up)."""
        later = sorted(self.step_seconds[1:]) or self.step_seconds
        return later[len(later) // 2] if later else 0.0

    @classmethod
    def load(cls, path: Path) -> TrainResult:
        """The log at ``path`` (empty if there is none); a log without epochs keeps them all."""
        if not path.exists():
            return cls()

        log = run_file(path)
        losses = [float(x) for x in log.get("losses", [])]
        return cls(
            losses=losses,
            step_epochs=[int(e) for e in log.get("step_epochs", [-1] * len(losses))],
            step_seconds=[float(x) for x in log.get("step_seconds", [])],
            seconds=float(log.get("seconds", 0.0)),
            tokens_per_step=int(log.get("tokens_per_step", 0)),
        )

    def before(self, epoch: int) -> TrainResult:
        """The steps of the epochs before ``epoch``: what a resume after them continues."""
        kept = [i for i, e in enumerate(self.step_epochs) if e < epoch]
        return TrainResult(
            losses=[self.losses[i] for i in kept],
            step_epochs=[self.step_epochs[i] for i in kept],
            step_seconds=self.step_seconds,
            seconds=self.seconds,
            tokens_per_step=self.tokens_per_step,
        )

    def then(self, later: TrainResult) -> TrainResult:
        """This log followed by a later run's."""
        return TrainResult(
            losses=self.losses + later.losses,
            step_epochs=self.step_epochs + later.step_epochs,
            step_seconds=self.step_seconds + later.step_seconds,
            seconds=self.seconds + later.seconds,
            checkpoint=later.checkpoint,
            tokens_per_step=later.tokens_per_step,
        )

    def to_dict(self) -> dict[str, Any]:
        """The log as ``train_log.json`` holds it: the fields :meth:`load` reads, with the
        checkpoints' folder, the step count, steps per second over all runs and the median step
        time."""
        return {
            "losses": self.losses,
            "step_epochs": self.step_epochs,
            "step_seconds": self.step_seconds,
            "steps": self.steps,
            "seconds": self.seconds,
            "steps_per_second": self.steps / self.seconds if self.seconds else 0.0,
            "median_step_seconds": self.median_step_seconds,
            "tokens_per_step": self.tokens_per_step,
            "checkpoint": str(self.checkpoint),
        }

    def text(self) -> str:
        """What ``specshim train`` prints: that the run was already trained, that no step ran,
        or the steps and their speed, the first loss beside the mean of the last five, and the
        checkpoints' folder."""
        if self.already_trained:
            plural = "s" if self.already_trained != 1 else ""
            return (
                f"already trained to {self.already_trained} epoch{plural}; nothing to do "
                f"(checkpoints: {self.checkpoint}; pass a larger --epochs to train on)"
            )
        if not self.losses:
            return "no training steps ran"
        first, last = self.losses[0], sum(self.losses[-5:]) / len(self.losses[-5:])
        return (
            f"steps: {self.steps} in {self.seconds:.1f} s "
            f"({self.steps / self.seconds:.2f} steps/s; median step "
            f"{self.median_step_seconds * 1000:.1f} ms)\n"
            f"loss: first {first:.4f}, mean of last 5 {last:.4f}\n"
            f"checkpoint: {self.checkpoint}"
        )


def _train_metrics(record: logging.LogRecord) -> dict[str, Any] | None:
    """The message of one of speculators' per-step records (``{"train": {...}, "epoch": e}``)."""
    message = record.msg
    if isinstance(message, dict) and isinstance(message.get("train"), dict):
        return message
    return None


class MetricCollector(logging.Handler):
    """Reads the per-step metrics speculators logs (``{"train": {"loss": ...}}``), and when.

    Attached to ``speculators.metrics`` by ``train`` and by benchmarks/training_ratio.py, which
    times speculators' trainer driven directly with the same clock.
    """

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.epochs: list[int] = []
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the loss, epoch (-1 when it names none) and time of a per-step record with a
        loss; ignore any other record."""
        message = _train_metrics(record)
        if message is not None and message["train"].get("loss") is not None:
            self.losses.append(float(message["train"]["loss"]))
            self.epochs.append(int(message.get("epoch", -1)))
            self.times.append(record.created)

    def step_seconds(self) -> list[float]:
        """The time between consecutive steps' metrics (each after speculators' ``.item()``)."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


class TokenCounter:
    """Counts the tokens of every batch the loader hands out (its ``lengths``, packed)."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, collate: Callable[[list[Any]], dict[str, Any]]) -> Callable[..., Any]:
        """``collate``, adding the sum of each batch's ``lengths`` to ``count`` as it returns."""

        def counting(batch: list[Any]) -> dict[str, Any]:
            collated = collate(batch)
            self.count += int(collated["lengths"].sum())
            return collated

        return counting


class ProgressBar(logging.Handler):
    """One tqdm bar an epoch on stderr: steps, loss and tokens/s from speculators' metrics.

    speculators draws its own bar only where its ``local_rank`` is 0, which on the CPU (a
    device there) is never, and without loss or throughput. tokens/s counts the steps after an
    epoch's first (the loader collates a batch just before its step, so the tokens counted at
    step k's metrics are exactly those of steps 1..k).
    """

    def __init__(self, epochs: int, steps_per_epoch: int, tokens: TokenCounter) -> None:
        super().__init__()
        self.epochs, self.steps_per_epoch, self.tokens = epochs, steps_per_epoch, tokens
        self.bar: Any = None
        self.epoch = -1
        self.first_tokens, self.first_time = 0, 0.0

    def emit(self, record: logging.LogRecord) -> None:
        """Advance the bar one step for a per-step record, starting a new bar when its epoch
        changes; show its loss, and tokens/s from the epoch's second step on."""
        message = _train_metrics(record)
        if message is None:
            return
        epoch = int(message.get("epoch", 0))
        if epoch != self.epoch:
            self._start(epoch)
        postfix = f"loss {float(message['train'].get('loss', math.nan)):.4f}"
        seconds = time.perf_counter() - self.first_time
        if self.bar.n and seconds > 0:
            postfix += f", {(self.tokens.count - self.first_tokens) / seconds:,.0f} tok/s"
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update()

    def _start(self, epoch: int) -> None:
        from tqdm import tqdm

        self.close_bar()
        self.epoch = epoch
        self.first_tokens, self.first_time = self.tokens.count, time.perf_counter()
        self.bar = tqdm(
            total=self.steps_per_epoch,
            desc=f"[specshim train] epoch {epoch + 1}/{self.epochs}",
            unit="step",
            file=sys.stderr,
            disable=progress.hidden(),
        )

    def close_bar(self) -> None:
        """Close the current epoch's bar, if one is open."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """Close the open bar, then the handler."""
        self.close_bar()
        super().close()


@dataclass(frozen=True)
class Settings:
    """What a run's checkpoints depend on: a ``resume`` must give the same (``--epochs`` and
    ``--device`` may change). Paths are compared resolved."""

    data: str
    verifier: str
    vocab: str
    max_len: int
    num_layers: int
    ttt_steps: int
    lr: float
    seed: int
    dtype: str

    def differences(self, recorded: dict[str, Any]) -> list[str]:
        """``--name value (the run in --out used other)`` for every setting that differs."""
        mine = asdict(self)
        return [
            f"--{name.replace('_', '-')} {mine[name]} (the run in it used {recorded.get(name)})"
            for name in mine
            if recorded.get(name) != mine[name]
        ]


def _resolved(path: str | Path) -> str:
    return str(Path(path).resolve())


def check_options(
    epochs: int, lr: float, max_len: int, num_layers: int, ttt_steps: int, dtype: str,
    device: str | None, resume: bool, overwrite: bool,
) -> None:  # fmt: skip
    """Refuse a bad option with one line, before anything is loaded or written."""
    counts = {"--epochs": epochs, "--max-len": max_len, "--num-layers": num_layers,
              "--ttt-steps": ttt_steps}  # fmt: skip
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr must be a number greater than 0, got {lr}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device is not None and device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out, --overwrite removes it: pass one")


def check_inputs(data: Path, vocab: Path) -> None:
    """Is ``data`` one complete extraction (:func:`extracted.check`) with the layers EAGLE-3
    reads, ``vocab`` a vocabulary?"""
    if not (any(data.glob("data_*.pt")) and (data / "sample_lengths.json").is_file()):
        raise ValueError(
            f"--data {data} is not an extraction folder (expected data_*.pt and "
            f"sample_lengths.json): run `specshim extract --out {shlex.quote(str(data))}` first"
        )
    missing = [name for name in ("d2t.npy", "t2d.npy") if not (vocab / name).is_file()]
    if missing:
        raise ValueError(
            f"--vocab {vocab} has no {' or '.join(missing)}: run "
            f"`{shlex.join(['specshim', 'vocab', '--data', str(data), '--out', str(vocab)])}` first"
        )
    first = extracted.check(data)[0]
    layers = len(stored.load_torch(first, "a sample", mmap=True)["hidden_states"])
    if layers != AUX_LAYERS + 1:
        raise ValueError(
            f"{first} holds {layers} layers; EAGLE-3 training reads {AUX_LAYERS} auxiliary "
            f"layers plus the last one ({AUX_LAYERS + 1} in all)"
        )


def _device(device: str | None) -> str:
    """The device to train on: ``cuda`` if there is one, unless the caller chose."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here; pass --device cpu")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def _contents(out: Path) -> list[Path]:
    """What ``out`` holds, less the lock of the command writing there (``out_lock``)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; expected a folder (new, or a run to resume)")
    return out_lock.contents(out) if out.is_dir() else []


def _is_run_file(path: Path) -> bool:
    name = path.name
    return name in RUN_FILES or name.startswith(("served", "eval-served")) or name.endswith(".tmp")


def check_out(out: Path, settings: Settings, resume: bool, overwrite: bool) -> None:
    """Refuse to mix two runs in one ``--out``, before anything is written.

    A folder that is not empty needs ``resume`` (its recorded settings must match) or
    ``overwrite`` (it must hold nothing but a run's files, which are all that is removed).
    """
    contents = _contents(out)
    if not contents:
        return
    if overwrite:
        foreign = [p.name for p in contents if not _is_run_file(p)]
        if foreign:
            raise ValueError(
                f"--overwrite: --out {out} holds files a training run does not write: "
                f"{console.listed(foreign)}; nothing was removed: pick a new --out"
            )
    elif not resume:
        raise ValueError(
            f"--out {out} is not empty: pass --resume to continue the run in it or "
            f"--overwrite to start over, or pick a new --out"
        )
    elif not (out / SETTINGS_FILE).exists():
        note(f"--resume: {out} records no settings ({SETTINGS_FILE}); they cannot be checked")
    else:
        differences = settings.differences(run_file(out / SETTINGS_FILE))
        if differences:
            raise ValueError(
                f"--resume: the run in {out} had other settings: {'; '.join(differences)}; "
                f"pass the same, or --overwrite to start over, or pick a new --out"
            )


def run_file(path: Path) -> dict[str, Any]:
    """A JSON object this module wrote into ``--out``; anything else is one line naming it."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); expected the JSON a run writes") from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} holds a {type(data).__name__}; expected the JSON object a run writes"
        )
    return data


def remove_run(out: Path) -> None:
    """``overwrite``: move the earlier run's files into ``out/.overwritten``, then delete that.

    A kill midway leaves only run files (the trash among them), which the next ``overwrite``
    removes too; nothing else in ``out`` is touched (``check_out`` refused any).
    """
    trash = out / TRASH
    shutil.rmtree(trash, ignore_errors=True)  # an earlier overwrite's, killed midway
    trash.mkdir()
    for path in _contents(out):
        if path != trash:
            path.rename(trash / path.name)
    shutil.rmtree(trash)


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be created: {exc.strerror}") from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable")


def trained_epochs(checkpoints: Path) -> int:
    """How many epochs the complete checkpoints hold (speculators resumes after the last)."""
    complete = [int(p.name) for p in epochs(checkpoints) if is_complete(p)]
    return max(complete) + 1 if complete else 0


def note(text: str) -> None:
    """Print ``[specshim train] text`` on stderr."""
    console.status("specshim train", text)


def check_verifier(verifier: str, trust_remote_code: bool) -> None:
    """Refuse, before ``--out`` is touched, a verifier whose config cannot be read, or that only
    its own code reads and ``trust_remote_code`` is off (:mod:`specshim.runner.remote_code`)."""
    try:
        remote_code.config(verifier, trust_remote_code)
    except OSError as exc:
        raise ValueError(
            f"--verifier {verifier}: no model config could be read ({console.first_line(exc)})"
        ) from None


def draft_layer_config(verifier: str, num_layers: int, trust_remote_code: bool = False) -> Any:
    """A Llama decoder config with the verifier's sizes, as speculators' own script builds it
    (the verifier's own code run only with ``trust_remote_code``)."""
    from transformers import LlamaConfig

    config = remote_code.config(verifier, trust_remote_code)
    config = getattr(config, "text_config", config)
    layer = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        head_dim=getattr(config, "head_dim", None),
        tie_word_embeddings=False,
    )
    import speculators.models.eagle3.attention  # noqa: F401  (registers simple_flex_attention)

    layer._attn_implementation = "simple_flex_attention"
    return layer


def build_model(
    verifier: str,
    d2t: Any,
    t2d: Any,
    num_layers: int,
    ttt_steps: int,
    trust_remote_code: bool = False,
) -> Any:
    """A new EAGLE-3 draft of ``num_layers`` layers (:func:`draft_layer_config`) with a draft
    vocabulary the size of ``d2t``: built with ``Eagle3DraftModel.from_training_args`` where
    speculators has it (0.4+), given ``ttt_steps``; else from a typed ``Eagle3SpeculatorConfig``
    whose greedy proposal has ``ttt_steps`` speculative tokens (0.3.0, see the module's
    docstring). The verifier's own code runs only with ``trust_remote_code``, in speculators'
    reading of it too."""
    with remote_code.in_speculators(trust_remote_code, remote_code.TRAINING_LOADERS):
        return _draft(verifier, d2t, t2d, num_layers, ttt_steps, trust_remote_code)


def _draft(
    verifier: str, d2t: Any, t2d: Any, num_layers: int, ttt_steps: int, trust_remote_code: bool
) -> Any:
    """:func:`build_model`'s draft, made by the speculators release installed."""
    from speculators.models.eagle3 import Eagle3DraftModel

    layer = draft_layer_config(verifier, num_layers, trust_remote_code)
    if hasattr(Eagle3DraftModel, "from_training_args"):  # speculators 0.4+
        return Eagle3DraftModel.from_training_args(
            verifier_config=layer,
            draft_vocab_size=d2t.shape[0],
            norm_before_residual=True,
            ttt_steps=ttt_steps,
            verifier_name_or_path=verifier,
            t2d=t2d,
            d2t=d2t,
        )
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=d2t.shape[0],
        norm_before_residual=True,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[
                GreedyTokenProposalConfig(proposal_type="greedy", speculative_tokens=ttt_steps)
            ],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"]),
        ),
    )
    return Eagle3DraftModel(config=config, t2d=t2d, d2t=d2t)


#: speculators writes a checkpoint's files in this order; the last one marks it complete.
CHECKPOINT_FILES = ("model.safetensors", "optimizer_state_dict.pt", "scheduler_state_dict.pt")


def epochs(checkpoints: Path) -> list[Path]:
    """The epoch directories under ``checkpoints``, in training order."""
    return sorted((p for p in checkpoints.glob("*") if p.name.isdigit()), key=lambda p: int(p.name))


def checkpoint_problem(epoch_dir: Path) -> str | None:
    """The first of a checkpoint's files that is missing or does not read, and why, or None.

    Each is read as cheaply as it is checked: the model's safetensors header (and that the
    file is as long as it says), the optimizer's state memory-mapped, the scheduler's whole.
    """
    model, optimizer, scheduler = (epoch_dir / name for name in CHECKPOINT_FILES)
    try:
        stored.check_safetensors(model, "the draft's weights")
        stored.load_torch(optimizer, "the optimizer's state", mmap=True)
        stored.load_torch(scheduler, "the scheduler's state")
    except stored.BadFile as exc:
        return f"{exc.path.name} {exc.problem}"
    return None


def is_complete(epoch_dir: Path) -> bool:
    """Are all of a checkpoint's files there and readable (:func:`checkpoint_problem`)?"""
    return checkpoint_problem(epoch_dir) is None


def set_aside_incomplete(checkpoints: Path) -> list[str]:
    """Rename epoch directories that a kill left half-written (or whose files were damaged
    since), so resuming skips them; return one line for each, naming the file at fault.

    speculators' checkpointer resumes from the highest-numbered directory, complete or not;
    a directory with a file missing or unreadable (:func:`checkpoint_problem`) is renamed to
    ``incomplete-<epoch>`` (kept for inspection, ignored by speculators) and that epoch is
    trained again.
    """
    moved = []
    for epoch_dir in epochs(checkpoints):
        if problem := checkpoint_problem(epoch_dir):
            target = checkpoints / f"incomplete-{epoch_dir.name}"
            while target.exists():
                target = target.with_name(target.name + "-again")
            epoch_dir.rename(target)
            moved.append(f"set aside checkpoint {epoch_dir} as {target.name} ({problem})")
    return moved


def _loader(
    files: list[str],
    max_len: int,
    seed: int,
    dtype: Any,
    world: distributed.World,
    tokens: TokenCounter | None = None,
) -> Any:
    """speculators' dataset, packing sampler and collate function (counting tokens if asked)."""
    from speculators.train.data import Eagle3SampleFileDataset, create_collate_fn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2
    from torch.utils.data import DataLoader

    dataset = Eagle3SampleFileDataset(max_len=max_len, file_list=files, hidden_states_dtype=dtype)
    sampler = MultipackDistributedBatchSamplerV2(
        batch_max_length=max_len,
        lengths=dataset.approx_lengths,
        num_replicas=world.size,
        rank=world.rank,
        seed=seed,
    )
    collate = create_collate_fn(max_len)
    collate = tokens.wrap(collate) if tokens else collate
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)


def _prepare_out(out: Path, settings: Settings, resume: bool, overwrite: bool, epochs: int) -> None:
    """On one process: clear or set up ``out`` as ``check_out`` allowed, record the settings."""
    if overwrite and _contents(out):
        remove_run(out)
        note(f"--overwrite: removed the earlier run in {out}")
    if resume:
        for line in set_aside_incomplete(out / "checkpoints"):
            note(line)
        done = trained_epochs(out / "checkpoints")
        if done:
            left = f"epoch {epochs}" if done + 1 == epochs else f"epochs {done + 1} to {epochs}"
            note(
                f"resuming from {out / 'checkpoints' / str(done - 1)} "
                f"({done} of {epochs} epochs done; training {left})"
            )
        else:
            note(f"--resume: no checkpoint in {out}; starting from epoch 1")
    files.save_json(out / SETTINGS_FILE, asdict(settings))


def _barrier(world: distributed.World) -> None:
    if world.size > 1:
        import torch.distributed as dist

        dist.barrier()


def _checkpointing_log(trainer: type, write_log: Callable[[], None]) -> type:
    """``trainer``, writing the training log after every checkpoint, so that the log always
    covers the epochs the checkpoints hold, even when a later epoch is killed."""

    class LoggingTrainer(trainer):  # type: ignore[misc, valid-type]
        def save_checkpoint(self, epoch: int) -> None:
            super().save_checkpoint(epoch)
            write_log()

    return LoggingTrainer


def train(
    data: Path,
    verifier: str,
    out: Path,
    vocab: Path | None = None,
    epochs: int = 3,
    lr: float = 1e-3,
    max_len: int = 1024,
    num_layers: int = 1,
    ttt_steps: int = 3,
    device: str | None = None,
    resume: bool = False,
    seed: int = 0,
    dtype: str = "float32",
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> TrainResult:
    """Train a draft into ``out`` (see the module's docstring for what ``out`` may hold).

    Every check (options, data, vocabulary, the verifier's config, ``out``) runs before
    anything is loaded or written; a bad one raises ``ValueError`` with one line. ``data`` is
    held for reading (:func:`out_lock.held`, shared) from before its check to the last step:
    a command writing there meanwhile stops this one, or is stopped. The verifier's own code
    runs only with ``trust_remote_code``.
    """
    check_options(epochs, lr, max_len, num_layers, ttt_steps, dtype, device, resume, overwrite)
    if _resolved(data) == _resolved(out):
        raise ValueError(f"--out {out} is the --data folder: pick a folder of its own for the run")
    with out_lock.held(data, "train", "--data", shared=True):
        vocab = vocab or data
        check_inputs(data, vocab)
        check_verifier(verifier, trust_remote_code)
        settings = Settings(
            _resolved(data), _resolved(verifier) if Path(verifier).exists() else verifier,
            _resolved(vocab), max_len, num_layers, ttt_steps, lr, seed, dtype,
        )  # fmt: skip
        check_out(out, settings, resume, overwrite)
        device = _device(device)
        checkpoints = out / "checkpoints"
        earlier = TrainResult.load(out / LOG_FILE) if resume else TrainResult()
        if resume and (done := trained_epochs(checkpoints)) >= epochs:
            earlier.checkpoint, earlier.already_trained = checkpoints, done
            return earlier
        _make_out(out)
        world = distributed.start(device)
        try:
            if world.rank == 0:
                _prepare_out(out, settings, resume, overwrite, epochs)
            _barrier(world)
            done = trained_epochs(checkpoints) if resume else 0
            return _run(settings, out, epochs, device, world, resume, earlier.before(done),
                        trust_remote_code)  # fmt: skip
        finally:
            world.stop()


def _run(
    settings: Settings,
    out: Path,
    epochs: int,
    device: str,
    world: distributed.World,
    resume: bool,
    earlier: TrainResult,
    trust_remote_code: bool = False,
) -> TrainResult:
    """speculators' trainer on the checked settings; the log is ``earlier`` plus this run."""
    import numpy as np
    import torch

    specshim.apply()
    vocab = Path(settings.vocab)
    d2t = torch.from_numpy(np.load(vocab / "d2t.npy"))
    t2d = torch.from_numpy(np.load(vocab / "t2d.npy"))
    random.seed(settings.seed)
    np.random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    torch_dtype = getattr(torch, settings.dtype)
    model = build_model(settings.verifier, d2t, t2d, settings.num_layers, settings.ttt_steps,
                        trust_remote_code)  # fmt: skip
    model = model.to(torch_dtype)

    from speculators.train.trainer import Trainer, TrainerConfig

    options = dict(
        lr=settings.lr,
        num_epochs=epochs,
        save_path=str(out / "checkpoints"),
        resume_from_checkpoint=resume,
        is_distributed=world.size > 1,
        # speculators moves the model and each batch with .to(local_rank): a device works too
        local_rank=world.local_rank if device == "cuda" else torch.device(device),
        train_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": settings.ttt_steps},
        val_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": settings.ttt_steps},
    )
    accepted = inspect.signature(TrainerConfig).parameters
    config = TrainerConfig(**{k: v for k, v in options.items() if k in accepted})
    data_files = sorted(str(p) for p in extracted.sample_files(Path(settings.data)))
    tokens = TokenCounter()
    loader = _loader(data_files, settings.max_len, settings.seed, torch_dtype, world, tokens)
    collector = MetricCollector()
    handlers: list[logging.Handler] = [collector]
    if world.rank == 0:
        handlers.append(ProgressBar(epochs, len(loader), tokens))
    metric_logger = logging.getLogger("speculators.metrics")
    metric_logger.setLevel(logging.INFO)
    started = time.perf_counter()

    def log() -> TrainResult:
        run = TrainResult(
            losses=list(collector.losses),
            step_epochs=list(collector.epochs),
            step_seconds=collector.step_seconds(),
            seconds=time.perf_counter() - started,
            checkpoint=out / "checkpoints",
            tokens_per_step=settings.max_len,
        )
        return earlier.then(run)

    def write_log() -> None:
        if world.rank == 0:
            files.save_json(out / LOG_FILE, log().to_dict())

    for handler in handlers:
        metric_logger.addHandler(handler)
    try:
        trainer_class = _checkpointing_log(distributed.trainer_class(Trainer, device), write_log)
        trainer_class(model, config, loader, None).run_training()
    finally:
        for handler in handlers:
            metric_logger.removeHandler(handler)
            handler.close()
    write_log()
    return log()
