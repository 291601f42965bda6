"""``etstore expand``: store a workload with its collectives replaced by an algorithm's ops."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.algorithms.specs import algorithms_by_type, parse_by_type
from etstore.app.expand import expand_stored, resolve_algorithm
from etstore.cli._common import add_format, open_from_args, progress_to, status_words
from etstore.cli._console import styled
from etstore.cli._render import render
from etstore.errors import OptionError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _expand(args: argparse.Namespace, console: Console) -> int:
    if args.algo is None and args.by_type is None:
        raise OptionError("expand: give --algo ALGORITHM and/or --by-type COLLECTIVE=ALGORITHM,...")
    with open_from_args(args) as store:
        algorithms: Any = args.algo
        if args.by_type is not None:
            algorithms = parse_by_type(args.by_type)
            if args.algo is not None:  # --algo covers the types --by-type does not name
                base = resolve_algorithm(store, args.algo)
                algorithms = {**algorithms_by_type(base), **algorithms}
        with progress_to(console, f"expand {args.trace}") as step:
            done = expand_stored(
                store,
                args.trace,
                algorithms,
                where=args.where,
                reduce_duration_micros=args.reduce_duration_micros,
                name=args.name,
                progress=step,
            )
    result, report, names = done.expansion, done.report, done.algorithm_names
    info = report.trace
    coll = result.collectives
    if args.format == "table":
        status = status_words(report)
        console.print(
            styled(
                (info.name, "bold"),
                f" (expanded, {status}) from {args.trace}: {info.ranks} ranks, "
                f"{info.ops:,} ops, {info.deps:,} deps, {info.messages:,} messages; "
                f"expanded {coll.num_rows} collective{'' if coll.num_rows == 1 else 's'} into "
                f"{result.lineage.num_rows:,} ops, left {result.skipped} collective node"
                f"{'' if result.skipped == 1 else 's'} as they were",
            )
        )
    rows = coll.to_pylist()
    for r in rows:
        r["algorithm"] = names.get(r["algorithm"], r["algorithm"])
    table = pa.Table.from_pylist(
        [{"trace": info.name, **r} for r in rows],
        schema=pa.schema([("trace", pa.string()), *coll.schema]),
    )
    render(table, args.format, title="expanded collectives", console=console)
    return 0


def register(sub: Any) -> None:
    """Add ``expand`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "expand",
        help="replace collective nodes by an algorithm's send/recv/reduce ops (stores a new trace)",
        description=(
            "Store a new trace (kind expanded, parent TRACE) in which each selected COMM_COLL node on "
            "each rank of its group becomes that rank's part of the algorithm; see docs/expand.md."
        ),
    )
    sp.add_argument("trace", help="stored workload trace")
    sp.add_argument(
        "--algo",
        help="stored algorithm trace, or a generator (ring, direct, halving-doubling, tree, "
        "alltoall-direct; NAME:CHUNKS for chunks per rank) made for each group size",
    )
    sp.add_argument(
        "--by-type",
        metavar="COLL=ALGO,...",
        help="algorithm per collective type, e.g. allreduce=ring,allgather=direct (overrides --algo)",
    )
    sp.add_argument(
        "--where",
        help="DuckDB SQL condition over the collective nodes' columns, e.g. "
        "\"comm_size > 1048576 AND pg_name = 'dp0'\"",
    )
    sp.add_argument(
        "--reduce-duration-micros",
        type=int,
        default=None,
        help="duration (µs) of every reduce/copy COMP node of an expansion (default: the algorithm's)",
    )
    sp.add_argument("--name", help="name of the new trace (default: <TRACE>-expanded)")
    add_format(sp)
    sp.set_defaults(handler=_expand)
