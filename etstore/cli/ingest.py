"""The ``ingest`` command: read traces, algorithms, measured and tuner runs into the store."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.app.fanout import fanout
from etstore.app.ingest_files import BatchProgressFn, BatchStats, OnError, ingest_paths
from etstore.cli._common import add_format, open_from_args, phase_step, progress, say, stored_status
from etstore.cli._console import warn
from etstore.cli._inputs import read_files
from etstore.cli._render import recognised_line
from etstore.cli._tables import add_table, chosen_table, note, print_table
from etstore.errors import OptionError
from etstore.store.base import IngestReport, Store

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


_TABLES = {
    "traces": "one row per trace stored (status new, new name or already stored; same_as)",
    "measured": "one row per nccl-tests / rccl-tests log stored as a measured run",
    "tuner": "one row per tuner trajectory stored as a tuner run",
}


def _ingest(args: argparse.Namespace, console: Console) -> int:
    on_error: OnError = "skip" if args.keep_going else "raise"
    if args.ray is not None and args.name and len(args.paths) > 1:
        raise OptionError(
            "ingest --ray: give the trace's directory or a quoted glob, not its files one by one"
        )
    with fanout(args.ray) as fan, open_from_args(args) as store:  # Ray up before the store is held
        bar = progress(console)
        with bar or contextlib.nullcontext():
            step = _bar_step(bar) if bar else None
            if args.name and len(args.paths) > 1:  # the files of one trace, as a glob of them reads
                stats = _ingest_files(store, args.paths, args.name, step)
            else:
                map_fn = fan.ordered_map if fan.engine == "ray" else None
                stats = ingest_paths(
                    store, args.paths, name=args.name, on_error=on_error, progress=step, map_fn=map_fn
                )
        if fan.engine == "ray":
            say(f"rank files decoded on {fan.where}")
    tables = {
        "traces": pa.Table.from_pylist([_report_row(r) for r in stats.reports]),
        "measured": pa.Table.from_pylist([m.as_row() for m in stats.measured]),
        "tuner": pa.Table.from_pylist([t.as_row() for t in stats.tuner]),
    }
    only = chosen_table(args)
    if only is None:  # the table format: each kind of input stored
        for name in [n for n, t in tables.items() if t.num_rows] or ["traces"]:
            print_table(tables[name], "table", console=console)
    else:
        if args.table is None and not stats.reports:  # the one kind stored, when no trace was
            only = "measured" if stats.measured or not stats.tuner else "tuner"
        print_table(tables[only], args.format, console=console)
        others = [f"{t.num_rows} {n} (--table {n})" for n, t in tables.items() if n != only and t.num_rows]
        if args.table is None and others:  # inputs of several kinds: say where the rest is
            note(f"printed the {only} table; also stored: {', '.join(others)}", args.format, console)
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


def _ingest_files(store: Store, paths: list[str], name: str, step: BatchProgressFn | None) -> BatchStats:
    """``ingest F1 F2 ... --name X``: the files are one trace's, read together as a glob of them is."""
    label = f"{name} ({len(paths)} files)"
    read = (lambda done, total: step(label, "read", done, total)) if step else None
    trace = read_files(paths, name=name, progress=read)
    stored = (lambda stage, done, total: step(label, stage, done, total)) if step else None
    report = store.ingest(trace, name=name, progress=stored)
    info = report.trace
    return BatchStats(1, 0, info.ops, info.deps, info.missing, (report,))


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
        **stored_status(report),
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
        "paths",
        nargs="+",
        help=".et/.json file, directory, glob or <dir>/<prefix>; .xml for MSCCL-IR; each one trace "
        "(with --name: the files of one trace)",
    )
    sp.add_argument(
        "--name",
        help="trace name (default: the file prefix); given several files, they are read as one trace, "
        "as a glob of them would be",
    )
    sp.add_argument(
        "--keep-going",
        action="store_true",
        help="skip inputs that fail (listed after the summary; exit 1) instead of stopping at the first",
    )
    sp.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="decode Chakra .et rank files as Ray tasks (each worker must see the files at the same "
        "path): alone, Ray on this machine; 'auto' or an address, a cluster (docs/scale-out.md)",
    )
    add_format(sp)
    add_table(sp, _TABLES, "traces")
    sp.set_defaults(handler=_ingest)
