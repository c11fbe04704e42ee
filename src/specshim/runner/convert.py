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

import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import files, out_lock, stored
from specshim.runner.dataset import record as sample_record
from specshim.runner.layer_ids import ascending, generator_ids, typed, vllm_ids
from specshim.runner.progress import Progress

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


def _fingerprint(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stamp(path: Path) -> list[Any]:
    """A file's name, size and modification time: what a fingerprint records of a source
    file without reading it (a file rewritten since has another size or time)."""
    stat = path.stat()
    return [path.name, stat.st_size, stat.st_mtime_ns]


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    return sorted(int(m[1]) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)))


def _contiguous(folder: Path, pattern: re.Pattern[str], name: str) -> int:
    """How many files ``name.format(i)`` there are, refusing a gap (a sample missing)."""
    found = _numbered(folder, pattern)
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
    legacy = bool(_numbered(folder, LEGACY_FILE))
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


def _given_ids(
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


class LegacySource:
    """A speculators 0.3/0.4 folder, read one ``data_{i}.pt`` at a time."""

    def __init__(self, folder: Path, layers: list[int] | None) -> None:
        self.folder = folder
        self.count = _contiguous(folder, LEGACY_FILE, "data_{}.pt")
        path = folder / "data_config.json"
        self.data_config, recorded = _json_field(path, "hidden_states", "layer_ids")
        self.generator_ids = _given_ids(
            recorded, layers, path, "the speculators 0.3/0.4 ids the data was extracted at"
        )
        if self.data_config is not None:  # kept for the round trip, in the one order
            self.data_config["hidden_states"]["layer_ids"] = self.generator_ids

    def file(self, i: int) -> Path:
        """Sample ``i``'s file."""
        return self.folder / f"data_{i}.pt"

    def fingerprint(self, i: int) -> str:
        """What sample ``i`` is converted from: ``data_{i}.pt``'s name, size and modification
        time (the file is not read) and the layer ids."""
        return _fingerprint(_stamp(self.file(i)), self.generator_ids)

    def load(self, i: int) -> Sample:
        """``data_{i}.pt``, memory-mapped: its states are read from disk only when used."""
        path = self.file(i)
        holds = "speculators 0.3/0.4 data (input_ids, hidden_states, loss_mask)"
        data = stored.load_torch(path, holds, mmap=True)
        try:
            sample = Sample(data["input_ids"], data["loss_mask"], list(data["hidden_states"]))
        except Exception as exc:  # noqa: BLE001 a foreign file: name it, say what was expected
            raise ConversionError(
                f"{path}: could not be loaded as {holds}: {console.first_line(exc)}"
            ) from None
        _check(sample, str(path), len(self.generator_ids))
        return sample

    def row(self, i: int) -> tuple[Any, Any]:
        """Sample ``i``'s token ids and loss mask."""
        sample = self.load(i)
        return sample.input_ids, sample.loss_mask


class ArrowSource:
    """A speculators >= 0.5 folder: the Arrow dataset's rows and one ``hs_{i}.safetensors``
    per row, read one at a time."""

    def __init__(self, folder: Path, layers: list[int] | None) -> None:
        from datasets import Dataset, load_from_disk

        self.folder = folder
        self.states_dir = folder / HIDDEN_STATES
        try:
            dataset = load_from_disk(str(folder))
        except Exception as exc:  # noqa: BLE001 datasets' own errors have no common base
            raise ConversionError(
                f"--data {folder}: the Arrow dataset: {console.first_line(exc)}"
            ) from None
        missing = {"input_ids", "loss_mask"} - set(getattr(dataset, "column_names", []))
        if not isinstance(dataset, Dataset) or missing:
            raise ConversionError(
                f"--data {folder}: expected one dataset with input_ids and loss_mask columns"
            )
        self.rows = dataset.with_format("torch")
        self.count = len(dataset)
        manifest, recorded = _json_field(folder / MANIFEST, "generator_layer_ids")
        self.vllm = _given_ids(
            recorded and vllm_ids(recorded),
            layers,
            folder / MANIFEST,
            "vLLM's ids as vLLM was launched (eagle_aux_hidden_state_layer_ids, the last "
            "layer included)",
        )
        self.generator_ids = generator_ids(self.vllm)
        #: the 0.3/0.4 data_config.json an earlier conversion kept (None: none was kept)
        self.data_config = manifest and manifest.get("data_config")

    def row(self, i: int) -> tuple[Any, Any]:
        """Row ``i``'s token ids and loss mask."""
        row = self.rows[i]
        return row["input_ids"], row["loss_mask"]

    def file(self, i: int) -> Path:
        """Row ``i``'s states file."""
        return self.states_dir / f"hs_{i}.safetensors"

    def fingerprint(self, i: int) -> str:
        """What row ``i`` is converted from: ``hs_{i}.safetensors``'s name, size and
        modification time (None when it is missing, which :meth:`load` refuses), the row's
        token ids and loss mask, and the layer ids."""
        ids, mask = self.row(i)
        path = self.file(i)
        stamp = _stamp(path) if path.exists() else None  # a missing file fails in load()
        return _fingerprint(stamp, ids.tolist(), mask.tolist(), self.vllm)

    def load(self, i: int) -> Sample:
        """Row ``i`` with the states of ``hs_{i}.safetensors``, one ``[seq, hidden]`` tensor per
        layer. A file that is missing, unreadable or FP8-quantized, states not
        ``[seq, layers, hidden]``, or ``token_ids`` other than the row's ``input_ids`` raise
        :class:`ConversionError`, as does any part :func:`_check` refuses."""
        from safetensors.torch import load_file

        path = self.file(i)
        if not path.exists():
            raise ConversionError(f"{path} is missing: row {i} of {self.folder} has no states")
        try:
            data = load_file(path)
            states, token_ids = data["hidden_states"], data["token_ids"]
        except Exception as exc:  # noqa: BLE001 a truncated or foreign file: name it
            raise ConversionError(
                f"{path}: could not be loaded as speculators >= 0.5 hidden states "
                f"(hidden_states, token_ids): {console.first_line(exc)}"
            ) from None
        if FP8_SCALES in data:
            raise ConversionError(
                f"{path}: FP8-quantized states (hs_connectors' fp8 backend) are not supported: "
                "generate with the file backend"
            )
        ids, mask = self.row(i)
        if states.dim() != 3:
            raise ConversionError(
                f"{path}: hidden_states has shape {list(states.shape)}, expected "
                "[seq, layers, hidden]"
            )
        if token_ids.tolist() != ids.tolist():
            raise ConversionError(f"{path}: token_ids differ from row {i}'s input_ids")
        sample = Sample(token_ids, mask, list(states.unbind(1)))
        _check(sample, str(path), len(self.vllm))
        return sample


def _check(sample: Sample, where: str, layers: int) -> None:
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
        return _numbered(self.directory, LEGACY_FILE)

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
        return _numbered(self.directory, ARROW_FILE) if self.directory.is_dir() else []

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


def _json_field(path: Path, *keys: str) -> tuple[dict[str, Any] | None, list[int] | None]:
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


def _check_out(out: Path, manifest: dict[str, Any]) -> None:
    """Refuse an ``--out`` that holds another conversion, or holds files this command did
    not write; a folder holding this same conversion is resumed."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConversionError(f"--out {out} is a file, expected a folder")
    earlier, _ = _json_field(out / MANIFEST, "generator_layer_ids")
    if earlier is None and any(p.name != out_lock.LOCK_FILE for p in out.iterdir()):
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
