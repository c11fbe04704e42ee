"""Draw docs/benchmarks.png from the figures the benchmark scripts saved in docs/benchmarks/.

.venv/bin/python benchmarks/plot.py      (needs the `bench` extra: matplotlib)
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from common import RESULTS

OUT = RESULTS.parent / "benchmarks.png"


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


def gpu_extraction_panel(ax: plt.Axes, data: dict) -> None:
    """Each path of benchmarks/gpu_extraction.py against vLLM's prefill in the same run."""
    rates = data["rates"]
    paths = [p for p in rates if p != "vllm_prefill"]
    ax.bar(paths, [rates[p] / rates["vllm_prefill"] for p in paths])
    ax.axhline(1.0, color="black", linewidth=1, label="vLLM's prefill")
    ax.axhline(0.9, color="grey", linestyle="--", linewidth=1, label="goal 0.9")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("tokens/s vs vLLM prefill")
    where, args = data.get("where", {}), data["args"]
    ax.set_title(
        f"Extraction on {where.get('device', 'a GPU')}, vLLM {where.get('vllm', '?')}\n"
        f"{args.get('architecture', 'llama')} {args['layers']} x {args['hidden']}, "
        f"{args['prompts']} x {args['length']} tokens ({where.get('date', '?')})",
        fontsize=9,
    )
    ax.legend(fontsize=7)


def main() -> None:
    panels = [
        (name, draw, data)
        for name, draw in (
            ("extraction", extraction_panel),
            ("scaling", scaling_panel),
            ("output", output_panel),
            ("gpu_extraction", gpu_extraction_panel),
        )
        if (data := load(name)) is not None
    ]
    if not panels:
        raise SystemExit(f"no results in {RESULTS}: run the benchmark scripts first")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    for ax, (_, draw, data) in zip([axes] if len(panels) == 1 else axes, panels, strict=True):
        draw(ax, data)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT} ({', '.join(name for name, _, _ in panels)})")


if __name__ == "__main__":
    main()
