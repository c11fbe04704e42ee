"""``specshim extract``: hidden states through speculators' own generator, patched by specshim.

Output is what speculators 0.3/0.4 training reads: ``data_{i}.pt`` (``input_ids``, a list of
``[seq, hidden]`` tensors, ``loss_mask``), ``token_freq.pt``, ``sample_lengths.json`` and
``data_config.json``. Every file is written atomically, so a run killed at any moment leaves
only whole files; running again skips the samples already written and neither loses nor
duplicates one.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files
from specshim.runner.progress import Progress

MANIFEST = "specshim_extract.json"


class ExtractionError(RuntimeError):
    pass


@dataclass
class Summary:
    samples: int
    extracted: int
    resumed: int
    truncated: int
    skipped: list[str] = field(default_factory=list)
    tokens_per_second: float = 0.0
    seconds: float = 0.0

    def text(self) -> str:
        lines = [
            f"samples: {self.samples} ({self.extracted} extracted, {self.resumed} already done)",
            f"truncated to max_model_len - 1: {self.truncated}",
            f"skipped bad rows: {len(self.skipped)}",
            f"throughput: {self.tokens_per_second:,.0f} tokens/s over {self.seconds:.1f} s",
        ]
        return "\n".join(lines + [f"  {s}" for s in self.skipped[:10]])


def _check_manifest(out: Path, settings: dict[str, Any]) -> None:
    path = out / MANIFEST
    if path.exists():
        previous = json.loads(path.read_text())
        if previous != settings:
            changed = {k: (previous.get(k), v) for k, v in settings.items() if previous.get(k) != v}
            raise ExtractionError(
                f"{out} holds an extraction with other settings {changed} (was, now); "
                "use a new --out directory or the same settings to resume"
            )
    else:
        files.save_json(path, settings)


def _prepare(samples: list[dataset.Sample], limit: int, truncate: bool) -> int:
    over = [s for s in samples if len(s.input_ids) > limit]
    if over and not truncate:
        first = over[0]
        raise ExtractionError(
            f"sample {first.index} has {len(first.input_ids)} tokens, more than max_model_len - 1 "
            f"= {limit} ({len(over)} such samples); raise --max-model-len or pass --truncate"
        )
    return len(over)


def _record(result: dict[str, Any], sample: dataset.Sample, limit: int) -> dict[str, Any]:
    import torch

    ids = sample.input_ids[:limit]
    got = result["input_ids"].tolist()
    if got != ids:
        raise ExtractionError(
            f"sample {sample.index}: the generator returned other input ids than it was given "
            f"({len(got)} vs {len(ids)} tokens): refusing to write misaligned data"
        )
    return {
        "input_ids": result["input_ids"],
        "hidden_states": [h.contiguous() for h in result["hidden_states"]],
        "loss_mask": torch.tensor(sample.loss_mask[:limit], dtype=torch.long),
    }


def _token_freq(samples: list[dataset.Sample], limit: int) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(t for t, m in zip(s.input_ids[:limit], s.loss_mask[:limit], strict=True) if m)
    return dict(counts)


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
) -> Summary:
    from transformers import AutoTokenizer

    import specshim
    from specshim.runner import hardware_setup

    hardware_setup.prepare_for_vllm(tensor_parallel_size)
    specshim.apply()
    tokenizer = AutoTokenizer.from_pretrained(model)
    skipped: list[dataset.BadRow] = []
    samples = list(dataset.read(data, tokenizer, skip_bad=skip_bad, skipped=skipped))
    if not samples:
        raise ExtractionError(f"{data} holds no usable samples")
    limit = max_model_len - 1
    truncated = _prepare(samples, limit, truncate)
    out.mkdir(parents=True, exist_ok=True)
    files.remove_partials(out)
    _check_manifest(
        out,
        {"model": str(model), "data": str(data), "layers": layers, "max_model_len": max_model_len},
    )
    todo = [s for s in samples if not (out / f"data_{s.index}.pt").exists()]
    bar = Progress(total=len(todo), visible=progress)
    if todo:
        with (
            _generator(model, layers, max_model_len, tensor_parallel_size) as generator,
            files.BackgroundWriter(depth=2 * batch_size) as writer,
        ):
            bar = Progress(total=len(todo), visible=progress)  # timed from the engine's start
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                results = generator.generate([s.input_ids for s in batch])
                for sample, result in zip(batch, results, strict=True):
                    writer.submit(out / f"data_{sample.index}.pt", _record(result, sample, limit))
                bar.update(len(batch), sum(min(len(s.input_ids), limit) for s in batch))
            bar.finish()
            _save_data_config(generator, out, data, max_model_len, len(samples))
    files.save_torch(out / "token_freq.pt", _token_freq(samples, limit))
    files.save_json(
        out / "sample_lengths.json",
        {str(s.index): min(len(s.input_ids), limit) for s in samples},
    )
    return Summary(
        samples=len(samples),
        extracted=len(todo),
        resumed=len(samples) - len(todo),
        truncated=truncated,
        skipped=[str(e) for e in skipped],
        tokens_per_second=bar.tokens_per_second,
        seconds=bar.elapsed,
    )


@contextlib.contextmanager
def _generator(
    model: str, layers: list[int] | None, max_model_len: int, tensor_parallel_size: int
) -> Iterator[Any]:
    """speculators' generator, with its vLLM workers shut down on the way out.

    Its own ``__del__`` would do it at interpreter exit, when its logger is already gone.
    """
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    generator = VllmHiddenStatesGenerator(
        model,
        layer_ids=layers,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
    )
    try:
        yield generator
    finally:
        generator.executor.shutdown()
        del generator.executor


def _save_data_config(generator: Any, out: Path, data: Path, seq_length: int, count: int) -> None:
    """``data_config.json`` built by speculators' own ``DataGenerationConfig``."""
    from speculators.data_generation.config_generator import DataGenerationConfig

    config = DataGenerationConfig.from_generator(
        generator,
        train_data_path=str(data),
        seq_length=seq_length,
        cache_dir=str(out),
        num_samples=count,
    )
    files.save_json(out / "data_config.json", config.to_dict())
