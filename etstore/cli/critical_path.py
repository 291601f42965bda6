"""The ``critical-path`` command: the longest dependency path of a stored trace, or of a
simulation run (its own module: drawing a run's path needs the report's schedule code, which
``sql`` and ``cypher`` should not load)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.app.critical_path import stored_critical_path
from etstore.cli._common import add_format, open_from_args, progress_to
from etstore.cli._tables import add_limit, add_table, chosen_table, one_row, print_table
from etstore.errors import OptionError, StoreError
from etstore.progress import ProgressFn
from etstore.report import critical_path_steps, schedule_critical_path
from etstore.report._data import run_infos

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


_CRITICAL_PATH_TABLES = {
    "path": "the path's ops in order: step, rank, id, name, type, duration_micros, start_micros, via "
    "(with --run: start_ns, end_ns instead of the durations)",
    "ranks": "the longest path within each rank: rank, length_micros, ops (with --run: the ops and the "
    "time held_ns the path spends on each rank)",
    "summary": "one row: trace, rank, length_micros, ops, dropped_edges (with --run: run, trace, length_ns, "
    "makespan_ns, ops)",
}


def _critical_path(args: argparse.Namespace, console: Console) -> int:
    if args.run is not None:
        return _run_path(args, console)
    if args.trace is None:
        raise OptionError("critical-path: name a stored trace, or a simulation run with --run ID")
    with (
        progress_to(console, f"critical-path {args.trace}") as step,
        open_from_args(args, read_only=True) as store,
    ):  # read a unit of ranks at a time: the trace need not fit in memory
        cp = stored_critical_path(store, args.trace, rank=args.rank, progress=step)
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


def _report(step: ProgressFn | None, phase: str, done: int) -> None:
    """One step of a phase counted 0 or 1 (loading, a query): the bar says what runs."""
    if step is not None:
        step(phase, done, 1)


def _run_path(args: argparse.Namespace, console: Console) -> int:
    """The chain of binding waits through a recorded simulation run (``--run ID``)."""
    if args.rank is not None:
        raise OptionError(
            "critical-path --run: --rank weighs one rank of a stored trace; a run's path crosses ranks"
        )
    with (
        open_from_args(args, read_only=True) as store,
        progress_to(console, f"critical-path run {args.run}") as step,
    ):
        warehouse = store.warehouse
        (run,) = run_infos(warehouse, [args.run])
        if args.trace is not None and args.trace != run.trace:
            raise OptionError(f"run {args.run} simulated {run.trace!r}, not {args.trace!r}")
        if (
            run.num_ops
            and not warehouse.query(
                "SELECT count(*) FROM op_timings WHERE run_id = $r", {"r": run.run_id}
            ).scalar()
        ):
            raise StoreError(
                f"run {run.run_id} has no per-op timings in {store.location}: a server's copy of "
                "published runs holds none; read it in the store that recorded it"
            )
        _report(step, "path", 0)
        path = schedule_critical_path(warehouse, run).drop_columns(["row"])
        _report(step, "path", 1)
    start, end = path["start_ns"].to_numpy(), path["end_ns"].to_numpy()
    length_ns = float(end[-1] - start[0]) if len(start) else 0.0
    held_from, held_to = critical_path_steps(start, end)
    ranks = (
        pa.table({"rank": path["rank"], "held_ns": pa.array(held_to - held_from, pa.float64())})
        .group_by("rank")
        .aggregate([([], "count_all"), ("held_ns", "sum")])
        .rename_columns(["rank", "ops", "held_ns"])
        .sort_by("rank")
    )
    summary = {
        "run": run.run_id,
        "trace": run.trace,
        "length_ns": length_ns,
        "makespan_ns": run.total_ns,
        "ops": path.num_rows,
    }
    tables = {"path": path, "ranks": ranks, "summary": one_row(summary)}
    only = chosen_table(args)
    if only is not None:
        print_table(tables[only], args.format, limit=args.limit, console=console)
        return 0
    title = f"critical path of run {run.run_id} ({run.trace}, {run.topology})"
    print_table(path, "table", limit=args.limit, title=title, console=console)
    console.print(
        f"length {length_ns / 1e3:,.3f} µs over {path.num_rows} ops; makespan {run.total_ns / 1e3:,.3f} µs"
    )
    if ranks.num_rows > 1:
        title = "time the path spends on each rank"
        print_table(ranks, "table", limit=args.limit, title=title, console=console)
    return 0


def register(sub: Any) -> None:
    """Add ``critical-path`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "critical-path",
        help="longest dependency path of a trace or a simulation run",
        description="The longest path through a stored trace weighed by its ops' own durations, across "
        "ranks through message edges; with --run ID, the chain of ops through a recorded simulation run "
        "where each step's start was set by the end of the one before (a dependency, the message a "
        "receive waited for, the collective peer that joined last).",
    )
    sp.add_argument("trace", nargs="?", default=None, help="stored trace (optional with --run)")
    sp.add_argument("--rank", type=int, default=None, help="only this rank (default: all, across messages)")
    sp.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="ID",
        help="the critical path of simulation run ID (etstore runs)",
    )
    add_limit(sp, 50)
    add_format(sp)
    add_table(sp, _CRITICAL_PATH_TABLES, "path")
    sp.set_defaults(handler=_critical_path)
