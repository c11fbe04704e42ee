"""The commands about the installation itself: ``report``, ``snapshot`` and ``triage``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specshim.cli.options import (
    _command,
)

#: where ``specshim snapshot`` records by default: a checkout's shipped snapshots (run there)
SNAPSHOTS_IN_CHECKOUT = Path("src/specshim/data/contracts")


def _report(args: argparse.Namespace) -> int:
    from specshim import report

    full = report.build(probe_imports=not args.no_import, reuse=not args.fresh)
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
    command.add_argument(
        "--fresh",
        action="store_true",
        help="probe again even if nothing the last report imported has changed",
    )
    command.set_defaults(handler=_report)


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
