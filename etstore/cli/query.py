"""Query commands: cypher, sql, critical-path."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_from_args, params
from etstore.cli._render import render
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


def _critical_path(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=True) as store:
        trace = store.load(args.trace)
    cp = critical_path(trace, rank=args.rank)
    # every format prints the same rows (JSON: a list of row objects, as for every command)
    path = cp.path if args.limit <= 0 else cp.path.slice(0, args.limit)
    render(path, args.format, title=f"critical path of {args.trace}", console=console)
    if args.format == "table":
        console.print(
            f"length {cp.length_micros:,.0f} µs over {cp.path.num_rows} ops"
            + (
                f" ({cp.path.num_rows - path.num_rows} more not shown)"
                if path.num_rows < cp.path.num_rows
                else ""
            )
            + (f"; {cp.dropped_edges} edges inside dependency cycles ignored" if cp.dropped_edges else "")
        )
        if args.rank is None and cp.per_rank.num_rows > 1:
            render(cp.per_rank, "table", title="longest path within each rank", console=console)
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
    sp.add_argument(
        "--limit", type=int, default=50, help="rows of the path to print in every format (0 = all)"
    )
    add_format(sp)
    sp.set_defaults(handler=_critical_path)
