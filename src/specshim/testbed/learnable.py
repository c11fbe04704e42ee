"""A tiny verifier worth drafting for: a Llama trained for minutes on a learnable corpus.

A verifier with random weights gives every draft zero acceptance, so acceptance would prove
nothing. This one learns counting, countdowns, repeated patterns, templated sentences and
(imperfectly, but deterministically) small sums, so its greedy continuations are predictable
and a draft trained on its hidden states can be accepted.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

from specshim import console

ANIMALS = ("cat", "dog", "fox", "bird", "cow")
COLORS = ("red", "blue", "green", "brown", "white")
PLACES = ("mat", "box", "tree", "house", "hill")
PATTERNS = ("a b c", "x y", "one two three", "up down", "red green blue")

#: Fixed prompts the verifier continues greedily in ``specshim eval``.
PROMPTS = (
    "count : 7 8 9",
    "count : 41 42",
    "down : 77 76 75",
    "add : 3 + 5 =",
    "add : 12 + 7 =",
    "repeat : a b c a b c",
    "repeat : up down up",
    "the red fox sat on the",
    "the blue cow sat on the hill .",
    "count : 60",
    "down : 30 29",
    "repeat : one two three",
)


def document(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        start = rng.randint(1, 80)
        return "count : " + " ".join(str(i) for i in range(start, start + 16)) + " ."
    if kind == 1:
        start = rng.randint(20, 99)
        return "down : " + " ".join(str(i) for i in range(start, start - 12, -1)) + " ."
    if kind == 2:
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        return f"add : {a} + {b} = {a + b} . so {a} plus {b} is {a + b} ."
    if kind == 3:
        return "repeat : " + " ".join([rng.choice(PATTERNS)] * 4) + " ."
    animal, color, place = rng.choice(ANIMALS), rng.choice(COLORS), rng.choice(PLACES)
    return (
        f"the {color} {animal} sat on the {place} . the {animal} is {color} . "
        f"where is the {animal} ? the {animal} is on the {place} ."
    )


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(count)]


def build_verifier(
    out: str | Path, seconds: float = 180.0, max_steps: int = 400, seed: int = 0
) -> Path:
    """Train the verifier into ``out`` (a Hugging Face model folder) for at most ``seconds``.

    A 4-layer Llama (hidden 128) on 20,000 documents, batches of 16 x 128 tokens, AdamW with a
    cosine schedule over whichever runs out first, steps or time. Writes ``train_log.json``.
    """
    import torch

    from specshim.testbed import tiny_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = documents(20_000, seed)
    tokenizer = tiny_model.build_tokenizer(out, 512, texts, add_bos=True)
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    data = torch.tensor(stream)
    config = tiny_model.model_config(
        "llama", tokenizer, num_layers=4, hidden_size=128, ffn_factor=3
    )
    torch.manual_seed(seed)
    model = tiny_model.model_class("llama")(config).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    started = time.perf_counter()
    model.train()
    for step in range(max_steps):
        elapsed = time.perf_counter() - started
        if elapsed > seconds:
            break
        done = max(elapsed / seconds, step / max_steps)
        scale = min(1.0, (step + 1) / 10) * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))
        for group in optimizer.param_groups:
            group["lr"] = 4e-3 * scale
        starts = torch.randint(0, len(data) - 129, (16,), generator=generator)
        batch = torch.stack([data[s : s + 128] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 25 == 0:
            console.status("verifier", f"step {step} loss {losses[-1]:.3f}")
    model.eval()
    tiny_model.save(model, out)
    log = {
        "steps": len(losses),
        "seconds": round(time.perf_counter() - started, 1),
        "first_loss": losses[0],
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "corpus_tokens": len(stream),
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2, sort_keys=True))
    return out


def write_dataset(verifier: str | Path, path: Path, samples: int = 300, seed: int = 1) -> Path:
    """Extraction input: ``{"input_ids": [...]}`` rows of whole documents up to 120 tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(verifier)
    texts = iter(documents(samples * 20, seed))
    rows = []
    for _ in range(samples):
        ids: list[int] = []
        while True:
            doc = tokenizer(next(texts))["input_ids"] + [tokenizer.eos_token_id]
            if ids and len(ids) + len(doc) > 120:
                break
            ids += doc
        rows.append(json.dumps({"input_ids": ids}))
    path.write_text("\n".join(rows) + "\n")
    return path
