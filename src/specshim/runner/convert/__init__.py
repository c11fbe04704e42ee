"""``specshim convert``: training data between speculators 0.3/0.4 and speculators >= 0.5.

The same samples in two layouts:

* **0.3/0.4**, what ``specshim extract`` and speculators' own generator write:
  ``data_{i}.pt`` holding ``input_ids`` (``[seq]`` int64), ``hidden_states`` (a list of
  ``[seq, hidden]`` tensors, one per layer id) and ``loss_mask`` (``[seq]`` int64), beside
  ``sample_lengths.json``, ``token_freq.pt`` and ``data_config.json`` (whose
  ``hidden_states.layer_ids`` names the layers).
* **>= 0.5**, what speculators 0.9.0's ``ArrowDataset`` reads (``speculators prepare-data``
  and ``generate-offline-data`` write it): a dataset saved by ``datasets``' ``save_to_disk``
  with the columns ``input_ids``, ``loss_mask`` and ``seq_len`` in torch format, and for row
  i ``hidden_states/hs_{i}.safetensors`` holding ``hidden_states`` (``[seq, layers,
  hidden]``) and ``token_ids`` (``[seq]``, the row's ids); ``token_freq.pt`` beside it.

Layer ids. The two generations number the same tensor differently: >= 0.5 takes vLLM's
numbering (:mod:`specshim.runner.layer_ids`), so the generator's last layer ``n - 1`` is vLLM's
``n`` (the last layer speculators' launch_vllm.py appends). Both store the layers in the same order
(the auxiliary layers, then the last one, which both trainers take as the verifier's last hidden
state), so a conversion moves every tensor unchanged, bit for bit, and renumbers only the ids.
speculators >= 0.5 then trains on the converted data with ``--target-layer-ids`` set to the vLLM ids
without the last one.

Where the ids come from: a 0.3/0.4 folder names them in ``data_config.json``; a >= 0.5
folder does not record them, except one written by this module, whose ``specshim_convert.json``
keeps them (and the 0.3/0.4 ``data_config.json``, so that a round trip gives it back); for any
other source ``--layers`` gives them, in the source's own numbering. Either way they are taken
in ascending order, the order every generator stores the layers in (a ``data_config.json`` that
lists them in another order, as speculators 0.3/0.4's generator writes what it was given, is
read and kept ascending).

Streaming: one sample's tensors are in memory at a time; what is kept per sample is a ledger
line and two short lists of token ids while they are counted. Resume: every file is written
atomically and recorded, once in place, in ``specshim_convert_done.jsonl`` with a
fingerprint of what it was made from (the source files' name, size and modification time, the
row's token ids and loss mask, the layer ids); a rerun keeps a file only when both still
match, converts the rest, and removes sample files beyond the source's count. The small
files (the Arrow dataset, ``sample_lengths.json``, ``token_freq.pt``, ``data_config.json``)
are rebuilt by every run once all samples are in place.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim.runner import files, out_lock
from specshim.runner.convert.read import ArrowSource, LegacySource
from specshim.runner.convert.samples import (
    ARROW,
    LEDGER,
    LEGACY,
    MANIFEST,
    ConversionError,
    detect,
    json_field,
)
from specshim.runner.convert.write import ArrowDest, LegacyDest
from specshim.runner.layer_ids import vllm_ids
from specshim.runner.progress import Progress


@dataclass
class Summary:
    """What :func:`convert` did, for ``specshim convert`` to print: the direction, ``out``, the
    source's sample count (``written`` converted by this run, ``kept`` from an earlier one),
    the sample files ``removed`` beyond that count, and the speculators 0.3/0.4 layer ids."""

    direction: str
    out: Path
    samples: int
    written: int
    kept: int
    removed: int
    generator_ids: list[int]

    def text(self) -> str:
        """The lines ``specshim convert`` prints: the counts, the layer ids in both numberings,
        and how to train on ``out`` with the release that reads it."""
        vllm = vllm_ids(self.generator_ids)
        lines = [
            f"{self.direction}: {self.samples} samples ({self.written} converted, "
            f"{self.kept} already done)",
            f"layer ids: speculators 0.3/0.4 {self.generator_ids} = vLLM {vllm}",
        ]
        if self.removed:
            lines.append(f"removed sample files beyond the source's samples: {self.removed}")
        if self.direction.endswith(ARROW):
            ids = [str(k) for k in vllm[:-1]]
            command = ["speculators", "train", "--data-path", str(self.out),
                       "--target-layer-ids", *ids, "--on-missing", "raise"]  # fmt: skip
            lines.append(f"train with speculators >= 0.5: {shlex.join(command)} ...")
        else:
            command = ["specshim", "train", "--data", str(self.out)]
            lines.append(f"train with speculators 0.3/0.4: {shlex.join(command)} ...")
        return "\n".join(lines)


def _check_out(out: Path, manifest: dict[str, Any]) -> None:
    """Refuse an ``--out`` that holds another conversion, or holds files this command did
    not write; a folder holding this same conversion is resumed."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConversionError(f"--out {out} is a file, expected a folder")
    earlier, _ = json_field(out / MANIFEST, "generator_layer_ids")
    if earlier is None and out_lock.contents(out):
        raise ConversionError(
            f"--out {out} is not empty and holds no {MANIFEST}: pass an empty or new folder"
        )
    if earlier is not None and earlier != manifest:
        raise ConversionError(
            f"--out {out} holds a conversion of other data or layer ids "
            f"(from {earlier.get('source')}): pass another folder"
        )


def convert(
    data: Path, out: Path, layers: list[int] | None = None, progress: bool = True
) -> Summary:
    """Convert the folder ``data`` into the other layout in ``out`` (see the module doc),
    resuming what an earlier run of the same conversion left there. ``data`` is held for
    reading (:func:`out_lock.held`, shared) throughout: an extraction into it meanwhile
    stops this one, or is stopped."""
    if out.resolve() == data.resolve():
        raise ConversionError(f"--out {out} is --data itself: pass another folder")
    with out_lock.held(data, "convert", "--data", shared=True):
        kind = detect(data)
        source: LegacySource | ArrowSource
        dest: LegacyDest | ArrowDest
        if kind == LEGACY:
            source, dest = LegacySource(data, layers), ArrowDest(out)
        else:
            source, dest = ArrowSource(data, layers), LegacyDest(out)
        manifest = {
            "direction": dest.direction,
            "source": str(data.resolve()),
            "generator_layer_ids": source.generator_ids,
            "vllm_layer_ids": vllm_ids(source.generator_ids),
            "data_config": source.data_config if kind == LEGACY else None,
        }
        _check_out(out, manifest)
        dest.directory.mkdir(parents=True, exist_ok=True)
        files.save_json(out / MANIFEST, manifest)
        files.remove_partials(dest.directory)
        written, kept, removed = _convert_samples(source, dest, out, progress)

        dest.finish(source, (source.row(i) for i in range(source.count)))
        return Summary(
            dest.direction, out, source.count, written, kept, removed, source.generator_ids
        )


def _convert_samples(
    source: LegacySource | ArrowSource,
    dest: LegacyDest | ArrowDest,
    out: Path,
    progress: bool,
) -> tuple[int, int, int]:
    """Write every sample file ``dest`` lacks, one sample at a time; return how many were
    written, kept from an earlier run, and removed (beyond the source's count)."""
    ledger = files.Ledger(out / LEDGER)
    entries = ledger.entries()
    kept: list[files.Entry] = []
    todo: list[tuple[int, str]] = []
    for i in range(source.count):
        print_ = source.fingerprint(i)
        entry = entries.get(dest.name(i))
        if entry and entry.fingerprint == print_ and entry.still_there(dest.directory):
            kept.append(entry)
        else:
            todo.append((i, print_))
    stale = [i for i in dest.existing() if i >= source.count]
    for i in stale:
        (dest.directory / dest.name(i)).unlink()
    ledger.keep(kept)
    need = sum(path.stat().st_size for i, _ in todo if (path := source.file(i)).exists())
    if free := files.room_short(dest.directory, need):
        raise ConversionError(
            f"--out {out}: the {len(todo):,} samples to convert need about "
            f"{files.size(need)} (their files' size in --data), and {free}: free some space or "
            "choose another --out"
        )
    bar = Progress(total=len(todo), label="convert", visible=progress)
    for i, print_ in todo:
        sample = source.load(i)
        path = dest.directory / dest.name(i)
        dest.write(path, sample)
        ledger.record(path, print_)
        bar.update(1, sample.input_ids.shape[0])
    bar.finish()
    return len(todo), len(kept), len(stale)
