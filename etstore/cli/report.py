"""The ``report`` command: simulation runs (and sweeps) as one self-contained HTML file."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import open_from_args
from etstore.errors import OptionError
from etstore.report import latest_run, write_report

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _report(args: argparse.Namespace, console: Console) -> int:
    if not args.runs and not args.latest and not args.sweep:
        raise OptionError("report: name at least one run id, or pass --latest or --sweep ID")
    with open_from_args(args, read_only=True) as store:
        con = store.warehouse
        runs = list(args.runs)
        if args.latest:
            runs.append(latest_run(con))
        path = write_report(con, runs, args.out, sweep_ids=args.sweep or (), title=args.title)
    console.print(str(path.resolve()), highlight=False, soft_wrap=True)
    return 0


def register(sub: Any) -> None:
    """Add ``report`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "report",
        help="write an HTML report (timelines, breakdowns, bandwidth, links) of simulation runs",
        description="Write one self-contained HTML file (opens offline) from the simulation metrics in the "
        "store's DuckDB. Two or more runs are shown side by side with their differences against the first.",
    )
    sp.add_argument("runs", nargs="*", type=int, metavar="RUN", help="simulation run ids (etstore runs)")
    sp.add_argument("--out", default="report.html", help="output file (default: report.html)")
    sp.add_argument("--sweep", type=int, action="append", metavar="ID", help="add a sweep's bandwidth curves")
    sp.add_argument("--latest", action="store_true", help="add the most recent run")
    sp.add_argument("--title", help="page title")
    sp.set_defaults(handler=_report)
