"""The ``timeline`` command: a simulation run or a timestamped trace as Chrome trace-event JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import open_from_args
from etstore.ingest.chrome_trace import write_chrome_trace
from etstore.report.timeline import write_run_timeline

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _timeline(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        if args.source.isdigit() and args.source not in {t.name for t in store.traces()}:
            path = write_run_timeline(store.warehouse, int(args.source), args.out)
        else:
            path = write_chrome_trace(store.load(args.source), args.out)
    console.print(str(path), highlight=False, soft_wrap=True)
    return 0


def register(sub: Any) -> None:
    """Add ``timeline`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "timeline",
        help="timeline of a run or timestamped trace as Chrome trace JSON (Perfetto, chrome://tracing)",
        description="Write the Chrome trace-event JSON of a simulation run (a run id) or of a stored trace "
        "whose ops carry timestamps (a trace name): per rank a process with compute and comm tracks, "
        "messages and collectives as flows, link utilisation as counters. Open it in Perfetto UI or "
        "chrome://tracing.",
    )
    sp.add_argument(
        "source", metavar="RUN_OR_TRACE", help="a simulation run id (etstore runs) or a stored trace name"
    )
    sp.add_argument("--out", default="timeline.json", help="output file (default: timeline.json)")
    sp.set_defaults(handler=_timeline)
