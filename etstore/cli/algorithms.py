"""Algorithm commands: check an algorithm, generate built-in ones."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.algorithms.check import check_algorithm
from etstore.algorithms.generators import GENERATORS, generate
from etstore.cli._common import add_format, open_from_args, print_json, stored_status
from etstore.cli._console import styled
from etstore.cli._inputs import trace_from
from etstore.cli._render import render
from etstore.errors import OptionError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _check(args: argparse.Namespace, console: Console) -> int:
    docs, failed = [], 0
    with open_from_args(args, read_only=True) as store:
        for spec in args.algos:
            trace = trace_from(store, spec)
            if trace.kind != "algorithm":
                raise OptionError(f"check needs an algorithm trace; {trace.name!r} is a {trace.kind}")
            report = check_algorithm(trace, max_problems=args.max_problems)
            failed += not report.ok
            if args.format == "json":
                docs.append(
                    {"algorithm": trace.name, **{k: getattr(report, k) for k in report.__dataclass_fields__}}
                )
                continue
            style = "green" if report.ok else "red"
            console.print(styled((trace.name, "bold"), ": ", (report.summary(), style)), soft_wrap=True)
            for problem in report.problems:
                console.print(f"  - {problem}", highlight=False, soft_wrap=True)
    if args.format == "json":
        print_json(docs)
    return 1 if failed else 0


def _gen(args: argparse.Namespace, console: Console) -> int:
    trace = generate(args.generator, coll=args.coll, ranks=args.ranks, chunks=args.chunks)
    name = args.name or f"{args.generator.replace(':', '-')}-{args.coll}-{args.ranks}r-{args.chunks}c"
    with open_from_args(args) as store:
        report = store.ingest(trace, name=name)
    info = report.trace
    row = {
        "trace": info.name,
        **stored_status(report),
        "collective": trace.params.get("collective"),
        "ranks": info.ranks,
        "chunks_per_rank": args.chunks,
        "ops": info.ops,
        "deps": info.deps,
        "messages": info.messages,
    }
    render(pa.Table.from_pylist([row]), args.format, console=console)
    return 0


def _gen_list(args: argparse.Namespace, console: Console) -> int:
    rows = [
        {"generator": name, "collectives": ", ".join(info.collectives), "about": info.description}
        for name, info in GENERATORS.items()
    ]
    render(pa.Table.from_pylist(rows), args.format, console=console)
    return 0


def register(sub: Any) -> None:
    """Add ``check`` and ``algo gen|list`` to the subparsers ``sub``."""
    sp = sub.add_parser("check", help="prove an algorithm delivers its collective (exit 1 if not)")
    sp.add_argument(
        "algos", nargs="+", metavar="ALGO", help="stored algorithm trace, or an MSCCL-IR .xml file"
    )
    sp.add_argument("--max-problems", type=int, default=20, help="problems listed at most (default 20)")
    add_format(sp)
    sp.set_defaults(handler=_check)

    sp = sub.add_parser("algo", help="built-in collective algorithms")
    algo = sp.add_subparsers(dest="algo_command", required=True, metavar="ACTION")
    gp = algo.add_parser("gen", help="generate a built-in algorithm and store it")
    gp.add_argument(
        "generator",
        help="ring, direct, halving-doubling, tree, alltoall-direct, nccl-ring[:CH[:PROTO]], "
        "nccl-tree[:CH[:PROTO[:NODES]]] (--chunks: loops per channel)",
    )
    gp.add_argument("--coll", required=True, help="allreduce, allgather, reducescatter, alltoall")
    gp.add_argument("--ranks", type=int, required=True, help="number of ranks")
    gp.add_argument("--chunks", type=int, default=1, help="chunks per rank (default 1)")
    gp.add_argument("--name", help="trace name (default: <generator>-<coll>-<N>r-<k>c)")
    add_format(gp)
    gp.set_defaults(handler=_gen)
    lp = algo.add_parser("list", help="the built-in generators and their collectives")
    add_format(lp)
    lp.set_defaults(handler=_gen_list)
