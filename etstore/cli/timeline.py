"""The ``timeline`` command: a simulation run or a timed trace as Chrome trace-event JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import open_to_record
from etstore.cli._inputs import trace_from
from etstore.report.recorded_timeline import write_recorded_timeline
from etstore.report.timeline import write_run_timeline

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _timeline(args: argparse.Namespace, console: Console) -> int:
    with open_to_record(args) as store:  # records nothing: the store read-only, or none
        if (
            store is not None
            and args.source.isdigit()
            and args.source not in {t.name for t in store.traces()}
        ):
            path = write_run_timeline(store.warehouse, int(args.source), args.out)
        else:
            path = write_recorded_timeline(trace_from(store, args.source), args.out)
    console.print(str(path), highlight=False, soft_wrap=True)
    return 0


def register(sub: Any) -> None:
    """Add ``timeline`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "timeline",
        help="timeline of a run or timestamped trace as Chrome trace JSON (Perfetto, chrome://tracing)",
        description="Write the Chrome trace-event JSON of a simulation run (a run id) or of a trace whose "
        "ops carry timestamps (a stored trace's name, or the files or directory of a recording). A run: per "
        "rank a process with compute and comm tracks, messages and collectives as flows, link utilisation "
        "as counters. A trace: time from its start, per rank a process with a track per CPU thread and GPU "
        "stream (a Kineto recording; else per op type), launch (or message) flows and the critical path "
        "as a track of its own. Open it in Perfetto UI or chrome://tracing.",
    )
    sp.add_argument(
        "source",
        metavar="RUN_OR_TRACE",
        help="a simulation run id (etstore runs), a stored trace, or trace files / a recording's directory",
    )
    sp.add_argument("--out", default="timeline.json", help="output file (default: timeline.json)")
    sp.set_defaults(handler=_timeline, no_record=True)
