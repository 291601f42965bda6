"""What ``sim`` and ``sweep`` share: the simulator's options, their config, and ``--algo`` resolved."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from etstore.algorithms.nccl import is_nccl_spec
from etstore.algorithms.specs import algorithms_by_type, parse_by_type
from etstore.app.expand import resolve_algorithm
from etstore.collective import COLLECTIVE_NAMES
from etstore.errors import OptionError
from etstore.sim import BUILTIN_ALGORITHMS
from etstore.sim.config import SimConfig, read_system_config
from etstore.store import Store

__all__ = ["add_sim_options", "algo_arg", "algo_args", "sim_config"]


def algo_arg(store: Store | None, spec: str) -> Any:
    """A built-in name stays a name; anything else is a stored algorithm (or an error naming both)."""
    if spec in BUILTIN_ALGORITHMS:
        return spec
    algo = resolve_algorithm(store, spec)  # a stored name first; an NCCL spec's fields checked here
    if isinstance(algo, str) and is_nccl_spec(algo):  # NCCL's: its fields are channels, protocol ...
        return algo
    if isinstance(algo, str):  # a generator with chunks: the simulator takes them from --chunks
        name, chunks = algo.partition(":")[0], algo.partition(":")[2]
        raise OptionError(f"--algo {spec!r}: write --algo {name} --chunks {chunks} for the simulator")
    return algo


def algo_args(store: Store | None, specs: list[str] | None) -> dict[str, Any] | None:
    """``--algo ring`` (every collective it implements; ``native``/``replay``: every type) or
    ``--algo allreduce=ring,allgather=NAME``, parsed and resolved as ``expand`` does."""
    if not specs:
        return None
    out: dict[str, Any] = {}
    for item in (p.strip() for spec in specs for p in spec.split(",") if p.strip()):
        if "=" in item:
            out.update({coll: algo_arg(store, algo) for coll, algo in parse_by_type(item).items()})
            continue
        algo = algo_arg(store, item)
        cover = (
            dict.fromkeys(COLLECTIVE_NAMES, algo)
            if algo in ("native", "replay")
            else algorithms_by_type(algo)
        )
        for coll, a in cover.items():
            out.setdefault(coll, a)
    return out


def sim_config(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    if args.congestion:
        overrides["congestion"] = args.congestion
    if args.policy:
        overrides["scheduling_policy"] = args.policy
    if args.hops:
        overrides["hops"] = args.hops
    if args.chunks is not None:
        overrides["algorithm_chunks"] = args.chunks
    if args.reduction_mem_accesses is not None:
        overrides["reduction_mem_accesses"] = args.reduction_mem_accesses
    if args.copy_mem_accesses is not None:
        overrides["copy_mem_accesses"] = args.copy_mem_accesses
    if getattr(args, "expanded_slots", None):  # sim only
        overrides["expanded_slots"] = args.expanded_slots
    if args.system_config:
        return read_system_config(args.system_config, **overrides)
    return dataclasses.replace(SimConfig(), **overrides)


def memory_passes(text: str) -> int:
    """A count of memory passes: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of memory passes (0 or more), got {text!r}"
        )
    return value


def add_sim_options(sp: argparse.ArgumentParser) -> None:
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
    sp.add_argument(
        "--reduction-mem-accesses",
        type=memory_passes,
        metavar="N",
        help="memory passes of a local reduction, on every path (default 3: ASTRA-sim's native "
        "collectives; 0 with --copy-mem-accesses 0: ASTRA-sim's custom collectives, 1 ns a step)",
    )
    sp.add_argument(
        "--copy-mem-accesses",
        type=memory_passes,
        metavar="N",
        help="memory passes of a local copy in an algorithm (default 2)",
    )
    sp.add_argument("--system-config", metavar="FILE", help="ASTRA-sim system config JSON")
    sp.add_argument("--no-record", action="store_true", help="do not write metrics to the store")
