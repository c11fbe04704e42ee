"""specshim as a user gets it: the wheel built from this checkout, installed into a fresh
virtual environment and run outside the checkout, reads the matrix and snapshots it ships."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from specshim import applier, contracts, hardware, matrix, versions

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess:
    """Run ``command``; a failure shows its output."""
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def build_wheel(work: Path) -> Path:
    """The wheel of this checkout's sources, built offline with this environment's setuptools
    (no build isolation: nothing is downloaded) from a copy, so that the checkout gets no
    build/ or egg-info and a stale build/ cannot leak into the wheel."""
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "compat_matrix.yaml"):
        shutil.copy2(ROOT / name, source / name)
    pip = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index")
    run(*pip, "--wheel-dir", work / "dist", source)
    (wheel,) = (work / "dist").glob("specshim-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    """The bin folder of a fresh virtual environment holding the specshim wheel and nothing
    else of specshim. vLLM, torch and specshim's requirements are this test environment's,
    added after the fresh site-packages by a .pth line, as a user installs specshim beside
    their vLLM: a folder named in a .pth file is not scanned for .pth files, so the checkout's
    editable specshim (``__editable__.specshim-*.pth``) stays out."""
    work = wheel.parents[1]
    venv.create(work / "venv", with_pip=False)
    python = work / "venv" / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index")
    run(*pip, wheel)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    beside = Path(site.stdout.strip()) / "test_environment.pth"
    beside.write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python.parent


def as_a_user(command: str, *args: str, bin_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``specshim COMMAND ARGS`` of the installed wheel, run in ``cwd``, with speculators 0.3.0
    installed and no specshim selection or matrix override inherited from the tests."""
    env = {k: v for k, v in os.environ.items() if k not in (applier.APPLY_ENV, "SPECSHIM_MATRIX")}
    env["PYTHONPATH"] = str(ROOT / ".spec" / "0.3.0")
    command_line = [str(bin_dir / "specshim"), command, *args]
    return subprocess.run(
        command_line, capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def installed_vllm() -> versions.Installed:
    vllm = versions.vllm()
    if vllm.version is None:
        pytest.skip("vLLM is not installed")
    return vllm


def test_the_wheel_ships_the_top_level_matrix_byte_for_byte(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("specshim/data/top_level/compat_matrix.yaml")
    assert shipped == (ROOT / "compat_matrix.yaml").read_bytes()


def test_the_listed_packages_are_every_package_under_src() -> None:
    """pyproject.toml lists the packages (the matrix's package maps the repository's top), so a
    new package under src/ left off the list would be missing from the wheel."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = find_namespace_packages(ROOT / "src", exclude=["*.egg-info", "*__pycache__*"])
    assert sorted(listed) == sorted([*found, "specshim.data.top_level"])


def test_the_installed_matrix_is_the_shipped_copy(installed: Path, tmp_path: Path) -> None:
    where = run(
        installed / "python",
        "-c",
        "from specshim import matrix; print(matrix.shipped())",
        cwd=tmp_path,
    )
    shipped = Path(where.stdout.strip())
    assert shipped.is_relative_to(installed.parent), shipped
    assert shipped.read_bytes() == (ROOT / "compat_matrix.yaml").read_bytes()


def test_the_wheel_is_imported_not_the_checkout(installed: Path, tmp_path: Path) -> None:
    where = run(
        installed / "python", "-c", "import specshim; print(specshim.__file__)", cwd=tmp_path
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.parent)


def test_installed_report_quotes_the_shipped_matrix(installed: Path, tmp_path: Path) -> None:
    """``specshim report`` of the installed wheel, run in an empty folder, gives the verdict the
    checkout's matrix gives for this vLLM with speculators 0.3.0: a measured row, quoted."""
    vllm = installed_vllm()
    here = matrix.where(hardware.detect())
    expected = matrix.verdict(matrix.load(), vllm.version, "0.3.0", vllm.distribution, here)
    assert expected.status != "untested", expected.detail  # the matrix measured this setup
    result = as_a_user("report", "--json", "--no-import", bin_dir=installed, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    assert json.loads(result.stdout)["verdict"] == expected.to_dict()


def test_installed_triage_diffs_against_a_shipped_snapshot(installed: Path, tmp_path: Path) -> None:
    """``specshim triage`` of the installed wheel, with no option, in an empty folder, compares
    with the snapshot nearest this vLLM among those the wheel ships."""
    vllm = installed_vllm()
    nearest = contracts.nearest(sorted(contracts.shipped().glob("vllm-*.json")), vllm.version)
    result = as_a_user("triage", bin_dir=installed, cwd=tmp_path)
    first = result.stdout.partition("\n")[0]
    shipped = installed.parent / "lib"
    assert f" against {shipped}/" in first, result.stdout[-2000:] + result.stderr[-2000:]
    assert first.endswith(
        f"/specshim/data/contracts/{nearest.name} (vLLM {contracts.load(nearest)['vllm']})"
    ), first
