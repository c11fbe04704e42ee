"""Draw docs/benchmarks.png, and the GPU runs alone as docs/benchmarks_gpu.png, from the
figures the benchmark scripts saved in docs/benchmarks/.

.venv/bin/python benchmarks/plot.py      (needs the `bench` extra: matplotlib)
"""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from common import RESULTS, ceiling

OUT = RESULTS.parent / "benchmarks.png"
#: The GPU extraction panel alone, the figure docs/benchmarks.md opens with.
GPU_OUT = RESULTS.parent / "benchmarks_gpu.png"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def grouped_bars(ax: plt.Axes, table: dict, value: str) -> None:
    """One group of bars per row of ``table`` ({group: {path: {value: x}}}), one bar per path."""
    groups = list(table)
    paths = list(next(iter(table.values())))
    width = 0.8 / len(paths)
    for i, path in enumerate(paths):
        heights = [table[group][path][value] for group in groups]
        ax.bar([g + i * width for g in range(len(groups))], heights, width, label=path)
    ax.set_xticks(
        [g + width * (len(paths) - 1) / 2 for g in range(len(groups))], groups, fontsize=7
    )


def extraction_panel(ax: plt.Axes, table: dict) -> None:
    grouped_bars(ax, table, "ratio")
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="goal 0.9")
    ax.set_ylabel("tokens/s vs vLLM prefill")
    ax.set_title("Extraction throughput (tiny Llama, CPU)")
    ax.legend(fontsize=7)


def scaling_panel(ax: plt.Axes, table: dict) -> None:
    for tp, by_size in table.items():
        sizes = sorted(by_size, key=int)
        ax.plot(
            [int(n) for n in sizes],
            [by_size[n]["peak_rss_mib"] for n in sizes],
            marker="o",
            label=f"extracting process, TP {tp}",
        )
        ax.plot(
            [int(n) for n in sizes],
            [by_size[n]["worker_peak_rss_mib"] for n in sizes],
            marker="s",
            linestyle=":",
            label=f"largest vLLM worker, TP {tp}",
        )
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("samples extracted")
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_title("Memory as the dataset grows")
    ax.legend(fontsize=7)


def output_panel(ax: plt.Axes, table: dict) -> None:
    grouped_bars(ax, table, "megabytes_per_second")
    ax.set_ylabel("MB/s written")
    ax.set_title("Writing one sample")
    ax.legend(fontsize=7)


#: What each path of benchmarks/gpu_extraction.py is, as the GPU figure's legend says it.
GPU_PATHS = {
    "extract": "extract (its defaults)",
    "extract_engine": "extract --backend engine",
    "extract_native": "extract --backend native",
    "native": "vLLM's native path",
    "disk_processes": "disk: extract's writers alone",
    "disk": "disk: one file after another",
}


def run_ceiling(run: dict) -> tuple[float, str]:
    """The ceiling of a saved GPU run; a run with neither prefill nor disk draws as missing."""
    return ceiling(run["rates"]) or (math.nan, "none")


def gpu_extraction_panel(ax: plt.Axes, runs: list[dict]) -> None:
    """Each path of benchmarks/gpu_extraction.py against min(vLLM's prefill, the disk) of its
    own run, one group of bars per run (a GPU, a vLLM release, a model shape)."""
    shown = [p for p in GPU_PATHS if any(p in run["rates"] for run in runs)]
    width = 0.8 / len(shown)
    for i, path in enumerate(shown):
        ratios = [run["rates"].get(path, math.nan) / run_ceiling(run)[0] for run in runs]
        ax.bar([g + i * width for g in range(len(runs))], ratios, width, label=GPU_PATHS[path])
    ax.set_xticks(
        [g + width * (len(shown) - 1) / 2 for g in range(len(runs))],
        [run_label(run) for run in runs],
        fontsize=7,
    )
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(0.97, color="grey", linestyle="--", linewidth=1, label="goal 0.97")
    ax.set_ylabel("tokens/s vs min(vLLM prefill, disk), same run")
    ax.set_title("Extraction on GPUs, every file written", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)


def run_label(run: dict) -> str:
    """A GPU run's group label: device, vLLM, model shape, prompts, day."""
    where, args = run.get("where", {}), run["args"]
    length = args["length"]
    if isinstance(length, list):  # [shortest, longest]
        length = str(length[0]) if length[0] == length[1] else f"{length[0]}-{length[1]}"
    device = where.get("device", "a GPU").removeprefix("NVIDIA ")
    return (
        f"{device}, vLLM {where.get('vllm', '?')}\n"
        f"{args.get('architecture', 'llama')} {args['layers']} x {args['hidden']}, "
        f"{args['prompts']} x {length} tokens\n"
        f"ceiling: {run_ceiling(run)[1]}; {where.get('date', '?')}"
    )


def main() -> None:
    panels = [
        (name, draw, data)
        for name, draw in (
            ("extraction", extraction_panel),
            ("scaling", scaling_panel),
            ("output", output_panel),
        )
        if (data := load(name)) is not None
    ]
    found = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("gpu_extraction*.json"))]
    # a run without vLLM's prefill beside it has no ceiling to be drawn against
    if gpu_runs := [run for run in found if "vllm_prefill" in run["rates"]]:
        panels.append(("gpu_extraction", gpu_extraction_panel, gpu_runs))
    if not panels:
        raise SystemExit(f"no results in {RESULTS}: run the benchmark scripts first")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    for ax, (_, draw, data) in zip([axes] if len(panels) == 1 else axes, panels, strict=True):
        draw(ax, data)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT} ({', '.join(name for name, _, _ in panels)})")
    if gpu_runs:
        fig, ax = plt.subplots(figsize=(2.6 + 1.8 * len(gpu_runs), 5.4))
        gpu_extraction_panel(ax, gpu_runs)
        fig.tight_layout()
        fig.savefig(GPU_OUT, dpi=110)
        print(f"wrote {GPU_OUT} ({len(gpu_runs)} runs)")


if __name__ == "__main__":
    main()
