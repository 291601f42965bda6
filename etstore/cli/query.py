"""Query commands: cypher, sql."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_from_args, params, progress_to
from etstore.cli._render import render

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _cypher(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=not args.write) as store:
        with progress_to(console, "cypher") as step:
            store.index(progress=step)  # the graph index follows the store: built here if behind
        result = store.cypher(args.query, params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


def _sql(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args, read_only=not args.write) as store:
        result = store.sql(args.query, params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


def register(sub: Any) -> None:
    """Add ``cypher`` and ``sql`` to the subparsers ``sub``."""
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
