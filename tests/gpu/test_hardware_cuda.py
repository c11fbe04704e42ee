"""Naming the GPU leaves CUDA untouched in the calling process, so that vLLM may fork its
processes after it (``specshim.hardware.detect`` asks NVML, not the CUDA runtime)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

#: In a fresh interpreter, as ``specshim``'s commands do before vLLM starts: torch's checks
#: through NVML, the GPU named, speculators imported (it asks ``torch.cuda.is_available()``);
#: then fork a child that computes on the GPU.
NAMED_THEN_FORKED = """
import os, sys, torch
from specshim import hardware
hardware.keep_forks_able_to_use_cuda()
named = hardware.detect()
import speculators
assert not torch.cuda.is_initialized()
pid = os.fork()
if pid == 0:
    try:
        ok = float(torch.ones(4, device="cuda").sum()) == 4.0
    except Exception as exc:
        print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        ok = False
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print(named.kind, named.name, named.count, named.compute_capability, sep="|")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_after_the_gpu_is_named_computes_on_it() -> None:
    """The child of a process that named the GPU and imported speculators runs CUDA (with the
    runtime asked instead, it fails: "Cannot re-initialize CUDA in forked subprocess"), and the
    name, count and capability are torch's own."""
    import torch

    done = subprocess.run(
        [sys.executable, "-c", NAMED_THEN_FORKED], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    major, minor = torch.cuda.get_device_capability(0)
    expected = ["cuda", torch.cuda.get_device_name(0), str(torch.cuda.device_count()),
                f"sm_{major}{minor}"]  # fmt: skip
    assert done.stdout.strip().splitlines()[-1].split("|") == expected
