"""Scaling: `specshim extract` end to end as the dataset grows, at tensor parallel 1 and 2.

Each case is a fresh process running the real extraction (engine start included) on the tiny
Llama and the built-in chat data; it reports wall time, extraction throughput, the peak memory
of the extracting process (which must stay flat: samples are written as they come, never held)
and of its largest vLLM worker, and the bytes written. Ratios are against 10 samples at the
same tensor parallel size, and tensor parallel 2 against 1 at the same size, all in one run.

    PYTHONPATH=.spec/0.4.0.1 .venv/bin/python benchmarks/scaling.py [--sizes 10,100,1000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import run_worker, save_results

WORKER = r"""
import json, resource, sys, time
from pathlib import Path
from specshim import hardware
hardware.configure_cpu()
from specshim.runner import extraction

if __name__ == "__main__":
    model, data, out, tp = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    start = time.perf_counter()
    summary = extraction.extract(model, data, out, max_model_len=256, batch_size=32,
                              tensor_parallel_size=tp, progress=False)
    seconds = time.perf_counter() - start
    tokens = sum(json.loads((out / "sample_lengths.json").read_text()).values())
    written = sum(p.stat().st_size for p in out.glob("data_*.pt"))
    print("RESULT", json.dumps({
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_second": summary.tokens_per_second,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "bytes_per_token": written / tokens,
    }))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--tp", default="1,2")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    tps = [int(x) for x in args.tp.split(",")]
    from specshim.testbed import data, tiny_model

    work = Path(tempfile.mkdtemp(prefix="specshim-scaling-"))
    model = str(tiny_model.build(work / "model", "llama"))
    script = work / "worker.py"
    script.write_text(WORKER)
    found: dict[int, dict[int, dict[str, float]]] = {tp: {} for tp in tps}
    for size in sizes:
        rows = data.write(work / f"chats-{size}.jsonl", count=size)
        for tp in tps:
            out = work / f"out-{size}-tp{tp}"
            found[tp][size] = run_worker(script, model, str(rows), str(out), str(tp))
    header = (
        f"{'tp':>3}{'samples':>9}{'tokens':>9}{'wall s':>9}{'tok/s':>9}{'peak MiB':>10}"
        f"{'vs 10':>8}{'worker MiB':>12}{'s/sample vs 10':>16}{'tok/s vs tp1':>14}"
    )
    print(header)
    for tp in tps:
        base = found[tp][sizes[0]]
        for size in sizes:
            r = found[tp][size]
            memory = r["peak_rss_mib"] / base["peak_rss_mib"]
            per_sample = (r["seconds"] / size) / (base["seconds"] / sizes[0])
            vs_tp1 = r["tokens_per_second"] / found[tps[0]][size]["tokens_per_second"]
            print(
                f"{tp:>3}{size:>9}{r['tokens']:>9}{r['seconds']:>9.1f}"
                f"{r['tokens_per_second']:>9,.0f}{r['peak_rss_mib']:>10.0f}{memory:>8.3f}"
                f"{r['worker_peak_rss_mib']:>12.0f}{per_sample:>16.3f}{vs_tp1:>14.3f}"
            )
    save_results(
        "scaling", {str(tp): {str(n): r for n, r in by.items()} for tp, by in found.items()}
    )


if __name__ == "__main__":
    main()
