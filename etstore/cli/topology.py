"""Topology commands: describe a topology, synthesize an algorithm for it."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from etstore.algorithms.synth import SynthResult, synthesize
from etstore.cli._common import add_format, open_from_args, print_json, progress_to, stored_status
from etstore.cli._console import styled
from etstore.cli._render import render
from etstore.cli._sim_args import memory_passes
from etstore.cli._topology_args import add_topology_options, topology_from
from etstore.collective import chakra_name
from etstore.sim import collective_workload, simulate
from etstore.sim.config import SimConfig, read_system_config
from etstore.units import parse_size

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["default_name", "register"]

_DEFAULT_SIZE = "1GiB"
_DEFAULT_TRIALS = 8


PART_OPS = 1 << 19
"""Ops per part when a synthesized trace is stored: above this it is built and stored rank range by
rank range (up to ~800 bytes per op of a part at its peak), never whole."""


def _topo_show(args: argparse.Namespace, console: Console) -> int:
    topo = topology_from(args, args.spec, routes=False)
    doc = topo.describe()
    if args.format == "json":  # one row, as the CSV prints it
        print_json([doc])
        return 0
    if args.format == "csv":
        render(pa.Table.from_pylist([{k: str(v) for k, v in doc.items()}]), "csv", console=console)
        return 0
    rows = [{"property": k, "value": "" if v is None else str(v)} for k, v in doc.items()]
    render(pa.Table.from_pylist(rows), args.format, title=f"topology {topo.name}", console=console)
    return 0


def default_name(res: SynthResult, size: str, trials: int, system_config: str | None = None) -> str:
    """The stored name of a synthesized algorithm, from its own inputs alone.

    ``synth-<collective>-<topology>-<k>c-s<seed>``, then ``-r<root>`` for a broadcast or
    reduce from a root other than 0, ``-<size>`` for a size other than the default,
    ``-t<trials>`` for a trial count other than the default, and the simulator settings
    its time is for where they are not ``sim``'s defaults (``-aware``, ``-red<N>`` and
    ``-copy<N>`` memory passes, ``-sys-<file stem>``): two requests share a name exactly
    when they ask for the same algorithm.
    """
    label = re.sub(r"[^A-Za-z0-9.]+", "-", res.topology).strip("-")
    name = f"synth-{res.collective}-{label}-{res.chunks_per_npu}c-s{res.seed}"
    if res.collective in ("broadcast", "reduce") and res.extra.get("root", 0) != 0:
        name += f"-r{res.extra['root']}"
    if res.buffer_bytes != parse_size(_DEFAULT_SIZE):
        name += "-" + re.sub(r"[^A-Za-z0-9.]+", "-", size).strip("-")
    if trials != _DEFAULT_TRIALS:
        name += f"-t{trials}"
    timed = res.timed_by
    if system_config:
        name += "-sys-" + re.sub(r"[^A-Za-z0-9.]+", "-", Path(system_config).stem).strip("-")
    if timed:
        defaults = SimConfig()
        if timed["congestion"] != defaults.congestion:
            name += f"-{timed['congestion']}"
        if timed["reduction_mem_accesses"] != defaults.reduction_mem_accesses:
            name += f"-red{timed['reduction_mem_accesses']}"
        if timed["copy_mem_accesses"] != defaults.copy_mem_accesses:
            name += f"-copy{timed['copy_mem_accesses']}"
    return name


def _sim_config(args: argparse.Namespace) -> SimConfig:
    """The simulator settings the reported time is for: ``sim``'s defaults, a system file, and the
    options ``sim`` shares with ``synth``."""
    overrides: dict[str, Any] = {}
    for key in ("congestion", "reduction_mem_accesses", "copy_mem_accesses"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.system_config:
        return read_system_config(args.system_config, **overrides)
    return dataclasses.replace(SimConfig(), **overrides)


def _model(doc: dict[str, Any]) -> str:
    """How the time was priced, in words (the ``sim`` options that give the same time)."""
    passes = doc["reduction_mem_accesses"]
    reduce = f"{passes} memory passes at {doc['local_mem_bw_gb_per_s']:g} GB/s" if passes else "1 ns"
    return f"as etstore sim times the stored algorithm: {doc['congestion']} network, reductions {reduce}"


def _simulated(res: SynthResult, config: SimConfig, doc: dict[str, Any]) -> float:
    """Put ``sim``'s time of the algorithm in ``doc`` and return what it adds to the
    congestion-unaware figure synthesis gives (a switch's second hop and shared ports, parallel
    links' queues), in ns."""
    coll = chakra_name(res.collective) or res.collective
    work = collective_workload(coll, res.num_npus, res.buffer_bytes)
    total = float(simulate(work, res.network, config=config, algorithms={coll: res.trace}).total_ns)
    doc.update(
        time_ns=total,
        ratio=total / res.lower_bound_ns if res.lower_bound_ns > 0 else 1.0,
        time_exact=True,
    )
    return total - res.time_ns


def _sweep_command(args: argparse.Namespace, doc: dict[str, Any]) -> str:
    """The ``etstore sweep`` command that simulates the stored algorithm as this time was priced."""
    words = [
        "etstore sweep",
        f"--coll {doc['collective']}",
        f"--sizes {args.size}",
        f"--algo {doc['trace']}",
        f"--topo {args.topo}",
    ]
    for opt in ("bw", "lat", "congestion", "reduction_mem_accesses", "copy_mem_accesses", "system_config"):
        if getattr(args, opt) is not None:
            words.append(f"--{opt.replace('_', '-')} {getattr(args, opt)}")
    return " ".join(words)


def _synth(args: argparse.Namespace, console: Console) -> int:
    topo = topology_from(args, routes=False)
    config = _sim_config(args)
    with progress_to(console, f"synth {args.coll} on {topo.name}") as step:
        res = synthesize(
            topo,
            coll=args.coll,
            chunks_per_npu=args.chunks,
            trials=args.trials,
            seed=args.seed,
            buffer_bytes=parse_size(args.size),
            root=args.root,
            config=config,
            progress=step,
        )
        doc = res.to_dict(deps=False)  # the trace itself is never held whole
        simulated = not res.time_exact  # congestion-aware queues the schedule does not show
        doc["aware_extra_ns"] = _simulated(res, config, doc) if simulated else 0.0
        if not args.no_store:
            name = args.name or default_name(res, args.size, args.trials, args.system_config)
            # built and stored rank range by rank range: a 4,096-NPU trace never whole in memory;
            # the parts hold the schedule until the last is built, so the graph load runs without it
            parts, ops = res.trace_parts(PART_OPS), res.num_ops
            del res
            with open_from_args(args) as store:
                stored = (lambda ph, done, total: step(f"store {ph}", done, total)) if step else None
                report = store.ingest_parts(parts, name=name, ops=ops, progress=stored)
            items = list(doc.items())
            at = list(doc).index("ops") + 1  # deps beside ops, as the stored trace counts them
            doc = {
                "trace": report.trace.name,
                **stored_status(report),
                **dict(items[:at]),
                "deps": report.trace.deps,
                **dict(items[at:]),
            }
    if args.format == "json":  # one row, as the CSV prints it
        print_json([doc])
        return 0
    if args.format == "csv":
        render(pa.Table.from_pylist([{k: str(v) for k, v in doc.items()}]), "csv", console=console)
        return 0
    where = (" → stored as ", (str(doc["trace"]), "bold")) if "trace" in doc else ()
    again = f"  the same time: {_sweep_command(args, doc)}\n" if "trace" in doc else ""
    phases = ""
    if simulated:
        phases += (
            f"  congestion-aware links add {doc['aware_extra_ns'] / 1e3:,.2f} µs to the schedule's "
            f"{(doc['time_ns'] - doc['aware_extra_ns']) / 1e3:,.2f} µs congestion-unaware (a switch's "
            "second hop, shared ports, parallel links' queues): simulated\n"
        )
    if doc.get("phases_bound_ns"):
        phases += (
            f"  reduce-scatter then all-gather bound {doc['phases_bound_ns'] / 1e3:,.2f} µs "
            f"(ratio {doc['time_ns'] / doc['phases_bound_ns']:.4f}; the lower bound lets a chunk's "
            "all-gather overlap the reduce-scatter of others)\n"
        )
    console.print(
        styled(
            f"{doc['collective']} on {topo.name} ({doc['npus']} NPUs, "
            f"{doc['chunks_per_npu']} chunk(s)/NPU, {doc['buffer_bytes']:,} B)",
            *where,
            "\n"
            f"  collective time {doc['time_ns'] / 1e3:,.2f} µs ({_model(doc)}), "
            f"lower bound {doc['lower_bound_ns'] / 1e3:,.2f} µs, ratio {doc['ratio']:.4f}\n"
            f"{phases}{again}"
            f"  {doc['transfers']:,} transfers, {doc['ops']:,} ops; best of {doc['trials']} trial(s) "
            f"(seed {doc['seed']}), synthesized in {doc['synthesis_s']:.3f} s",
        ),
        soft_wrap=True,
    )
    return 0


def register(sub: Any) -> None:
    """Add ``topo show`` and ``synth`` to the subparsers ``sub``."""
    sp = sub.add_parser("topo", help="network topologies")
    topo = sp.add_subparsers(dest="topo_command", required=True, metavar="ACTION")
    show = topo.add_parser("show", help="NPUs, links, diameter and bisection bandwidth of a topology")
    show.add_argument("spec", help="topology spec (mesh2d:8x8, torus3d:4x4x4, ...) or a YAML/JSON file")
    show.add_argument("--bw", type=float, default=None, help="link bandwidth GB/s (GB = 2^30) where unset")
    show.add_argument("--lat", type=float, default=None, help="link latency ns where unset")
    add_format(show)
    show.set_defaults(handler=_topo_show)

    sp = sub.add_parser("synth", help="synthesize a topology-aware collective algorithm and store it")
    add_topology_options(sp)
    sp.add_argument(
        "--coll", required=True, help="allgather, reducescatter, allreduce, broadcast, reduce, alltoall"
    )
    sp.add_argument("--chunks", type=int, default=1, help="chunks per NPU (default 1)")
    sp.add_argument(
        "--trials",
        type=int,
        default=_DEFAULT_TRIALS,
        help=f"seeded greedy runs, stopping at the lower bound; the best is kept (default {_DEFAULT_TRIALS})",
    )
    sp.add_argument("--seed", type=int, default=0, help="base seed (same seed, same algorithm)")
    sp.add_argument(
        "--size",
        default=_DEFAULT_SIZE,
        help=f"collective size for the reported time (default {_DEFAULT_SIZE})",
    )
    sp.add_argument("--root", type=int, default=0, help="root NPU of broadcast and reduce")
    sp.add_argument(
        "--name",
        help="trace name (default: synth-<coll>-<topology>-<k>c-s<seed>, plus any non-default options)",
    )
    sp.add_argument("--no-store", action="store_true", help="only report; do not store the algorithm")
    sp.add_argument(
        "--congestion",
        choices=("aware", "unaware"),
        help="network model of the reported time, as `sim --congestion` (default unaware)",
    )
    sp.add_argument(
        "--reduction-mem-accesses",
        type=memory_passes,
        metavar="N",
        help="memory passes of a reduction in the reported time, as `sim` (default 3; 0: 1 ns a step)",
    )
    sp.add_argument(
        "--copy-mem-accesses",
        type=memory_passes,
        metavar="N",
        help="memory passes of an all-to-all local copy in the reported time, as `sim` (default 2)",
    )
    sp.add_argument(
        "--system-config",
        metavar="FILE",
        help="ASTRA-sim system config JSON the reported time is for, as `sim --system-config`",
    )
    add_format(sp)
    sp.set_defaults(handler=_synth)
