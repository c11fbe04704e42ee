"""The sources of ``specshim convert``: a speculators 0.3/0.4 folder or a speculators >= 0.5
one, read one sample at a time, each sample checked as it is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import stored
from specshim.runner.convert.samples import (
    FP8_SCALES,
    HIDDEN_STATES,
    LEGACY_FILE,
    MANIFEST,
    ConversionError,
    Sample,
    check_sample,
    contiguous,
    file_stamp,
    fingerprint_of,
    given_ids,
    json_field,
)
from specshim.runner.layer_ids import generator_ids, vllm_ids


class LegacySource:
    """A speculators 0.3/0.4 folder, read one ``data_{i}.pt`` at a time."""

    def __init__(self, folder: Path, layers: list[int] | None) -> None:
        self.folder = folder
        self.count = contiguous(folder, LEGACY_FILE, "data_{}.pt")
        path = folder / "data_config.json"
        self.data_config, recorded = json_field(path, "hidden_states", "layer_ids")
        self.generator_ids = given_ids(
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
        return fingerprint_of(file_stamp(self.file(i)), self.generator_ids)

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
        check_sample(sample, str(path), len(self.generator_ids))
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
        manifest, recorded = json_field(folder / MANIFEST, "generator_layer_ids")
        self.vllm = given_ids(
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
        stamp = file_stamp(path) if path.exists() else None  # a missing file fails in load()
        return fingerprint_of(stamp, ids.tolist(), mask.tolist(), self.vllm)

    def load(self, i: int) -> Sample:
        """Row ``i`` with the states of ``hs_{i}.safetensors``, one ``[seq, hidden]`` tensor per
        layer. A file that is missing, unreadable or FP8-quantized, states not
        ``[seq, layers, hidden]``, or ``token_ids`` other than the row's ``input_ids`` raise
        :class:`ConversionError`, as does any part :func:`check_sample` refuses."""
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
        check_sample(sample, str(path), len(self.vllm))
        return sample
