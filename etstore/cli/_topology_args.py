"""``--topo SPEC`` with ``--bw`` / ``--lat``: the topology options of ``topo``, ``synth``,
``sim`` and ``sweep``, apart from the commands so that ``sim`` does not load the synthesizer."""

from __future__ import annotations

import argparse

from etstore.sim.network import needs_route_table
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS, Topology, parse_topology

__all__ = ["add_topology_options", "topology_from"]


def add_topology_options(sp: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--topo SPEC`` plus default link ``--bw`` / ``--lat`` (specs may override per dimension)."""
    sp.add_argument(
        "--topo",
        required=required,
        metavar="SPEC",
        help="topology spec (ring:16, mesh2d:8x8, torus3d:4x4x4,bw=50,lat=500, ...) or a YAML/JSON file",
    )
    sp.add_argument("--bw", type=float, default=None, help="link bandwidth GB/s (GB = 2^30) where unset")
    sp.add_argument("--lat", type=float, default=None, help="link latency ns where unset")


def topology_from(args: argparse.Namespace, spec: str | None = None, *, routes: bool = True) -> Topology:
    """The topology ``spec`` (default ``--topo``) names, links defaulting to ``--bw`` / ``--lat``.

    ``routes``: the command simulates over it, so its N × N routing tables, where the simulation
    will build them (:func:`~etstore.sim.network.needs_route_table`), are checked against
    the memory budget now, in one line, before a trace is even read (``topo show`` and
    ``synth`` pass False: closed forms and the synthesizer's own estimate cover them).
    """
    topo = parse_topology(
        args.topo if spec is None else spec,
        bandwidth_gb_per_s=DEFAULT_BANDWIDTH_GB_PER_S if args.bw is None else args.bw,
        latency_ns=DEFAULT_LATENCY_NS if args.lat is None else args.lat,
    )
    if routes and needs_route_table(topo, getattr(args, "congestion", None) or "unaware"):
        topo.require_routes()
    return topo
