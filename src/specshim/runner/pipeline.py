"""``specshim run``: the whole pipeline on a built-in default, from a clean directory.

Trains a tiny verifier worth drafting for (``testbed.learnable``: a few minutes on the CPU,
kept in the work directory for later runs), extracts hidden states through the real vLLM and
speculators (patched by specshim), builds the draft vocabulary, trains an EAGLE-3 draft through
speculators' trainer, exports it with the layer ids vLLM serving needs, and ends with
``specshim eval``: the acceptance table from vLLM's own speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specshim import console
from specshim.runner import files, out_lock

#: The verifier has 4 layers: the generator's default ids [2, n//2, n-3, n-1] would collapse to
#: three distinct layers, so the pipeline names them: three auxiliary layers and the last.
LAYERS = [0, 1, 2, 3]
DRAFT_VOCAB = 256
#: Written first into a work directory: it is this command's, and a rerun may write there.
MARKER = "specshim_run.json"
#: How many of a refused work directory's files its message names.
NAMED = 3


@dataclass(frozen=True)
class Settings:
    """What ``specshim run`` is asked for: its work directory (kept between runs), the
    verifier's training time, the number of samples and training epochs, and the extraction
    backend (``specshim extract --backend``)."""

    workdir: Path
    max_model_len: int = 256
    verifier_seconds: float = 180.0
    samples: int = 300
    epochs: int = 3
    backend: str = "auto"
    overwrite: bool = False


def show(text: str) -> None:
    """Print part of the run's result where the command's result goes (its log holds the
    rest of stdout while the run goes on)."""
    print(text, file=console.result())


def say(message: str) -> None:
    """One progress line on stderr, as ``specshim run``."""
    console.status("specshim run", message)


def claim(work: Path, overwrite: bool) -> None:
    """Make ``work`` (an existing folder) this command's, before anything else is written.

    The pipeline replaces ``data.jsonl``, the vocabulary, the draft and the evaluation in its
    work directory: a folder that holds files and no :data:`MARKER` (the user's, or another
    command's) is refused with one line unless ``overwrite``; then the marker is written."""
    if not overwrite and not (work / MARKER).exists() and (found := out_lock.contents(work)):
        names = ", ".join(p.name for p in found[:NAMED]) + (", ..." if len(found) > NAMED else "")
        raise ValueError(
            f"--workdir {work} holds files specshim run did not write ({names}): "
            "pick an empty or new --workdir, or pass --overwrite to let it replace them"
        )
    files.save_json(work / MARKER, {"written_by": "specshim run"})


def run(settings: Settings) -> int:
    """The whole pipeline in ``settings.workdir``: a verifier trained there before is kept and
    the extraction resumes, the draft is trained anew. Exit status 0 when greedy output with
    the draft is the verifier's own, 1 otherwise."""
    work = settings.workdir
    claim(work, settings.overwrite)
    from specshim.runner import evaluate, export, extraction, train, vocab
    from specshim.testbed import learnable

    verifier = work / "verifier"
    if not (verifier / "config.json").exists():
        say(f"training the verifier for up to {settings.verifier_seconds:.0f} s ({verifier})")
        learnable.build_verifier(verifier, seconds=settings.verifier_seconds)
    dataset = learnable.write_dataset(verifier, work / "data.jsonl", settings.samples)
    say(f"verifier {verifier}, data {dataset}")
    states = work / "hidden_states"
    summary = extraction.extract(
        str(verifier),
        dataset,
        states,
        layers=LAYERS,
        max_model_len=settings.max_model_len,
        backend=settings.backend,
    )
    show(summary.text())
    target = vocab.target_vocab_size(verifier)
    d2t, t2d = vocab.build(states, min(DRAFT_VOCAB, target), target, work, overwrite=True)
    show(f"vocabulary: {d2t}, {t2d}")
    # The demo trains its draft anew on every run (extraction above resumes instead): a
    # second `specshim run` in the same work directory must not be refused as a mixed run.
    trained = train.train(
        states, str(verifier), work / "draft", vocab=work, epochs=settings.epochs, overwrite=True
    )
    show(trained.text())
    served = export.export(work / "draft", states, work / "draft" / "served")
    say(f"exported for vLLM: {served}")
    result = evaluate.evaluate(
        str(verifier),
        str(served),
        list(learnable.PROMPTS),
        work / "eval",
        max_model_len=settings.max_model_len,
        overwrite=True,  # the work directory is the run's (claim): its eval too
    )
    show(result.table())
    return 0 if result.identical else 1
