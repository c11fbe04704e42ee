"""``specshim extract``: hidden states through speculators' own generator, patched by specshim.

Output is what speculators 0.3/0.4 training reads: ``data_{i}.pt`` (``input_ids``, a list of
``[seq, hidden]`` tensors, ``loss_mask``), ``token_freq.pt``, ``sample_lengths.json`` and
``data_config.json``. Every file is written atomically, so a run killed at any moment leaves
only whole files.

Resume is tied to content, not to positions: once ``data_{i}.pt`` is in place, its entry in
``specshim_extract_done.jsonl`` records a fingerprint of the row it came from (its token ids
and loss mask as written, the model and the layer ids) and the file's size and modification
time. A rerun keeps a sample only when its row's fingerprint and the file both still match
that entry; everything else (a row edited, inserted, removed or moved, a file emptied,
truncated or replaced, a file written but not yet recorded when the run was killed) is
extracted again, and ``data_{i}.pt`` beyond the current number of samples are removed, so
the folder always holds exactly one file per current row.

Only files specshim wrote into the folder are replaced or removed: sample files that still
hold what its ledger recorded for them (or, claimed in ``specshim_extract.json`` by a run
killed before it recorded them, their row's tokens), and the final files of a folder a run
started in. Any other file a run would replace or remove (a user's own ``data_77.pt``, one a
stale ledger line names, one damaged since, a folder speculators' own generator wrote) stops
it before vLLM starts, naming them, unless ``--overwrite`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specshim import console
from specshim.runner import dataset, files, remote_code
from specshim.runner.extraction import backends, final_files, options, recording, resume
from specshim.runner.extraction import verify as verification
from specshim.runner.extraction.backends.base import Launch
from specshim.runner.progress import Progress


@dataclass
class Summary:
    """What one ``specshim extract`` run did, for its closing lines and
    ``specshim_extract.json``."""

    samples: int
    extracted: int
    resumed: int
    truncated: int
    skipped: list[str] = field(default_factory=list)
    tokens_per_second: float = 0.0
    seconds: float = 0.0
    redone: list[int] = field(default_factory=list)  # lines whose earlier file was not kept
    removed: int = 0  # stale data_i.pt beyond the current samples
    verified: str = ""
    handoff: str = "rpc"  # how the states left vLLM's worker (Backend.handoff)
    backend: str = "generator"  # who made the states, and for --backend auto, why
    # how much one engine step took at most, and vLLM's memory fraction:
    # "32 prompts, 8,192 tokens (gpu_memory_utilization 0.8)"
    engine: str = ""
    recomputed: int = 0  # prompts vLLM preempted part-way and computed again (engine backend)

    def text(self) -> str:
        """The summary as the lines ``specshim extract`` prints at the end."""
        throughput = (
            f"{self.tokens_per_second:,.0f} tokens/s over {self.seconds:.1f} s (tokens "
            "extracted / time from the engine's start to the last file written; states "
            f"handed over by {self.handoff})"
            if self.extracted
            else "none, nothing was left to extract"
        )
        lines = [
            f"samples: {self.samples} ({self.extracted} extracted, {self.resumed} already done)",
            f"truncated to max_model_len - 1: {self.truncated}",
            f"skipped bad rows: {len(self.skipped)}",
            f"throughput: {throughput}",
            f"backend: {self.backend}",
        ]
        if self.engine:
            lines.append(f"engine steps: at most {self.engine}")
        if self.recomputed:
            lines.append(
                f"recomputed: {self.recomputed} prompts that vLLM preempted part-way for KV "
                "cache room and computed again (their files hold the second pass); fewer "
                "tokens a step (--max-num-batched-tokens) or more memory "
                "(--gpu-memory-utilization) spare that work"
            )
        if self.redone:
            lines.append(
                f"extracted again, their row changed or their file was damaged or unrecorded: "
                f"{len(self.redone)} (first: line {self.redone[0]})"
            )
        if self.removed:
            lines.append(f"removed data_i.pt beyond the current samples: {self.removed}")
        if self.verified:
            lines.append(self.verified)
        return "\n".join(lines + [f"  {s}" for s in self.skipped[:10]])


def _engine_taken(generator: Any) -> str:
    """The step limits and memory fraction vLLM was started with, as the summary says them."""
    scheduler = generator.vllm_config.scheduler_config
    memory = generator.vllm_config.cache_config.gpu_memory_utilization
    return (
        f"{scheduler.max_num_seqs} prompts, {scheduler.max_num_batched_tokens:,} tokens "
        f"(gpu_memory_utilization {memory:g})"
    )


def extract(
    model: str,
    data: Path,
    out: Path,
    layers: list[int] | None = None,
    max_model_len: int = 2048,
    batch_size: int = 8,
    tensor_parallel_size: int = 1,
    truncate: bool = False,
    skip_bad: bool = False,
    progress: bool = True,
    handoff: str = "auto",
    verify: int = 0,
    backend: str = "auto",
    engine: options.EngineSettings = options.EngineSettings(),
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> Summary:
    """Extract every sample of ``data`` not already in ``out`` (see the module doc for what
    resume keeps), then, with ``verify``, re-extract that many random samples one at a time
    and compare them with the batched files. Every input and option is checked before vLLM
    starts; ``specshim_extract.json`` is written only once it has. Files specshim did not
    write that the run would replace or remove
    (:func:`~specshim.runner.extraction.resume.not_written_here`) stop it before anything changes,
    unless ``overwrite``. The model's own code runs, here and in vLLM, only with
    ``trust_remote_code`` (:mod:`specshim.runner.remote_code`)."""
    options.check_numbers(batch_size, max_model_len, tensor_parallel_size, verify, engine, backend)
    generator_handoff = backends.checked_handoff(backend, handoff, tensor_parallel_size)
    config = options.model_config(model, trust_remote_code)
    layers = options.choose_layers(options.text_config(config).num_hidden_layers, layers)
    options.check_length(config, max_model_len)
    console.phase("config read")
    options.prepare_out(out)
    settings = resume.settings_for(model, data, layers, max_model_len)
    claimed = resume.check_manifest(out, settings)

    import specshim
    from specshim import hardware

    hardware.prepare_for_vllm(tensor_parallel_size)
    chosen = backends.choose(backend, tensor_parallel_size, handoff, generator_handoff)
    specshim.apply()
    console.phase("adapters applied")
    tokenizer = remote_code.tokenizer(model, trust_remote_code)
    skipped: list[dataset.BadRow] = []
    samples = list(dataset.read(data, tokenizer, skip_bad=skip_bad, skipped=skipped))
    if not samples:
        raise options.ExtractionError(f"{data} holds no usable samples")
    limit = max_model_len - 1
    truncated = options.truncated_rows(samples, limit, truncate, data)
    prints = [resume.fingerprint(s, limit, settings) for s in samples]
    work = resume.plan(out, samples, prints)
    if not overwrite and (foreign := resume.not_written_here(out, work, claimed, settings)):
        raise options.ExtractionError(files.refusal("--out", out, foreign))
    files.remove_partials(out)
    for path in work.stale:
        path.unlink()
    options.check_room(out, work.todo, limit, len(layers), options.text_config(config).hidden_size)
    console.phase("plan made")
    extracted: Progress | None = None  # the run's bar: its rate and time go to the summary
    verified = ""
    taken = ""
    recomputed = 0
    if work.todo or verify or not final_files.config_current(out, len(samples)):
        with (
            remote_code.in_speculators(trust_remote_code, remote_code.EXTRACTION_LOADERS),
            backends.running(chosen, Launch(
                model, layers, max_model_len, tensor_parallel_size, out, engine, trust_remote_code
            )) as generator,
        ):  # fmt: skip
            console.phase("engine started")
            taken = _engine_taken(generator)
            # only now: a failed start leaves nothing; the claim before any sample is written
            claim = {resume.CLAIMED: max(claimed, len(samples))}
            files.save_json(out / resume.MANIFEST, {**settings, **claim})
            files.Ledger(out / resume.LEDGER).keep(work.kept)
            extracted = recording.run(
                chosen, out, work.todo, prints, samples, batch_size, limit, progress
            )
            console.phase("last sample written")
            final_files.save_data_config(generator, out, data, max_model_len, len(samples))
            if verify:
                verified = verification.compare(generator, out, samples, verify, layers)
            recomputed = chosen.recomputed()
        console.phase("engine closed")
    files.save_torch(out / "token_freq.pt", final_files.token_freq(samples, limit))
    files.save_json(
        out / "sample_lengths.json",
        {str(s.index): min(len(s.input_ids), limit) for s in samples},
    )
    console.phase("final files written")
    return Summary(
        samples=len(samples),
        extracted=len(work.todo),
        resumed=len(work.kept),
        truncated=truncated,
        skipped=[str(e) for e in skipped],
        tokens_per_second=extracted.tokens_per_second if extracted else 0.0,
        seconds=extracted.elapsed if extracted else 0.0,
        redone=work.redone,
        removed=len(work.stale),
        verified=verified,
        handoff=chosen.handoff,
        backend=f"{chosen.name} ({chosen.why})",
        engine=taken,
        recomputed=recomputed,
    )
