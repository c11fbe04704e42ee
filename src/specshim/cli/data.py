"""The commands that make and reshape training data: ``extract``, ``convert`` and ``vocab``."""

from __future__ import annotations

import argparse
from pathlib import Path

from specshim import console
from specshim.cli.options import (
    _add_layers,
    _add_trust_remote_code,
    _add_verbose,
    _command,
)


def _extract(args: argparse.Namespace) -> int:
    """Run the extraction, the libraries' log in ``--out`` (:mod:`~specshim.runner.library_log`:
    stdout holds only the summary)."""
    from specshim.runner import extraction, library_log
    from specshim.runner.extraction import options

    with library_log.kept(args.out, args.verbose):
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
