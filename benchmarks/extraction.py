"""Extraction throughput: specshim + speculators' generator against what users would run instead.

Same tiny model, same prompts, engine start excluded, each path in a fresh process, median of
``--runs``; every figure is also given as a ratio to vLLM's own prefill of the same prompts
(``LLM.generate(..., max_tokens=1)`` on the same engine settings), which is the floor since
extraction is one prefill pass.

    PYTHONPATH=.spec/0.4.0.1 .venv/bin/python benchmarks/extraction.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MIXES = {"short": (8, 32), "mixed": (8, 250), "long": (200, 250)}
PROMPTS = 64
MAX_MODEL_LEN = 256

WORKER = r"""
import json, sys, time
from specshim.testbed import cpu
cpu.configure()
mode, model, prompts_path, max_len = sys.argv[1:4] + [int(sys.argv[4])]
prompts = json.load(open(prompts_path))
tokens = sum(len(p) for p in prompts)
if __name__ == "__main__":
    if mode == "specshim":
        import specshim
        specshim.apply()
        from speculators.data_generation import vllm_hidden_states_generator as gen
        g = gen.VllmHiddenStatesGenerator(model, max_model_len=max_len)
        g.generate(prompts[:2])
        t = time.perf_counter(); g.generate(prompts); elapsed = time.perf_counter() - t
    elif mode == "vllm_prefill":
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model, max_model_len=max_len, enforce_eager=True, block_size=32,
                  enable_prefix_caching=False, max_num_seqs=32)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        llm.generate(batch[:2], params, use_tqdm=False)
        t = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - t
    else:
        import torch
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).eval()
        t = time.perf_counter()
        with torch.no_grad():
            for p in prompts:
                m(torch.tensor([p]), output_hidden_states=True)
        elapsed = time.perf_counter() - t
    print("RESULT", json.dumps({"tokens": tokens, "seconds": elapsed}))
"""

MODES = ("vllm_prefill", "specshim", "transformers")


def prompts(mix: str, vocab: int = 384, seed: int = 0) -> list[list[int]]:
    low, high = MIXES[mix]
    rng = random.Random(seed)
    return [
        [rng.randrange(8, vocab) for _ in range(rng.randint(low, high))] for _ in range(PROMPTS)
    ]


def run(mode: str, model: str, prompt_file: Path, script: Path) -> float:
    out = subprocess.run(
        [sys.executable, str(script), mode, model, str(prompt_file), str(MAX_MODEL_LEN)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{mode} failed:\n{out.stderr[-3000:]}")
    result = json.loads(lines[-1][7:])
    return result["tokens"] / result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default=None, help="default: build the tiny Llama")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specshim-bench-"))
    model = args.model
    if model is None:
        from specshim.testbed import tiny_model

        model = str(tiny_model.build(work / "model", "llama"))
    script = work / "worker.py"
    script.write_text(WORKER)
    print(f"{'mix':<8}{'path':<16}{'tokens/s (median)':>20}{'vs vLLM prefill':>18}")
    for mix in MIXES:
        prompt_file = work / f"{mix}.json"
        prompt_file.write_text(json.dumps(prompts(mix)))
        rates = {m: statistics.median(run(m, model, prompt_file, script) for _ in range(args.runs))
                 for m in MODES}  # fmt: skip
        for mode in MODES:
            ratio = rates[mode] / rates["vllm_prefill"]
            print(f"{mix:<8}{mode:<16}{rates[mode]:>20,.0f}{ratio:>18.3f}")


if __name__ == "__main__":
    main()
