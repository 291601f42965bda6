"""``etstore publish URL``: send the store's traces, runs and metrics to a Neo4j server."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from etstore.app.publish import PublishReport, publish, store_identity
from etstore.cli._common import open_from_args, print_json, progress_to
from etstore.cli._render import Rows, render
from etstore.errors import StoreError
from etstore.store import EmbeddedStore

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _ensure_identity(args: argparse.Namespace) -> None:
    """A store that never published gets its id now, in one short writable open; the publish
    itself then reads the store as a reader, so other commands need not wait for it."""
    with open_from_args(args, read_only=True) as store:
        if not isinstance(store, EmbeddedStore):
            raise StoreError(f"{store.location}: publish reads an embedded store (a directory), not a server")
        if store_identity(store, create=False) is not None:
            return
    with open_from_args(args) as store:
        assert isinstance(store, EmbeddedStore)
        store_identity(store)


def _publish(args: argparse.Namespace, console: Console) -> int:
    _ensure_identity(args)
    with open_from_args(args, read_only=True) as store, progress_to(console, "publish") as step:
        report = publish(store, args.url, names=args.trace, prune=args.prune, progress=step)
    if args.format == "json":
        print_json(report.as_row())
    else:
        render(_rows(report), "table", console=console)
    return 0


def _rows(report: PublishReport) -> Rows:
    """The report as ``what``/``count`` rows (runs by kind), for the table."""
    rows: list[dict[str, Any]] = [
        {"what": "names published", "count": report.names},
        {"what": "contents sent", "count": report.contents_sent},
        {"what": "contents already there", "count": report.contents_present},
        {"what": "ops sent", "count": report.ops_sent},
        {"what": "names added", "count": report.names_added},
        {"what": "names updated", "count": report.names_updated},
        {"what": "names removed", "count": report.names_removed},
        {"what": "contents removed", "count": report.contents_removed},
        {"what": "lineage pairs added", "count": report.lineage_added},
        {"what": "lineage pairs removed", "count": report.lineage_removed},
        {"what": "payloads sent for contents already there", "count": report.payloads_sent},
        {"what": "interrupted publishes swept", "count": report.swept},
    ]
    if report.legacy_upgraded:
        rows.append({"what": "former backend contents upgraded", "count": report.legacy_upgraded})
    for label, n in report.records_added.items():
        rows.append({"what": f"{label} added", "count": n})
    for label, n in report.records_removed.items():
        if n:
            rows.append({"what": f"{label} removed", "count": n})
    return Rows(("what", "count"), rows)


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "publish", help="publish the store's traces, runs and metrics to a Neo4j server (idempotent)"
    )
    sp.add_argument("url", metavar="URL", help="neo4j://[user:pass@]host[:port][/database]")
    sp.add_argument(
        "--trace",
        action="append",
        metavar="NAME",
        help="publish only this trace and the runs about it (repeatable; default: everything)",
    )
    sp.add_argument(
        "--prune",
        action="store_true",
        help="also remove from the server the names and runs this store published and no longer has",
    )
    sp.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default: table)"
    )
    sp.set_defaults(handler=_publish)
