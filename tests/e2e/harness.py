"""Run the driver in a fresh process and compute the transformers reference for its output."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import conftest
from conftest import ROOT, speculators_path, vllm_python
from specshim.testbed import model_runner_v2

DRIVER = Path(__file__).with_name("driver.py")
OUT = Path(os.environ.get("SPECSHIM_E2E_OUT", ROOT / "build" / "e2e"))
#: bf16 (vLLM's CPU dtype here) against float32: per-token relative error of about 1-2 %.
MAX_RELATIVE_ERROR = 0.05
MIN_COSINE = 0.999
#: The environment name of the running interpreter's own CUDA vLLM (tests/gpu, on the H200).
CUDA = "cuda"
#: This test session: pytest-xdist's run id, shared by its workers, or this process's own.
#: :func:`run` makes each run once per session and reads it back in every other worker.
SESSION = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


@functools.cache
def run(
    vllm: str,
    speculators: str,
    model: Path,
    exclude: tuple[str, ...] = (),
    shim: bool = True,
    batches: str = "1,11,40",
    tp: int = 1,
    prompt_len: int = 0,
    max_model_len: int = 256,
    runner_v2: bool = False,
) -> dict[str, Any]:
    """The driver's results, or ``{"error": {...}}`` when the generator raised.

    ``vllm`` names a CPU environment, or :data:`CUDA` for this interpreter's CUDA vLLM (whose
    ``PYTHONPATH`` is kept behind speculators'; ``runner_v2=False`` then selects the V1
    runner, since V2 is CUDA vLLM's default).
    """
    OUT.mkdir(parents=True, exist_ok=True)
    name = "-".join(
        map(
            str,
            (
                vllm,
                speculators,
                model.name,
                *exclude,
                shim,
                batches,
                tp,
                prompt_len,
                max_model_len,
                "v2" if runner_v2 else "v1",
            ),
        )
    )
    if len(name) > 200:  # many adapters excluded: keep the file name under the OS limit
        name = f"{vllm}-{speculators}-{hashlib.sha1(name.encode()).hexdigest()[:16]}"
    out = OUT / f"{name.replace(',', '_')}.pt"
    with open(f"{out}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a run made by another worker of this session is read
        return _made_here(out) or _make(
            out, vllm, speculators, model, exclude, shim, batches, tp, prompt_len,
            max_model_len, runner_v2,
        )  # fmt: skip


def _made_here(out: Path) -> dict[str, Any] | None:
    """The result at ``out`` if a process of this test session made it (see :data:`SESSION`)."""
    made = Path(f"{out}.session")
    if not made.exists() or made.read_text() != SESSION:
        return None
    return _result(out)


def _result(out: Path) -> dict[str, Any]:
    error = Path(f"{out}.error.json")
    if error.exists():
        # all the driver printed: a vLLM worker logs the root cause before the generator's
        # summary, and vLLM's logger writes to stdout
        log = Path(f"{out}.log").read_text()
        return {"error": {**json.loads(error.read_text()), "log": log}}
    return torch.load(out, weights_only=False)


def _make(
    out: Path,
    vllm: str,
    speculators: str,
    model: Path,
    exclude: tuple[str, ...],
    shim: bool,
    batches: str,
    tp: int,
    prompt_len: int,
    max_model_len: int,
    runner_v2: bool,
) -> dict[str, Any]:
    """Run the driver into ``out`` (see :func:`run`) and record that this session made it."""
    for stale in (out, *(Path(f"{out}.{end}") for end in ("error.json", "log", "session"))):
        stale.unlink(missing_ok=True)
    on_gpu = vllm == CUDA
    paths = [str(speculators_path(speculators))]
    if on_gpu and os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("SPECSHIM_APPLY", None)
    if tp > 1 and conftest.WORKER_CORES is not None:
        env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # a worker's cores: the driver binds each rank
    if on_gpu:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner_v2 else "0"
    elif runner_v2:
        env.update(model_runner_v2.environment(env))
    cmd = [
        sys.executable if on_gpu else str(vllm_python(vllm)),
        str(DRIVER),
        "--model",
        str(model),
        "--out",
        str(out),
        "--batches",
        batches,
        "--tp",
        str(tp),
        "--prompt-len",
        str(prompt_len),
        "--max-model-len",
        str(max_model_len),
    ]
    if exclude:
        cmd += ["--exclude", ",".join(exclude)]
    if not shim:
        cmd.append("--no-shim")
    if on_gpu:
        cmd.append("--gpu")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    Path(f"{out}.log").write_text(proc.stdout + proc.stderr)
    if not Path(f"{out}.error.json").exists() and (proc.returncode != 0 or not out.exists()):
        raise AssertionError(f"driver died (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    Path(f"{out}.session").write_text(SESSION)
    return _result(out)


def wait_while_running(
    process: subprocess.Popen, done: Callable[[], bool], before: str, seconds: float = 600
) -> None:
    """Wait until ``done()`` holds, failing if ``process`` ends first (it ended ``before``
    what the test meant to do) or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not done():
        assert process.poll() is None, f"the command ended before {before}"
        assert time.monotonic() < deadline, f"not ready within {seconds} s: {before}"
        time.sleep(0.05)


#: What vLLM's processes make in /dev/shm (Python's shared memory and semaphores); specshim's
#: own buffers are removed by the next extraction (``ring.sweep``).
VLLMS_SHARED_MEMORY = ("psm_", "sem.mp-")


def shared_memory_of_group(group: int) -> set[Path]:
    """vLLM's files in /dev/shm that the processes of process group ``group`` map now. Taken
    just before the group is killed with SIGKILL, they are what it leaves (nothing of vLLM's
    cleans up after SIGKILL; each queue is hundreds of MB of the machine's memory), and no
    other test's: read from the group's own mappings, not from what appeared meanwhile."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != group:
                continue  # after the command's name: state, parent, group
            maps = (stat.parent / "maps").read_text()
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        for line in maps.splitlines():
            path = Path(line.split(maxsplit=5)[-1])
            if path.parent == Path("/dev/shm") and path.name.startswith(VLLMS_SHARED_MEMORY):
                found.add(path)
    return found


def assert_ran(result: dict[str, Any]) -> None:
    """Fail with the generator's error first, then the root cause a vLLM worker logged."""
    error = result.get("error")
    if error is None:
        return
    found = (re.search(r"\b\w*(Error|Exception): .*", line) for line in error["log"].splitlines())
    logged = [m.group(0) for m in found if m and error["message"].strip() not in m.group(0)]
    cause = f" (last error logged: {logged[-1]})" if logged else ""
    raise AssertionError(
        f"{error['type']}: {error['message'].strip()}{cause}\n{error['traceback']}"
    )


def reference(model: Path, input_ids: torch.Tensor, layer_ids: list[int]) -> list[torch.Tensor]:
    """Output of decoder layer k (before the final norm) in float32 transformers, per layer id.

    This is speculators' convention: layer id k is captured after layer k, which is
    transformers' ``hidden_states[k + 1]`` for every layer but the last (whose
    ``hidden_states`` entry is taken after the final norm), so hooks read the layers directly.
    """
    hf = _model(model)
    captured: dict[int, torch.Tensor] = {}

    def keep(k: int) -> Any:
        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            captured[k] = out[0] if isinstance(out, tuple) else out

        return hook

    hooks = [hf.model.layers[k].register_forward_hook(keep(k)) for k in layer_ids]
    try:
        with torch.no_grad():
            hf(input_ids[None])
    finally:
        for hook in hooks:
            hook.remove()
    return [captured[k][0] for k in layer_ids]


@functools.cache
def _model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(worst per-token relative error, worst per-token cosine) of ``got`` against ``want``."""
    got = got.float()
    relative = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=-1).min().item()
    return relative, cosine


def assert_matches_transformers(
    model: Path, result: dict[str, Any], key: str, samples: slice | list[int] = slice(None)
) -> None:
    """Every layer of the chosen samples of ``result[key]`` within bf16 noise of transformers."""
    chosen = (
        result[key][samples] if isinstance(samples, slice) else [result[key][i] for i in samples]
    )
    for n, sample in enumerate(chosen):
        want = reference(model, sample["input_ids"], result["layer_ids"])
        for layer, got, ref in zip(result["layer_ids"], sample["hidden_states"], want, strict=True):
            relative, cosine = errors(got, ref)
            where = f"{key}, sample {n}, layer {layer}"
            assert relative < MAX_RELATIVE_ERROR, f"{where}: relative error {relative:.3f}"
            assert cosine > MIN_COSINE, f"{where}: cosine {cosine:.5f}"
