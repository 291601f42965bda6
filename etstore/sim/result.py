"""What a replay produces: :class:`SimResult`, the schemas of its tables, bus bandwidth.

Every table is Arrow and every time is in ns. Reported rates (``algbw_gb_per_s``,
``busbw_gb_per_s``) are GB/s with GB = 10^9 bytes, as nccl-tests prints them, so they
compare with measured runs directly; link bandwidths (``bandwidth_gb_per_s``, an input)
and the offered load compared with them (``offered_gb_per_s``) keep the topology's
GB = 2^30 (ASTRA-sim's convention).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import SimulationError
from etstore.sim.config import SimConfig

__all__ = [
    "COLLECTIVES_SCHEMA",
    "LINKS_SCHEMA",
    "OP_TIMINGS_SCHEMA",
    "OVERLOAD_SCHEMA",
    "RANK_BREAKDOWN_SCHEMA",
    "STUCK_SCHEMA",
    "SimResult",
    "busbw_factor",
    "nccl_bytes",
    "not_stuck",
    "rate_gb_per_s",
]

OP_TIMINGS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.uint64()),
        ("name", pa.string()),
        ("type", pa.string()),
        ("ready_ns", pa.float64()),
        ("start_ns", pa.float64()),
        ("end_ns", pa.float64()),
    ]
)
RANK_BREAKDOWN_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("total_ns", pa.float64()),
        ("compute_ns", pa.float64()),
        ("comm_ns", pa.float64()),
        ("exposed_comm_ns", pa.float64()),
        ("overlap_ns", pa.float64()),
        ("idle_ns", pa.float64()),
    ]
)
COLLECTIVES_SCHEMA = pa.schema(
    [
        ("coll_seq", pa.int64()),
        ("pg_name", pa.string()),
        ("comm_type", pa.string()),
        ("algorithm", pa.string()),
        ("group_size", pa.int32()),
        ("size_bytes", pa.int64()),
        ("start_ns", pa.float64()),
        ("end_ns", pa.float64()),
        ("time_ns", pa.float64()),
        ("algbw_gb_per_s", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("busbw_factor", pa.float64()),
    ]
)
LINKS_SCHEMA = pa.schema(
    [
        ("link", pa.int32()),
        ("src", pa.int32()),
        ("dst", pa.int32()),
        ("latency_ns", pa.float64()),
        ("bandwidth_gb_per_s", pa.float64()),
        ("bytes", pa.float64()),
        ("messages", pa.int64()),
        ("busy_ns", pa.float64()),
        ("utilization", pa.float64()),
    ]
)
OVERLOAD_SCHEMA = pa.schema(
    [
        ("link", pa.int32()),
        ("src", pa.int32()),
        ("dst", pa.int32()),
        ("bandwidth_gb_per_s", pa.float64()),
        ("offered_gb_per_s", pa.float64()),
        ("bytes", pa.float64()),
        ("messages", pa.int64()),
        ("from_ns", pa.float64()),
        ("to_ns", pa.float64()),
    ]
)
STUCK_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("id", pa.uint64()),
        ("name", pa.string()),
        ("type", pa.string()),
        ("state", pa.string()),
        ("reason", pa.string()),
    ]
)


def not_stuck(message: str) -> SimulationError:
    """A :class:`SimulationError` raised before the replay ran: its ``.stuck`` is the empty table."""
    return SimulationError(message, STUCK_SCHEMA.empty_table())


def busbw_factor(comm_type: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: 2(n-1)/n all-reduce, (n-1)/n gather/scatter/all-to-all, else 1."""
    if n <= 1:
        return 0.0 if comm_type in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL") else 1.0
    if comm_type == "ALL_REDUCE":
        return 2.0 * (n - 1) / n
    if comm_type in ("ALL_GATHER", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "ALL_TO_ALL"):
        return (n - 1) / n
    return 1.0


def nccl_bytes(comm_type: str, comm_size: int, n: int) -> int:
    """nccl-tests' S: the total array for all-gather (comm_size is per rank), else comm_size."""
    return comm_size * n if comm_type == "ALL_GATHER" else comm_size


def rate_gb_per_s(nbytes: float, time_ns: float) -> float:
    """A reported rate: ``nbytes`` over ``time_ns`` in GB/s with GB = 10^9 (nccl-tests), 0 when no time.

    Bytes per ns are exactly 10^9 bytes per s, so the rate is ``nbytes / time_ns``:
    nccl-tests' ``algbw = S / t / 1.0E9`` with t in seconds. It is not the 2^30-based GB
    of link bandwidths (a link of 50 GB/s moves 53.687 GB/s in this unit).

    >>> rate_gb_per_s(1e9, 1e9)  # 10^9 bytes in one second
    1.0
    """
    return nbytes / time_ns if time_ns > 0 else 0.0


@dataclass(frozen=True, eq=False)
class SimResult:
    """What one replay produced; every table is Arrow, every time ns.

    Attributes
    ----------
    ops
        :data:`OP_TIMINGS_SCHEMA`, one row per op of the trace (collective sub-ops are
        not listed): when it became ready, started and ended.
    ranks
        :data:`RANK_BREAKDOWN_SCHEMA`: per rank, its finish time ``total_ns`` =
        ``compute_ns + exposed_comm_ns + idle_ns``; ``comm_ns`` is time with any
        send, receive or collective in flight, ``overlap_ns`` the part of it hidden
        under compute.
    collectives
        :data:`COLLECTIVES_SCHEMA`: per collective instance, first start to last end
        over its ranks, and nccl-tests ``algbw = S / t`` and ``busbw = algbw · f``
        (GB/s with GB = 10^9, as nccl-tests prints them; not the 2^30 of link bandwidths).
    links
        :data:`LINKS_SCHEMA`: bytes and busy time per directed link, utilization =
        busy / ``total_ns`` (congestion-unaware: the load offered, may exceed 1).
    total_ns
        Simulated makespan.
    wall_s
        Wall time of the whole call; ``loop_s`` of the event loop alone.
    events
        Events processed: one per op that finished (a send and its matched receive
        are two), plus one per link hop with the congestion-aware model.
    overloaded
        :data:`OVERLOAD_SCHEMA`, congestion-unaware only: links offered more than their
        bandwidth, i.e. the bytes of the messages routed over a link divided by the
        window from the first one's start to the last one's arrival exceed the
        link's bandwidth. ``offered_gb_per_s`` is in the unit of ``bandwidth_gb_per_s``,
        the topology's GB = 2^30, so the two compare directly. Such a result is
        physically impossible (the unaware model lets messages share a link at full
        speed); worst first. Empty when congestion-aware (links queue) or nothing exceeds.
    """

    ops: pa.Table
    ranks: pa.Table
    collectives: pa.Table
    links: pa.Table
    total_ns: float
    wall_s: float
    loop_s: float
    events: int
    sim_ops: int
    trace_name: str
    topology: str
    num_npus: int
    config: SimConfig
    algorithms: Mapping[str, str] = field(default_factory=dict)
    overloaded: pa.Table = field(default_factory=OVERLOAD_SCHEMA.empty_table)

    @property
    def events_per_s(self) -> float:
        """Events per wall second of the event loop."""
        return self.events / self.loop_s if self.loop_s > 0 else float("inf")

    def params(self) -> dict[str, Any]:
        """JSON-able parameters of the run (config, algorithms, topology; overloaded links when any)."""
        out: dict[str, Any] = {
            "config": self.config.to_dict(),
            "algorithms": dict(self.algorithms),
            "topology": self.topology,
        }
        if self.overloaded.num_rows:  # so a recorded impossible run stays marked in the warehouse
            out["overloaded_links"] = self.overloaded.to_pylist()
        return out

    def overload_warning(self) -> str | None:
        """One line naming the most overloaded link, or None (see :attr:`overloaded`)."""
        if not self.overloaded.num_rows:
            return None
        w = self.overloaded.slice(0, 1).to_pylist()[0]
        more = self.overloaded.num_rows - 1
        return (
            f"physically impossible under the congestion-unaware model: link {w['link']} "
            f"(NPU {w['src']} -> {w['dst']}) is offered {w['offered_gb_per_s']:,.1f} GB/s over "
            f"{w['from_ns']:,.0f}..{w['to_ns']:,.0f} ns but carries {w['bandwidth_gb_per_s']:,.1f} GB/s"
            + (f" ({more} more links exceed theirs)" if more else "")
            + "; simulate congestion-aware for a feasible time"
        )

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest (what ``etstore sim`` prints)."""
        r = self.ranks
        out: dict[str, Any] = {
            "trace": self.trace_name,
            "topology": self.topology,
            "congestion": self.config.congestion,
            "total_ns": self.total_ns,
            "ops": self.ops.num_rows,
            "sim_ops": self.sim_ops,
            "events": self.events,
            "wall_s": round(self.wall_s, 6),
            "events_per_s": round(self.events_per_s, 1),
        }
        if r.num_rows:
            for col in ("compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns"):
                out[f"mean_{col}"] = float(pc.mean(r[col]).as_py())
        if self.overloaded.num_rows:
            worst = self.overloaded.slice(0, 1).to_pylist()[0]
            out["overloaded_links"] = self.overloaded.num_rows
            out["worst_link"] = {
                k: worst[k] for k in ("link", "src", "dst", "bandwidth_gb_per_s", "offered_gb_per_s")
            }
        if self.collectives.num_rows:
            out["collectives"] = self.collectives.num_rows
            out["mean_busbw_gb_per_s"] = float(pc.mean(self.collectives["busbw_gb_per_s"]).as_py())
        return out
