"""``etstore breakdown`` (where a recorded step's time went, as measured, by HTA's definitions)
and ``etstore diff`` (two traces side by side)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.analysis.breakdown import breakdown
from etstore.analysis.diff import diff_traces
from etstore.app.breakdown import stored_breakdown
from etstore.cli._common import add_format, open_to_record, progress_to
from etstore.cli._inputs import trace_from
from etstore.cli._tables import add_limit, add_table, chosen_table, print_parts, print_table

if TYPE_CHECKING:
    from rich.console import Console

    from etstore.store.base import Store

__all__ = ["register"]

_TABLES = {
    "ranks": "per rank: shares of GPU time idle, computing, the rest; communication hidden",
    "kernels": "per rank and kernel class: count, time, share",
    "collectives": "per rank and collective: arrival skew, wait, transfer, bus bandwidth of the transfer",
}


def _breakdown(args: argparse.Namespace, console: Console) -> int:
    with open_to_record(args) as store:  # records nothing: the store read-only, or none
        if store is not None and args.trace in {t.name for t in store.traces()}:
            return _stored(args, console, store)
        trace = trace_from(store, args.trace)
    out = breakdown(trace)
    tables = {"ranks": out.ranks, "kernels": out.kernels, "collectives": out.collectives}
    one = chosen_table(args)
    for name, table in tables.items():
        if one is None or one == name:
            print_table(table, args.format, console=console, limit=args.limit, title=f"{trace.name}: {name}")
    return 0


def _stored(args: argparse.Namespace, console: Console, store: Store) -> int:
    """A stored trace's breakdowns, read a unit of ranks at a time; the collectives printed part by
    part (CSV and JSON never hold the whole table)."""
    with progress_to(console, f"breakdown {args.trace}") as step:
        out = stored_breakdown(store, args.trace, progress=step)
    one = chosen_table(args)
    for name in _TABLES:
        if one is not None and one != name:
            continue
        title = f"{args.trace}: {name}"
        if name == "collectives":
            print_parts(out.collective_batches(), args.format, console=console, limit=args.limit, title=title)
        else:
            table = out.ranks if name == "ranks" else out.kernels
            print_table(table, args.format, console=console, limit=args.limit, title=title)
    return 0


def _diff(args: argparse.Namespace, console: Console) -> int:
    with open_to_record(args) as store:
        a, b = trace_from(store, args.a), trace_from(store, args.b)
    table = diff_traces(a, b, kinds=args.kind or ("op", "kernel", "collective", "rank"))
    title = f"{b.name} against {a.name} (B - A), largest time change first"
    print_table(table, args.format, console=console, limit=args.limit, title=title)
    return 0


def register(sub: Any) -> None:
    """Add ``breakdown`` and ``diff`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "breakdown",
        help="where a recorded step's time went, as measured: per rank, kernel class and collective",
    )
    sp.add_argument("trace", help="stored trace, or the directory / files of a recording (ET + Kineto)")
    add_table(sp, _TABLES, "ranks")
    add_limit(sp, 0)
    add_format(sp)
    sp.set_defaults(handler=_breakdown, no_record=True)

    sp = sub.add_parser("diff", help="two traces side by side by op, kernel, collective and rank")
    sp.add_argument("a", help="stored trace, or the files of a recording (the reference, A)")
    sp.add_argument("b", help="stored trace, or the files of a recording (B)")
    sp.add_argument(
        "--kind",
        action="append",
        choices=("op", "kernel", "collective", "rank"),
        help="groups to compare (repeatable; default all): host ops by name, device kernels by name, "
        "collectives by type and size, ranks",
    )
    add_limit(sp, 30)
    add_format(sp)
    sp.set_defaults(handler=_diff, no_record=True)
