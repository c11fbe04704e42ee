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

import contextlib
import inspect
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import specshim
from specshim.runner import distributed, extracted, files, out_lock
from specshim.runner.train.checkpoints import trained_epochs
from specshim.runner.train.draft import build_model
from specshim.runner.train.metrics import MetricCollector, ProgressBar, TokenCounter, TrainResult
from specshim.runner.train.options import (
    Settings,
    check_inputs,
    check_options,
    check_verifier,
    choose_device,
    resolved,
)
from specshim.runner.train.out import LOG_FILE, check_out, make_out, prepare_out


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
    anything is loaded or written; a bad one raises ``ValueError`` with one line. ``data`` (and
    ``vocab``, where it is another folder) is held for reading (:func:`out_lock.held`, shared)
    from before its check to the last step: a command writing there meanwhile stops this one,
    or is stopped. The verifier's own code
    runs only with ``trust_remote_code``.
    """
    check_options(epochs, lr, max_len, num_layers, ttt_steps, dtype, device, resume, overwrite)
    if resolved(data) == resolved(out):
        raise ValueError(f"--out {out} is the --data folder: pick a folder of its own for the run")
    vocab = vocab or data
    with contextlib.ExitStack() as reading:
        reading.enter_context(out_lock.held(data, "train", "--data", shared=True))
        if resolved(vocab) != resolved(data):
            reading.enter_context(out_lock.held(vocab, "train", "--vocab", shared=True))
        check_inputs(data, vocab)
        check_verifier(verifier, trust_remote_code)
        settings = Settings(
            resolved(data), resolved(verifier) if Path(verifier).exists() else verifier,
            resolved(vocab), max_len, num_layers, ttt_steps, lr, seed, dtype,
        )  # fmt: skip
        check_out(out, settings, resume, overwrite)
        device = choose_device(device)
        checkpoints = out / "checkpoints"
        earlier = TrainResult.load(out / LOG_FILE) if resume else TrainResult()
        if resume and (done := trained_epochs(checkpoints)) >= epochs:
            earlier.checkpoint, earlier.already_trained = checkpoints, done
            return earlier
        make_out(out)
        world = distributed.start(device)
        try:
            if world.rank == 0:
                prepare_out(out, settings, resume, overwrite, epochs)
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
