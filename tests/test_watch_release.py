"""scripts/watch_release.sh, the steps of CI's watch workflow, on a release already unpacked.

vLLM 0.34.0 is the recorded release (its wheel unpacked by scripts/test.sh, its snapshot
shipped, docs/triage/vllm-0.34.0-vs-0.32.0.txt what triage said of it): the script reuses the
unpacked wheel, so these runs must not reach the network, and pip and HTTP are pointed at
nowhere to make sure they do not. Newest-version lookups run against a local index of
empty stand-in wheels ("fake" in their names): only their file names are read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, SPECULATORS, speculators_path, unpacked_vllm, vllm_python
from specshim import contracts

SCRIPT = ROOT / "scripts" / "watch_release.sh"
BASELINE = contracts.shipped() / "vllm-0.32.0.json"
RECORDED_TRIAGE = ROOT / "docs" / "triage" / "vllm-0.34.0-vs-0.32.0.txt"
#: a fact no adapter reads (specshim's own plugin group): moved, it needs a human
UNCOVERED = "exists:vllm.plugins:DEFAULT_PLUGINS_GROUP"


def offline_env(index: Path | None = None) -> dict[str, str]:
    """The environment without pip's configuration; pip's index is ``index`` (a local folder)
    or none, and HTTP goes to a closed port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    closed = "http://127.0.0.1:9"
    env.update(PIP_CONFIG_FILE=os.devnull, http_proxy=closed, https_proxy=closed)
    env.pop("SPECSHIM_APPLY", None)
    if index is None:
        env["PIP_NO_INDEX"] = "1"
    else:
        env["PIP_INDEX_URL"] = index.as_uri()
    return env


def watch(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [str(SCRIPT), *map(str, args)]
    return subprocess.run(
        command, env=env or offline_env(), capture_output=True, text=True, timeout=600
    )


def moved_section(text: str) -> list[str]:
    """The lines of triage's "upstream facts that moved" section."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("upstream facts that moved"))
    return lines[start : lines.index("", start)]


def needs_test_bed() -> None:
    """What the script runs on: the default environment and every speculators."""
    vllm_python("0.32.0")
    for version in SPECULATORS:
        speculators_path(version)


def shipped_files() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in contracts.shipped().iterdir()}


@pytest.mark.vllm
def test_a_recorded_release_is_triaged_and_its_snapshot_recorded(tmp_path: Path) -> None:
    """0.34.0 against 0.32.0: every moved fact covered and decided (exit 0), the moved facts
    as triage recorded them for that release, and a snapshot equal to the shipped one
    written into --out, none into the shipped snapshots."""
    vllm_python("0.32.0")
    unpacked_vllm("0.34.0")
    spec = speculators_path("0.4.0.1")
    before = shipped_files()
    result = watch("0.34.0", "--against", BASELINE, "--out", tmp_path, "--speculators", spec)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = (tmp_path / "triage-speculators-0.4.0.1.txt").read_text()
    assert moved_section(text) == moved_section(RECORDED_TRIAGE.read_text())
    assert "upstream facts that moved: 11" in text
    assert (
        "  import:vllm.v1.core.kv_cache_utils:get_kv_cache_config_from_groups: True -> None"
        "  [kv_cache_planner_moved]"
    ) in text
    assert "moved facts no adapter covers: 0" in text
    assert "moved facts whose adapter did not decide on this installation: 0" in text
    assert text in result.stdout
    assert result.stdout.rstrip().endswith(
        f"vllm 0.34.0 against {BASELINE}: every moved fact is covered and every adapter decided"
    )
    recorded = contracts.load(tmp_path / "vllm-0.34.0.json")
    shipped = contracts.load(contracts.shipped() / "vllm-0.34.0.json")
    assert contracts.diff(shipped, recorded) == []
    assert recorded["decisions"] == {"0.4.0.1": shipped["decisions"]["0.4.0.1"]}
    assert shipped_files() == before


@pytest.mark.vllm
def test_a_fact_no_adapter_covers_needs_a_human(tmp_path: Path) -> None:
    """Against a 0.32.0 snapshot doctored so that a fact no adapter reads moves: exit 1, the
    fact named under what needs a human. The snapshot already in --out is kept (the run is
    triage only)."""
    vllm_python("0.32.0")
    unpacked_vllm("0.34.0")
    spec = speculators_path("0.4.0.1")
    doctored = contracts.load(BASELINE)
    doctored["facts"][UNCOVERED] = None
    contracts.save(tmp_path / "vllm-0.32.0.json", doctored)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(contracts.shipped() / "vllm-0.34.0.json", out)
    result = watch(
        "0.34.0", "--against", tmp_path / "vllm-0.32.0.json", "--out", out, "--speculators", spec
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"{out}/vllm-0.34.0.json: kept" in result.stdout
    assert f"  {UNCOVERED}: None -> True  [NO ADAPTER]" in result.stdout
    tail = result.stdout.split(" needs a human (")[1].splitlines()[1:]
    assert tail == [
        "with speculators 0.4.0.1:",
        "  moved facts no adapter covers: 1",
        f"    {UNCOVERED}",
    ]
    assert (out / "needs-a-human.txt").read_text().splitlines() == tail


def test_a_bad_option_is_one_line_and_status_2() -> None:
    result = watch("0.34.0", "--agianst", "x.json")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("watch_release: unknown option --agianst; usage: ")


def fake_index(root: Path, *versions: str) -> Path:
    """A local package index (pip reads a folder's index.html) holding empty stand-in vllm
    wheels of ``versions``."""
    folder = root / "index" / "vllm"
    folder.mkdir(parents=True)
    links = []
    for version in versions:
        name = f"vllm-{version}-py3-none-any.whl"
        (folder / name).write_bytes(b"fake")
        links.append(f'<a href="{name}">{name}</a>')
    (folder / "index.html").write_text("\n".join(links))
    return folder.parent


def test_without_version_the_newest_release_is_taken(tmp_path: Path) -> None:
    """No VERSION: the newest release on the index, not a pre-release; a wheel that cannot be
    unpacked (here a stand-in) stops the watch with status 2."""
    needs_test_bed()
    index = fake_index(tmp_path, "0.98.0", "0.97.1", "0.99.0rc1")
    result = watch(env=offline_env(index))
    newest_recorded = contracts.shipped() / "vllm-0.34.0.json"
    assert result.stdout.splitlines()[0] == f"vllm 0.98.0 against {newest_recorded}"
    assert result.returncode == 2
    assert "watch_release: vllm==0.98.0 could not be fetched and unpacked" in result.stderr
    assert not (ROOT / ".wheels" / "vllm-0.98.0").exists()


def test_nightly_takes_the_newest_wheel_of_the_nightly_index(tmp_path: Path) -> None:
    needs_test_bed()
    index = fake_index(tmp_path, "0.98.0", "0.99.0rc1.dev12+gfake")
    result = watch("--nightly", env={**offline_env(index), "VLLM_NIGHTLY_INDEX": index.as_uri()})
    newest_recorded = contracts.shipped() / "vllm-0.34.0.json"
    assert result.stdout.splitlines()[0] == f"vllm 0.99.0rc1.dev12+gfake against {newest_recorded}"
    assert result.returncode == 2
    assert not (ROOT / ".wheels" / "vllm-0.99.0rc1.dev12+gfake").exists()


def test_nightly_is_skipped_where_its_index_is_unreachable() -> None:
    env = {**offline_env(), "VLLM_NIGHTLY_INDEX": "http://127.0.0.1:9/nightly"}
    result = watch("--nightly", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no nightly wheel from http://127.0.0.1:9/nightly")
    assert result.stdout.rstrip().endswith("nightly skipped")
