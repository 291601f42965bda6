"""``etstore replay``: a recorded step replayed as it ran, simulated beside measured per rank."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from etstore.cli._common import add_format, open_to_record
from etstore.cli._inputs import trace_from
from etstore.cli._perturb_args import add_perturbation, perturbation_from
from etstore.cli._render import json_text, render
from etstore.cli._topology_args import topology_from
from etstore.sim.replay import replay

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["register"]


def _replay(args: argparse.Namespace, console: Console) -> int:
    with open_to_record(args) as store:  # records nothing: the store read-only, or none
        trace = trace_from(store, args.trace)
    fit = args.topo == "fitted"
    topo = topology_from(args) if args.topo and not fit else None
    out = replay(trace, topo, fit=fit, perturbation=perturbation_from(args))
    table = out.collectives if args.collectives else out.steps
    network = out.label
    if args.format == "json":
        sys.stdout.write(json_text(table.to_pylist()) + "\n")
        sys.stderr.write(f"network: {network}\n")
        return 0
    render(
        table,
        args.format,
        title=f"{trace.name} replayed {'with' if out.network == 'recorded' else 'on'} {network}",
        console=console,
    )
    if args.format == "table":
        errors = [abs(e) for e in out.steps["error_pct"].to_pylist() if e is not None]
        worst = f"; worst rank error {max(errors):.1f}%" if errors else ""
        console.print(f"network: {network}{worst}")
    else:
        sys.stderr.write(f"network: {network}\n")
    return 0


def register(sub: Any) -> None:
    """Add ``replay`` to the subparsers ``sub``."""
    sp = sub.add_parser(
        "replay",
        help="replay a recorded PyTorch trace (ET + Kineto) as it ran; measured beside simulated",
    )
    sp.add_argument("trace", help="stored trace, or the directory / files of a recording")
    sp.add_argument(
        "--topo",
        default=None,
        metavar="SPEC",
        help="network to replay on: a topology (what-if), or 'fitted' (switch:N fitted to the recording's "
        "collectives); default: each collective takes its recorded transfer time, as it ran",
    )
    sp.add_argument(
        "--bw", type=float, default=None, help="link bandwidth GB/s (GB = 2^30) where --topo leaves it unset"
    )
    sp.add_argument("--lat", type=float, default=None, help="link latency ns where --topo leaves it unset")
    sp.add_argument(
        "--collectives",
        action="store_true",
        help="one row per rank and collective kernel instead of per rank",
    )
    add_perturbation(sp)
    add_format(sp)
    sp.set_defaults(handler=_replay, no_record=True)
