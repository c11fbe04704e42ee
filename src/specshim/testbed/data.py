"""A small built-in chat dataset, written as JSONL, for the default run and the tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTIONS = (
    ("What comes after {n}?", "After {n} comes {m}."),
    ("Count from {n} to {m}.", "{n}, {m}."),
    ("What is {n} plus one?", "{n} plus one is {m}."),
)


def conversations(count: int = 64, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        question, answer = rng.choice(QUESTIONS)
        n = rng.randint(1, 50)
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": question.format(n=n, m=n + 1)},
                    {"role": "assistant", "content": answer.format(n=n, m=n + 1)},
                ]
            }
        )
    return rows


def write(path: Path, count: int = 64, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in conversations(count, seed)))
    return path
