"""Analysis commands: overlap (find opportunities), rewrite (apply them), compare (simulate both)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.analysis.split import SplitCost
from etstore.app.compare import compare
from etstore.app.opportunities import explain, find_and_record
from etstore.app.rewrite import rewrite_stored
from etstore.cli._common import add_format, open_from_args, progress_to, stored_status
from etstore.cli._console import styled
from etstore.cli._render import json_text, render
from etstore.cli._tables import add_table, chosen_table, one_row, print_table
from etstore.errors import OptionError
from etstore.sim import SimConfig
from etstore.sim.config import EXPANDED_SLOTS

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["hoist_table", "register"]


def _config(args: argparse.Namespace) -> Any:
    """The simulator's settings the command's flags change (None: the defaults)."""
    changes = {
        k: v for k, v in (("congestion", args.congestion), ("expanded_slots", args.expanded_slots)) if v
    }
    return SimConfig(**changes) if changes else None


def _split(args: argparse.Namespace) -> SplitCost:
    return SplitCost(overhead_us=args.split_overhead, interference=args.interference)


def _split_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--split-overhead",
        type=int,
        default=SplitCost.overhead_us,
        metavar="US",
        help=f"chunk: launch cost of each piece after the first, µs (default {SplitCost.overhead_us})",
    )
    sp.add_argument(
        "--interference",
        type=float,
        default=SplitCost.interference,
        metavar="F",
        help="chunk: how much slower a piece runs beside communication (default 1.0: measure it)",
    )


def _sim_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--congestion", choices=("unaware", "aware"), default=None, help="network model")
    sp.add_argument(
        "--expanded-slots",
        choices=EXPANDED_SLOTS,
        default=None,
        help="how an expanded collective's sends and reductions hold their NPU's slots (docs/simulator.md)",
    )


def _overlap(args: argparse.Namespace, console: Console) -> int:
    if args.explain:
        # beside a csv or json table the queries go to stderr: stdout is that one table
        out = sys.stdout if args.trace is None else sys.stderr
        for finder, engine, text in explain():
            if args.format == "table":
                console.print(styled((f"-- {finder} ({engine})", "bold")))
                console.print(text, highlight=False)
            else:
                out.write(f"-- {finder} ({engine})\n{text}\n")
        if args.trace is None:
            return 0
    if args.trace is None:
        raise OptionError("overlap: name a trace (or pass --explain alone to print the queries)")
    with open_from_args(args) as store, progress_to(console, f"overlap {args.trace}") as step:
        found = find_and_record(
            store,
            args.trace,
            topo=args.topo,
            config=_config(args),
            run_id=args.run,
            kinds=args.kind or ("overlap", "chunk", "reorder"),
            max_pieces=args.max_pieces,
            limit=args.limit,
            progress=step,
            measure=not args.estimates,
            split=_split(args),
        )
    if args.format == "json":
        # id first: what `rewrite --opportunity` takes; detail says what moves
        rows = [{"id": r.pop("id"), **r, "detail": json.loads(r["detail"])} for r in found.to_pylist()]
        sys.stdout.write(json_text(rows) + "\n")
        return 0
    details = [json.loads(d) for d in found["detail"].to_pylist()]
    if found.num_rows and all("moves" in d for d in details) and args.format == "table":
        _measured_table(args.trace, found, details, console)
        return 0
    render(found, args.format, title=f"opportunities in {args.trace}", console=console)
    if args.format == "table" and args.estimates:
        best = max(found["gain_ns"].to_pylist(), default=0) or 0
        console.print(
            f"{found.num_rows} opportunities; largest estimated gain {best / 1e3:,.1f} µs "
            "(estimates overlap, so they do not add up; without --estimates each is simulated)",
            soft_wrap=True,
        )
    elif args.format == "table":
        console.print(
            f"{found.num_rows} opportunities, each simulated with it applied on top of the ones of its kind "
            f"above it: the gains of a kind add up to what applying them realises "
            f"({sum(found['gain_ns'].to_pylist()) / 1e3:,.1f} µs in all)",
            soft_wrap=True,
        )
    return 0


def hoist_table(found: pa.Table) -> pa.Table:
    """A recording's opportunities as a table: what moves in front of what, on how many ranks,
    the estimate, the gain its replay measured (on top of the ones above) and alone."""
    rows = []
    for o, gain, raw in zip(
        found["id"].to_pylist(),
        found["gain_ns"].to_pylist(),
        found["detail"].to_pylist(),
        strict=True,
    ):
        d = json.loads(raw)
        moves = d["moves"]
        rows.append(
            {
                "id": o,
                "in front of": d["held"],
                "ranks": len(moves),
                "ops moved": sum(len(m["moved"]) for m in moves),
                "estimated_us": round(d["estimate_ns"] / 1e3, 1),
                "gain_us": round(gain / 1e3, 1),
                "gain_pct": round(gain / d["makespan_ns"] * 100, 2) if d.get("makespan_ns") else None,
                "alone_gain_us": round(d["alone_gain_ns"] / 1e3, 1),
            }
        )
    return pa.Table.from_pylist(rows)


def _measured_table(trace: str, found: pa.Table, details: list[dict[str, Any]], console: Console) -> None:
    """:func:`hoist_table`, and how to read and apply it."""
    print_table(hoist_table(found), "table", title=f"opportunities in {trace}", console=console)
    network = details[0].get("network", "")
    total = sum(found["gain_ns"].to_pylist())
    console.print(
        f"{found.num_rows} opportunities measured by replaying {trace} on {network} (makespan "
        f"{details[0]['makespan_ns'] / 1e3:,.1f} µs): each gain is on top of the ones above it, so "
        f"applying all of them takes off {total / 1e3:,.1f} µs; alone_gain is one applied alone. "
        f"Apply: etstore rewrite {trace} --apply overlap (or --opportunity N), then etstore compare",
        soft_wrap=True,
        highlight=False,
    )


def _rewrite(args: argparse.Namespace, console: Console) -> int:
    if args.apply is None:
        if not args.opportunity:
            raise OptionError(
                "rewrite: say what to apply: --apply overlap|reorder|chunk-split or --opportunity N"
            )
        args.apply = "overlap"
    with open_from_args(args) as store:
        report = rewrite_stored(
            store,
            args.trace,
            args.apply,
            name=args.name,
            topo=args.topo,
            run_id=args.run,
            max_pieces=args.max_pieces,
            opportunities=args.opportunity,
            split=_split(args),
        )
        info = report.trace
        params = store.load(info.name).params
    row = {
        "trace": info.name,
        "parent": args.trace,
        "applied": params.get("applied", args.apply),
        "changes": params.get("changes"),
        **stored_status(report),
        "ops": info.ops,
        "deps": info.deps,
    }
    render(pa.Table.from_pylist([row]), args.format, console=console)
    split = params.get("split_ops") or []
    if split and args.format == "table":  # what each split op became
        rows = [
            {
                "rank": o["rank"],
                "id": o["id"],
                "op": o["name"],
                "before_us": o["before_us"],
                "pieces_us": " + ".join(str(p) for p in o["pieces_us"]),
                "after_us": sum(o["pieces_us"]),
            }
            for o in split
        ]
        cost = params.get("split") or {}
        title = (
            f"split ops (a launch {cost.get('overhead_us')} µs per piece after the first, "
            f"x{cost.get('interference')} beside communication)"
        )
        print_table(pa.Table.from_pylist(rows), "table", limit=20, title=title, console=console)
    return 0


def _compare(args: argparse.Namespace, console: Console) -> int:
    with open_from_args(args) as store:
        cmp = compare(store, args.a, args.b, args.topo, config=_config(args))
    summary = {
        "comparison_id": cmp.comparison_id,
        "trace_a": cmp.trace_a,
        "trace_b": cmp.trace_b,
        "run_a": cmp.run_a,
        "run_b": cmp.run_b,
        "topology": cmp.topology,
        "total_a_ns": cmp.total_a_ns,
        "total_b_ns": cmp.total_b_ns,
        "diff_ns": cmp.diff_ns,
    }
    only = chosen_table(args)
    if only is not None:
        print_table(cmp.table if only == "ranks" else one_row(summary), args.format, console=console)
        return 0
    render(
        cmp.table, "table", title=f"{cmp.trace_a} (A) vs {cmp.trace_b} (B) on {cmp.topology}", console=console
    )
    pct = cmp.diff_ns / cmp.total_a_ns * 100 if cmp.total_a_ns else 0.0
    console.print(
        f"makespan A {cmp.total_a_ns:,.0f} ns, B {cmp.total_b_ns:,.0f} ns: {cmp.diff_ns:+,.0f} ns "
        f"({pct:+.1f}%); runs {cmp.run_a} and {cmp.run_b}, comparison {cmp.comparison_id}"
    )
    return 0


def _topo_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--topo", default=None, help="topology spec or file (default: ring over the ranks, 50 GB/s, 500 ns)"
    )


def register(sub: Any) -> None:
    """Add ``overlap``, ``rewrite`` and ``compare`` to the subparsers ``sub``."""
    sp = sub.add_parser("overlap", help="find overlap, chunk and reorder opportunities, each gain simulated")
    sp.add_argument("trace", nargs="?", help="stored trace")
    sp.add_argument("--explain", action="store_true", help="print the Cypher and SQL queries the finders run")
    _topo_arg(sp)
    _sim_flags(sp)
    sp.add_argument("--run", type=int, default=None, help="take timings from this recorded run instead")
    sp.add_argument(
        "--kind",
        action="append",
        choices=("overlap", "chunk", "reorder"),
        help="only these finders (repeatable)",
    )
    sp.add_argument("--max-pieces", type=int, default=8, help="chunk: at most this many pieces per consumer")
    _split_flags(sp)
    sp.add_argument(
        "--limit", type=int, default=32, help="simulate at most this many opportunities per kind (default 32)"
    )
    sp.add_argument(
        "--estimates",
        action="store_true",
        help="keep the finders' estimates instead of simulating each opportunity (quick; not a recording)",
    )
    add_format(sp)
    sp.set_defaults(handler=_overlap)

    sp = sub.add_parser("rewrite", help="store a new trace applying overlap, reorder or chunk-split")
    sp.add_argument("trace", help="stored trace")
    sp.add_argument("--apply", default=None, metavar="{overlap,reorder,chunk-split}", help="what to apply")
    sp.add_argument(
        "--opportunity",
        type=int,
        action="append",
        metavar="N",
        help="a recording: apply opportunity N of 'etstore overlap' (repeatable; default every one)",
    )
    sp.add_argument("--name", default=None, help="name of the new trace (default: <trace>-<apply>)")
    _topo_arg(sp)
    sp.add_argument("--run", type=int, default=None, help="chunk-split: chunk arrival from this recorded run")
    sp.add_argument(
        "--max-pieces", type=int, default=8, help="chunk-split: at most this many pieces per consumer"
    )
    _split_flags(sp)
    add_format(sp)
    sp.set_defaults(handler=_rewrite)

    sp = sub.add_parser("compare", help="simulate two traces and record per-rank and total differences")
    sp.add_argument("a", help="stored trace A (the baseline)")
    sp.add_argument("b", help="stored trace B")
    _topo_arg(sp)
    _sim_flags(sp)
    add_format(sp)
    add_table(
        sp,
        {
            "ranks": "per rank: time in A and in B and their difference (ns)",
            "summary": "one row: the traces, runs, topology, makespans A and B and their difference",
        },
        "ranks",
    )
    sp.set_defaults(handler=_compare)
