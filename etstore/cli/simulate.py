"""Simulation commands: replay a stored trace over a topology; sweep bus bandwidth, or a trace over
the values of one what-if knob."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.app.runs import record_jobs, record_run
from etstore.cli._common import add_format, open_to_record, progress_to
from etstore.cli._console import styled, warn
from etstore.cli._inputs import trace_from
from etstore.cli._perturb_args import add_perturbation, perturbation_from
from etstore.cli._sim_args import add_sim_options, algo_args, sim_config
from etstore.cli._tables import add_limit, add_table, chosen_table, one_row, print_table
from etstore.cli._topology_args import add_topology_options, topology_from
from etstore.errors import OptionError
from etstore.sim import simulate
from etstore.sim.config import (
    EXPANDED_SLOTS,
    read_comm_groups,
    read_network_config,
)
from etstore.sim.jobs import JobRuns, JobsResult, job_tables, read_placement, simulate_jobs
from etstore.sim.perturb import Perturbation, perturb, perturb_network

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _network(args: argparse.Namespace) -> tuple[Any, Any]:
    """(topology, dims) from ``--network-config`` (ASTRA-sim YAML) or ``--topo``."""
    if args.network_config:
        net = read_network_config(args.network_config)
        return net.topology, net.dims
    if not args.topo:
        raise OptionError("sim: give --topo SPEC or --network-config FILE")
    return topology_from(args), None


def _perturbed_network(topo: Any, perturbation: Perturbation | None) -> Any:
    """The topology with the links the perturbation changes (itself where it changes none)."""
    return topo if perturbation is None else perturb_network(topo, perturbation)


def _changed(perturbation: Perturbation | None) -> str:
    """`` with …`` naming what a perturbation changed, for a command's first line."""
    return "" if perturbation is None else f" with {perturbation.describe()}"


_SIM_TABLES = {
    "summary": "one row: run_id, makespan total_ns, events, means, collectives, overloaded links",
    "ranks": "per rank: finish, compute, communication, exposed communication and idle time (ns)",
    "collectives": "per collective instance: type, algorithm, group, size, time, bus bandwidth",
}


def _placement(trace: Any, topo: Any) -> str | None:
    """Where the ranks ran, when the topology has NPUs the trace leaves empty (rank r is NPU r)."""
    ranks = sorted(trace.ranks)
    if not ranks or topo is None or topo.num_npus <= len(ranks):
        return None
    lo, hi = ranks[0], ranks[-1]
    where = (
        f"ranks {lo}..{hi} on NPUs {lo}..{hi}" if hi - lo + 1 == len(ranks) else f"rank r on NPU r ({ranks})"
    )
    return (
        f"placement: {len(ranks)} ranks on a topology of {topo.num_npus} NPUs: {where}; "
        f"the other {topo.num_npus - len(ranks)} NPUs run nothing"
    )


def _sized(trace: Any) -> None:
    """Refuse an algorithm whose messages carry no size: replayed as it is it would move 0
    bytes, a time that means nothing. An algorithm is timed at a collective size."""
    if trace.kind != "algorithm":
        return
    comm = pc.is_in(trace.ops["type"], pa.array(["COMM_SEND_NODE", "COMM_RECV_NODE"]))
    sizes = pc.fill_null(trace.ops["comm_size"].filter(comm), 0)
    if len(sizes) and pc.max(sizes).as_py() == 0:
        raise OptionError(
            f"{trace.name!r} is an algorithm whose messages carry no size: time it at a collective "
            f"size with 'etstore sweep --algo {trace.name} --sizes 1GiB --topo ...', or in a workload "
            f"with 'etstore sim WORKLOAD --algo COLL={trace.name}'"
        )


def _sim(args: argparse.Namespace, console: Console) -> int:
    if len(args.trace) > 1 or args.placement:
        return _sim_jobs(args, console)
    topo, dims = _network(args)
    config = sim_config(args)
    groups = read_comm_groups(args.comm_groups) if args.comm_groups else None
    perturbation = perturbation_from(args)
    topo = _perturbed_network(topo, perturbation)
    with open_to_record(args) as store:
        trace = trace_from(store, args.trace[0])
        _sized(trace)
        if perturbation is not None and perturbation.changes_compute:  # a what-if of compute
            trace = perturb(trace, perturbation)
        algorithms = algo_args(store, args.algo)
        run_id = None
        with progress_to(console, f"sim {trace.name}") as step:
            result = simulate(
                trace, topo, config=config, algorithms=algorithms, groups=groups, dims=dims, progress=step
            )
            if store is not None and not args.no_record:
                if step:
                    step("record", 0, result.sim_ops)
                run_id = record_run(
                    store.warehouse,
                    result,
                    trace_name=trace.name,
                    params={
                        "algo": args.algo or [],
                        "argv": "sim",
                        **({"perturbation": perturbation.to_dict()} if perturbation else {}),
                    },
                )
                if step:
                    step("record", result.sim_ops, result.sim_ops)
    summary = {"run_id": run_id, **result.summary()}
    if config.ignored:  # system-file keys not modelled; read_system_config also warns on stderr
        summary["ignored_system_keys"] = list(config.ignored)
    warning = result.overload_warning()
    if warning:  # on stderr, so json and csv output stay parseable
        warn(warning)
    placed = _placement(trace, topo)
    if placed:
        warn(placed)
    tables = {"summary": one_row(summary), "ranks": result.ranks, "collectives": _collectives(result, args)}
    only = chosen_table(args)
    if only is not None:
        print_table(tables[only], args.format, limit=args.limit, console=console)
        return 0
    head = f"run {run_id}: " if run_id is not None else ""
    console.print(
        styled(
            head,
            (trace.name, "bold"),
            f" on {topo.name}{_changed(perturbation)} ({config.congestion} network): "
            f"{result.total_ns / 1e3:,.3f} µs simulated; {result.events:,} events in {result.wall_s:.2f} s "
            f"({result.events_per_s / 1e6:.2f} M events/s)",
        ),
        highlight=False,
        soft_wrap=True,
    )
    print_table(result.ranks, "table", limit=args.limit, title="per rank (ns)", console=console)
    if result.collectives.num_rows:
        print_table(
            tables["collectives"],
            "table",
            limit=args.limit,
            title=f"collectives ({result.collectives.num_rows}; busbw GB/s, GB = 10^9)",
            console=console,
        )
    if run_id is not None:
        console.print(
            f"metrics recorded: SELECT * FROM runs WHERE run_id = {run_id}", highlight=False, soft_wrap=True
        )
    return 0


def _sim_jobs(args: argparse.Namespace, console: Console) -> int:
    """``sim A B ... [--placement FILE]``: the jobs together on one fabric, a run each and a joint run."""
    several = len(args.trace) > 1
    if several and args.comm_groups:
        raise OptionError(
            "sim: --comm-groups replaces one trace's groups; with several traces each keeps its own"
        )
    topo, dims = _network(args)
    config = sim_config(args)
    groups = [read_comm_groups(args.comm_groups)] if args.comm_groups else None
    placement = read_placement(args.placement) if args.placement else None
    perturbation = perturbation_from(args)
    topo = _perturbed_network(topo, perturbation)  # the shared fabric's links: every job's
    with open_to_record(args) as store:
        traces = [trace_from(store, spec) for spec in args.trace]
        if perturbation is not None and perturbation.changes_compute:  # one trace's ranks
            if several:
                raise OptionError(
                    "sim: --slow, --scale and --jitter take one trace, not several jobs (links: --degrade, "
                    "--fail and --scale bw|lat change the shared fabric)"
                )
            traces = [perturb(traces[0], perturbation)]
        algorithms = algo_args(store, args.algo)
        runs = None
        with progress_to(console, f"sim {' '.join(t.name for t in traces)}") as step:
            result = simulate_jobs(
                traces,
                topo,
                placement=placement,
                config=config,
                algorithms=algorithms,
                groups=groups,
                dims=dims,
                progress=step,
            )
            if store is not None and not args.no_record:
                params = {
                    "algo": args.algo or [],
                    "argv": "sim",
                    **({"perturbation": perturbation.to_dict()} if perturbation else {}),
                }
                runs = record_jobs(store.warehouse, result, params=params)
    warning = result.joint.overload_warning()
    if warning:
        warn(warning)
    used = sum(len(j.npu) for j in result.combined.jobs)
    if topo.num_npus > used:
        idle = topo.num_npus - used
        warn(f"placement: {used} ranks on a topology of {topo.num_npus} NPUs; the other {idle} run nothing")
    tables = job_tables(result, runs)
    only = chosen_table(args)
    if only is not None:
        print_table(tables[only], args.format, limit=args.limit, console=console)
        return 0
    where = f"{topo.name}{_changed(perturbation)} ({config.congestion} network)"
    _print_jobs(result, tables, runs, where, args.limit, console)
    return 0


def _print_jobs(
    result: JobsResult, tables: dict[str, Any], runs: JobRuns | None, where: str, limit: int, console: Console
) -> None:
    """The table format of ``sim A B``: a line, the jobs, their ranks and collectives."""
    joint, jobs = result.joint, result.combined.jobs
    head = f"run {runs.joint}: " if runs is not None else ""
    names = ", ".join(j.trace_name for j in jobs)
    console.print(
        f"{head}{len(jobs)} job{'s' if len(jobs) > 1 else ''} ({names}) on {where}: "
        f"{joint.total_ns / 1e3:,.3f} µs simulated; {joint.events:,} events in {joint.wall_s:.2f} s",
        highlight=False,
        soft_wrap=True,
    )
    summary = tables["summary"]
    shown = ["job", "run_id", "trace", "total_ns", "mean_compute_ns", "mean_exposed_comm_ns", "collectives"]
    summary = summary.select([c for c in shown if c in summary.column_names])
    print_table(summary, "table", title="jobs (ns)", console=console)
    print_table(tables["ranks"], "table", limit=limit, title="per rank (ns)", console=console)
    colls = tables["collectives"]
    if colls.num_rows:
        keep = [
            "job",
            "pg_name",
            "comm_type",
            "algorithm",
            "group_size",
            "size_bytes",
            "time_ns",
            "busbw_gb_per_s",
        ]
        title = f"collectives ({colls.num_rows}; busbw GB/s, GB = 10^9)"
        print_table(colls.select(keep), "table", limit=limit, title=title, console=console)
    if runs is not None:
        ids = ", ".join(str(i) for i in (runs.joint, *runs.jobs))
        console.print(
            f"metrics recorded: SELECT * FROM runs WHERE run_id IN ({ids})", highlight=False, soft_wrap=True
        )


def _collectives(result: Any, args: argparse.Namespace) -> Any:
    """The collectives table: every column in CSV and JSON, the ones people read in the table format."""
    if args.format != "table":
        return result.collectives
    shown = ("pg_name", "comm_type", "algorithm", "group_size", "size_bytes", "time_ns", "busbw_gb_per_s")
    return result.collectives.select([c for c in shown if c in result.collectives.column_names])


def register(sub: Any) -> None:
    """Add ``sim`` to the subparsers ``sub``."""
    sp = sub.add_parser("sim", help="replay a trace over a network; metrics into DuckDB")
    sp.add_argument(
        "trace",
        nargs="+",
        help="stored trace name or trace files; several: jobs sharing the fabric (J0, J1, ... in this order)",
    )
    sp.add_argument(
        "--placement",
        metavar="FILE",
        help='where each job rank runs: JSON {"J0-0": NPU, ...} (ASTRA-sim multi-tenant form); '
        "default: the jobs on consecutive NPUs in the order given",
    )
    add_topology_options(sp, required=False)
    sp.add_argument(
        "--network-config", metavar="FILE", help="ASTRA-sim analytical network YAML (instead of --topo)"
    )
    sp.add_argument(
        "--algo",
        action="append",
        metavar="[COLL=]ALGO",
        help="collective algorithm: native, replay, ring, direct, halving-doubling, tree, a stored "
        "algorithm, nccl-ring[:CH[:PROTO[:LOOPS]]], nccl-tree[:CH[:PROTO[:NODES[:LOOPS]]]], or "
        "nccl[:GPU[:NODES[:CH]]] (NCCL's tuning model picks per size; the collectives table says what); "
        "COLL=ALGO for one collective type (e.g. allreduce=ring,allgather=my-algo)",
    )
    sp.add_argument(
        "--comm-groups",
        metavar="FILE",
        help="ASTRA-sim communicator group JSON; replaces the trace's groups, every pg_name must be in it",
    )
    sp.add_argument(
        "--expanded-slots",
        choices=EXPANDED_SLOTS,
        help="NPU slots of an expanded collective's sends and reductions: astra (each send on its NPU's "
        "comm slot, each reduction on its compute slot, as ASTRA-sim runs the exported .et) or collective "
        "(none; the block holds the comm slot as its node did; the default); docs/simulator.md",
    )
    add_limit(sp, 20)
    add_sim_options(sp)
    add_perturbation(sp)
    add_format(sp)
    add_table(sp, _SIM_TABLES, "summary")
    sp.set_defaults(handler=_sim)
