"""Naming the GPU leaves CUDA untouched in the calling process, so that vLLM may fork its
processes after it (``specshim.hardware.detect`` asks NVML, not the CUDA runtime)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import SPECULATORS, speculators_path

pytestmark = pytest.mark.gpu

#: In a fresh interpreter, as ``specshim``'s commands do before vLLM starts: torch's checks
#: through NVML, the GPU named, specshim applied and speculators imported (its EAGLE-3 model
#: asks ``torch.cuda.is_available()`` at import); then fork a child that computes on the GPU.
NAMED_THEN_FORKED = """
import os, sys, torch
import specshim
from specshim import hardware
hardware.keep_forks_able_to_use_cuda()
named = hardware.detect()
specshim.apply()
import speculators.models.eagle3
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


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_a_child_forked_after_the_gpu_is_named_computes_on_it(speculators: str) -> None:
    """The child of a process that named the GPU and imported speculators runs CUDA (with the
    runtime asked instead, it fails: "Cannot re-initialize CUDA in forked subprocess"), and the
    name, count and capability are torch's own."""
    import torch

    paths = [str(speculators_path(speculators)), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(
        [sys.executable, "-c", NAMED_THEN_FORKED],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    major, minor = torch.cuda.get_device_capability(0)
    expected = ["cuda", torch.cuda.get_device_name(0), str(torch.cuda.device_count()),
                f"sm_{major}{minor}"]  # fmt: skip
    assert done.stdout.strip().splitlines()[-1].split("|") == expected
