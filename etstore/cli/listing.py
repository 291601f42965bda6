"""The ``ls`` command: the stored traces, one row each.

It imports only what a listing needs: an embedded store's names and counts come from its
catalog (:mod:`etstore.store.listing`, stdlib ``sqlite3``) and render as plain rows, so
``etstore ls`` loads no engine, numpy, pyarrow or reader (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_from_args, say
from etstore.cli._render import Rows, render
from etstore.store import TraceInfo
from etstore.store.listing import list_traces

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


_COLUMNS = ("name", "kind", "ranks", "ops", "deps", "missing", "messages", "parent", "created")
"""What the ls table and CSV show of each trace (JSON shows every field of its row)."""


def _listed_traces(args: argparse.Namespace) -> list[TraceInfo]:
    """The traces of the store ``--store`` names, as its ``traces()`` lists them.

    An embedded store is read from its catalog alone (:mod:`etstore.store.listing`),
    waiting ``--wait`` seconds for a writer like any reader; the store is opened
    read-only instead where the catalog cannot answer alone (a server, a new store, a
    write to recover, another format).
    """
    infos = list_traces(args.store, wait_s=args.wait, notify=say, purpose="ls")
    if infos is None:
        with open_from_args(args, read_only=True) as store:
            infos = store.traces()
    return infos


def _ls(args: argparse.Namespace, console: Console) -> int:
    rows = [t.as_row() for t in _listed_traces(args)]
    # plain rows, not Arrow: the listing comes from SQLite, and converting it would load pyarrow's pandas
    if args.format == "json":
        columns = list(rows[0]) if rows else []
        render(Rows(columns, rows), "json", console=console)
    else:
        render(Rows(_COLUMNS, rows), args.format, console=console)
    return 0


def register(sub: Any) -> None:
    sp = sub.add_parser("ls", help="list stored traces")
    add_format(sp)
    sp.set_defaults(handler=_ls)
