"""``specshim train``'s options and inputs, checked before anything is loaded or written;
a bad one is one ``ValueError`` line naming it."""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import extracted, remote_code, stored

#: What speculators' training reads (speculators/train/data.py, standardize_data_v1).
AUX_LAYERS = 3
DTYPES = ("float32", "bfloat16")
DEVICES = ("cpu", "cuda")


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


def resolved(path: str | Path) -> str:
    """``path`` made absolute, as :class:`Settings` records and compares it."""
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


def choose_device(device: str | None) -> str:
    """The device to train on: ``cuda`` if there is one, unless the caller chose."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here; pass --device cpu")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_verifier(verifier: str, trust_remote_code: bool) -> None:
    """Refuse, before ``--out`` is touched, a verifier whose config cannot be read, or that only
    its own code reads and ``trust_remote_code`` is off (:mod:`specshim.runner.remote_code`)."""
    try:
        remote_code.config(verifier, trust_remote_code)
    except OSError as exc:
        raise ValueError(
            f"--verifier {verifier}: no model config could be read ({console.first_line(exc)})"
        ) from None
