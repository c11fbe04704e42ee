"""The commands that train and evaluate a draft: ``train``, ``eval`` and ``run``."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from specshim.cli.options import (
    _add_trust_remote_code,
    _add_verbose,
    _command,
)
from specshim.runner import out_lock


def _train(args: argparse.Namespace) -> int:
    from specshim.runner import library_log, train

    with library_log.kept(args.out, args.verbose):
        result = train.train(
            args.data,
            args.verifier,
            args.out,
            vocab=args.vocab,
            epochs=args.epochs,
            lr=args.lr,
            max_len=args.max_len,
            num_layers=args.num_layers,
            ttt_steps=args.ttt_steps,
            device=args.device,
            resume=args.resume,
            dtype=args.dtype,
            overwrite=args.overwrite,
            trust_remote_code=args.trust_remote_code,
        )
    print(result.text())
    return 0


def _add_train(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "train",
        "EAGLE-3 draft training through speculators",
        "Train an EAGLE-3 draft on an extraction folder with speculators' own trainer,\n"
        "one checkpoint per epoch; --resume continues after the last one. The folder is\n"
        "checked to be one complete extraction before the first step. Data-parallel:\n"
        "torchrun --nproc_per_node=N -m specshim.cli train ...",
        "  specshim train --data hs/ --verifier meta-llama/Llama-3.1-8B-Instruct \\\n"
        "      --out draft/ --epochs 3 --dtype bfloat16",
    )
    command.add_argument("--data", required=True, type=Path, help="an extraction folder")
    command.add_argument("--verifier", required=True, help="the verifier model the data came from")
    command.add_argument(
        "--out",
        required=True,
        type=Path,
        help="a new or empty folder for checkpoints and train_log.json (one run a folder)",
    )
    command.add_argument(
        "--vocab", type=Path, default=None, help="folder of d2t.npy/t2d.npy (default: --data)"
    )
    command.add_argument("--epochs", type=int, default=3, help="epochs to train in all (>= 1)")
    command.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (> 0)")
    command.add_argument(
        "--max-len", type=int, default=1024, help="tokens packed into a step (>= 1)"
    )
    command.add_argument("--num-layers", type=int, default=1, help="draft decoder layers (>= 1)")
    command.add_argument(
        "--ttt-steps", type=int, default=3, help="draft steps unrolled per position (>= 1)"
    )
    command.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    command.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out after its last checkpoint (same settings)",
    )
    command.add_argument(
        "--overwrite",
        action="store_true",
        help="remove the run in --out (checkpoints, log, exports) and start over",
    )
    command.add_argument(
        "--dtype", default="float32", help="float32 or bfloat16 (model and states)"
    )
    _add_trust_remote_code(command)
    _add_verbose(command, "OUT")
    command.set_defaults(handler=_train)


def _eval(args: argparse.Namespace) -> int:
    """Export (a training folder) and evaluate the draft. A training ``--draft`` is held alone
    for the whole run, as ``train`` holds it: eval writes ``served/`` there, and two evals of
    one draft would write the same one; an exported draft, only read, is held shared."""
    from specshim.runner import evaluate, export, library_log
    from specshim.testbed import learnable

    draft = served = args.draft
    training = (draft / "checkpoints").is_dir()  # speculators' training output: export it first
    if training:
        if args.data is None:
            from specshim.cli import parser

            parser().error("eval of a training folder needs --data (its extraction folder)")
        served = draft / ("served" if args.layer_shift == 1 else f"served-shift-{args.layer_shift}")
    named = served.resolve()  # `--draft .` is named by the folder it is, not ""
    out = args.out or named.parent / f"eval-{named.name}"  # one a draft: see --help
    # a training folder is written (served/): held alone for the whole run, as train holds it
    drafts = (
        contextlib.nullcontext()
        if draft.resolve() == out.resolve()
        else out_lock.held(draft, "eval", "--draft", shared=not training)
    )
    reading = (  # the extraction the export reads, held for reading as train holds it
        out_lock.held(args.data, "eval", "--data", shared=True)
        if training and args.data.resolve() not in (draft.resolve(), out.resolve())
        else contextlib.nullcontext()
    )
    with drafts, reading, out_lock.held(out, "eval"), library_log.kept(out, args.verbose):
        evaluate.check(out, args.overwrite)
        if training:
            export.check(served, "--draft", args.overwrite)
            export.export(draft, args.data, served, shift=args.layer_shift)
        else:
            evaluate.check_draft(draft)
        prompts = (
            [line for line in args.prompts.read_text().splitlines() if line.strip()]
            if args.prompts
            else list(learnable.PROMPTS)
        )
        result = evaluate.evaluate(
            args.verifier,
            str(served),
            prompts,
            out,
            k=args.k,
            max_tokens=args.max_tokens,
            max_model_len=args.max_model_len,
            trust_remote_code=args.trust_remote_code,
            overwrite=args.overwrite,
        )
    print(result.table())
    return 0 if result.identical else 1


def _add_eval(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "eval",
        "acceptance of a draft in vLLM's EAGLE-3 decoding",
        "Serve the draft with its verifier in vLLM's EAGLE-3 speculative decoding, check that\n"
        "greedy output is unchanged, and print the acceptance rate at each draft position\n"
        "and the mean acceptance length (docs/eval.md). A training folder is exported to\n"
        "the form vLLM loads first. Exit status 1: the output changed.",
        "  specshim eval --verifier meta-llama/Llama-3.1-8B-Instruct --draft draft/ \\\n"
        "      --data hs/ --prompts prompts.txt",
    )
    command.add_argument("--verifier", required=True, help="the verifier model folder (or hub id)")
    command.add_argument("--draft", type=Path, required=True, help="training or exported folder")
    command.add_argument(
        "--data", type=Path, default=None, help="the extraction folder (layer ids)"
    )
    command.add_argument("--prompts", type=Path, default=None, help="one prompt a line")
    command.add_argument("--k", type=int, default=3, help="speculative tokens per step")
    command.add_argument("--max-tokens", type=int, default=48, help="tokens generated per prompt")
    command.add_argument("--max-model-len", type=int, default=256, help="vLLM's context")
    command.add_argument(
        "--layer-shift",
        type=int,
        default=1,
        help="serving id = generator id + shift; 1 is consistent, 0 reads one layer early",
    )
    command.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where eval.json goes (default: eval-NAME beside the served draft NAME, e.g. "
        "draft/eval-served)",
    )
    command.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files in --out and served/ that specshim did not write (else the run "
        "stops first)",
    )
    _add_trust_remote_code(command)
    _add_verbose(command, "OUT")
    command.set_defaults(handler=_eval)


def _run(args: argparse.Namespace) -> int:
    from specshim.runner import library_log, pipeline

    settings = pipeline.Settings(
        args.workdir,
        args.max_model_len,
        args.verifier_seconds,
        args.samples,
        args.epochs,
        args.backend,
        args.overwrite,
    )
    with library_log.kept(args.workdir, args.verbose):
        return pipeline.run(settings)


def _add_run(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from specshim.runner.extraction.backends import BACKENDS

    command = _command(
        commands,
        "run",
        "the whole pipeline on a built-in tiny verifier",
        "Train a tiny verifier, extract its hidden states, train an EAGLE-3 draft and\n"
        "evaluate it: every step of the real pipeline in a few minutes, on the CPU or a GPU.",
        "  specshim run --workdir runs/demo",
    )
    command.add_argument(
        "--workdir",
        type=Path,
        default=Path("runs/default"),
        help="everything goes here; a rerun reuses the verifier and the extracted states",
    )
    command.add_argument("--max-model-len", type=int, default=256, help="vLLM's context")
    command.add_argument(
        "--verifier-seconds", type=float, default=180.0, help="training time of the verifier"
    )
    command.add_argument("--samples", type=int, default=300, help="rows extracted for training")
    command.add_argument("--epochs", type=int, default=3, help="draft training epochs")
    command.add_argument(
        "--backend", choices=BACKENDS, default="auto", help="as `specshim extract --backend`"
    )
    command.add_argument(
        "--overwrite",
        action="store_true",
        help="let it write into a --workdir that holds files another run or tool wrote",
    )
    _add_verbose(command, "WORKDIR")
    command.set_defaults(handler=_run)
