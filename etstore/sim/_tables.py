"""The result tables of a replay, from the loop's end times (see :class:`~etstore.sim.result.SimResult`).

The loop records only when ops end (and when ops that waited for a slot started);
ready and start times follow from the dependencies, and every table is a
vectorised pass over those arrays.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from etstore.model import Trace
from etstore.sim._build import Built, LoopInputs
from etstore.sim._kinds import K_COMP, K_CPU, K_RECV, K_SEND
from etstore.sim._loop import LoopOutput
from etstore.sim.network import Network
from etstore.sim.result import (
    COLLECTIVES_SCHEMA,
    LINKS_SCHEMA,
    OP_TIMINGS_SCHEMA,
    OVERLOAD_SCHEMA,
    RANK_BREAKDOWN_SCHEMA,
    busbw_factor,
    nccl_bytes,
    rate_gb_per_s,
)
from etstore.topology import GIB

__all__ = ["Tables", "result_tables"]


class Tables(NamedTuple):
    """The tables of a :class:`~etstore.sim.result.SimResult` and its makespan."""

    ops: pa.Table
    ranks: pa.Table
    collectives: pa.Table
    links: pa.Table
    total_ns: float
    overloaded: pa.Table


def _union_length(start: np.ndarray, end: np.ndarray, group: np.ndarray, ngroups: int) -> np.ndarray:
    """Per group, the length of the union of intervals [start, end) (vectorised sweep)."""
    out = np.zeros(ngroups)
    ok = end > start
    if not ok.any():
        return out
    s, e, g = start[ok], end[ok], group[ok]
    span = float(max(e.max(), 1.0)) * 2.0 + 1.0
    s2, e2 = s + g * span, e + g * span
    order = np.argsort(s2, kind="stable")
    s2, e2, g = s2[order], e2[order], g[order]
    cover = np.maximum.accumulate(e2)
    prev = np.concatenate([[-np.inf], cover[:-1]])
    lo = np.maximum(s2, prev)
    np.add.at(out, g, np.maximum(e2 - lo, 0.0))
    return out


def _ready_and_start(built: Built, out: LoopOutput) -> tuple[np.ndarray, np.ndarray]:
    """An op is ready when its last dependency ends; it starts then unless it waited for a slot."""
    esrc, edst, end = built.esrc, built.edst, out.end
    ready = np.zeros(len(end))
    if len(esrc):
        by_dst = np.argsort(edst, kind="stable")
        d_sorted = edst[by_dst]
        cuts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
        ready[d_sorted[cuts]] = np.maximum.reduceat(end[esrc[by_dst]], cuts)
    start = np.asarray(out.start)
    return ready, np.where(start >= 0, start, ready)


def _breakdown(
    built: Built,
    kind: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    is_coll: np.ndarray,
) -> pa.Table:
    """:data:`RANK_BREAKDOWN_SCHEMA` from the trace ops' start and end times."""
    ranks = built.ranks
    ng = len(ranks)
    g = np.searchsorted(ranks, rank)
    comp = (kind == K_COMP) | (kind == K_CPU)
    comm = (kind == K_SEND) | (kind == K_RECV) | is_coll
    total = np.zeros(ng)
    if len(end):
        np.maximum.at(total, g, end)
    comp_u = _union_length(start[comp], end[comp], g[comp], ng)
    comm_u = _union_length(start[comm], end[comm], g[comm], ng)
    both = comp | comm
    all_u = _union_length(start[both], end[both], g[both], ng)
    return pa.Table.from_arrays(
        [
            pa.array(ranks.astype(np.int32)),
            pa.array(total),
            pa.array(comp_u),
            pa.array(comm_u),
            pa.array(all_u - comp_u),
            pa.array(comp_u + comm_u - all_u),
            pa.array(np.maximum(total - all_u, 0.0)),
        ],
        schema=RANK_BREAKDOWN_SCHEMA,
    )


def _collectives(built: Built, start: np.ndarray, end: np.ndarray) -> pa.Table:
    """:data:`COLLECTIVES_SCHEMA`: one row per collective instance, rates in GB/s with GB = 10^9."""
    rows: dict[str, list[Any]] = {f.name: [] for f in COLLECTIVES_SCHEMA}
    for inst in built.instances:
        rws = np.asarray(inst.rows)
        s, e = float(start[rws].min()), float(end[rws].max())
        n = len(inst.group)
        t = e - s
        nbytes = nccl_bytes(inst.type, inst.size, n)
        f = busbw_factor(inst.type, n)
        algbw = rate_gb_per_s(nbytes, t)
        for k, v in (
            ("coll_seq", inst.seq),
            ("pg_name", inst.pg),
            ("comm_type", inst.type),
            ("algorithm", inst.algorithm),
            ("group_size", n),
            ("size_bytes", inst.size),
            ("start_ns", s),
            ("end_ns", e),
            ("time_ns", t),
            ("algbw_gb_per_s", algbw),
            ("busbw_gb_per_s", algbw * f),
            ("busbw_factor", f),
        ):
            rows[k].append(v)
    return pa.Table.from_pydict(rows, schema=COLLECTIVES_SCHEMA)


class _Messages(NamedTuple):
    """Messages as rows: the trace's own sends one per row, a deferred collective's per NPU pair."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    messages: np.ndarray  # how many messages the row stands for
    first: np.ndarray  # start of the earliest message of the row, ns
    last: np.ndarray  # arrival of the latest


def _messages(inp: LoopInputs, out: LoopOutput, start: np.ndarray) -> _Messages:
    sends = np.flatnonzero(inp.kind == K_SEND)
    msgs = _Messages(
        inp.msrc[sends],
        inp.mdst[sends],
        inp.size[sends].astype(np.float64),
        np.ones(len(sends), dtype=np.int64),
        start[sends],
        out.end[sends],
    )
    p = out.pairs
    if p is None:
        return msgs
    ours = (p.src, p.dst, p.nbytes, p.count, p.first, p.last)
    return _Messages(*(np.concatenate([a, b]) for a, b in zip(msgs, ours, strict=True)))


def _links(net: Network, msgs: _Messages, out: LoopOutput, aware: bool, total: float) -> pa.Table:
    """:data:`LINKS_SCHEMA`: the aware loop's link counters, else the load the sends offer."""
    if aware:
        nbytes, count, busy = out.lbytes, out.lmsgs, out.lbusy
    else:
        nbytes, count, busy = net.link_loads(msgs.src, msgs.dst, msgs.nbytes, msgs.messages)
    nl = net.topo.num_links
    util = busy / total if total > 0 else np.zeros(nl)
    return pa.Table.from_arrays(
        [
            pa.array(np.arange(nl, dtype=np.int32)),
            pa.array(net.src.astype(np.int32)),
            pa.array(net.dst.astype(np.int32)),
            pa.array(net.latency_ns),
            pa.array(np.asarray(net.topo.bandwidth_gb_per_s, dtype=np.float64)),
            pa.array(nbytes),
            pa.array(count),
            pa.array(busy),
            pa.array(util),
        ],
        schema=LINKS_SCHEMA,
    )


def _overloaded(net: Network, msgs: _Messages, links: pa.Table) -> pa.Table:
    """:data:`OVERLOAD_SCHEMA`: links whose bytes over their busy window exceed their bandwidth.

    The window of a link runs from the start of the first message routed over it to
    the arrival of the last. One message alone exceeds only when it is charged at a
    faster dimension than a link its route crosses (the unaware model charges a
    cross-dimension message to its first differing dimension, as ASTRA-sim); otherwise
    its time includes ``size / bandwidth`` and only messages sharing the link exceed.
    """
    if not len(msgs.src):
        return OVERLOAD_SCHEMA.empty_table()
    lo, hi = net.link_windows(msgs.src, msgs.dst, msgs.first, msgs.last)
    nbytes = links["bytes"].to_numpy()
    bw = links["bandwidth_gb_per_s"].to_numpy()
    window = hi - lo
    used = (nbytes > 0) & (window > 0)
    offered = np.zeros(len(nbytes))  # in the links' unit (GB = 2^30), to compare with their bandwidth
    offered[used] = nbytes[used] / window[used] * 1e9 / GIB
    over = np.flatnonzero(used & (offered > bw * (1 + 1e-9)))
    over = over[np.argsort(-(offered[over] / bw[over]), kind="stable")]
    take = pa.array(over)
    return pa.Table.from_arrays(
        [
            links["link"].take(take),
            links["src"].take(take),
            links["dst"].take(take),
            pa.array(bw[over]),
            pa.array(offered[over]),
            pa.array(nbytes[over]),
            links["messages"].take(take),
            pa.array(lo[over]),
            pa.array(hi[over]),
        ],
        schema=OVERLOAD_SCHEMA,
    )


def result_tables(
    trace: Trace, built: Built, inp: LoopInputs, out: LoopOutput, net: Network, *, aware: bool
) -> Tables:
    """Op timings, rank breakdown, collectives and link loads of a replay that finished.

    Notes
    -----
    O(V log V) sorts over the V simulated ops, plus one row per collective instance.
    """
    n0 = built.n0
    end = out.end
    ready, start = _ready_and_start(built, out)
    total = float(end.max()) if len(end) else 0.0
    if out.pairs is not None and len(out.pairs.last):  # a send nothing waits for may land last
        total = max(total, float(out.pairs.last.max()))
    # trace-level timings: a collective ends with its join
    end_top = end[:n0].copy()
    has_join = built.join_of >= 0
    end_top[has_join] = end[built.join_of[has_join]]
    ops = trace.ops
    timings = pa.Table.from_arrays(
        [
            ops["rank"],
            ops["id"],
            ops["name"],
            ops["type"],
            pa.array(ready[:n0]),
            pa.array(start[:n0]),
            pa.array(end_top),
        ],
        schema=OP_TIMINGS_SCHEMA,
    )
    kind, rank = inp.kind[:n0], inp.rank[:n0]
    msgs = _messages(inp, out, start)
    links = _links(net, msgs, out, aware, total)
    return Tables(
        ops=timings,
        ranks=_breakdown(built, kind, rank, start[:n0], end_top, built.is_coll),
        collectives=_collectives(built, start[:n0], end_top),
        links=links,
        total_ns=total,
        overloaded=OVERLOAD_SCHEMA.empty_table() if aware else _overloaded(net, msgs, links),
    )
