"""Model FLOP utilisation of `specshim train` for a Llama-8B-shaped EAGLE-3 draft, on a GPU.

Real hidden states of an 8B model are too large to carry to the lent GPU, so this script
makes its inputs there: a verifier config of Llama-3.1-8B's shape (hidden 4096, 32 heads, 8 KV
heads, vocabulary 128,256) with random embeddings, lm_head and final norm (the three tensors
EAGLE-3 training loads), random hidden states in the layout `specshim extract` writes, and a
32,000-token draft vocabulary built by `specshim vocab`. The step time does not depend on the
values. Then:

- `specshim train` and speculators' trainer driven directly (benchmarks/training_ratio.py's
  comparison: ABBA order, a clean slate between runs): the step and run throughput ratios at
  this size;
- the FLOPs of one training step (forward and backward, TTT steps 3), counted by torch's
  FlopCounterMode on the same model and batch; MFU = FLOPs per step / median step time / the
  device's dense bf16 peak. FlopCounterMode cannot look inside FlexAttention, so the counting
  pass computes the same attention densely: attention is counted over the full score matrix,
  masked blocks included (PaLM's convention for MFU).

    PYTHONPATH=.spec/0.4.0.1:src python benchmarks/gpu_mfu.py [--samples 24] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

#: dense bf16 peak, FLOP/s, by the device name torch reports
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "B200": 2250e12, "A100": 312e12}
LLAMA_8B = dict(
    hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
    num_hidden_layers=32, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_theta=500000.0, architectures=["LlamaForCausalLM"], model_type="llama",
    torch_dtype="bfloat16", tie_word_embeddings=False,
)  # fmt: skip
LAYERS = 4  # three auxiliary layers and the last, as the generator captures them


def make_inputs(root: Path, samples: int, tokens: int, draft_vocab: int) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    from specshim.runner import files, vocab

    verifier, data = root / "verifier", root / "hidden"
    verifier.mkdir(parents=True, exist_ok=True)
    (verifier / "config.json").write_text(json.dumps(LLAMA_8B))
    h, v = LLAMA_8B["hidden_size"], LLAMA_8B["vocab_size"]
    weights = {
        "model.embed_tokens.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02,
        "lm_head.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02,
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    save_file(weights, str(verifier / "model.safetensors"), metadata={"format": "pt"})
    generator = torch.Generator().manual_seed(0)
    freq: dict[int, int] = {}
    for i in range(samples):
        ids = torch.randint(0, v, (tokens,), generator=generator)
        record = {
            "input_ids": ids,
            "hidden_states": [torch.randn(tokens, h, dtype=torch.bfloat16) for _ in range(LAYERS)],
            "loss_mask": torch.ones(tokens, dtype=torch.long),
        }
        files.save_torch(data / f"data_{i}.pt", record)
        for t in ids.tolist():
            freq[t] = freq.get(t, 0) + 1
    files.save_torch(data / "token_freq.pt", freq)
    files.save_json(data / "sample_lengths.json", {str(i): tokens for i in range(samples)})
    vocab.build(data, draft_vocab, v, data)
    return verifier, data


def step_flops(verifier: Path, data: Path, tokens: int, device: str = "cuda") -> tuple[float, int]:
    """FLOPs of one training step on the first batch, and the draft's trainable parameters."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from specshim.adapters.training import cpu_flex_attention
    from specshim.runner import distributed, train
    from specshim.runner.train.draft import build_model

    d2t = torch.from_numpy(np.load(data / "d2t.npy"))
    t2d = torch.from_numpy(np.load(data / "t2d.npy"))
    model = build_model(str(verifier), d2t, t2d, 1, 3).to(torch.bfloat16).to(device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    files = sorted(str(p) for p in data.glob("data_*.pt"))
    loader = train._loader(files, tokens, 0, torch.bfloat16, distributed.World(1, 0, 0))
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in next(iter(loader)).items()}
    # FlopCounterMode cannot see inside FlexAttention's higher-order op: count this pass with
    # the same attention computed densely (specshim's CPU path), and eagerly.
    attention = sys.modules["speculators.models.eagle3.attention"]

    def dense(query: Any, key: Any, value: Any, **kwargs: Any) -> Any:
        # key/value heads repeated for grouped-query attention: the arithmetic GQA does
        groups = query.shape[1] // key.shape[1]
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        return cpu_flex_attention.dense_attention(
            query, key, value, kwargs["block_mask"], kwargs.get("scale"), False
        )

    with (
        mock.patch.object(attention, "flex_attention", dense),
        torch.compiler.set_stance("force_eager"),
        FlopCounterMode(display=False) as counter,
    ):
        _, loss, _ = model(**batch, use_off_policy_tokens=False, ttt_steps=3)
        loss.backward()
    return float(counter.get_total_flops()), trainable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--draft-vocab", type=int, default=32000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)  # even: ABBA order balances
    parser.add_argument("--out", type=Path, default=Path("/tmp/mfu.json"))
    args = parser.parse_args()
    import torch

    import specshim

    specshim.apply()
    import training_ratio

    root = Path(tempfile.mkdtemp(prefix="specshim-mfu-"))
    started = time.perf_counter()
    verifier, data = make_inputs(root, args.samples, args.tokens, args.draft_vocab)
    print(f"inputs made in {time.perf_counter() - started:.0f} s", flush=True)
    options = SimpleNamespace(
        data=data, verifier=str(verifier), device="cuda", epochs=args.epochs,
        max_len=args.tokens, dtype="bfloat16",
    )  # fmt: skip
    comparison = training_ratio.compare(options, root, args.repeats)
    flops, trainable = step_flops(verifier, data, args.tokens)
    name = torch.cuda.get_device_name(0)
    peak = next((p for key, p in PEAK_BF16.items() if key in name), None)
    step = comparison["median_step_seconds"]["specshim"]
    result = {
        "device": name,
        "draft_trainable_parameters": trainable,
        "tokens_per_step": args.tokens,
        "median_step_seconds": step,
        "tokens_per_second": args.tokens / step,
        "flops_per_step": flops,
        "achieved_tflops": flops / step / 1e12,
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "mfu": flops / step / peak if peak else None,
        "comparison": comparison,  # training_ratio.compare: steps and runs, both paths
    }
    print(training_ratio.table(comparison, args.epochs))
    args.out.write_text(json.dumps(result, indent=2))
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()
