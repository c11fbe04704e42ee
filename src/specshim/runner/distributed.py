"""Data-parallel training under ``torchrun``, on GPUs and on the CPU.

torchrun sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; with more than one process
speculators' trainer shards the draft with FSDP2 and saves through its distributed
checkpointer. speculators' own set-up (``maybe_setup_distributed``) insists on an accelerator,
so the runner starts the process group itself: NCCL on GPUs, gloo on the CPU (measured with
torch 2.13: FSDP2's ``fully_shard`` and ``ReduceOp.AVG`` both work on gloo).

One CPU gap is left in speculators' trainer: its sharding moves the draft's decoder layers to
the meta device, and ``setup_model`` then materialises them with ``to_empty(device="cuda")``
(always in 0.3.0; in 0.4 when torch has no accelerator) and calls ``reset_parameters``, which
transformers' RMSNorm does not have (its weights stay uninitialised: NaN loss, measured). On
the CPU the runner's trainer materialises the layers on the CPU and loads back the weights
every rank built from the same seed, so a data-parallel run starts where one process would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class World:
    """torchrun's process group as this process sees it: how many processes, this one's rank
    in all and on its machine (1, 0, 0 for a single process)."""

    size: int
    rank: int
    local_rank: int

    def stop(self) -> None:
        """Leave the process group, if one was joined."""
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def first() -> bool:
    """True in torchrun's first process, and in a process torchrun did not start."""
    return os.environ.get("RANK", "0") == "0"


def start(device: str) -> World:
    """Join torchrun's process group (a single process needs none)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(1, 0, 0)
    import torch
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return World(size, rank, local_rank)


def trainer_class(trainer: type, device: str) -> type:
    """speculators' ``Trainer``, or on the CPU a subclass that shards without CUDA."""
    if device != "cpu":
        return trainer

    class CpuTrainer(trainer):  # type: ignore[misc, valid-type]
        def setup_model(self) -> Any:
            if not self.is_distributed:
                return super().setup_model()
            from speculators.train.utils import apply_fully_sharded
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            initial = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            apply_fully_sharded(self.model)  # moves the layers to the meta device
            if self.resume_from_checkpoint and self.checkpointer.previous_epoch != -1:
                self.checkpointer.load_model_state_dict(self.model)
                return None
            for layer in self.model.layers.children():
                layer.to_empty(device="cpu")
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.model, initial, options=options)
            return None

    return CpuTrainer
