"""Extraction on a GPU against vLLM's own prefill, vLLM's native hidden-state path and the disk.

One process tree, each path in a fresh process on the same model and prompts, engine start
excluded (every path warms up on two prompts first), every figure also a ratio to vLLM's
prefill of the same prompts (``LLM.generate(max_tokens=1)``, the engine's floor for one
prefill pass) and to the disk's sequential write rate for the same bytes (what any path that
writes the states must stay under):

- ``vllm_prefill``: ``LLM.generate(max_tokens=1)`` with vLLM's defaults (compiled, CUDA
  graphs), no prefix caching; ``vllm_prefill@eager=on`` with ``enforce_eager``;
- ``native``: vLLM's ``extract_hidden_states`` speculative method with its
  ``ExampleHiddenStatesConnector`` (vLLM >= 0.18), timed until every file is written;
- ``generator_rpc``: speculators' generator after ``specshim.apply()``, states through the RPC;
- ``extract``: ``specshim extract`` with its defaults (no ``--backend``: what ``auto`` picks
  for this vLLM, speculators and GPU, the path a user gets), writing every sample to disk;
- ``extract_rpc``: ``specshim extract`` writing every sample to disk, states through the RPC
  (the files are compared: equal tensor for tensor, or the worst relative error where
  batches differ);
- ``extract_worker``: the same, vLLM's worker writing the files itself
  (``specshim.runner.in_worker.writer``), which reports where its time went; ``extract`` and
  any ``extract_*`` path also take ``@writers=N`` (the worker's writer processes,
  ``SPECSHIM_WRITER_PROCESSES``), ``@batch_size=N`` (prompts per ``generate`` call,
  ``extract --batch-size``; default 128), ``@max_num_seqs=N`` and ``@max_num_batched_tokens=N``,
  ``extract``'s engine steps (``options.EngineSettings``; vLLM's ``LLM`` on an H200 takes
  16,384 tokens a step), and for the engine and native backends ``@ahead_steps=N``, the steps
  of tokens their feed keeps waiting in vLLM's engine (``engine_feed.AHEAD_STEPS``, 4);
- ``extract_native``: ``specshim extract --backend native``, vLLM's native path writing
  speculators 0.3/0.4's files: in vLLM's worker, through specshim's connector
  (``specshim.runner.in_worker.connector``), where the installed vLLM allows it;
  ``extract_native@read_back=on`` instead reads vLLM's own files back in the caller, as
  where it does not;
- ``extract_engine``: ``specshim extract --backend engine``, speculators' capture inside
  ``LLM.generate``'s own engine loop, vLLM's worker writing the files
  (``specshim.runner.extraction.backends.engine``); its files are compared with the other
  ``extract`` paths' like theirs;
- ``disk``: ``torch.save`` + fsync of the same bytes, one file after another, to the same disk
  (each disk path removes what it wrote once timed, so that a real disk keeps room for the
  extractions);
- ``disk_writer``: the same on ``specshim extract``'s writer threads;
- ``disk_processes``: the same bytes written by the worker writer's processes
  (:mod:`specshim.runner.in_worker.writer_processes`) from states already in the ring, processes
  started before the clock: the writing alone at the parallelism ``extract_engine`` writes
  with (``@writers=N`` as there), the ceiling that counts for it where one process writing
  is slower than prefill.

    python benchmarks/gpu_extraction.py [--prompts 512 --length 512 --hidden 2048 --layers 16]
        [--length 32-1100]   # each prompt's length drawn evenly from 32 to 1,100 tokens
        [--paths vllm_prefill,native,extract_engine,extract_engine@writers=4,disk,disk_writer]
        [--repeat 3]

With ``--repeat N`` every path runs N times, in N rounds of all the paths (so that a drift of
the machine's speed reaches every path alike), each ``extract_*`` run in an empty folder; the
table gives each path's median run and the spread of its runs against prefill's median (one
H100 gave the same path 0.59 and 0.72 of prefill in two runs, docs/benchmarks.md run 12).

The model is a Llama with random bf16 weights, built here (no download).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ceiling, run_worker, save_results

LAYER_COUNT = 4  # captured layers, speculators' default count
PATHS = (
    "vllm_prefill",
    "native",
    "generator_rpc",
    "extract",
    "extract_rpc",
    "extract_worker",
    "extract_native",
    "extract_engine",
    "disk",
    "disk_writer",
    "disk_processes",
)


def build_model(out: Path, shape: argparse.Namespace) -> Path:
    """A model of ``shape`` (architecture, layers, hidden size, head size, key-value heads)
    with random weights, served in bfloat16."""
    from specshim.testbed import tiny_model

    if not (out / "config.json").exists():
        tiny_model.build(
            out, shape.architecture, num_layers=shape.layers, hidden_size=shape.hidden,
            head_dim=shape.head_dim, kv_heads=shape.kv_heads,
        )  # fmt: skip
        config = json.loads((out / "config.json").read_text())
        config["torch_dtype"] = config["dtype"] = "bfloat16"
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def layer_ids(model: str) -> list[int]:
    """speculators' default ids for the model: [2, n // 2, n - 3, n - 1]."""
    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    return [2, layers // 2, layers - 3, layers - 1]


def lengths(text: str) -> tuple[int, int]:
    """``--length``: ``N`` (every prompt N tokens) or ``A-B`` (drawn evenly from A to B)."""
    low, _, high = text.partition("-")
    try:
        shortest, longest = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or A-B tokens, got {text!r}") from None
    if not 0 < shortest <= longest:
        raise argparse.ArgumentTypeError(f"expected 0 < A <= B, got {text!r}")
    return shortest, longest


def write_prompts(path: Path, count: int, length: tuple[int, int], vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    shortest, longest = length
    prompts = []
    for _ in range(count):  # a length drawn only for a range: one length, the prompts of before
        size = rng.randint(shortest, longest) if shortest < longest else shortest
        prompts.append([rng.randrange(8, vocab) for _ in range(size)])
    path.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts))
    return prompts


class Timers:
    """Seconds spent inside chosen callables, by label: where a path's time goes."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()

    def wrap(self, owner: Any, name: str, by_first_argument: bool = False) -> None:
        """Time ``owner.name`` from now on (per first argument, for ``collective_rpc``)."""
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                label = (
                    f"{name}({getattr(args[0], '__name__', args[0])!r})"
                    if by_first_argument and args
                    else name
                )
                self.seconds[label] += time.perf_counter() - start

        setattr(owner, name, timed)


def _timed(run: Any, prompts: list[list[int]], timers: Timers | None = None) -> dict[str, Any]:
    run(prompts[:2])  # warm-up
    if timers:
        timers.seconds.clear()
    start = time.perf_counter()
    run(prompts)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "tokens_per_second": sum(map(len, prompts)) / seconds}
    return result | ({"inside": dict(timers.seconds)} if timers else {})


def _vllm_prefill(
    model: str, prompts: list[list[int]], max_len: int, mode: str
) -> dict[str, float]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    eager = _settings(mode).get("eager", "off")
    if eager not in ("on", "off"):
        raise ValueError(f"{mode}: eager=on or eager=off, got {eager}")
    llm = LLM(
        model, max_model_len=max_len, enforce_eager=eager == "on", enable_prefix_caching=False
    )
    params = SamplingParams(max_tokens=1, temperature=0.0)
    return _timed(
        lambda ps: llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params), prompts
    )


def _native(model: str, prompts: list[list[int]], max_len: int, work: Path) -> dict[str, float]:
    import fcntl

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from specshim.runner.extraction.backends import native

    # the layers extract captures, in speculators 0.3/0.4's numbering (vLLM's is one more)
    llm = LLM(**native.engine_options(model, layer_ids(model), max_len, 1, work / "native"))
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def run(ps: list[list[int]]) -> None:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params)
        for output in outputs:  # written asynchronously: wait until each file is complete
            with open(output.kv_transfer_params["hidden_states_path"] + ".lock") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)

    return _timed(run, prompts)


def _generator(model: str, prompts: list[list[int]], max_len: int) -> dict[str, Any]:
    import specshim

    specshim.apply()
    from speculators.data_generation.vllm_hidden_states_generator import (
        VllmHiddenStatesGenerator,
    )

    generator = VllmHiddenStatesGenerator(model, layer_ids=layer_ids(model), max_model_len=max_len)
    timers = Timers()
    timers.wrap(generator.executor, "execute_model")
    timers.wrap(generator.executor, "sample_tokens")
    timers.wrap(generator.executor, "collective_rpc", by_first_argument=True)

    def run(ps: list[list[int]]) -> None:
        for start in range(0, len(ps), 128):
            generator.generate(ps[start : start + 128])

    return _timed(run, prompts, timers)


def _extract(model: str, data: Path, max_len: int, out: Path, mode: str) -> dict[str, Any]:
    import contextlib

    from specshim.runner import extraction, files
    from specshim.runner.extraction import backends, options, recording
    from specshim.runner.extraction.backends import engine as engine_loop
    from specshim.runner.extraction.backends import feed as engine_feed
    from specshim.runner.extraction.backends import native
    from specshim.runner.extraction.backends.generator import WorkerFilesClient
    from specshim.runner.in_worker import writer as worker_writer

    handoff = mode.removeprefix("extract").removeprefix("_").split("@")[0] or "auto"
    settings = _settings(mode)
    if settings.pop("read_back", "off") == "on":
        native.writes_in_worker = lambda *_: False
    batch_size = int(settings.pop("batch_size", 128))
    if "ahead_steps" in settings:  # the feed's steps of tokens kept waiting in vLLM's engine
        engine_feed.AHEAD_STEPS = int(settings.pop("ahead_steps"))
    engine = options.EngineSettings(
        *(int(settings.pop(k)) if k in settings else None
          for k in ("max_num_seqs", "max_num_batched_tokens"))
    )  # fmt: skip
    if settings:
        raise ValueError(
            f"{mode}: unknown settings {sorted(settings)}; expected writers, read_back, "
            "batch_size, ahead_steps, max_num_seqs or max_num_batched_tokens"
        )
    backend = handoff if handoff in ("native", "engine", "auto") else "generator"
    timers = Timers()  # generate: the engine and the hand-off; the rest: this process's share
    started = backends.running
    worker: list[Any] = []  # what the hand-off did in the worker (page-locked or not)

    @contextlib.contextmanager
    def timed_generator(chosen: backends.Backend, *args: Any, **kwargs: Any) -> Any:
        with started(chosen, *args, **kwargs) as generator:  # for auto: the one it picked
            timers.wrap(generator, "generate")
            if chosen.name == "native":
                yield generator
                return
            if chosen.name == "engine":
                yield generator
                worker.extend(generator.llm.collective_rpc("specshim_engine_state"))
                return
            timers.wrap(generator.executor, "execute_model")
            timers.wrap(generator.executor, "collective_rpc", by_first_argument=True)
            yield generator
            if chosen.handoff == "worker":
                worker.extend(generator.executor.collective_rpc(worker_writer.state))

    backends.running = timed_generator
    timers.wrap(recording, "_checked")
    timers.wrap(files.BackgroundWriter, "submit")  # blocks while the writer is behind
    timers.wrap(WorkerFilesClient, "expect")  # blocks while the worker's is
    timers.wrap(WorkerFilesClient, "finished")
    timers.wrap(native.NativeFiles, "finished")
    # where vLLM's worker writes (worker hand-off, native and engine backends): the caller's
    # share of each batch, and the run's end (the feed's last steps, then every file in
    # place), outside ``generate``
    timers.wrap(recording._WorkerWrites, "announce")
    timers.wrap(recording._WorkerWrites, "take")  # asks the worker every RECORD_EVERY prompts
    timers.wrap(engine_loop.EngineFiles, "finished")  # with wait: drain, then the last files
    timers.wrap(engine_feed.EngineFeed, "drain")
    summary = extraction.extract(
        model,
        data,
        out,
        layers=layer_ids(model),
        max_model_len=max_len,
        batch_size=batch_size,
        progress=False,
        handoff="auto" if backend != "generator" else handoff,
        backend=backend,
        engine=engine,
    )
    return {
        "seconds": summary.seconds,
        "tokens_per_second": summary.tokens_per_second,
        "inside": dict(timers.seconds),
        "handoff": worker[0] if worker else None,
        "steps": summary.engine,
        "backend": summary.backend,
    }


def _disk(prompts: list[list[int]], hidden: int, work: Path, threads: int) -> dict[str, float]:
    """One sample's worth of bf16 states per prompt written as extract writes them (torch.save
    + fsync + rename), on ``threads`` writer threads (1: one file after another)."""
    import torch

    from specshim.runner import files

    out = work / f"disk_{threads}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        with files.BackgroundWriter(depth=256, threads=threads) as writer:
            for i, p in enumerate(prompts):
                states = [
                    torch.ones(len(p), hidden, dtype=torch.bfloat16) for _ in range(LAYER_COUNT)
                ]
                writer.submit(out / f"data_{i}.pt", {"input_ids": torch.tensor(p), "hs": states})
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(out)
    return {"seconds": seconds, "tokens_per_second": sum(map(len, prompts)) / seconds}


def _settings(mode: str) -> dict[str, str]:
    """``mode``'s ``@name=value`` settings, ``writers`` taken out and set in the environment,
    where :class:`specshim.runner.in_worker.writer.WorkerFiles` reads it (vLLM's worker is a
    process started after this)."""
    from specshim.runner.in_worker import writer as worker_writer

    _, *variant = mode.split("@")
    settings = dict(v.split("=", 1) for v in variant)
    if "writers" in settings:
        os.environ[worker_writer.WRITERS_VARIABLE] = settings.pop("writers")
    return settings


def _disk_processes(prompts: list[list[int]], hidden: int, out: Path) -> dict[str, Any]:
    """The writer processes alone, the ceiling for a path that writes through them: every
    sample's states already in a ring of the worker's size (as many samples' slots as fit, all
    ones, each with the largest magnitudes the worker would have computed on the GPU; the jobs take
    the slots in turn, so that the processes read memory, not one sample's bytes from the
    cache), the processes started before the clock, as the engine's start does; timed from the
    first job handed out to the last file written."""
    import torch

    from specshim.runner.in_worker.protocol import Expected
    from specshim.runner.in_worker.ring import HostRing, aligned
    from specshim.runner.in_worker.writer import RING_BYTES, writers_from_environment
    from specshim.runner.in_worker.writer_processes import WriteJob, WriterProcesses

    out.mkdir(parents=True, exist_ok=True)
    longest = max(map(len, prompts))
    layer_bytes = aligned(longest * hidden * 2)
    largest_at = LAYER_COUNT * layer_bytes  # in each slot
    slot_bytes = largest_at + aligned(4 * LAYER_COUNT)
    slots = max(1, RING_BYTES // slot_bytes)
    ring = HostRing()
    ring.hold(slots * slot_bytes, cuda=False)
    for slot in range(0, slots * slot_bytes, slot_bytes):
        ring.memory[slot : slot + largest_at].view(torch.bfloat16).fill_(1)
        largest = ring.memory[slot + largest_at : slot + largest_at + 4 * LAYER_COUNT]
        largest.view(torch.float32).fill_(1)
    place = (str(ring.buffer.path), ring.size)
    jobs = [
        WriteJob(i, Expected(str(out / f"data_{i}.pt"), p, [1] * len(p), f"prompt {i}"),
                 list(range(LAYER_COUNT)), place, "bfloat16",
                 [(slot + layer * layer_bytes, (len(p), hidden)) for layer in range(LAYER_COUNT)],
                 slot + largest_at)
        for i, p in enumerate(prompts)
        for slot in [i % slots * slot_bytes]
    ]  # fmt: skip
    processes = WriterProcesses(writers_from_environment())
    try:
        processes.start()
        written = []
        start = time.perf_counter()
        for job in jobs:
            while not processes.submit(job):
                written.extend(processes.answers(timeout=None))
        while processes.out:
            written.extend(processes.answers(timeout=None))
        seconds = time.perf_counter() - start
    finally:
        processes.close()
        ring.release()
        shutil.rmtree(out)
    if problems := [w.problem for w in written if w.problem]:
        raise RuntimeError(f"disk_processes: {problems[0]}")
    save_cpu = sum(w.seconds.get("save_cpu", 0.0) for w in written)
    return {
        "seconds": seconds,
        "tokens_per_second": sum(map(len, prompts)) / seconds,
        "inside": {"torch.save CPU, summed": save_cpu},
    }


def worker(mode: str, model: str, data: str, max_len: int, hidden: int, work: str) -> None:
    from specshim.runner import files

    prompts = [json.loads(line)["input_ids"] for line in Path(data).read_text().splitlines()]
    root = Path(work)
    if mode.startswith("vllm_prefill"):
        result = _vllm_prefill(model, prompts, max_len, mode)
    elif mode == "native":
        result = _native(model, prompts, max_len, root)
    elif mode == "generator_rpc":
        result = _generator(model, prompts, max_len)
    elif mode.startswith("extract"):
        result = _extract(model, Path(data), max_len, root / mode, mode)
    elif mode == "disk":
        result = _disk(prompts, hidden, root, threads=1)
    elif mode == "disk_writer":
        result = _disk(prompts, hidden, root, threads=files.WRITER_THREADS)
    else:
        if unknown := sorted(_settings(mode)):
            raise ValueError(f"{mode}: unknown settings {unknown}; expected writers")
        result = _disk_processes(prompts, hidden, root / mode)
    print("RESULT", json.dumps(result), flush=True)


def where_measured() -> dict[str, str]:
    """The device, vLLM release and day of this run, for the plot's title."""
    import datetime

    import torch

    from specshim import versions

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    vllm = versions.vllm().version or "?"
    return {"device": device, "vllm": vllm, "date": datetime.date.today().isoformat()}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median rate (the lower of the middle two where their number is even)."""
    rate = statistics.median_low(run["tokens_per_second"] for run in runs)
    return next(run for run in runs if run["tokens_per_second"] == rate)


def compare_files(one: Path, other: Path) -> tuple[int, float]:
    """How many data_*.pt files ``other`` holds, and the worst relative error of its states
    against ``one``'s (0.0: equal tensor for tensor). The file sets, token ids, loss masks and
    shapes must be the same (raises where they differ)."""
    import torch

    names = sorted(p.name for p in one.glob("data_*.pt"))
    assert names == sorted(p.name for p in other.glob("data_*.pt")), "different file sets"
    worst = 0.0
    for name in names:
        a, b = (torch.load(d / name) for d in (one, other))
        assert torch.equal(a["input_ids"], b["input_ids"]), name
        assert torch.equal(a["loss_mask"], b["loss_mask"]), name
        for x, y in zip(a["hidden_states"], b["hidden_states"], strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            if not torch.equal(x, y):
                error = (y.float() - x.float()).norm() / x.float().norm().clamp_min(1e-12)
                worst = max(worst, float(error))
    return len(names), worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--length", type=lengths, default=(512, 512), help="N or A-B tokens")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--architecture", choices=("llama", "qwen3"), default="llama")
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: half the heads")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset")
    parser.add_argument("--work", type=Path, default=None, help="default: a new temp folder")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each path, in rounds")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="specshim-gpu-bench-"))
    model = build_model(work / "model", args)
    data = work / "prompts.jsonl"
    prompts = write_prompts(data, args.prompts, args.length, vocab=384)
    max_len = args.length[1] + 16
    chosen = args.paths.split(",")
    if args.repeat < 1:
        parser.error(f"--repeat: expected at least 1, got {args.repeat}")
    if unknown := [p for p in chosen if p.split("@")[0] not in PATHS]:
        parser.error(f"--paths: unknown {unknown}; expected some of {', '.join(PATHS)}")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in chosen}
    width = max(15, *(len(m) + 2 for m in chosen))
    for _ in range(args.repeat):
        for mode in chosen:
            if mode.startswith("extract"):  # else it would resume the last run's folder
                shutil.rmtree(work / mode, ignore_errors=True)
            try:
                found = run_worker(
                    Path(__file__), "--worker", mode, str(model), str(data), str(max_len),
                    str(args.hidden), str(work), timeout=1200,
                )  # fmt: skip
            except RuntimeError as exc:  # one path failing leaves the others' figures
                print(f"{mode}: {exc}", file=sys.stderr, flush=True)
                continue
            runs[mode].append(found)
            spent = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(found.get("inside", {}).items()))
            print(f"{mode:<{width}}{found['tokens_per_second']:>14,.0f} tokens/s in "
                  f"{found['seconds']:.2f} s" + (f" ({spent})" if spent else "")
                  + (f" steps: at most {found['steps']}" if found.get("steps") else "")
                  + (f" worker: {found['handoff']}" if found.get("handoff") else "")
                  + (f" backend: {found['backend']}" if found.get("backend") else ""),
                  file=sys.stderr, flush=True)  # fmt: skip
    median = {mode: _median_run(found) for mode, found in runs.items() if found}
    rates = {mode: run["tokens_per_second"] for mode, run in median.items()}
    inside = {mode: run.get("inside", {}) for mode, run in median.items()}
    worker_side = {
        mode: {k: run[k] for k in ("steps", "handoff", "backend") if run.get(k)}
        for mode, run in median.items()
    }
    written = [m for m in rates if m.startswith("extract")]
    for mode in written[1:]:
        compared, worst = compare_files(work / written[0], work / mode)
        how = f"within relative error {worst:.1e} of" if worst else "equal, tensor for tensor,"
        print(f"{mode}'s {compared} files {how} {written[0]}'s")
    base = rates.get("vllm_prefill")
    bound = ceiling(rates)
    heads = f"{args.hidden // args.head_dim}/{args.kv_heads or args.hidden // args.head_dim // 2}"
    shortest, longest = args.length
    length = f"{shortest}" if shortest == longest else f"{shortest} to {longest}"
    print(f"\n{args.prompts} prompts x {length} tokens ({sum(map(len, prompts)):,} in all), "
          f"{args.architecture} {args.layers} x "
          f"{args.hidden}, heads {heads} of {args.head_dim}")  # fmt: skip
    print(f"{'path':<{width}}{'tokens/s':>14}{'vs prefill':>12}{'vs min(prefill, disk)':>24}"
          + ("  runs vs prefill" if args.repeat > 1 else ""))  # fmt: skip
    for mode, rate in rates.items():
        vs_base = f"{rate / base:.3f}" if base else "-"
        vs_ceiling = f"{rate / bound[0]:.3f}" if bound else "-"
        each = sorted(run["tokens_per_second"] / base for run in runs[mode]) if base else []
        spread = (
            f"  {len(each)}: {each[0]:.3f} to {each[-1]:.3f}" if args.repeat > 1 and each else ""
        )
        print(f"{mode:<{width}}{rate:>14,.0f}{vs_base:>12}{vs_ceiling:>24}{spread}")
    print(
        "(disk: the faster of the disk paths"
        + ("; each path's median run)" if args.repeat > 1 else ")")
    )
    save_results(
        "gpu_extraction",
        {
            "rates": rates,
            "inside": inside,
            "worker": worker_side,
            "runs": {
                mode: [run["tokens_per_second"] for run in found] for mode, found in runs.items()
            },
            "args": vars(args) | {"work": str(work)},
            "where": where_measured(),
        },
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        mode, model, data, max_len, hidden, work = sys.argv[2:8]
        worker(mode, model, data, int(max_len), int(hidden), work)
    else:
        main()
