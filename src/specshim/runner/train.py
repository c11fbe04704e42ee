"""``specshim train``: EAGLE-3 draft training through the installed speculators' own trainer.

speculators 0.3/0.4 ship their training loop (``speculators.train.trainer.Trainer``), dataset,
packing sampler and checkpointer in the wheel, but the script that wires them together lives
only in their repository. This module is that wiring, for both releases:

- 0.4.x builds the draft with ``Eagle3DraftModel.from_training_args``;
- 0.3.0 has no ``from_training_args``: the typed ``Eagle3SpeculatorConfig`` is built here, with
  the draft layer config copied from the verifier's, and ``Eagle3DraftModel(config, t2d, d2t)``.

Checkpoints are speculators' own, one per epoch (model, optimizer, scheduler); ``resume``
continues from the last one. The loss of every step is collected from speculators' metric
logger and returned, so the caller can check that it goes down.
"""

from __future__ import annotations

import inspect
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import specshim
from specshim.runner import distributed, files

#: What speculators' training reads (speculators/train/data.py, standardize_data_v1).
AUX_LAYERS = 3


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    checkpoint: Path | None = None
    step_seconds: list[float] = field(default_factory=list)
    tokens_per_step: int = 0

    @property
    def median_step_seconds(self) -> float:
        """The median step time after the first (which pays for compilation and warm-up)."""
        later = sorted(self.step_seconds[1:]) or self.step_seconds
        return later[len(later) // 2] if later else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "losses": self.losses,
            "steps": self.steps,
            "seconds": self.seconds,
            "steps_per_second": self.steps / self.seconds if self.seconds else 0.0,
            "median_step_seconds": self.median_step_seconds,
            "tokens_per_step": self.tokens_per_step,
            "checkpoint": str(self.checkpoint),
        }

    def text(self) -> str:
        if not self.losses:
            return "no training steps ran (already trained to the requested epochs?)"
        first, last = self.losses[0], sum(self.losses[-5:]) / len(self.losses[-5:])
        return (
            f"steps: {self.steps} in {self.seconds:.1f} s "
            f"({self.steps / self.seconds:.2f} steps/s; median step "
            f"{self.median_step_seconds * 1000:.1f} ms)\n"
            f"loss: first {first:.4f}, mean of last 5 {last:.4f}\n"
            f"checkpoint: {self.checkpoint}"
        )


class MetricCollector(logging.Handler):
    """Reads the per-step metrics speculators logs (``{"train": {"loss": ...}}``), and when.

    Attached to ``speculators.metrics`` by ``train`` and by benchmarks/training_ratio.py, which
    times speculators' trainer driven directly with the same clock.
    """

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg
        if isinstance(message, dict) and isinstance(message.get("train"), dict):
            loss = message["train"].get("loss")
            if loss is not None:
                self.losses.append(float(loss))
                self.times.append(record.created)

    def step_seconds(self) -> list[float]:
        """The time between consecutive steps' metrics (each after speculators' ``.item()``)."""
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


def draft_layer_config(verifier: str, num_layers: int) -> Any:
    """A Llama decoder config with the verifier's sizes, as speculators' own script builds it."""
    from transformers import AutoConfig, LlamaConfig

    config = AutoConfig.from_pretrained(verifier)
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


def build_model(verifier: str, d2t: Any, t2d: Any, num_layers: int, ttt_steps: int) -> Any:
    from speculators.models.eagle3 import Eagle3DraftModel

    layer = draft_layer_config(verifier, num_layers)
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


def is_complete(epoch_dir: Path) -> bool:
    """Are all of a checkpoint's files there, the last one readable?"""
    import torch

    if not all((epoch_dir / name).exists() for name in CHECKPOINT_FILES):
        return False
    try:
        torch.load(epoch_dir / CHECKPOINT_FILES[-1], weights_only=True)
    except Exception:
        return False
    return True


def set_aside_incomplete(checkpoints: Path) -> list[Path]:
    """Rename epoch directories that a kill left half-written, so resuming skips them.

    speculators' checkpointer resumes from the highest-numbered directory, complete or not;
    a directory missing any of its files (or whose last file does not load) is renamed to
    ``incomplete-<epoch>`` (kept for inspection, ignored by speculators) and that epoch is
    trained again.
    """
    moved = []
    for epoch_dir in epochs(checkpoints):
        if not is_complete(epoch_dir):
            target = checkpoints / f"incomplete-{epoch_dir.name}"
            while target.exists():
                target = target.with_name(target.name + "-again")
            epoch_dir.rename(target)
            moved.append(target)
    return moved


def _loader(files: list[str], max_len: int, seed: int, dtype: Any, world: distributed.World) -> Any:
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
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=create_collate_fn(max_len))


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
) -> TrainResult:
    import time

    import numpy as np
    import torch

    specshim.apply()
    data_files = sorted(str(p) for p in data.glob("data_*.pt"))
    if not data_files:
        raise FileNotFoundError(f"no data_*.pt in {data}: run `specshim extract` first")
    first = torch.load(data_files[0], weights_only=True, mmap=True)  # the layer count only
    if len(first["hidden_states"]) != AUX_LAYERS + 1:
        raise ValueError(
            f"{data_files[0]} holds {len(first['hidden_states'])} layers; EAGLE-3 training reads "
            f"{AUX_LAYERS} auxiliary layers plus the last one ({AUX_LAYERS + 1} in all)"
        )
    vocab = vocab or data
    d2t = torch.from_numpy(np.load(vocab / "d2t.npy"))
    t2d = torch.from_numpy(np.load(vocab / "t2d.npy"))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"--dtype must name a torch dtype (float32, bfloat16), got {dtype!r}")
    model = build_model(verifier, d2t, t2d, num_layers, ttt_steps).to(torch_dtype)

    from speculators.train.trainer import Trainer, TrainerConfig

    if resume:
        for path in set_aside_incomplete(out / "checkpoints"):
            print(f"[specshim train] set aside a half-written checkpoint: {path}")

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    world = distributed.start(device)
    options = dict(
        lr=lr,
        num_epochs=epochs,
        save_path=str(out / "checkpoints"),
        resume_from_checkpoint=resume,
        is_distributed=world.size > 1,
        # speculators moves the model and each batch with .to(local_rank): a device works too
        local_rank=world.local_rank if device == "cuda" else torch.device(device),
        train_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": ttt_steps},
        val_call_kwargs={"use_off_policy_tokens": False, "ttt_steps": ttt_steps},
    )
    accepted = inspect.signature(TrainerConfig).parameters
    config = TrainerConfig(**{k: v for k, v in options.items() if k in accepted})
    collector = MetricCollector()
    metric_logger = logging.getLogger("speculators.metrics")
    metric_logger.addHandler(collector)
    metric_logger.setLevel(logging.INFO)
    started = time.perf_counter()
    try:
        loader = _loader(data_files, max_len, seed, torch_dtype, world)
        trainer = distributed.trainer_class(Trainer, device)(model, config, loader, None)
        trainer.run_training()
    finally:
        metric_logger.removeHandler(collector)
        world.stop()
    result = TrainResult(
        losses=collector.losses,
        steps=len(collector.losses),
        seconds=time.perf_counter() - started,
        checkpoint=out / "checkpoints",
        step_seconds=collector.step_seconds(),
        tokens_per_step=max_len,
    )
    if world.rank == 0:
        files.save_json(out / "train_log.json", result.to_dict())
    return result
