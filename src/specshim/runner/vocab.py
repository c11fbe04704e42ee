"""``specshim vocab``: the draft vocabulary (``d2t.npy``, ``t2d.npy``) from token frequencies.

The mapping is built by speculators' own ``build_vocab_mappings_from_distribution`` (the most
frequent loss-masked tokens, padded with the lowest ids): ``d2t`` holds offsets
(``target_id = draft_id + d2t[draft_id]``), ``t2d`` a boolean mask over the target vocabulary.
"""

from __future__ import annotations

from pathlib import Path


def check_sizes(draft_vocab_size: int, target_vocab_size: int | None) -> None:
    """Refuse sizes that cannot be right with one line, before a model or data is read."""
    if draft_vocab_size < 1:
        raise ValueError(f"--draft-vocab-size must be at least 1, got {draft_vocab_size}")
    if target_vocab_size is not None and target_vocab_size < 1:
        raise ValueError(f"--target-vocab-size must be at least 1, got {target_vocab_size}")


def check_counts(freq: dict, path: Path, target_vocab_size: int, fix: str) -> None:
    """Refuse counts speculators' mapping cannot take, with one line: a token id or count that
    is not a whole number, a negative count, or an id outside the target vocabulary (counts of
    another model's tokenizer, or a --target-vocab-size too small)."""
    from specshim.runner import stored

    for token, count in freq.items():
        if not (_whole(token) and _whole(count)) or count < 0:
            raise stored.BadFile(
                path, f"holds {token!r}: {count!r} (expected token id: count, whole numbers)", fix
            )
    if freq and not 0 <= min(freq) <= max(freq) < target_vocab_size:
        outside = min(freq) if min(freq) < 0 else max(freq)
        raise ValueError(
            f"{path} counts token id {outside}, outside a "
            f"target vocabulary of {target_vocab_size}: pass the verifier's vocabulary size "
            "(--target-vocab-size, or --model), or extract with that verifier"
        )


def _whole(value: object) -> bool:
    """An int (or a 0-d integer tensor, as torch may save one), not a bool."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, int) and not isinstance(value, bool)


def target_vocab_size(model: str | Path, trust_remote_code: bool = False) -> int:
    """The verifier's vocabulary size, from its config (a multimodal model's text part), the
    model's own code run only with ``trust_remote_code`` (:mod:`specshim.runner.remote_code`).

    A model that cannot be read is one line naming it (transformers' own error, which for a
    missing folder talks about repo ids, is kept as the cause).
    """
    from specshim.runner import remote_code

    try:
        config = remote_code.config(str(model), trust_remote_code)
    except OSError as exc:
        raise ValueError(
            f"--model {model}: no model config could be read (expected a model folder with "
            f"config.json, or a hub id)"
        ) from exc
    return getattr(config, "text_config", config).vocab_size


def build(
    data: Path, draft_vocab_size: int, target_vocab_size: int, out: Path, overwrite: bool = False
) -> tuple[Path, Path]:
    """Write ``d2t.npy`` and ``t2d.npy`` into ``out`` from ``data``'s ``token_freq.pt``.

    Files of those names already in ``out`` are refused unless ``overwrite``, before anything
    is read: they may be the user's own, or the vocabulary a trained draft was built on."""
    import numpy as np

    from specshim.runner import files, stored

    check_sizes(draft_vocab_size, target_vocab_size)
    d2t_path, t2d_path = out / "d2t.npy", out / "t2d.npy"
    if not overwrite and (found := [p.name for p in (d2t_path, t2d_path) if p.exists()]):
        raise ValueError(
            f"{out} already holds {' and '.join(found)}: pass --overwrite to replace them, "
            "or pick another --out"
        )
    if draft_vocab_size > target_vocab_size:
        raise ValueError(
            f"--draft-vocab-size must be at most the target vocabulary ({target_vocab_size}), "
            f"got {draft_vocab_size}"
        )
    freq_path = data / "token_freq.pt"
    if not freq_path.exists():
        raise FileNotFoundError(f"{freq_path} not found: run `specshim extract` into {data} first")
    fix = f"run `specshim extract` with --out {data} again, which writes it anew"
    freq = stored.load_torch(freq_path, "token counts ({token id: count})", fix=fix)
    if not isinstance(freq, dict):
        kind = type(freq).__name__
        raise stored.BadFile(freq_path, f"holds a {kind}, not {{token id: count}}", fix)
    check_counts(freq, freq_path, target_vocab_size, fix)
    import specshim

    specshim.apply()  # speculators' import needs it on transformers 5
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    files.write_atomic(d2t_path, lambda f: np.save(f, d2t.numpy()))
    files.write_atomic(t2d_path, lambda f: np.save(f, t2d.numpy()))
    return d2t_path, t2d_path
