"""Prepare, on the CPU, what benchmarks/gpu_train.sh trains from on the GPU.

Builds a tiny Llama (8 layers, hidden 512), 40 prompts of 200-250 random token ids, extracts
their hidden states through specshim + speculators on vLLM's CPU build, builds the draft
vocabulary, and writes a stripped verifier (config and the three tensors EAGLE-3 training
loads: embeddings, lm_head, final norm) so that everything fits in one device transfer.

    PYTHONPATH=.spec/0.4.0.1 .venv/bin/python benchmarks/gpu_prepare.py [--root .gpu]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

KEEP = ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")


def strip_verifier(model: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(model / "config.json", out / "config.json")
    weights = load_file(model / "model.safetensors")
    save_file({k: weights[k] for k in KEEP}, out / "model.safetensors", metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path(".gpu"))
    args = parser.parse_args()
    from specshim.testbed import tiny_model

    model = args.root / "model"
    if not (model / "config.json").exists():
        tiny_model.build(model, "llama", num_layers=8, hidden_size=512, seed=1)
    rng = random.Random(0)
    data = args.root / "data.jsonl"
    rows = [[rng.randrange(8, 384) for _ in range(rng.randint(200, 250))] for _ in range(40)]
    data.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    cli = [sys.executable, "-m", "specshim.cli"]
    hidden = str(args.root / "hidden")
    subprocess.run([*cli, "extract", "--model", str(model), "--data", str(data), "--out", hidden,
                    "--max-model-len", "256"], check=True)  # fmt: skip
    subprocess.run([*cli, "vocab", "--data", hidden, "--draft-vocab-size", "256",
                    "--model", str(model)], check=True)  # fmt: skip
    strip_verifier(model, args.root / "verifier")


if __name__ == "__main__":
    main()
