"""``specshim vocab``: the draft vocabulary (``d2t.npy``, ``t2d.npy``) from token frequencies.

The mapping is built by speculators' own ``build_vocab_mappings_from_distribution`` (the most
frequent loss-masked tokens, padded with the lowest ids): ``d2t`` holds offsets
(``target_id = draft_id + d2t[draft_id]``), ``t2d`` a boolean mask over the target vocabulary.
"""

from __future__ import annotations

from pathlib import Path


def target_vocab_size(model: str | Path) -> int:
    """The verifier's vocabulary size, from its config (a multimodal model's text part)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    return getattr(config, "text_config", config).vocab_size


def build(
    data: Path, draft_vocab_size: int, target_vocab_size: int, out: Path
) -> tuple[Path, Path]:
    import numpy as np
    import torch

    from specshim.runner import files

    freq_path = data / "token_freq.pt"
    if not freq_path.exists():
        raise FileNotFoundError(f"{freq_path} not found: run `specshim extract` into {data} first")
    if not 0 < draft_vocab_size <= target_vocab_size:
        raise ValueError(
            f"--draft-vocab-size must be in [1, {target_vocab_size}] (the target vocabulary), "
            f"got {draft_vocab_size}"
        )
    import specshim

    specshim.apply()  # speculators' import needs it on transformers 5
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = torch.load(freq_path, weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    d2t_path, t2d_path = out / "d2t.npy", out / "t2d.npy"
    files.write_atomic(d2t_path, lambda f: np.save(f, d2t.numpy()))
    files.write_atomic(t2d_path, lambda f: np.save(f, t2d.numpy()))
    return d2t_path, t2d_path
