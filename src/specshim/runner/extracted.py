"""An extraction folder as training reads it: one complete extraction, or one line saying
which of its files are missing or wrong.

speculators' dataset loads a sample only when its batch comes, so a damaged or foreign
``data_{i}.pt`` stops a run steps in, and a missing one is never noticed (it trains on what
is there). A complete extraction names the same samples three ways: ``sample_lengths.json``
(written last, with each sample's token count, which speculators packs batches by), the
resume ledger (an entry for each file written whole; absent in a folder speculators' own
generator wrote) and the ``data_{i}.pt`` files themselves. Each file must load, memory-mapped
(under a millisecond), and hold the layers of the first, of its hidden size, one state per
token ``sample_lengths.json`` records. Where the ledger and the manifest are there, a file
must also hold the token ids and loss mask its ledger entry fingerprints (another sample's
file copied over it has the same shape and length); file times are not compared, as a copy
of the folder changes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import files, stored
from specshim.runner.extraction.resume import LEDGER, MANIFEST, SAMPLE_FILE, holds

LENGTHS = "sample_lengths.json"
#: What a sample file holds (``dataset.record``).
KEYS = frozenset({"input_ids", "hidden_states", "loss_mask"})
#: Files a refusal names; the rest are counted.
SHOWN = 3


def sample_lengths(data: Path) -> dict[int, int]:
    """``data/sample_lengths.json``: each sample's index and token count."""
    path = data / LENGTHS
    fix = f"expected {{index: tokens}}: run `specshim extract` with --out {data} again"
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        lengths = {int(i): n for i, n in recorded.items()}
    except (OSError, ValueError, AttributeError, RecursionError) as exc:
        raise stored.BadFile(path, f"cannot be read ({console.first_line(exc)})", fix) from None
    if not (lengths and all(type(n) is int and n > 0 for n in lengths.values())):
        raise stored.BadFile(
            path, "names no samples, or a count that is not a positive integer", fix
        )
    return lengths


def sample_files(data: Path) -> list[Path]:
    """The sample files ``sample_lengths.json`` names, in index order (what training reads)."""
    return [data / f"data_{i}.pt" for i in sorted(sample_lengths(data))]


def _shape(sample: Any) -> tuple[int, int, int]:
    """(layers, hidden size, tokens) of a loaded sample; ``ValueError`` saying what is wrong."""
    import torch

    if not (isinstance(sample, dict) and sample.keys() >= KEYS):
        raise ValueError(f"holds no {', '.join(sorted(KEYS))}")
    states, ids, mask = sample["hidden_states"], sample["input_ids"], sample["loss_mask"]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in (ids, mask)):
        raise ValueError("input_ids or loss_mask is not a 1-D tensor")
    tokens = len(ids)
    if len(mask) != tokens:
        raise ValueError(f"{len(mask)} loss mask entries for {tokens} input ids")
    if not (isinstance(states, list | tuple) and states):
        raise ValueError("hidden_states is not a list of tensors")
    shapes = {tuple(s.shape) if isinstance(s, torch.Tensor) else () for s in states}
    if len(shapes) != 1 or len(shape := shapes.pop()) != 2 or shape[0] != tokens:
        raise ValueError(f"hidden_states are not one [{tokens}, hidden] tensor a layer")
    return len(states), shape[1], tokens


def _problems(data: Path, lengths: dict[int, int]) -> dict[str, str]:
    """What is wrong with each sample file that is, by file name."""
    named = {f"data_{i}.pt": i for i in lengths}
    problems: dict[str, str] = {}
    recorded = files.Ledger(data / LEDGER).entries()
    settings = _recorded_settings(data)
    for name in recorded:
        if name not in named:
            problems[name] = f"recorded in {LEDGER} but not in {LENGTHS}"
    for path in data.glob("data_*.pt"):
        if SAMPLE_FILE.fullmatch(path.name) and path.name not in named:
            problems.setdefault(path.name, f"not in {LENGTHS}")
    first: tuple[str, int, int] | None = None  # (name, layers, hidden) of the first good file
    for name, index in sorted(named.items(), key=lambda item: item[1]):
        try:
            sample = stored.load_torch(data / name, "a sample", mmap=True)
            layers, hidden, tokens = _shape(sample)
        except stored.BadFile as exc:
            problems[name] = exc.problem
            continue
        except ValueError as exc:
            problems[name] = str(exc)
            continue
        first = first or (name, layers, hidden)
        if (layers, hidden) != first[1:]:
            problems[name] = (
                f"{layers} layers of hidden size {hidden} ({first[0]}: {first[1]} of {first[2]})"
            )
        elif tokens != lengths[index]:
            problems[name] = f"{tokens} tokens, {LENGTHS} records {lengths[index]}"
        elif (
            settings
            and name in recorded
            and not holds(sample, recorded[name].fingerprint, settings)
        ):
            problems[name] = "holds other tokens than extract recorded for it"
    return problems


def _recorded_settings(data: Path) -> dict[str, Any] | None:
    """The settings ``data/specshim_extract.json`` holds, which the ledger's fingerprints
    hash; None where there is no readable one (a folder extract did not write)."""
    try:
        settings = json.loads((data / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return (
        settings if isinstance(settings, dict) and settings.keys() >= {"model", "layers"} else None
    )


def _index(name: str) -> int:
    """The sample index in a file's name (-1 for another name), to list files in order."""
    match = SAMPLE_FILE.fullmatch(name)
    return int(match.group(1)) if match else -1


def check(data: Path) -> list[Path]:
    """The sample files of ``data``, once it holds one complete extraction (module doc);
    else ``ValueError``, one line naming the first :data:`SHOWN` files that are missing or
    wrong and how many there are."""
    lengths = sample_lengths(data)
    problems = _problems(data, lengths)
    if problems:
        order = sorted(problems, key=_index)
        shown = "; ".join(f"{name}: {problems[name]}" for name in order[:SHOWN])
        more = f"; and {len(order) - SHOWN} more" if len(order) > SHOWN else ""
        count = f"{len(order)} sample file{'s are' if len(order) > 1 else ' is'}"
        raise ValueError(
            f"--data {data} is not one complete extraction: {count} missing or wrong "
            f"({shown}{more}): delete the wrong ones and run `specshim extract` with --out "
            f"{data} and the same arguments again, which extracts just those"
        )
    return sample_files(data)
