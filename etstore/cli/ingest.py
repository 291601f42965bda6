"""The ``ingest`` command: read traces, algorithms, measured and tuner runs into the store."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.cli._common import add_format, open_from_args, phase_step, progress
from etstore.cli._console import warn
from etstore.cli._render import recognised_line, render
from etstore.errors import OptionError
from etstore.store.base import IngestReport
from etstore.store.batch import BatchProgressFn, OnError, ingest_paths

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _ingest(args: argparse.Namespace, console: Console) -> int:
    if args.name and len(args.paths) > 1:
        raise OptionError("ingest: --name names one trace; give one path with it")
    on_error: OnError = "skip" if args.keep_going else "raise"
    with open_from_args(args) as store:
        bar = progress(console)
        if bar:
            with bar:
                stats = ingest_paths(
                    store, args.paths, name=args.name, on_error=on_error, progress=_bar_step(bar)
                )
        else:
            stats = ingest_paths(store, args.paths, name=args.name, on_error=on_error)
    if stats.reports or not (stats.measured or stats.tuner):
        render(pa.Table.from_pylist([_report_row(r) for r in stats.reports]), args.format, console=console)
    if stats.measured:  # nccl-tests / rccl-tests logs became measured runs
        render(pa.Table.from_pylist([m.as_row() for m in stats.measured]), args.format, console=console)
    if stats.tuner:  # tuner trajectories became tuner runs
        render(pa.Table.from_pylist([t.as_row() for t in stats.tuner]), args.format, console=console)
    for report in stats.reports:  # what each input was recognised as; stdout stays data unless a table
        line = recognised_line(report.trace.name, report.trace.params)
        if line and args.format == "table":
            console.print(line, highlight=False, soft_wrap=True)
        elif line:
            sys.stderr.write(f"etstore: {line}\n")
        for warning in (report.trace.params.get("recognised") or {}).get("warnings") or []:
            warn(f"{report.trace.name}: {warning}")
    for _path, message in stats.skipped:  # on stderr, beside errors: stdout may be JSON
        sys.stderr.write(f"etstore: skipped {message}\n")
    return 1 if stats.skipped else 0


def _bar_step(bar: Any) -> BatchProgressFn:
    """A batch progress callback drawing one bar per input (:func:`phase_step`'s)."""
    steps: dict[str, Any] = {}

    def step(path: str, stage: str, done: int, total: int) -> None:
        if path not in steps:
            steps[path] = phase_step(bar, f"ingest {path}")
        steps[path](stage, done, total)

    return step


def _report_row(report: IngestReport) -> dict[str, Any]:
    """One row of the ingest summary."""
    info = report.trace
    return {
        "trace": info.name,
        "kind": info.kind,
        "status": "new" if report.created else "already stored",
        "ranks": info.ranks,
        "ops": info.ops,
        "deps": info.deps,
        "missing": info.missing,
        "messages": info.messages,
        "cycles": report.cycles,
        "unmatched": report.unmatched_sends + report.unmatched_recvs,
        "seconds": round(report.seconds, 3),
    }


def register(sub: Any) -> None:
    sp = sub.add_parser("ingest", help="read traces or algorithms into the store")
    sp.add_argument(
        "paths", nargs="+", help=".et/.json file, directory, glob or <dir>/<prefix>; .xml for MSCCL-IR"
    )
    sp.add_argument("--name", help="trace name (default: the file prefix)")
    sp.add_argument(
        "--keep-going",
        action="store_true",
        help="skip inputs that fail (listed after the summary; exit 1) instead of stopping at the first",
    )
    add_format(sp)
    sp.set_defaults(handler=_ingest)
