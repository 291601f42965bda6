"""``etstore replay``: a recorded step replayed as it ran, simulated beside measured per rank.

A replay of a stored trace is recorded as a run (``--no-record``: not), its steps measured
beside simulated in the run's parameters, so ``etstore report`` shows them; a replay of files
writes nothing and creates no store."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from etstore import store as stores
from etstore.app.runs import record_run
from etstore.cli._common import add_format, open_from_args
from etstore.cli._inputs import trace_from
from etstore.cli._perturb_args import add_perturbation, perturbation_from
from etstore.cli._render import json_text, render
from etstore.cli._topology_args import topology_from
from etstore.errors import OptionError
from etstore.sim.perturb import perturb_network
from etstore.sim.replay import replay

if TYPE_CHECKING:
    from rich.console import Console

    from etstore.store import Store

__all__ = ["register"]


def _stored(args: argparse.Namespace) -> bool:
    """Whether ``args.trace`` names a trace of an existing store (a replay of it is recorded)."""
    if not stores.store_exists(args.store):
        return False
    with open_from_args(args, read_only=True) as store:
        return args.trace in {t.name for t in store.traces()}


def _replay(args: argparse.Namespace, console: Console) -> int:
    record = not args.no_record and _stored(args)
    with _opened(args, write=record) as store:
        trace = trace_from(store, args.trace)
        fit = args.topo == "fitted"
        topo = topology_from(args) if args.topo and not fit else None
        perturbation = perturbation_from(args)
        if perturbation is not None and perturbation.changes_network:
            if topo is None:  # the recorded network is times, the fitted one a switch: no links to change
                raise OptionError(
                    "replay: --degrade, --fail and --scale bw|lat change links: give --topo SPEC "
                    "(the recorded and fitted networks have none to change)"
                )
            topo = perturb_network(topo, perturbation)
        out = replay(trace, topo, fit=fit, perturbation=perturbation)
        run_id = None
        if record and store is not None:
            run_id = record_run(
                store.warehouse,
                out.result,
                trace_name=trace.name,
                params={
                    "argv": "replay",
                    "replay": out.to_params(),
                    **({"perturbation": perturbation.to_dict()} if perturbation else {}),
                },
            )
    table = out.collectives if args.collectives else out.steps
    network = out.label
    recorded = f"; recorded as run {run_id} (etstore report {run_id})" if run_id is not None else ""
    if args.format == "json":
        sys.stdout.write(json_text(table.to_pylist()) + "\n")
        sys.stderr.write(f"network: {network}{recorded}\n")
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
        console.print(f"network: {network}{worst}{recorded}")
    else:
        sys.stderr.write(f"network: {network}{recorded}\n")
    return 0


@contextmanager
def _opened(args: argparse.Namespace, *, write: bool) -> Iterator[Store | None]:
    """The store, for writing where the replay is recorded; None where none exists (files)."""
    if not stores.store_exists(args.store):
        yield None
        return
    with open_from_args(args, read_only=not write) as store:
        yield store


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
    sp.add_argument(
        "--no-record",
        action="store_true",
        help="do not record the replay of a stored trace as a run (files are never recorded)",
    )
    add_format(sp)
    sp.set_defaults(handler=_replay)
