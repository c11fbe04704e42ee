"""specshim: run speculators 0.3/0.4 (EAGLE-3 draft training) on newer vLLM releases.

Each command's --help has an example; the docs are in docs/ of the source repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from specshim import console
from specshim.runner import distributed, files, out_lock

#: where ``specshim snapshot`` records by default: a checkout's shipped snapshots (run there)
SNAPSHOTS_IN_CHECKOUT = Path("src/specshim/data/contracts")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to file descriptor 1 to 2 for a while: vLLM's logger and its
    worker processes write to stdout, which holds only the command's summary."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class DefaultsShown(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with defaults shown, except where there is none to show (a required
    option, a flag, or a default of ``None`` whose meaning the help text states); the
    description and the examples after the options are printed as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def _command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    description: str,
    example: str,
) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` says what it does, shows its options' defaults
    (:class:`DefaultsShown`) and ends with an example; ``--quiet`` on every one."""
    command = commands.add_parser(
        name,
        help=help_text,
        description=description,
        epilog=f"example:\n{example}",
        formatter_class=DefaultsShown,
    )
    command.add_argument(
        "-q", "--quiet", action="store_true", help="no progress lines on stderr, only problems"
    )
    return command


def _report(args: argparse.Namespace) -> int:
    from specshim import report

    full = report.build(probe_imports=not args.no_import)
    print(json.dumps(full.to_dict(), indent=2) if args.json else full.to_text(args.verbose))
    return full.exit_code


def _add_report(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "report",
        "versions, accelerator, adapters and the verdict",
        "Say whether this vLLM, speculators and accelerator were tested together (the matrix\n"
        "specshim ships) and what to do first, then the versions, the patches this\n"
        "combination needs and the extraction backends. Exit status: 0 fine; 1 a needed\n"
        "patch failed or the combination is known broken; 2 bad usage.",
        "  specshim report\n  specshim report --verbose\n  specshim report --json > report.json",
    )
    command.add_argument("--json", action="store_true", help="machine-readable output")
    command.add_argument(
        "--verbose", action="store_true", help="every adapter's state and reason, one a row"
    )
    command.add_argument(
        "--no-import",
        action="store_true",
        help="do not import speculators' generator (adapters that wait for it stay waiting)",
    )
    command.set_defaults(handler=_report)


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError as exc:
        message = f"--layers takes comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(message) from exc


def _add_layers(command: argparse.ArgumentParser, help_text: str) -> None:
    """``--layers`` (comma-separated ids, default None), with what they mean to ``command``."""
    command.add_argument("--layers", type=_layers, default=None, help=help_text)


def _add_trust_remote_code(command: argparse.ArgumentParser) -> None:
    """The one switch for a model's own Python code (:mod:`specshim.runner.remote_code`), on
    every command that reads a model."""
    from specshim.runner import remote_code

    command.add_argument(
        remote_code.FLAG,
        action="store_true",
        help="run the Python code the model carries (auto_map in its config), here and in vLLM",
    )


def _add_verbose(command: argparse.ArgumentParser, folder: str) -> None:
    """``--verbose``: the libraries' log (:mod:`specshim.runner.library_log`) on stderr too."""
    command.add_argument(
        "--verbose",
        action="store_true",
        help=f"vLLM's and the other libraries' log on stderr too (it is always in "
        f"{folder}/libraries.log)",
    )


def _extract(args: argparse.Namespace) -> int:
    """Run the extraction, the libraries' log in ``--out`` (:mod:`~specshim.runner.library_log`);
    what vLLM's processes print themselves goes to stderr, so stdout holds only the summary."""
    from specshim.runner import extraction, library_log
    from specshim.runner.extraction import options

    with _stdout_to_stderr(), library_log.kept(args.out, args.verbose):
        summary = extraction.extract(
            args.model,
            args.data,
            args.out,
            layers=args.layers,
            max_model_len=args.max_model_len,
            batch_size=args.batch_size,
            tensor_parallel_size=args.tensor_parallel_size,
            truncate=args.truncate,
            skip_bad=args.skip_bad,
            verify=args.verify,
            handoff=args.handoff,
            backend=args.backend,
            engine=options.EngineSettings(
                args.max_num_seqs, args.max_num_batched_tokens, args.gpu_memory_utilization
            ),
            overwrite=args.overwrite,
            trust_remote_code=args.trust_remote_code,
        )
    print(summary.text())
    console.phase("summary printed")
    return 0


def _add_extract(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from specshim.runner.extraction.backends import BACKENDS
    from specshim.runner.extraction.backends.generator import CHOICES as HANDOFFS

    command = _command(
        commands,
        "extract",
        "hidden states of a verifier, as speculators 0.3/0.4 training reads them",
        "Run the verifier over your prompts through vLLM and write what speculators 0.3/0.4\n"
        "training reads: data_{i}.pt, token_freq.pt, sample_lengths.json, data_config.json.\n"
        "After a crash, Ctrl-C or kill, the same command resumes where it stopped.\n"
        "\n"
        "--data: JSONL, one row a line, either token ids or a chat:\n"
        '  {"input_ids": [128000, 9906, 1917], "loss_mask": [0, 1, 1]}\n'
        '  {"messages": [{"role": "user", "content": "Hi"},\n'
        '                {"role": "assistant", "content": "Hello!"}]}\n'
        "or a folder saved with datasets' save_to_disk (docs/data.md has the format).",
        "  specshim extract --model meta-llama/Llama-3.1-8B-Instruct \\\n"
        "      --data chats.jsonl --out hs/ --max-model-len 4096 --truncate",
    )
    command.add_argument("--model", required=True, help="verifier model directory or hub id")
    command.add_argument(
        "--data", required=True, type=Path, help="JSONL of token ids or chats, or a dataset folder"
    )
    command.add_argument("--out", required=True, type=Path, help="output directory (resumable)")
    _add_layers(
        command,
        "speculators layer ids, e.g. 2,16,29,31 (default: speculators' [2, n/2, n-3, n-1])",
    )
    command.add_argument(
        "--max-model-len", type=int, default=2048, help="vLLM's context; longer rows: --truncate"
    )
    command.add_argument("--batch-size", type=int, default=8, help="rows per generator call (>= 1)")
    command.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM workers (>= 1)")
    command.add_argument(
        "--truncate", action="store_true", help="truncate rows to --max-model-len - 1 tokens"
    )
    command.add_argument("--skip-bad", action="store_true", help="skip and count bad rows")
    command.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="N",
        help="after the run, re-extract N random samples one at a time and compare them",
    )
    command.add_argument(
        "--handoff",
        choices=HANDOFFS,
        default="auto",
        help="how the states leave vLLM's worker (auto: worker on one CUDA device, else rpc; "
        "docs/commands.md)",
    )
    command.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="which code extracts (auto: the one the matrix shows working here; docs/commands.md)",
    )
    command.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        metavar="N",
        help="prompts one engine step may take (default: the backend's own)",
    )
    command.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens one engine step may take (default: the backend's own)",
    )
    command.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        metavar="F",
        help="fraction of the GPU's memory vLLM may take (default 0.8; lower it on a shared GPU)",
    )
    command.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files in --out that specshim did not write (else the run stops first)",
    )
    _add_trust_remote_code(command)
    _add_verbose(command, "OUT")
    command.set_defaults(handler=_extract)


def _convert(args: argparse.Namespace) -> int:
    """Convert between speculators 0.3/0.4 and >= 0.5 data; stdout holds only the summary."""
    from specshim.runner import convert

    summary = convert.convert(args.data, args.out, layers=args.layers)
    print(summary.text())
    return 0


def _add_convert(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "convert",
        "training data between speculators 0.3/0.4 and >= 0.5 (both ways)",
        "Convert speculators 0.3/0.4 data (data_{i}.pt, data_config.json) into speculators\n"
        ">= 0.5 data (an Arrow dataset and hidden_states/hs_{i}.safetensors) or back; the\n"
        "direction is read from --data. Layer ids are renumbered (vLLM id = speculators\n"
        "0.3/0.4 id + 1). A rerun keeps what is already converted (docs/migration.md).",
        "  specshim convert --data hs/ --out hs-v09/",
    )
    command.add_argument("--data", required=True, type=Path, help="the folder to convert")
    command.add_argument("--out", required=True, type=Path, help="output folder (resumable)")
    _add_layers(
        command,
        "the source's layer ids where it records none, e.g. 3,16,30,32 (docs/migration.md)",
    )
    command.set_defaults(handler=_convert)


def _vocab(args: argparse.Namespace) -> int:
    from specshim.runner import vocab

    vocab.check_sizes(args.draft_vocab_size, args.target_vocab_size)  # before reading a model
    target = args.target_vocab_size or vocab.target_vocab_size(args.model, args.trust_remote_code)
    out = args.out or args.data
    for path in vocab.build(args.data, args.draft_vocab_size, target, out, args.overwrite):
        print(path)
    return 0


def _add_vocab(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "vocab",
        "d2t.npy / t2d.npy from token_freq.pt",
        "Build the draft's vocabulary mapping (d2t.npy, t2d.npy) from an extraction's\n"
        "token_freq.pt: the draft predicts the most frequent loss-masked tokens.",
        "  specshim vocab --data hs/ --draft-vocab-size 32000 \\\n"
        "      --model meta-llama/Llama-3.1-8B-Instruct",
    )
    command.add_argument("--data", required=True, type=Path, help="an extraction folder")
    command.add_argument(
        "--draft-vocab-size",
        required=True,
        type=int,
        help="tokens the draft predicts: the most frequent loss-masked ones (1 to the target's)",
    )
    command.add_argument(
        "--target-vocab-size",
        type=int,
        default=None,
        help="the verifier's vocabulary size (default: read from --model)",
    )
    command.add_argument(
        "--model", help="read the target vocabulary size from this model (folder or hub id)"
    )
    command.add_argument(
        "--out", type=Path, default=None, help="where d2t.npy/t2d.npy go (default: --data)"
    )
    command.add_argument(
        "--overwrite", action="store_true", help="replace d2t.npy/t2d.npy already in --out"
    )
    _add_trust_remote_code(command)
    command.set_defaults(handler=_vocab)


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


def _snapshot(args: argparse.Namespace) -> int:
    from specshim import contracts

    data = contracts.snapshot(args.speculators)
    out = args.out or SNAPSHOTS_IN_CHECKOUT / f"vllm-{data['vllm']}.json"
    contracts.save(out, data)
    print(out)
    return 0


def _add_snapshot(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "snapshot",
        "record the vLLM facts the adapters rely on",
        "Record every fact of the installed vLLM that specshim's patches read (signatures,\n"
        "attributes, fields, source markers) as a JSON file that `specshim triage` can\n"
        "compare a later vLLM with.",
        "  specshim snapshot --out vllm-trusted.json",
    )
    command.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"default {SNAPSHOTS_IN_CHECKOUT}/vllm-V.json (a checkout's shipped snapshots)",
    )
    command.add_argument(
        "--speculators",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder holding a speculators release (repeat): record every probe's decision",
    )
    command.set_defaults(handler=_snapshot)


def _triage_baseline(args: argparse.Namespace) -> Path:
    """The snapshot to compare with: ``--against``, else the recorded one nearest to the
    installed vLLM in ``--contracts``; checked before vLLM is imported, so a missing one is
    one line that says what to pass."""
    from specshim import contracts, versions

    if args.against is not None:
        return args.against
    installed = versions.vllm().version
    if installed is None:
        raise ValueError("vLLM is not installed: triage reads the installed vLLM")
    folder = args.contracts or contracts.shipped()
    recorded = sorted(folder.glob("vllm-*.json"))
    if not recorded:
        raise FileNotFoundError(
            f"no recorded snapshots (vllm-*.json) in {folder}: specshim ships its own (the "
            "default --contracts), and `specshim snapshot --out FILE` records one on a "
            "vLLM you trust; pass --against FILE (or --contracts DIR)"
        )
    return contracts.nearest(recorded, installed)


def _triage(args: argparse.Namespace) -> int:
    from specshim import contracts, report

    against = _triage_baseline(args)
    old = contracts.load(against)
    now = contracts.snapshot()
    changes = contracts.diff(old, now)
    print(f"vLLM {now['vllm']} ({now['distribution']}) against {against} (vLLM {old['vllm']})")
    print(f"\nupstream facts that moved: {len(changes)}")
    for change in changes:
        print(f"  {change.line()}")
    uncovered = [c for c in changes if not c.adapters]
    print(f"\nmoved facts no adapter covers: {len(uncovered)}")
    for change in uncovered:
        print(f"  {change.key}")
    full = report.build()
    states = {a.name: (a.state.value, a.reason) for a in full.adapters.adapters}
    unhandled = contracts.unhandled(changes, states)
    print(f"\nmoved facts whose adapter did not decide on this installation: {len(unhandled)}")
    for item in unhandled:
        print(f"  {item.line()}")
    print("\nadapters on this installation:")
    for adapter in full.adapters.adapters:
        print(f"  {adapter.name:<34} {adapter.state.value:<15} {adapter.reason}")
    if full.import_error:
        print(f"\nimporting speculators' generator failed: {full.import_error}")
    needs_a_human = uncovered or unhandled or full.import_error or not full.adapters.ok
    return 1 if needs_a_human else 0


def _add_triage(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _command(
        commands,
        "triage",
        "diff this vLLM against the nearest snapshot",
        "Snapshot the installed vLLM, compare it with the nearest recorded snapshot, and\n"
        "print which facts moved, which no patch covers, and what each patch decides here.\n"
        "Exit status 1: a human should look.",
        "  specshim triage\n  specshim triage --against vllm-trusted.json",
    )
    command.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="FILE",
        help="a snapshot to compare with (default: the one in --contracts nearest this vLLM)",
    )
    command.add_argument(
        "--contracts",
        type=Path,
        default=None,
        metavar="DIR",
        help="recorded snapshots, vllm-*.json (default: the ones shipped with specshim)",
    )
    command.set_defaults(handler=_triage)


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
    with drafts, out_lock.held(out, "eval"), library_log.kept(out, args.verbose):
        evaluate.check(out, args.overwrite)
        if training:
            export.check(served, "--draft", args.overwrite)
            export.export(draft, args.data, served, shift=args.layer_shift)
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


#: The commands in the order ``specshim --help`` lists them: each ``_add_<name>`` (beside its
#: handler above) declares one command's options.
COMMANDS = (
    _add_report,
    _add_extract,
    _add_convert,
    _add_vocab,
    _add_train,
    _add_snapshot,
    _add_triage,
    _add_eval,
    _add_run,
)


ROOT_EXAMPLE = """\
example:
  specshim report                                    # is this vLLM + speculators tested?
  specshim extract --model M --data chats.jsonl --out hs/
  specshim vocab --data hs/ --draft-vocab-size 32000 --model M
  specshim train --data hs/ --verifier M --out draft/
  specshim eval --verifier M --draft draft/ --data hs/
"""


def parser() -> argparse.ArgumentParser:
    import specshim

    root = argparse.ArgumentParser(
        prog="specshim",
        description=__doc__,
        epilog=ROOT_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"specshim {specshim.__version__}")
    commands = root.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return root


#: The exit status of a folder another command holds (:mod:`specshim.runner.out_lock`):
#: argparse's for a command that cannot run as given, apart from bad input's 1.
IN_USE = 2


def _written_folder(args: argparse.Namespace) -> tuple[str, Path] | None:
    """The option and folder ``args.command`` writes into, where one command at a time may:
    ``train`` under torchrun locks it in its first process only (all of them write there)."""
    if args.command in ("extract", "convert") or (args.command == "train" and distributed.first()):
        return "--out", args.out
    if args.command == "vocab":
        return ("--out", args.out) if args.out else ("--data", args.data)
    if args.command == "run":
        return "--workdir", args.workdir
    return None


@contextlib.contextmanager
def _holding(args: argparse.Namespace) -> Iterator[None]:
    """Inside, the command holds the folder it writes into (:func:`out_lock.held`)."""
    folder = _written_folder(args)
    if folder is None:
        yield
        return
    option, path = folder
    with out_lock.held(path, args.command, option):
        yield


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """Inside, SIGTERM (``kill``'s and a scheduler's stop) is raised as ``KeyboardInterrupt``,
    as Ctrl-C is, so that it gets the same clean-up (vLLM's processes shut down, what was
    written recorded) and one line; Python's default for it ends the process at once, and
    vLLM's workers outlive it. Yields the SIGTERMs received, for the exit status."""
    received: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:  # `specshim` alone: what there is to run
        parser().print_help()
        return 0
    console.configure(args.quiet)
    console.phase("command started")
    if args.command == "vocab" and args.target_vocab_size is None and args.model is None:
        parser().error("vocab needs --target-vocab-size or --model")
    with _sigterm_as_ctrl_c() as terminated:
        try:
            with _holding(args):
                return args.handler(args)
        except out_lock.OutInUse as exc:
            print(f"specshim {args.command}: {exc}", file=sys.stderr)
            return IN_USE
        except (FileNotFoundError, files.DiskFull, ValueError, RuntimeError) as exc:
            print(f"specshim {args.command}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line (what was saved)
            print(f"specshim {args.command}: {str(exc) or 'interrupted'}", file=sys.stderr)
            return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def run() -> NoReturn:
    """The ``specshim`` command: :func:`main`, then the process ends without the interpreter's
    teardown. After vLLM, that teardown (freeing every module of torch, vLLM and transformers)
    takes seconds and does nothing a user sees: each file was written and closed by then. What
    an exit does besides is done first: thread pools stopped and other threads joined, the exit
    handlers (``atexit``: vLLM's shutdown, the writer processes' end, ``logging``'s flush) run,
    every output buffer flushed."""
    code = main()
    import atexit
    import ctypes
    import threading

    # as the interpreter's exit does: thread pools told to stop, other threads joined, then the
    # exit handlers
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by its reader: nobody to tell
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # what C code wrote to stdout, buffered by the C library
    os._exit(code)


if __name__ == "__main__":
    run()
