"""Real extraction on CUDA vLLM: speculators' generator after ``specshim.apply()`` on a GPU.

The checks of the CPU suite (tests/e2e), on the interpreter's own CUDA vLLM (the lent H200:
CUDA vLLM 0.26.0, FlashAttention 3), with both model runners: parity with the float32
transformers forward pass for both speculators, counts, order, batches of 1, 11 and 40 (more
than speculators' 32 requests a step), each adapter the GPU needs left out and its break shown,
the workers' runner class, and the files vLLM's worker writes equal to those of the RPC path,
bit for bit.
Run with ``scripts/gpu_test.sh``; skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import SPECULATORS
from e2e import harness
from e2e.driver import MAX_MODEL_LEN, PROMPTS
from e2e.test_without_adapter import assert_raised, evidence
from specshim import versions
from specshim.adapters import registry
from specshim.adapters.model import LeftOut

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]
CUDA = harness.CUDA
RUNNERS = {
    "v1": "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
    "v2": "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
}
CASES = [(s, r) for s in SPECULATORS for r in RUNNERS]
BATCHES = ("batch_1", "batch_11", "batch_40")

#: The adapters' leave-one-out cases on the GPU (``Adapter.left_out``).
ON_THE_GPU = [(a.name, c) for a in registry.ADAPTERS for c in a.left_out if c.accelerator == "gpu"]
#: (speculators, runner, adapter) -> the case where it raises (type and text)
GPU_RAISES = {(c.speculators, c.runner, a): c for a, c in ON_THE_GPU if c.raises}
#: Left out, and the data still right, because that runner has nothing to break (and why).
GPU_HARMLESS = {(c.speculators, c.runner, a): c for a, c in ON_THE_GPU if c.harmless}


def holds_here(case: LeftOut) -> bool:
    """Whether ``case`` is recorded for the installed vLLM release (``LeftOut.releases``)."""
    installed = versions.vllm().version
    if not case.releases:
        return True
    return installed is not None and versions.satisfies(installed, case.releases)


def needs_release(case: LeftOut) -> None:
    if not holds_here(case):
        pytest.skip(f"recorded for vLLM {case.releases}, not vLLM {versions.vllm().version}")


def has_runner(runner: str) -> bool:
    """Whether this vLLM ships ``runner`` (from 0.34 only Model Runner V2 is left)."""
    return importlib.util.find_spec(RUNNERS[runner].rpartition(".")[0]) is not None


def needs_runner(runner: str) -> None:
    if not has_runner(runner):
        pytest.skip(f"this vLLM has no {runner} model runner ({RUNNERS[runner]})")


def gpu_run(speculators: str, runner: str, model: Any, **options: Any) -> dict[str, Any]:
    needs_runner(runner)
    return harness.run(CUDA, speculators, model, runner_v2=runner == "v2", **options)


@pytest.mark.parametrize(("speculators", "runner"), CASES)
def test_matches_transformers_in_count_order_and_value(speculators, runner, tiny_models) -> None:
    model = tiny_models["llama"]
    result = gpu_run(speculators, runner, model)
    harness.assert_ran(result)
    assert {w["runner"] for w in result["workers"]} == {RUNNERS[runner]}
    for key in BATCHES:
        samples = result[key]
        assert len(samples) == PROMPTS, key
        for prompt, sample in zip(result["prompts"], samples, strict=True):
            assert sample["input_ids"].tolist() == prompt[: MAX_MODEL_LEN - 1], key
            assert len(sample["hidden_states"]) == len(result["layer_ids"])
        harness.assert_matches_transformers(model, result, key)


@pytest.mark.parametrize(("speculators", "runner", "adapter"), sorted(GPU_RAISES))
def test_generator_fails_on_the_gpu_without(speculators, runner, adapter, tiny_models) -> None:
    case = GPU_RAISES[(speculators, runner, adapter)]
    needs_release(case)
    result = gpu_run(speculators, runner, tiny_models["llama"], exclude=(adapter,), batches="40")
    assert_raised(result, adapter, case.raises, case.text)


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_forked_worker_cannot_use_cuda(speculators, tiny_models) -> None:
    """Without worker_start_method the worker is forked after this process queried CUDA
    (measured: ``torch.cuda.is_initialized()`` is False when the executor starts, so vLLM's own
    switch to spawn does not fire) and dies at its first CUDA call."""
    adapter = "worker_start_method"
    case = GPU_RAISES[(speculators, "v2", adapter)]
    needs_release(case)
    result = gpu_run(speculators, "v2", tiny_models["llama"], exclude=(adapter,), batches="40")
    assert_raised(result, adapter, case.raises, case.text)
    assert "Cannot re-initialize CUDA in forked subprocess" in result["error"]["log"]


@pytest.mark.parametrize(("speculators", "runner", "adapter"), sorted(GPU_HARMLESS))
def test_left_out_and_still_right_on_this_runner(speculators, runner, adapter, tiny_models) -> None:
    needs_release(GPU_HARMLESS[(speculators, runner, adapter)])
    model = tiny_models["llama"]
    result = gpu_run(speculators, runner, model, exclude=(adapter,), batches="40")
    harness.assert_ran(result)
    harness.assert_matches_transformers(model, result, "batch_40")


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_every_adapter_applied_on_the_gpu_has_evidence(speculators, tiny_models) -> None:
    """Each adapter applied here is shown needed on this GPU, or by the CPU suite's cases."""
    result = gpu_run(speculators, "v2", tiny_models["llama"])
    harness.assert_ran(result)
    applied = set(result["applied"]) | set(result["workers"][0]["applied"])
    # every case, not one per (speculators, runner, adapter): one adapter can raise on some
    # releases and be harmless on others
    covered = {a for a, case in ON_THE_GPU if case.speculators == speculators and holds_here(case)}
    covered |= evidence(speculators) | {"extraction_executor"}
    assert applied <= covered, applied - covered
    # and the matrix's row for this vLLM on this GPU lists exactly these (report quotes it)
    import vllm

    from specshim import hardware, matrix

    here = matrix.where(hardware.detect())
    rows = [r for r in matrix.load() if (r.vllm, r.speculators, r.accelerator, r.backend)
            == (vllm.__version__, speculators, here, "generator")]  # fmt: skip
    assert [set(r.adapters or ()) for r in rows] == [applied]


def gpu_extract(
    speculators: str, model: Any, dataset: Any, out: Any, *extra: str, runner: str = "v2"
) -> None:
    """``specshim extract`` with this interpreter's CUDA vLLM, ``speculators`` and ``runner``."""
    import os
    import subprocess
    import sys

    from conftest import speculators_path
    from e2e.test_runner import extract_args

    paths = [str(speculators_path(speculators)), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env.pop("SPECSHIM_APPLY", None)
    needs_runner(runner)
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if share := os.environ.get("SPECSHIM_E2E_GPU_MEMORY"):  # gpu_test.sh's streams: a share each
        extra = ("--gpu-memory-utilization", share, *extra)
    cmd = [sys.executable, "-m", "specshim.cli", *extract_args(model, dataset, out), *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_native_backend_writes_the_generator_backends_files_on_the_gpu(
    speculators, tiny_models, tmp_path
) -> None:
    """``specshim extract --backend native`` (vLLM's extract_hidden_states) against the
    generator backend on CUDA vLLM: the checks of tests/e2e/test_native.py. On the V1 runner:
    vLLM 0.26.0's Model Runner V2 refuses the speculative method ("does not yet support:
    speculative method 'extract_hidden_states'", seen on an H100); on V2 where V1 is gone."""
    from e2e.test_native import assert_same_files
    from specshim.testbed import data

    dataset = data.write(tmp_path / "data.jsonl", count=12)
    for backend in ("generator", "native"):
        gpu_extract(speculators, tiny_models["llama"], dataset, tmp_path / backend,
                    "--backend", backend, runner="v1" if has_runner("v1") else "v2")  # fmt: skip
    assert_same_files(tmp_path / "generator", tmp_path / "native")


def test_native_files_written_by_vllms_worker_equal_the_callers_on_the_gpu(
    tiny_models, tmp_path
) -> None:
    """specshim's connector on CUDA vLLM: the checks of tests/e2e/test_native.py."""
    from e2e.test_native import assert_worker_writes_the_callers_files

    python = Path(sys.executable)
    assert_worker_writes_the_callers_files(python, tiny_models["llama"], tmp_path)


@pytest.mark.parametrize("speculators", SPECULATORS)
def test_files_written_in_the_worker_equal_the_rpc_paths_on_the_gpu(
    speculators, tiny_models, tmp_path
) -> None:
    """``--handoff worker`` (page-locked copies on a side stream, written in vLLM's worker)
    against ``--handoff rpc`` on CUDA vLLM: the same files, bit for bit; 40 to a batch, which
    request_batching splits into two calls of the generator, then 5."""
    from e2e.test_runner import assert_equal_files
    from specshim.testbed import data

    dataset = data.write(tmp_path / "data.jsonl", count=45)
    for how in ("rpc", "worker"):
        gpu_extract(speculators, tiny_models["llama"], dataset, tmp_path / how,
                    "--backend", "generator", "--handoff", how, "--batch-size", "40")  # fmt: skip
    assert assert_equal_files(tmp_path / "rpc", tmp_path / "worker") == 45


@pytest.mark.parametrize(("speculators", "runner"), CASES)
def test_engine_backend_writes_the_generator_backends_files_on_the_gpu(
    speculators, runner, tiny_models, tmp_path
) -> None:
    """``--backend engine`` (speculators' capture inside ``LLM.generate``'s loop, vLLM's worker
    writing) against the generator backend on CUDA vLLM, whole prompts (with ``--verify``) and
    16-token steps (chunked prefill, each prompt's chunks joined): the checks of
    tests/e2e/test_engine_loop.py, within bf16 noise (the engine batches differently)."""
    from e2e.test_native import assert_same_files
    from specshim.testbed import data

    dataset = data.write(tmp_path / "data.jsonl", count=12)
    runs = {
        "generator": ("--backend", "generator"),
        "engine": ("--backend", "engine", "--verify", "3"),
        "chunked": ("--backend", "engine", "--max-num-batched-tokens", "16"),
    }
    for name, more in runs.items():
        gpu_extract(speculators, tiny_models["llama"], dataset, tmp_path / name, *more,
                    runner=runner)  # fmt: skip
    for name in ("engine", "chunked"):
        assert_same_files(tmp_path / "generator", tmp_path / name)
