"""``etstore calibrate``: fit a topology's free network parameters to a measured nccl-tests run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms.nccl import is_nccl_spec
from etstore.app.calibrate import calibrate
from etstore.app.expand import resolve_algorithm
from etstore.cli._common import add_format, open_to_record
from etstore.cli._console import styled
from etstore.cli._render import render
from etstore.cli._tables import add_table, chosen_table, one_row, print_table
from etstore.errors import OptionError, UnknownTraceError
from etstore.model import Trace
from etstore.sim import BUILTIN_ALGORITHMS, SimConfig
from etstore.sim.calibrate import Calibration
from etstore.store import Store
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS
from etstore.units import parse_size

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _algorithm(store: Store, spec: str) -> str | Trace:
    """A built-in name stays a name; anything else is a stored algorithm (or an error naming both)."""
    if spec in BUILTIN_ALGORITHMS:
        return spec
    algo = resolve_algorithm(store, spec)  # a stored name first; an NCCL spec's fields checked here
    if isinstance(algo, str) and is_nccl_spec(algo):  # nccl: the run's own (algorithm, protocol)
        return algo
    if isinstance(algo, str):  # a generator with chunks ("ring:2"): the chunks are a simulator option
        raise OptionError(f"--algo {spec!r}: calibrate takes a generator without chunks, e.g. --algo ring")
    return algo


def _size(text: str | None, option: str) -> int | None:
    """A size option in bytes (``1MiB``), or None when not given."""
    if text is None:
        return None
    size = parse_size(text)
    if size < 0:
        raise OptionError(f"{option} {text!r}: a size cannot be negative")
    return size


def _points(cal: Calibration) -> pa.Table:
    """The per-size table as printed: times µs, errors %."""
    t = cal.points()
    return pa.table(
        {
            "size_bytes": t["size_bytes"],
            "fitted": pc.if_else(t["fitted"], "yes", "no"),
            "measured_us": pc.round(t["measured_time_us"], 2),
            "before_us": pc.round(t["sim_before_time_us"], 2),
            "before_err_%": pc.round(t["error_before_pct"], 1),
            "after_us": pc.round(t["sim_after_time_us"], 2),
            "after_err_%": pc.round(t["error_after_pct"], 1),
        }
    )


def _params(cal: Calibration) -> pa.Table:
    return pa.Table.from_pylist([q.as_dict() for q in cal.params])


def _write_system_config(path: str, cal: Calibration) -> None:
    """An ASTRA-sim system config carrying the fitted reduction bandwidth (``local-mem-bw``)."""
    Path(path).write_text(json.dumps({"local-mem-bw": cal.local_mem_bw_gb_per_s}, indent=2) + "\n")


_CALIBRATE_TABLES = {
    "points": "per size: measured, simulated before and after (µs), errors (%%), whether fitted",
    "params": "one row per network parameter: name, start, value, status",
    "summary": "one row: run, algorithm, start and fitted spec, RMS and max errors before and after",
}


def _calibrate(args: argparse.Namespace, console: Console) -> int:
    config = SimConfig(congestion=args.congestion) if args.congestion else SimConfig()
    with open_to_record(args) as store:
        if store is None:  # --no-record where no store exists: nothing has been measured here
            raise UnknownTraceError(f"no measured run {args.run!r}: no store exists yet (--store)")
        cal = calibrate(
            store.warehouse,
            args.run,
            args.topo,
            algorithm=_algorithm(store, args.algo),
            name=args.name,
            collective=args.coll,
            config=config,
            bandwidth_gb_per_s=DEFAULT_BANDWIDTH_GB_PER_S if args.bw is None else args.bw,
            latency_ns=DEFAULT_LATENCY_NS if args.lat is None else args.lat,
            local_mem_bw_gb_per_s=args.mem_bw,
            min_size_bytes=_size(args.min_size, "--min-size") or 1,
            max_size_bytes=_size(args.max_size, "--max-size"),
            record=not args.no_record,
        )
    if args.write_system_config:
        _write_system_config(args.write_system_config, cal)
    only = chosen_table(args)
    if only is not None:
        tables = {"points": cal.points(), "params": _params(cal), "summary": one_row(_summary(cal))}
        print_table(tables[only], args.format, console=console)
        return 0
    _print_table(cal, args, console)
    return 0


def _summary(cal: Calibration) -> dict[str, Any]:
    """The calibration in one row: what was fitted to what, the fitted spec, errors before and after."""
    return {
        "calibration": cal.name,
        "calibration_id": cal.calibration_id,
        "run": cal.run,
        "collective": cal.collective,
        "ranks": cal.num_npus,
        "algorithm": cal.algorithm,
        "start_spec": cal.start_spec,
        "spec": cal.spec,
        "local_mem_bw_gb_per_s": cal.local_mem_bw_gb_per_s,
        **cal.summary(),
        "rounds": cal.rounds,
        "simulations": cal.simulations,
    }


def _print_table(cal: Calibration, args: argparse.Namespace, console: Console) -> None:
    """The human summary: per-size errors, parameters, the fitted spec and how to reuse it."""
    head = f"calibration {cal.name} ({cal.calibration_id}): " if cal.name else ""
    console.print(
        styled(
            head,
            (str(cal.run), "bold"),
            f" ({cal.collective}, {cal.num_npus} ranks) with {cal.algorithm} "
            f"on {cal.start_spec}: {cal.rounds} rounds, {cal.simulations} simulations",
        ),
        soft_wrap=True,
    )
    render(
        _points(cal), "table", title="time per size: measured, simulated before and after", console=console
    )
    render(
        _params(cal),
        "table",
        title="parameters (ns; bw GB/s with GB = 2^30; local_mem_bw GB = 10^9)",
        console=console,
    )
    s = cal.summary()
    console.print(
        f"error over the fitted sizes: RMS {s['rms_error_before_pct']:.1f}% -> "
        f"{s['rms_error_after_pct']:.1f}%, max {s['max_error_before_pct']:.1f}% -> "
        f"{s['max_error_after_pct']:.1f}%",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"fitted spec: {cal.spec}", highlight=False, soft_wrap=True)
    console.print(
        f"reduction bandwidth: {cal.local_mem_bw_gb_per_s:g} GB/s (GB = 10^9; "
        '"local-mem-bw" of an ASTRA-sim system config)',
        highlight=False,
        soft_wrap=True,
    )
    config = args.write_system_config or "SYSTEM.json"
    console.print(
        f"reuse: etstore sweep --topo '{cal.spec}' --algo {cal.algorithm} --system-config {config}",
        highlight=False,
        soft_wrap=True,
    )
    if cal.name:
        console.print(
            f"recorded: SELECT * FROM v_measured_vs_sim WHERE calibration = '{cal.name}'",
            highlight=False,
            soft_wrap=True,
        )


def register(sub: Any) -> None:
    """Add ``calibrate`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "calibrate", help="fit a topology's latency and bandwidth to a measured nccl-tests run"
    )
    sp.add_argument("run", help="measured run (name or id; see SELECT * FROM measured_runs)")
    sp.add_argument(
        "--topo",
        required=True,
        metavar="SPEC",
        help="topology spec; axes without bw= / lat= are fitted (e.g. ring:8, ring:4+switch:2,lat=500)",
    )
    sp.add_argument(
        "--algo",
        default="native",
        help="algorithm: native (default), ring, direct, halving-doubling, tree, a stored algorithm, "
        "nccl-ring[:CH[:PROTO]], nccl-tree[:CH[:PROTO[:NODES]]], or nccl: the (algorithm, protocol) the "
        "run's log says it forced (NCCL_ALGO/NCCL_PROTO), else NCCL's tuning model per size",
    )
    sp.add_argument("--name", help="name of the stored calibration (default RUN-ALGO)")
    sp.add_argument("--coll", help="collective, when the run does not say (all-gather logs and the like)")
    sp.add_argument(
        "--bw", type=float, default=None, help="starting link bandwidth GB/s (GB = 2^30) where unset"
    )
    sp.add_argument("--lat", type=float, default=None, help="starting link latency ns where unset")
    sp.add_argument(
        "--mem-bw",
        type=float,
        default=None,
        help="fix the reduction bandwidth (GB/s, GB = 10^9) instead of fitting it",
    )
    sp.add_argument("--min-size", help="smallest size fitted (e.g. 2MiB; default: every size)")
    sp.add_argument("--max-size", help="largest size fitted")
    sp.add_argument("--congestion", choices=("aware", "unaware"), help="network model (default unaware)")
    sp.add_argument(
        "--write-system-config",
        metavar="FILE",
        help='write {"local-mem-bw": fitted} as an ASTRA-sim system config for sim/sweep --system-config',
    )
    sp.add_argument("--no-record", action="store_true", help="do not store the calibration")
    add_format(sp)
    add_table(sp, _CALIBRATE_TABLES, "points")
    sp.set_defaults(handler=_calibrate)
