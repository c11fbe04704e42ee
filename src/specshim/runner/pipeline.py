"""``specshim run``: the whole pipeline on a built-in default, from a clean directory.

Builds a tiny Llama model and a small chat dataset locally, extracts hidden states through
the real vLLM and speculators (patched by specshim), builds the draft vocabulary and trains an
EAGLE-3 draft through speculators' trainer.
"""

from __future__ import annotations

import sys
from pathlib import Path


def run(workdir: Path, max_model_len: int = 256) -> int:
    from specshim.runner import extract, vocab
    from specshim.testbed import data, tiny_model

    model = workdir / "model"
    if not (model / "config.json").exists():
        tiny_model.build(model, "llama")
    dataset = data.write(workdir / "data.jsonl")
    print(f"[specshim run] model {model}, data {dataset}", file=sys.stderr)
    summary = extract.extract(
        str(model), dataset, workdir / "hidden_states", max_model_len=max_model_len
    )
    print(summary.text())
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(model).vocab_size
    d2t, t2d = vocab.build(workdir / "hidden_states", min(128, target), target, workdir)
    print(f"vocabulary: {d2t}, {t2d}")
    from specshim.runner import train

    result = train.train(
        workdir / "hidden_states", str(model), workdir / "draft", vocab=workdir, max_len=512
    )
    print(result.text())
    return 0
