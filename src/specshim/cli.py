"""The ``specshim`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _report(args: argparse.Namespace) -> int:
    from specshim import report

    full = report.build(probe_imports=not args.no_import)
    print(json.dumps(full.to_dict(), indent=2) if args.json else full.to_text())
    return full.exit_code


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="specshim", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("report", help="versions, accelerator, adapters and the verdict")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument(
        "--no-import",
        action="store_true",
        help="do not import speculators' generator (adapters that wait for it stay waiting)",
    )
    rep.set_defaults(handler=_report)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
