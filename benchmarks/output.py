"""Output: bytes per token and write throughput of `specshim extract`'s files, against a plain
`torch.save` of the same tensors.

Each record has the shape speculators' trainer reads (``input_ids``, one bf16 tensor per
captured layer, ``loss_mask``). It is written the runner's way (``files.save_torch``: a
temporary file, fsync, rename, so a killed run never leaves half a sample) and with
``torch.save`` straight to its path, alternately, ``--records`` times each; medians.

    .venv/bin/python benchmarks/output.py [--records 30] [--tokens 512]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import save_results

from specshim.runner import files

HIDDEN = {"tiny Llama (hidden 128)": 128, "Llama-8B-shaped (hidden 4096)": 4096}
LAYERS = 4


def record(tokens: int, hidden: int) -> dict[str, object]:
    return {
        "input_ids": torch.randint(0, 32000, (tokens,)),
        "hidden_states": [torch.randn(tokens, hidden, dtype=torch.bfloat16) for _ in range(LAYERS)],
        "loss_mask": torch.ones(tokens, dtype=torch.long),
    }


def payload_bytes(rec: dict) -> int:
    tensors = [rec["input_ids"], rec["loss_mask"], *rec["hidden_states"]]
    return sum(t.numel() * t.element_size() for t in tensors)


def timed_write(write, path: Path) -> float:
    start = time.perf_counter()
    write(path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specshim-output-"))
    paths = {
        "torch.save": lambda rec: lambda p: torch.save(rec, p),
        "specshim (atomic)": lambda rec: lambda p: files.save_torch(p, rec),
    }
    table = {}
    print(
        f"{'record':<32}{'path':<20}{'MB/s':>9}{'bytes/token':>13}"
        f"{'file/payload':>14}{'vs torch.save':>15}"
    )
    for label, hidden in HIDDEN.items():
        rec = record(args.tokens, hidden)
        payload = payload_bytes(rec)
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        sizes: dict[str, int] = {}
        for i in range(args.records):
            for name, make in paths.items():
                path = work / f"{name.split()[0]}-{hidden}-{i}.pt"
                seconds[name].append(timed_write(make(rec), path))
                sizes[name] = path.stat().st_size
                path.unlink()
        rates = {name: sizes[name] / statistics.median(s) / 1e6 for name, s in seconds.items()}
        table[label] = {}
        for name in paths:
            entry = {
                "megabytes_per_second": rates[name],
                "bytes_per_token": sizes[name] / args.tokens,
                "file_over_payload": sizes[name] / payload,
                "ratio": rates[name] / rates["torch.save"],
            }
            table[label][name] = entry
            print(
                f"{label:<32}{name:<20}{rates[name]:>9,.0f}{entry['bytes_per_token']:>13,.0f}"
                f"{entry['file_over_payload']:>14.4f}{entry['ratio']:>15.3f}"
            )
    save_results("output", table)


if __name__ == "__main__":
    main()
