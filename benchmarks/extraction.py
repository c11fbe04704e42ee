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
import tempfile
from pathlib import Path

from common import run_worker, save_results

MIXES = {"short": (8, 32), "mixed": (8, 250), "long": (200, 250)}
PROMPTS = 64
MAX_MODEL_LEN = 256

WORKER = r"""
import json, sys, time
from specshim import hardware
hardware.configure_cpu()
mode, model, prompts_path, max_len = sys.argv[1:4] + [int(sys.argv[4])]
mixes = json.load(open(prompts_path))


def timings(run):
    # warm up once, then time run(prompts) for every mix: {mix: tokens per second}
    run(next(iter(mixes.values()))[:2])
    rates = {}
    for mix, prompts in mixes.items():
        t = time.perf_counter()
        run(prompts)
        rates[mix] = sum(len(p) for p in prompts) / (time.perf_counter() - t)
    return rates


if __name__ == "__main__":
    if mode == "specshim":
        import specshim
        specshim.apply()
        from speculators.data_generation import vllm_hidden_states_generator as gen
        g = gen.VllmHiddenStatesGenerator(model, max_model_len=max_len)
        rates = timings(g.generate)
    elif mode == "vllm_prefill":
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model, max_model_len=max_len, enforce_eager=True, block_size=32,
                  enable_prefix_caching=False, max_num_seqs=32)
        params = SamplingParams(max_tokens=1, temperature=0.0)
        rates = timings(lambda ps: llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False))
    else:
        import torch
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).eval()

        def forward(ps):
            with torch.no_grad():
                for p in ps:
                    m(torch.tensor([p]), output_hidden_states=True)

        rates = timings(forward)
    print("RESULT", json.dumps(rates))
"""

MODES = ("vllm_prefill", "specshim", "transformers")


def prompts(mix: str, vocab: int = 384, seed: int = 0) -> list[list[int]]:
    low, high = MIXES[mix]
    rng = random.Random(seed)
    return [
        [rng.randrange(8, vocab) for _ in range(rng.randint(low, high))] for _ in range(PROMPTS)
    ]


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
    prompt_file = work / "mixes.json"
    prompt_file.write_text(json.dumps({mix: prompts(mix) for mix in MIXES}))
    # runs alternate between paths so that machine noise spreads over all of them
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.runs):
        for mode in MODES:
            found = run_worker(script, mode, model, str(prompt_file), str(MAX_MODEL_LEN))
            samples[mode].append(found)
    print(f"{'mix':<8}{'path':<16}{'tokens/s (median)':>20}{'vs vLLM prefill':>18}")
    table = {}
    for mix in MIXES:
        rates = {m: statistics.median(s[mix] for s in samples[m]) for m in MODES}
        table[mix] = {
            m: {"tokens_per_second": r, "ratio": r / rates["vllm_prefill"]}
            for m, r in rates.items()
        }
        for mode in MODES:
            ratio = rates[mode] / rates["vllm_prefill"]
            print(f"{mix:<8}{mode:<16}{rates[mode]:>20,.0f}{ratio:>18.3f}")
    save_results("extraction", table)


if __name__ == "__main__":
    main()
