"""What a run keeps and what it redoes in ``--out``: the manifest, the ledger of files in
place, each row's fingerprint, and the files specshim did not write there (module doc of
:mod:`specshim.runner.extraction`)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specshim.runner import dataset, files, stored
from specshim.runner.extraction import options
from specshim.runner.layer_ids import typed

MANIFEST = "specshim_extract.json"


LEDGER = "specshim_extract_done.jsonl"


SAMPLE_FILE = re.compile(r"data_(\d+)\.pt")


#: The files a run writes beside the samples, once every sample is in place.
FINAL_FILES = ("token_freq.pt", "sample_lengths.json", "data_config.json")


#: The manifest's count of the ``data_{i}.pt`` names (i below it) that runs into the folder
#: have written or were writing: such a file that no ledger entry names was put in place by a
#: run killed before it recorded it, and is the folder's own to write again.
CLAIMED = "claimed_samples"


@dataclass
class Plan:
    """What a run has to do in ``out``: the samples to extract, and what was found there."""

    todo: list[dataset.Sample]
    kept: list[files.Entry]
    redone: list[int]
    stale: list[Path]


def settings_for(model: str, data: Path, layers: list[int], max_model_len: int) -> dict[str, Any]:
    """What a resumed run must share with the first one; paths compared resolved."""
    local = Path(model).expanduser()
    return {
        "model": str(local.resolve()) if local.exists() else model,
        "data": str(data.resolve()),
        "layers": layers,
        "max_model_len": max_model_len,
    }


def check_manifest(out: Path, settings: dict[str, Any]) -> int:
    """Refuse an ``out`` that holds an extraction with other settings; return the samples
    its runs claimed (:data:`CLAIMED`; 0 where no run started there)."""
    path = out / MANIFEST
    if not path.exists():
        return 0
    previous = json.loads(path.read_text())

    def as_typed(value: Any) -> str:
        return typed(value) if isinstance(value, list) else str(value)

    changed = [
        f"--{name.replace('_', '-')} {as_typed(value)} (it holds {as_typed(previous.get(name))})"
        for name, value in settings.items()
        if previous.get(name) != value
    ]
    if changed:
        raise options.ExtractionError(
            f"--out {out} holds an extraction with other settings: {'; '.join(changed)}; "
            "use a new --out directory or the same settings to resume"
        )
    return int(previous.get(CLAIMED, 0))


def fingerprint(sample: dataset.Sample, limit: int, settings: dict[str, Any]) -> str:
    """sha256 of what ``data_{i}.pt`` is made from: the row's token ids and loss mask as
    written (truncated to ``limit``), the model and the layer ids."""
    made_from = [settings["model"], settings["layers"], sample.input_ids[:limit]]
    return hashlib.sha256(json.dumps([*made_from, sample.loss_mask[:limit]]).encode()).hexdigest()


def sample_file(sample: dataset.Sample) -> str:
    """The name of ``sample``'s file in the output folder, as speculators 0.3/0.4 name it."""
    return f"data_{sample.index}.pt"


def plan(out: Path, samples: list[dataset.Sample], prints: list[str]) -> Plan:
    """Split ``samples`` into those whose file is kept and those to extract (module doc)."""
    entries = files.Ledger(out / LEDGER).entries()
    todo, kept, redone = [], [], []
    for sample, print_ in zip(samples, prints, strict=True):
        entry = entries.get(sample_file(sample))
        if entry is not None and entry.fingerprint == print_ and entry.still_there(out):
            kept.append(entry)
            continue
        todo.append(sample)
        if (out / sample_file(sample)).exists():
            redone.append(sample.line)
    stale = [
        path
        for path in out.glob("data_*.pt")
        if (m := SAMPLE_FILE.fullmatch(path.name)) and int(m.group(1)) >= len(samples)
    ]
    return Plan(todo, kept, redone, stale)


def not_written_here(out: Path, work: Plan, claimed: int, settings: dict[str, Any]) -> list[str]:
    """The names of the files in ``out`` that this run would replace or remove (samples to
    extract again or beyond the current ones, the final files, temporary files of killed
    writes) and that are not a run's of specshim there, as it wrote them. A sample file is
    only while it holds what was recorded for it: the very file its ledger entry names (size
    and time), or the token ids and loss mask that entry fingerprints (a copied folder); one
    a run claimed (``claimed``) but had not recorded when it was killed, those of its row
    (``settings`` as :func:`fingerprint` takes them). Final files are a folder's where a run
    started, temporary files where their target's name is. Anything else is the user's own,
    or another tool's (a ledger line that names it does not make it specshim's), and not this
    run's to lose."""
    started = (out / MANIFEST).exists()
    recorded = files.Ledger(out / LEDGER).entries()
    rows = {sample_file(s): fingerprint(s, settings["max_model_len"] - 1, settings)
            for s in work.todo}  # fmt: skip

    def named(name: str) -> bool:  # a name a run writes here, whatever the file holds
        if name in (MANIFEST, LEDGER) or name in recorded:
            return True
        if number := SAMPLE_FILE.fullmatch(name):
            return int(number.group(1)) < claimed
        return started and name in FINAL_FILES

    def ours(name: str) -> bool:
        if not SAMPLE_FILE.fullmatch(name):
            return named(name)
        if (entry := recorded.get(name)) is not None:
            return entry.still_there(out) or _written_from(out / name, entry.fingerprint, settings)
        return named(name) and name in rows and _written_from(out / name, rows[name], settings)

    replaced = [sample_file(s) for s in work.todo if (out / sample_file(s)).exists()]
    final = [name for name in FINAL_FILES if (out / name).exists()]
    touched = [path.name for path in work.stale] + replaced + final
    foreign = [name for name in touched if not ours(name)]
    partials = [p.name for p in files.partials(out) if not named(files.partial_target(p.name))]
    return sorted(foreign) + sorted(partials)


def holds(sample: Any, made_from: str, settings: dict[str, Any]) -> bool:
    """Whether ``sample`` (a loaded ``data_{i}.pt``) holds the token ids and loss mask that
    :func:`fingerprint` made ``made_from`` of, with ``settings``: over the ids alone, the
    hidden states stay unread. Anything that is not a sample holds none."""
    try:
        ids, mask = sample["input_ids"].tolist(), sample["loss_mask"].tolist()
    except (TypeError, KeyError, IndexError, AttributeError):
        return False
    made = dataset.Sample(index=0, line=0, input_ids=ids, loss_mask=mask)
    return fingerprint(made, len(ids), settings) == made_from


def _written_from(path: Path, made_from: str, settings: dict[str, Any]) -> bool:
    """:func:`holds` of the sample file ``path``, memory-mapped; a file that does not load
    holds nothing."""
    try:
        return holds(stored.load_torch(path, "a sample", mmap=True), made_from, settings)
    except stored.BadFile:
        return False
