"""The destinations of ``specshim convert``: sample files written atomically one at a time,
then the small files of the layout (the Arrow dataset, ``sample_lengths.json``,
``token_freq.pt``, ``data_config.json``) from every row."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specshim.runner import files
from specshim.runner.convert.read import ArrowSource
from specshim.runner.convert.samples import (
    ARROW,
    ARROW_FILE,
    ARROW_META,
    HIDDEN_STATES,
    LEGACY,
    LEGACY_FILE,
    STAGING,
    Sample,
    numbered,
)
from specshim.runner.dataset import record as sample_record


class LegacyDest:
    """Writes speculators 0.3/0.4 files into ``out``."""

    direction = f"{ARROW} -> {LEGACY}"

    def __init__(self, out: Path) -> None:
        self.out = out
        self.directory = out

    def name(self, i: int) -> str:
        """Sample ``i``'s file name: ``data_{i}.pt``."""
        return f"data_{i}.pt"

    def existing(self) -> list[int]:
        """The numbers of the ``data_{i}.pt`` files in ``out``, sorted."""
        return numbered(self.directory, LEGACY_FILE)

    def write(self, path: Path, sample: Sample) -> None:
        """Save ``sample`` to ``path`` atomically as speculators 0.3/0.4 stores it: int64 ids and
        mask, and a list of the layers' states, each with its own storage (a view of the stacked
        states ``ArrowSource`` loads would save all of them)."""
        files.save_torch(path, sample_record(sample.input_ids, sample.states, sample.loss_mask))

    def finish(self, source: Any, rows: Iterator[tuple[Any, Any]]) -> None:
        """Write the small files from every row's token ids and loss mask:
        ``sample_lengths.json``, ``token_freq.pt``, and ``data_config.json`` (the one an
        earlier conversion kept, else one made from ``source``)."""
        lengths: dict[str, int] = {}
        counts: Counter[int] = Counter()
        for i, (ids, mask) in enumerate(rows):
            lengths[str(i)] = ids.shape[0]
            _count(counts, ids, mask)
        files.save_json(self.out / "sample_lengths.json", lengths)
        files.save_torch(self.out / "token_freq.pt", dict(counts))
        files.save_json(self.out / "data_config.json", source.data_config or _data_config(source))


def _data_config(source: ArrowSource) -> dict[str, Any]:
    """A ``data_config.json`` for data speculators 0.3/0.4 did not make: the fields specshim
    and speculators' schema use (layer ids, count, hidden size, file format), and where the
    data came from in place of the generator's run details, which were never recorded."""
    return {
        "version": "2.0",
        "converted_by": f"specshim convert from {ARROW} data at {source.folder}",
        "model": {"hidden_size": source.load(0).states[0].shape[-1] if source.count else None},
        "data": {"num_samples": source.count},
        "hidden_states": {
            "layer_ids": source.generator_ids,
            "vllm_layer_ids": source.vllm,
            "description": "speculators 0.3/0.4 generator ids (vLLM id - 1)",
        },
        "format": {"file_pattern": "data_{idx}.pt"},
    }


class ArrowDest:
    """Writes speculators >= 0.5 files into ``out``: ``hidden_states/hs_{i}.safetensors``,
    then the Arrow dataset and ``token_freq.pt``."""

    direction = f"{LEGACY} -> {ARROW}"

    def __init__(self, out: Path) -> None:
        self.out = out
        self.directory = out / HIDDEN_STATES

    def name(self, i: int) -> str:
        """Sample ``i``'s file name: ``hs_{i}.safetensors``."""
        return f"hs_{i}.safetensors"

    def existing(self) -> list[int]:
        """The numbers of the ``hs_{i}.safetensors`` files in ``out/hidden_states``, sorted
        (none without that folder)."""
        return numbered(self.directory, ARROW_FILE) if self.directory.is_dir() else []

    def write(self, path: Path, sample: Sample) -> None:
        """Save ``sample`` to ``path`` atomically as speculators >= 0.5 reads it: the states
        stacked into ``hidden_states`` (``[seq, layers, hidden]``, in the order of the layer
        ids) and the token ids as int64 ``token_ids``; the loss mask goes to the Arrow dataset."""
        import torch
        from safetensors.torch import save

        tensors = {
            "hidden_states": torch.stack(sample.states, dim=1),
            "token_ids": sample.input_ids.to(torch.long).contiguous(),
        }
        files.write_atomic(path, lambda f: f.write(save(tensors)))

    def finish(self, source: Any, rows: Iterator[tuple[Any, Any]]) -> None:
        """Write the Arrow dataset (``input_ids``, ``loss_mask`` and ``seq_len`` a row) from
        every row's token ids and loss mask, counting the loss-masked ids as the rows stream
        into it, then ``token_freq.pt`` of those counts. ``source`` is not used:
        :func:`convert` keeps the source's ``data_config.json`` in :data:`MANIFEST` instead."""
        counts: Counter[int] = Counter()

        def arrow_rows() -> Iterator[dict[str, Any]]:
            for ids, mask in rows:
                _count(counts, ids, mask)
                yield {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": len(ids)}

        _save_arrow(self.out, arrow_rows)
        files.save_torch(self.out / "token_freq.pt", dict(counts))


def _count(counts: Counter[int], ids: Any, mask: Any) -> None:
    """Add a row's loss-masked token ids to ``counts`` (``token_freq.pt``, as both
    speculators generations count it)."""
    counts.update(ids[mask.bool()].tolist())


def _save_arrow(out: Path, rows: Callable[[], Iterator[dict[str, Any]]]) -> None:
    """Write the Arrow dataset of ``rows`` into ``out`` as speculators >= 0.5 reads it.

    ``datasets`` writes the rows to Arrow as they come (flat memory), into a staging folder
    inside ``out``; the shards, then ``dataset_info.json``, then ``state.json`` (what
    ``load_from_disk`` opens first) are moved into ``out``, and shards of an earlier run that
    the new ``state.json`` does not list are removed."""
    import datasets
    from datasets import Dataset, Features, List, Value

    features = Features(
        {
            "input_ids": List(Value("int64")),
            "loss_mask": List(Value("int64")),
            "seq_len": Value("int64"),
        }
    )
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # convert shows its own progress
    try:
        with tempfile.TemporaryDirectory(dir=out, prefix=".specshim_cache.") as cache:
            # a fresh cache: the fingerprint only names it, nothing is reused
            dataset = Dataset.from_generator(
                rows, features=features, cache_dir=cache, fingerprint="specshim-convert"
            )
            dataset.set_format("torch")
            dataset.save_to_disk(str(staging))
            del dataset
    finally:
        if shown:
            datasets.enable_progress_bars()
    state = json.loads((staging / "state.json").read_text())
    shards = [entry["filename"] for entry in state["_data_files"]]
    for name in [*shards, *ARROW_META]:
        os.replace(staging / name, out / name)
    for stale in out.glob("data-*.arrow"):
        if stale.name not in shards:
            stale.unlink()
    shutil.rmtree(staging)
