"""What a synthesis will hold, estimated from its request before it runs, against the memory budget.

Why: the schedule grows with the chunks asked for, not with any file; ``--chunks 1000000`` on a
4-NPU ring is a 16-million-transfer All-to-All that used to run for minutes to 2.7 GB before
anything said no. Every count here is known from the topology and the request alone.

The per-transfer costs were measured (peak RSS of :func:`~etstore.algorithms.synth.synthesize`
and of building the trace part by part, on rings, meshes, tori, hypercubes, fully connected
and switch shapes) and rounded up, so they are upper bounds for those shapes:

- a flood (All-Gather, Broadcast and the reductions run as their reverse): ≤ 74 bytes per
  transfer (two trials' transfer columns, the candidate lists, the schedule);
- All-to-All: ≤ 201 bytes per transfer (a heap entry per admissible link per hop);
- storing the trace: ≤ 800 bytes per op of the largest part built at once (a part holds
  whole ranks), plus the index over all transfers.
"""

from __future__ import annotations

import math

import numpy as np

from etstore.errors import UnsatisfiableError
from etstore.topology import Topology
from etstore.units import budget_exceeded

__all__ = ["require_parts_budget", "require_synthesis_budget", "transfers"]

FLOOD_BYTES_PER_TRANSFER = 96
ROUTED_BYTES_PER_TRANSFER = 256
PART_BYTES_PER_OP = 1024
INDEX_BYTES_PER_TRANSFER = 26  # 8, and 18 more for All-to-All (see build_parts)


def _axis_hop_sum(kind: str, n: int) -> float:
    """Sum over ordered coordinate pairs of one axis of the hops between them."""
    if n < 2:
        return 0.0
    if kind == "line":  # a mesh line: |a - b|
        return (n * n - 1) * n / 3
    if kind == "uniring":
        return n * n * (n - 1) / 2
    if kind == "ring":  # min(|a - b|, n - |a - b|): n²/4 per coordinate, rounded down
        return float(n * (n * n // 4))
    return float(n * (n - 1))  # fc, switch: one hop


def _hop_sum(topo: Topology) -> float:
    """Hops summed over every ordered NPU pair: in closed form for intact built-in shapes (a
    product's distance is the sum of its axes'), else bounded by the diameter."""
    n = topo.num_npus
    if topo.is_regular():
        return sum(_axis_hop_sum(d.kind, d.size) * (n // d.size) ** 2 for d in topo.dims)
    return float(n) * (n - 1) * topo.diameter


def transfers(topo: Topology, coll: str, k: int) -> float:
    """Transfers the schedule of ``coll`` with ``k`` chunks per NPU will hold.

    Exact for the floods (every chunk reaches every NPU that lacks it once); for All-to-All
    every chunk takes a shortest path, so the hops summed over all pairs, times ``k``.
    """
    n = topo.num_npus
    if coll in ("broadcast", "reduce"):
        return float(n - 1) * k
    if coll in ("allgather", "reducescatter"):
        return float(n) * (n - 1) * k
    if coll == "allreduce":
        return 2.0 * n * (n - 1) * k
    return _hop_sum(topo) * k  # alltoall


def require_synthesis_budget(topo: Topology, coll: str, k: int) -> None:
    """Refuse a synthesis whose transfers would not fit the memory budget, before it starts.

    Raises
    ------
    UnsatisfiableError
        One line naming the request, its transfer count, the estimate and the budget knob.
    """
    count = transfers(topo, coll, k)
    per = ROUTED_BYTES_PER_TRANSFER if coll == "alltoall" else FLOOD_BYTES_PER_TRANSFER
    message = budget_exceeded(
        count * per,
        f"synth: {coll} on {topo.name} with {k:,} chunk(s) per NPU ({count:,.0f} transfers)",
    )
    if message is not None:
        raise UnsatisfiableError(message)


def require_parts_budget(ops_per_rank: np.ndarray, num_transfers: int, max_ops: int) -> None:
    """Refuse, before building any, trace parts whose largest would not fit the memory budget.

    ``ops_per_rank``: each rank's ops; a part holds whole ranks and up to ``max_ops`` ops
    unless one rank alone has more.

    Raises
    ------
    UnsatisfiableError
        As :func:`require_synthesis_budget`.
    """
    biggest = int(ops_per_rank.max(initial=0))
    part = max(biggest, min(max_ops, int(ops_per_rank.sum())))
    need = float(part) * PART_BYTES_PER_OP + float(num_transfers) * INDEX_BYTES_PER_TRANSFER
    message = budget_exceeded(
        need, f"synth: building the trace {math.ceil(part):,} ops at a time ({num_transfers:,} transfers)"
    )
    if message is not None:
        raise UnsatisfiableError(message)
