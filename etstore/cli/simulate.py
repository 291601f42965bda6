"""Simulation commands: replay a stored trace over a topology; sweep bus bandwidth."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from etstore import collectives
from etstore.cli._common import (
    add_format,
    open_to_record,
    print_json,
    progress,
    progress_to,
)
from etstore.cli._console import warn
from etstore.cli._inputs import trace_from
from etstore.cli._render import render
from etstore.cli._topology_args import add_topology_options, topology_from
from etstore.collective import COLLECTIVE_NAMES
from etstore.collectives.specs import algorithms_by_type, parse_by_type
from etstore.collectives.stored import resolve_algorithm
from etstore.errors import OptionError
from etstore.sim import BUILTIN_ALGORITHMS, simulate
from etstore.sim.config import SimConfig, read_comm_groups, read_network_config, read_system_config
from etstore.sim.metrics import record_run, record_sweep
from etstore.sim.sweep import parse_sizes, sweep
from etstore.store import Store

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _algorithm(store: Store | None, spec: str) -> Any:
    """A built-in name stays a name; anything else is a stored algorithm (or an error naming both)."""
    if spec in BUILTIN_ALGORITHMS:
        return spec
    algo = resolve_algorithm(store, spec)
    if isinstance(algo, str):  # a generator with chunks: the simulator takes them from --chunks
        name, chunks = algo.partition(":")[0], algo.partition(":")[2]
        raise OptionError(f"--algo {spec!r}: write --algo {name} --chunks {chunks} for the simulator")
    return algo


def _algorithms(store: Store | None, specs: list[str] | None) -> dict[str, Any] | None:
    """``--algo ring`` (every collective it implements; ``native``/``replay``: every type) or
    ``--algo allreduce=ring,allgather=NAME``, parsed and resolved as ``expand`` does."""
    if not specs:
        return None
    out: dict[str, Any] = {}
    for item in (p.strip() for spec in specs for p in spec.split(",") if p.strip()):
        if "=" in item:
            out.update({coll: _algorithm(store, algo) for coll, algo in parse_by_type(item).items()})
            continue
        algo = _algorithm(store, item)
        cover = (
            dict.fromkeys(COLLECTIVE_NAMES, algo)
            if algo in ("native", "replay")
            else algorithms_by_type(algo)
        )
        for coll, a in cover.items():
            out.setdefault(coll, a)
    return out


def _config(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    if args.congestion:
        overrides["congestion"] = args.congestion
    if args.policy:
        overrides["scheduling_policy"] = args.policy
    if args.hops:
        overrides["hops"] = args.hops
    if args.chunks is not None:
        overrides["algorithm_chunks"] = args.chunks
    if args.system_config:
        return read_system_config(args.system_config, **overrides)
    return dataclasses.replace(SimConfig(), **overrides)


def _network(args: argparse.Namespace) -> tuple[Any, Any]:
    """(topology, dims) from ``--network-config`` (ASTRA-sim YAML) or ``--topo``."""
    if args.network_config:
        net = read_network_config(args.network_config)
        return net.topology, net.dims
    if not args.topo:
        raise OptionError("sim: give --topo SPEC or --network-config FILE")
    return topology_from(args), None


def _sim(args: argparse.Namespace, console: Console) -> int:
    topo, dims = _network(args)
    config = _config(args)
    groups = read_comm_groups(args.comm_groups) if args.comm_groups else None
    with open_to_record(args) as store:
        trace = trace_from(store, args.trace)
        algorithms = _algorithms(store, args.algo)
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
                    params={"algo": args.algo or [], "argv": "sim"},
                )
                if step:
                    step("record", result.sim_ops, result.sim_ops)
    summary = {"run_id": run_id, **result.summary()}
    if config.ignored:  # system-file keys not modelled; read_system_config also warns on stderr
        summary["ignored_system_keys"] = list(config.ignored)
    warning = result.overload_warning()
    if warning:  # on stderr, so json and csv output stay parseable
        warn(warning)
    if args.format == "json":
        print_json(
            {
                **summary,
                "ranks": result.ranks.to_pylist(),
                "collectives": result.collectives.slice(0, args.limit).to_pylist(),
            }
        )
        return 0
    if args.format == "csv":
        render(result.ranks, "csv", console=console)
        return 0
    head = f"run {run_id}: " if run_id is not None else ""
    console.print(
        f"{head}[bold]{trace.name}[/] on {topo.name} ({config.congestion} network): "
        f"{result.total_ns / 1e3:,.3f} µs simulated; {result.events:,} events in {result.wall_s:.2f} s "
        f"({result.events_per_s / 1e6:.2f} M events/s)",
        highlight=False,
        soft_wrap=True,
    )
    render(result.ranks.slice(0, args.limit), "table", title="per rank (ns)", console=console)
    if result.collectives.num_rows:
        cols = [
            c
            for c in (
                "pg_name",
                "comm_type",
                "algorithm",
                "group_size",
                "size_bytes",
                "time_ns",
                "busbw_gb_per_s",
            )
            if c in result.collectives.column_names
        ]
        render(
            result.collectives.select(cols).slice(0, args.limit),
            "table",
            title=f"collectives ({result.collectives.num_rows}; busbw GB/s, GB = 2^30)",
            console=console,
        )
    if run_id is not None:
        console.print(
            f"metrics recorded: SELECT * FROM runs WHERE run_id = {run_id}", highlight=False, soft_wrap=True
        )
    return 0


def _sweep(args: argparse.Namespace, console: Console) -> int:
    sizes = parse_sizes(args.sizes)
    config = _config(args)
    topos = [topology_from(args, spec) for spec in args.topo]
    with open_to_record(args) as store:
        algos: dict[str, Any] = {}
        for item in (p.strip() for spec in args.algo for p in spec.split(",") if p.strip()):
            if item == "synth":
                algos[item] = _synth_factory(args.synth_chunks, args.seed)
            else:
                algos[item] = _algorithm(store, item)
        bar = progress(console)
        if bar:
            with bar:
                task = bar.add_task("sweep", total=len(sizes) * len(algos) * len(topos))
                points = sweep(
                    sizes,
                    algos,
                    topos,
                    collective=args.coll,
                    config=config,
                    progress=lambda done, _total: bar.update(task, completed=done),
                )
        else:
            points = sweep(sizes, algos, topos, collective=args.coll, config=config)
        sweep_id = None
        if store is not None and not args.no_record:
            sweep_id = record_sweep(store.warehouse, points, params={"algo": args.algo, "topo": args.topo})
    if args.format == "json":
        print_json({"sweep_id": sweep_id, "points": points.to_pylist()})
        return 0
    shown = points.select(
        ["topology", "algorithm", "size_bytes", "time_ns", "algbw_gb_per_s", "busbw_gb_per_s"]
    )
    render(shown, args.format, title=f"{args.coll} bus bandwidth (GB/s, GB = 2^30)", console=console)
    if sweep_id is not None and args.format == "table":
        console.print(
            f"sweep {sweep_id} recorded: SELECT * FROM sweep_points WHERE sweep_id = {sweep_id}",
            highlight=False,
            soft_wrap=True,
        )
    return 0


def _synth_factory(chunks: int, seed: int) -> Any:
    def build(topo: Any, coll: str) -> Any:
        return collectives.synthesize(topo, coll=coll, chunks_per_npu=chunks, seed=seed).trace

    return build


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--congestion",
        choices=("aware", "unaware"),
        help="network model (default unaware, as ASTRA-sim's analytical backend; a run whose links are "
        "offered more than their bandwidth prints a warning)",
    )
    sp.add_argument(
        "--hops",
        choices=("store-and-forward", "cut-through"),
        help="how an aware message crosses a multi-hop route (default store-and-forward, as ASTRA-sim)",
    )
    sp.add_argument(
        "--policy",
        choices=("FIFO", "LIFO"),
        help="collective priority (default LIFO, as ASTRA-sim); ready ops always issue by node id",
    )
    sp.add_argument("--chunks", type=int, default=None, help="chunks per rank for generated algorithms")
    sp.add_argument("--system-config", metavar="FILE", help="ASTRA-sim system config JSON")
    sp.add_argument("--no-record", action="store_true", help="do not write metrics to the store")


def register(sub: Any) -> None:
    """Add ``sim`` and ``sweep`` to the subparsers ``sub``."""
    sp = sub.add_parser("sim", help="replay a trace over a network; metrics into DuckDB")
    sp.add_argument("trace", help="stored trace name or trace files")
    add_topology_options(sp, required=False)
    sp.add_argument(
        "--network-config", metavar="FILE", help="ASTRA-sim analytical network YAML (instead of --topo)"
    )
    sp.add_argument(
        "--algo",
        action="append",
        metavar="[COLL=]ALGO",
        help="collective algorithm: native, replay, ring, direct, halving-doubling, tree or a stored "
        "algorithm; COLL=ALGO for one collective type (e.g. allreduce=ring,allgather=my-algo)",
    )
    sp.add_argument(
        "--comm-groups",
        metavar="FILE",
        help="ASTRA-sim communicator group JSON; replaces the trace's groups, every pg_name must be in it",
    )
    sp.add_argument("--limit", type=int, default=20, help="rows of each table to print (default 20)")
    _common(sp)
    add_format(sp)
    sp.set_defaults(handler=_sim)

    sp = sub.add_parser("sweep", help="bus bandwidth over sizes x algorithms x topologies")
    sp.add_argument("--coll", default="allreduce", help="collective (default allreduce)")
    sp.add_argument("--sizes", default="1KiB..1GiB:4", help="sizes: list and/or ranges A..B[:factor]")
    sp.add_argument(
        "--algo",
        action="append",
        required=True,
        help="algorithms (repeat or comma-separate): native, ring, direct, ..., synth, or stored names",
    )
    sp.add_argument("--topo", action="append", required=True, metavar="SPEC", help="topology (repeatable)")
    sp.add_argument("--bw", type=float, default=None, help="link bandwidth GB/s (GB = 2^30) where unset")
    sp.add_argument("--lat", type=float, default=None, help="link latency ns where unset")
    sp.add_argument("--synth-chunks", type=int, default=1, help="chunks per NPU for 'synth' (default 1)")
    sp.add_argument("--seed", type=int, default=0, help="seed for 'synth'")
    _common(sp)
    add_format(sp)
    sp.set_defaults(handler=_sweep)
