"""Query commands: cypher, sql, critical-path."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_from_args, params
from etstore.cli._render import render
from etstore.cli._tables import add_limit, add_table, chosen_table, one_row, print_table
from etstore.query import critical_path

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _cypher(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=not args.write) as store:
        result = store.cypher(args.query, params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


def _sql(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=not args.write) as store:
        result = store.sql(args.query, params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


_CRITICAL_PATH_TABLES = {
    "path": "the path's ops in order: step, rank, id, name, type, duration_micros, start_micros, via",
    "ranks": "the longest path within each rank: rank, length_micros, ops",
    "summary": "one row: trace, rank, length_micros, ops, dropped_edges",
}


def _critical_path(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        trace = store.load(args.trace)
    cp = critical_path(trace, rank=args.rank)
    summary = {
        "trace": args.trace,
        "rank": args.rank,
        "length_micros": cp.length_micros,
        "ops": cp.path.num_rows,
        "dropped_edges": cp.dropped_edges,
    }
    tables = {"path": cp.path, "ranks": cp.per_rank, "summary": one_row(summary)}
    only = chosen_table(args)
    if only is not None:
        print_table(tables[only], args.format, limit=args.limit, console=console)
        return 0
    title = f"critical path of {args.trace}"
    print_table(cp.path, "table", limit=args.limit, title=title, console=console)
    console.print(
        f"length {cp.length_micros:,.0f} µs over {cp.path.num_rows} ops"
        + (f"; {cp.dropped_edges} edges inside dependency cycles ignored" if cp.dropped_edges else "")
    )
    if args.rank is None and cp.per_rank.num_rows > 1:
        title = "longest path within each rank"
        print_table(cp.per_rank, "table", limit=args.limit, title=title, console=console)
    return 0


def register(sub: Any) -> None:
    """Add ``cypher``, ``sql`` and ``critical-path`` to the subparsers ``sub``."""
    for name, helptext, handler in (
        ("cypher", "run a Cypher query on the graph", _cypher),
        ("sql", "run SQL on the DuckDB tables", _sql),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("query")
        sp.add_argument(
            "--param",
            action="append",
            metavar="NAME=VALUE",
            help="query parameter ($NAME); VALUE is parsed as JSON when it can be",
        )
        sp.add_argument("--write", action="store_true", help="allow the query to modify the store")
        add_format(sp)
        sp.set_defaults(handler=handler)

    sp = sub.add_parser("critical-path", help="duration-weighted longest dependency path")
    sp.add_argument("trace")
    sp.add_argument("--rank", type=int, default=None, help="only this rank (default: all, across messages)")
    add_limit(sp, 50)
    add_format(sp)
    add_table(sp, _CRITICAL_PATH_TABLES, "path")
    sp.set_defaults(handler=_critical_path)
