"""``extract --verify N``: N random samples extracted again one request at a time and compared
with their batched files."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from specshim.runner import dataset
from specshim.runner.extraction import options, resume

#: ``--verify``: the most a token's states may differ between the batched file and a
#: single-request extraction, as ``|batched - single| / |single|`` per token and layer. bf16
#: on the CPU differs by well under 1 % between batch shapes; a sample from another row, or
#: batched states shifted by a token (speculators #279), differ by 50 % and more.
VERIFY_TOLERANCE = 0.05


def compare(
    generator: Any, out: Path, samples: list[dataset.Sample], count: int, layers: list[int]
) -> str:
    """Re-extract ``count`` random samples one request at a time and compare them with their
    batched files (:data:`VERIFY_TOLERANCE`); a mismatch is an error naming the line."""
    import torch

    chosen = random.sample(samples, min(count, len(samples)))
    worst = 0.0
    for sample in chosen:
        [single] = generator.generate([sample.input_ids])
        saved = torch.load(out / resume.sample_file(sample), weights_only=True)
        if single["input_ids"].tolist() != saved["input_ids"].tolist():
            raise options.ExtractionError(
                f"--verify: line {sample.line} ({resume.sample_file(sample)}): a single-request "
                "extraction gives other input ids than the batched file"
            )
        for layer, got, want in zip(
            layers, saved["hidden_states"], single["hidden_states"], strict=True
        ):
            error = _relative_error(got, want)
            worst = max(worst, error)
            if error > VERIFY_TOLERANCE:
                raise options.ExtractionError(
                    f"--verify: line {sample.line} ({resume.sample_file(sample)}), layer {layer}: "
                    f"the batched states differ from a single-request extraction by {error:.1%} "
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
