"""The ``etstore`` command: parses arguments, calls the library, renders the result."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console

from etstore import __version__
from etstore._render import FORMATS, render
from etstore.errors import EtstoreError
from etstore.store import ENV_VAR, Store, open_store

__all__ = ["main"]

Handler = Callable[[argparse.Namespace, Console], int]
_COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = fn
        return fn

    return register


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise EtstoreError(f"--param {text!r}: expected NAME=VALUE")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return dict(_parse_param(p) for p in args.param or [])


def _store(args: argparse.Namespace, *, read_only: bool = False) -> Store:
    return open_store(args.store, read_only=read_only)


def _progress(console: Console) -> Any:
    """A rich progress bar on a terminal, nothing when piped."""
    if not console.is_terminal or os.environ.get("CI"):
        return None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console, transient=True
    )


# ---------------------------------------------------------------- commands


@command("ingest")
def _ingest(args: argparse.Namespace, console: Console) -> int:
    from etstore.ingest import read_trace

    rows = []
    with _store(args) as store:
        progress = _progress(console)
        for spec in args.paths:
            if progress:
                with progress:
                    task = progress.add_task(f"ingest {spec}", total=3)
                    trace = read_trace(spec, name=args.name)
                    progress.advance(task)
                    report = store.ingest(
                        trace, name=args.name, progress=lambda _s, _d, _t, task=task: progress.advance(task)
                    )
            else:
                trace = read_trace(spec, name=args.name)
                report = store.ingest(trace, name=args.name)
            info = report.trace
            rows.append(
                {
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
            )
    render(pa.Table.from_pylist(rows), args.format, console=console)
    return 0


@command("ls")
def _ls(args: argparse.Namespace, console: Console) -> int:
    with _store(args, read_only=True) as store:
        rows = [t.as_row() for t in store.traces()]
    cols = ["name", "kind", "ranks", "ops", "deps", "missing", "messages", "parent", "created"]
    if args.format == "json":
        render(pa.Table.from_pylist(rows), "json", console=console)
    else:
        table = (
            pa.Table.from_pylist([{c: r[c] for c in cols} for r in rows])
            if rows
            else pa.table({c: pa.array([], pa.string()) for c in cols})
        )
        render(table, args.format, console=console)
    return 0


@command("show")
def _show(args: argparse.Namespace, console: Console) -> int:
    from etstore.query.summary import summarize

    with _store(args, read_only=True) as store:
        info = store.info(args.trace)
        s = summarize(store, args.trace)
    if args.format == "json":
        doc = {
            "trace": info.as_row(),
            "by_type_rank": s.by_type_rank.to_pylist(),
            "collectives": s.collectives.to_pylist(),
            "missing": s.missing.to_pylist(),
        }
        sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")
        return 0
    console.print(
        f"[bold]{info.name}[/] ({info.kind}) {info.ranks} ranks, {info.ops:,} ops, "
        f"{info.deps:,} deps, {info.missing:,} missing deps, {info.messages:,} messages"
    )
    render(s.by_type_rank, args.format, title="ops per rank and type", console=console)
    if s.collectives.num_rows:
        render(s.collectives, args.format, title="collectives", console=console)
    if s.missing.num_rows:
        render(s.missing, args.format, title="dependencies on absent nodes", console=console)
    return 0


@command("rm")
def _rm(args: argparse.Namespace, console: Console) -> int:
    with _store(args) as store:
        for name in args.traces:
            store.remove(name)
            console.print(f"removed {name}")
    return 0


@command("cypher")
def _cypher(args: argparse.Namespace, console: Console) -> int:
    with _store(args, read_only=not args.write) as store:
        result = store.cypher(args.query, _params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


@command("sql")
def _sql(args: argparse.Namespace, console: Console) -> int:
    with _store(args, read_only=not args.write) as store:
        result = store.sql(args.query, _params(args))
        render(result.to_arrow(), args.format, console=console)
    return 0


@command("export")
def _export(args: argparse.Namespace, console: Console) -> int:
    from etstore.ingest import write_chakra_json, write_et

    with _store(args, read_only=True) as store:
        trace = store.load(args.trace)
    if args.format == "json":
        paths = write_chakra_json(trace, args.out)
    elif args.format == "et":
        paths = write_et(trace, args.out, gzip_output=args.gzip)
    else:
        raise EtstoreError(f"export: unknown format {args.format!r}")
    for p in paths:
        console.print(str(p), highlight=False)
    return 0


@command("critical-path")
def _critical_path(args: argparse.Namespace, console: Console) -> int:
    from etstore.query import critical_path

    with _store(args, read_only=True) as store:
        trace = store.load(args.trace)
    cp = critical_path(trace, rank=args.rank)
    if args.format == "json":
        doc = {
            "trace": args.trace,
            "rank": args.rank,
            "length_micros": cp.length_micros,
            "dropped_cycle_edges": cp.dropped_edges,
            "per_rank": cp.per_rank.to_pylist(),
            "path": cp.path.to_pylist(),
        }
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
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


@command("demo")
def _demo(args: argparse.Namespace, console: Console) -> int:
    from etstore.demo import run_demo

    run_demo(store_location=args.store, console=console, out_dir=Path(args.out))
    return 0


# ---------------------------------------------------------------- parser


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="etstore",
        description="Store, query, expand and simulate Chakra execution traces and collective algorithms.",
    )
    p.add_argument("--version", action="version", version=f"etstore {__version__}")
    p.add_argument(
        "--store",
        default=None,
        help=f"store directory or neo4j://user:pass@host:7687 URL (default: ${ENV_VAR} or ./.etstore)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def fmt(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")

    sp = sub.add_parser("ingest", help="read traces or algorithms into the store")
    sp.add_argument(
        "paths", nargs="+", help=".et/.json file, directory, glob or <dir>/<prefix>; .xml for MSCCL-IR"
    )
    sp.add_argument("--name", help="trace name (default: the file prefix)")
    fmt(sp)

    sp = sub.add_parser("ls", help="list stored traces")
    fmt(sp)

    sp = sub.add_parser("show", help="counts per type and rank, collectives by type and size")
    sp.add_argument("trace")
    fmt(sp)

    sp = sub.add_parser("rm", help="remove traces")
    sp.add_argument("traces", nargs="+")

    for name, helptext in (
        ("cypher", "run a Cypher query on the graph"),
        ("sql", "run SQL on the DuckDB tables"),
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
        fmt(sp)

    sp = sub.add_parser("export", help="write a stored trace back to files")
    sp.add_argument("trace")
    sp.add_argument("--out", required=True, help="output prefix: writes <PREFIX>.<rank>.et (or .json)")
    sp.add_argument("--format", choices=("et", "json"), default="et")
    sp.add_argument(
        "--gzip", action="store_true", help="gzip the .et files (ASTRA-sim reads only plain files)"
    )

    sp = sub.add_parser("critical-path", help="duration-weighted longest dependency path")
    sp.add_argument("trace")
    sp.add_argument("--rank", type=int, default=None, help="only this rank (default: all, across messages)")
    sp.add_argument("--limit", type=int, default=50, help="rows of the path to print (0 = all)")
    fmt(sp)

    sp = sub.add_parser("demo", help="run the end-to-end demo on shipped examples")
    sp.add_argument(
        "--out", default="etstore-demo", help="directory for exported files (default: etstore-demo)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``etstore`` console script."""
    args = _parser().parse_args(argv)
    console = Console(soft_wrap=False)
    try:
        return _COMMANDS[args.command](args, console)
    except EtstoreError as exc:
        print(f"etstore: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("etstore: interrupted; nothing partial was kept", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
