"""What both layouts of ``specshim convert`` share: their names and files, a sample in neither
layout, and the checks a folder, its layer ids and every sample pass before anything is written."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner.layer_ids import ascending, typed

LEGACY = "speculators 0.3/0.4"
ARROW = "speculators >= 0.5"
MANIFEST = "specshim_convert.json"
LEDGER = "specshim_convert_done.jsonl"
HIDDEN_STATES = "hidden_states"
LEGACY_FILE = re.compile(r"data_(\d+)\.pt")
ARROW_FILE = re.compile(r"hs_(\d+)\.safetensors")
#: What ``datasets``' ``save_to_disk`` writes beside the Arrow shards.
ARROW_META = ("dataset_info.json", "state.json")
STAGING = ".specshim_arrow.tmp"
#: The per-token scales hs_connectors' FP8 backend stores beside quantized states.
FP8_SCALES = "hidden_states_scales"


class ConversionError(ValueError):
    """Bad input or output for ``specshim convert``; its message is the one line to show."""


@dataclass
class Sample:
    """One sample in neither layout: token ids, loss mask and one ``[seq, hidden]`` tensor per
    layer, in the order of the layer ids."""

    input_ids: Any
    loss_mask: Any
    states: list[Any]


def fingerprint_of(*parts: Any) -> str:
    """A hash of ``parts`` (JSON): what the ledger records of what a sample file was made from."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def file_stamp(path: Path) -> list[Any]:
    """A file's name, size and modification time: what a fingerprint records of a source
    file without reading it (a file rewritten since has another size or time)."""
    stat = path.stat()
    return [path.name, stat.st_size, stat.st_mtime_ns]


def numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    """The numbers of the files in ``folder`` whose names match ``pattern``, sorted."""
    return sorted(int(m[1]) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)))


def contiguous(folder: Path, pattern: re.Pattern[str], name: str) -> int:
    """How many files ``name.format(i)`` there are, refusing a gap (a sample missing)."""
    found = numbered(folder, pattern)
    for i, got in enumerate(found):
        if got != i:
            raise ConversionError(
                f"{folder / name.format(i)} is missing (expected {name.format(0)} to "
                f"{name.format(found[-1])} with no gap)"
            )
    return len(found)


def detect(folder: Path) -> str:
    """:data:`LEGACY` or :data:`ARROW`, from the files ``folder`` holds."""
    if not folder.is_dir():
        raise ConversionError(f"--data {folder}: no such folder")
    legacy = bool(numbered(folder, LEGACY_FILE))
    arrow = all((folder / meta).is_file() for meta in ARROW_META)
    if legacy and arrow:
        raise ConversionError(f"--data {folder} holds both data_{{i}}.pt and an Arrow dataset")
    if legacy:
        return LEGACY
    if arrow:
        return ARROW
    raise ConversionError(
        f"--data {folder} is neither {LEGACY} data (data_{{i}}.pt files) nor {ARROW} data (an "
        f"Arrow dataset saved by datasets, with {HIDDEN_STATES}/hs_{{i}}.safetensors)"
    )


def given_ids(
    recorded: list[int] | None, given: list[int] | None, where: Path, numbering: str
) -> list[int]:
    """The source's layer ids, ascending (the order its files hold the layers in, whatever
    order a ``data_config.json`` lists them in: :mod:`specshim.runner.layer_ids`): those
    ``where`` records, else ``--layers`` (in ``numbering``); both must name the same ids."""
    if given is not None:
        given = ascending(given, "--layers")
    if recorded is not None:
        recorded = ascending(recorded, str(where))
    if recorded is not None and given is not None and recorded != given:
        raise ConversionError(
            f"--layers {typed(given)} differs from the ids {where} records: {typed(recorded)}"
        )
    ids = recorded if recorded is not None else given
    if ids is None:
        raise ConversionError(
            f"{where.parent} records no layer ids (no {where.name}): pass --layers, {numbering}"
        )
    if len(ids) < 2:
        raise ConversionError(f"layer ids {typed(ids)}: expected two or more distinct ids")
    return ids


def check_sample(sample: Sample, where: str, layers: int) -> None:
    """Refuse a sample whose parts do not fit: one id per token, a mask as long, one
    ``[seq, hidden]`` state per layer id, all of one hidden size and dtype."""
    import torch

    ids, mask, states = sample.input_ids, sample.loss_mask, sample.states
    if not all(isinstance(t, torch.Tensor) for t in [ids, mask, *states]) or not states:
        raise ConversionError(f"{where}: expected tensors for input_ids, loss_mask and states")
    if ids.dim() != 1 or ids.is_floating_point():
        raise ConversionError(f"{where}: input_ids has shape {list(ids.shape)}, expected [seq]")
    seq = ids.shape[0]
    if list(mask.shape) != [seq]:
        raise ConversionError(f"{where}: loss_mask has shape {list(mask.shape)}, expected [{seq}]")
    if len(states) != layers:
        raise ConversionError(f"{where}: {len(states)} layers of states for {layers} layer ids")
    hidden, dtype = states[0].shape[-1], states[0].dtype
    for k, state in enumerate(states):
        if list(state.shape) != [seq, hidden] or state.dtype != dtype:
            raise ConversionError(
                f"{where}: layer {k}'s states are {list(state.shape)} {state.dtype}, expected "
                f"[{seq}, {hidden}] {dtype}"
            )


def json_field(path: Path, *keys: str) -> tuple[dict[str, Any] | None, list[int] | None]:
    """The JSON object in ``path`` and its list of ids at ``keys``; (None, None) when there is
    no such file, one line naming the file and the field when it does not hold them."""
    if not path.exists():
        return None, None
    field = ".".join(keys)
    try:
        whole = json.loads(path.read_text())
        value: Any = whole
        for key in keys:
            value = value[key]
        return whole, [int(k) for k in value]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConversionError(
            f"{path}: expected JSON with a list of layer ids at {field} ({console.first_line(exc)})"
        ) from None
