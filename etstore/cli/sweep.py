"""The ``sweep`` command: bus-bandwidth curves over sizes x algorithms x topologies, or a stored trace
over the values of one what-if knob; the points run here or as Ray tasks (``--ray``).

The store is read (stored algorithms, the trace) and closed before the points run, and opened
for writing only to record what came back, so sweeps of several processes or machines
recording into one store wait for each other for the length of a write, not of a sweep.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.algorithms import synthesize
from etstore.app.fanout import fanout
from etstore.app.runs import record_sensitivity, record_sweep
from etstore.app.sweeps import PointFailure, run_sensitivity, run_sweep
from etstore.cli._common import add_format, open_from_args, open_inputs, progress_to, say
from etstore.cli._console import warn
from etstore.cli._inputs import trace_from
from etstore.cli._render import render
from etstore.cli._sim_args import add_sim_options, algo_arg, algo_args, sim_config
from etstore.cli._topology_args import topology_from
from etstore.errors import OptionError, SimulationError
from etstore.sim.perturb import parse_knob
from etstore.sim.sweep import parse_sizes, sensitivity_table

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]

_SHOWN_FAILURES = 10


def _synth(topo: Any, coll: str, *, chunks: int, seed: int) -> Any:
    """The ``synth`` algorithm of a sweep: synthesized for each topology (a module-level function,
    so Ray ships it by reference)."""
    return synthesize(topo, coll=coll, chunks_per_npu=chunks, seed=seed).trace


def _report_failures(failed: Sequence[PointFailure], total: int, recorded: str) -> None:
    """One warning per failed point (the first few), and a summary line on stderr."""
    for f in failed[:_SHOWN_FAILURES]:
        warn(f"point {f.point} failed: {f.message}")
    more = f" ({len(failed) - _SHOWN_FAILURES} more not shown)" if len(failed) > _SHOWN_FAILURES else ""
    warn(f"{len(failed)} of {total} points failed{more}; {recorded}")


def _sweep(args: argparse.Namespace, console: Console) -> int:
    if args.trace is not None:
        return _sensitivity(args, console)
    if args.knob:
        raise OptionError("sweep --knob: name the trace to sweep (etstore sweep TRACE --knob ...)")
    if not args.algo:
        raise OptionError("sweep: give --algo (e.g. --algo ring,direct), or a TRACE and --knob")
    sizes = parse_sizes(args.sizes)
    config = sim_config(args)
    topos = [topology_from(args, spec) for spec in args.topo]
    algos: dict[str, Any] = {}
    with open_inputs(args) as store:
        for item in (p.strip() for spec in args.algo for p in spec.split(",") if p.strip()):
            if item == "synth":
                algos[item] = functools.partial(_synth, chunks=args.synth_chunks, seed=args.seed)
            else:
                algos[item] = algo_arg(store, item)
    with fanout(args.ray) as fan, progress_to(console, "sweep") as step:
        outcome = run_sweep(fan, sizes, algos, topos, collective=args.coll, config=config, progress=step)
        where = fan.where if fan.engine == "ray" else None
    total = len(sizes) * len(algos) * len(topos)
    points = outcome.points
    if points.num_rows == 0:
        first = outcome.failed[0]
        raise SimulationError(f"sweep: all {total} points failed; first, {first.point}: {first.message}")
    sweep_id = None
    if not args.no_record:
        with open_from_args(args) as store:
            params = {"algo": args.algo, "topo": args.topo}
            if outcome.failed:
                params["failed"] = [{"point": f.point, "message": f.message} for f in outcome.failed]
            sweep_id = record_sweep(store.warehouse, points, params=params)
    if where is not None:
        say(f"points ran on {where}")
    if args.format != "table":  # one table: every point, each with its sweep's id (null: not recorded)
        ids = pa.array([sweep_id] * points.num_rows, pa.int64())
        render(points.add_column(0, "sweep_id", ids), args.format, console=console)
    else:
        shown = points.select(
            ["topology", "algorithm", "size_bytes", "time_ns", "algbw_gb_per_s", "busbw_gb_per_s"]
        )
        render(shown, "table", title=f"{args.coll} bus bandwidth (GB/s, GB = 10^9)", console=console)
        if sweep_id is not None:
            console.print(
                f"sweep {sweep_id} recorded: SELECT * FROM sweep_points WHERE sweep_id = {sweep_id}",
                highlight=False,
                soft_wrap=True,
            )
    if outcome.failed:
        kept = (
            f"the other {points.num_rows} recorded as sweep {sweep_id}"
            if sweep_id is not None
            else "the rest shown"
        )
        _report_failures(outcome.failed, total, kept)
        return 1
    return 0


def _sensitivity(args: argparse.Namespace, console: Console) -> int:
    """``sweep TRACE --knob KNOB=V1,V2,...``: the trace once per value and topology, a run each, whose
    ``params.user.sensitivity`` holds the knob, the value and the sweep's first run."""
    if not args.knob:
        raise OptionError("sweep TRACE: give --knob KNOB=V1,V2,..., e.g. slow:3=1,1.5,2 or scale:bw=0.5,1,2")
    knob, values = parse_knob(args.knob, seed=args.seed)
    config = sim_config(args)
    topos = [topology_from(args, spec) for spec in args.topo]
    with open_inputs(args) as store:
        trace = trace_from(store, args.trace)
        algos = algo_args(store, args.algo)
    with fanout(args.ray) as fan, progress_to(console, f"sweep {trace.name}") as step:
        outcome = run_sensitivity(
            fan, trace, topos, knob, values, config=config, algorithms=algos, progress=step
        )
        if fan.engine == "ray":
            say(f"points ran on {fan.where}")
    total = len(topos) * len(values)
    points = outcome.points
    if not points:
        first = outcome.failed[0]
        raise SimulationError(
            f"sweep {trace.name}: all {total} points failed; first, {first.point}: {first.message}"
        )
    ids: list[int | None] = [None] * len(points)
    if not args.no_record:
        with open_from_args(args) as store:
            ids = list(
                record_sensitivity(
                    store.warehouse,
                    trace.name,
                    points,
                    knob=knob.name,
                    values=values,
                    params={"algo": args.algo or [], "argv": "sweep"},
                )
            )
    rows = sensitivity_table(points, knob).add_column(0, "run_id", pa.array(ids, pa.int64()))
    if args.format != "table":
        render(rows, args.format, console=console)
    else:
        render(rows, "table", title=f"{trace.name}: makespan per {knob.name} (ns)", console=console)
        if ids and ids[0] is not None:
            console.print(
                f"runs {ids[0]}..{ids[-1]} recorded (params.user.sensitivity): "
                f"etstore report {ids[0]} {ids[-1]}",
                highlight=False,
                soft_wrap=True,
            )
    if outcome.failed:
        kept = f"the other {len(points)} recorded as runs" if ids[0] is not None else "the rest shown"
        _report_failures(outcome.failed, total, kept)
        return 1
    return 0


def register(sub: Any) -> None:
    """Add ``sweep`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "sweep",
        help="busbw over sizes x algorithms x topologies, or a trace over a knob",
        description="Bus-bandwidth curves of one collective over sizes x algorithms x topologies; or, "
        "given a TRACE and --knob, the trace simulated once per value of a what-if knob on each "
        "topology, a recorded run each (docs/whatif.md).",
    )
    sp.add_argument(
        "trace",
        nargs="?",
        help="with --knob: a stored trace (or trace files) simulated once per knob value (docs/whatif.md)",
    )
    sp.add_argument(
        "--knob",
        metavar="KNOB=V1,V2,...",
        help="what-if knob of a TRACE sweep: slow:RANKS, scale:cpu|gpu|bw|lat, degrade:LINK (factors) "
        "or jitter (sigma, with --seed): slow:3=1,1.5,2",
    )
    sp.add_argument("--coll", default="allreduce", help="collective (default allreduce)")
    sp.add_argument("--sizes", default="1KiB..1GiB:4", help="sizes: list and/or ranges A..B[:factor]")
    sp.add_argument(
        "--algo",
        action="append",
        help="algorithms (repeat or comma-separate): native, ring, direct, ..., synth, or stored names; "
        "with a TRACE, as sim's --algo",
    )
    sp.add_argument("--topo", action="append", required=True, metavar="SPEC", help="topology (repeatable)")
    sp.add_argument("--bw", type=float, default=None, help="link bandwidth GB/s (GB = 2^30) where unset")
    sp.add_argument("--lat", type=float, default=None, help="link latency ns where unset")
    sp.add_argument("--synth-chunks", type=int, default=1, help="chunks per NPU for 'synth' (default 1)")
    sp.add_argument("--seed", type=int, default=0, help="seed for 'synth' and for a jitter knob")
    sp.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the points as Ray tasks: alone, a Ray instance on this machine (or $RAY_ADDRESS); "
        "'auto', the cluster started here by 'ray start'; else a cluster address (docs/scale-out.md)",
    )
    add_sim_options(sp)
    add_format(sp)
    sp.set_defaults(handler=_sweep)
