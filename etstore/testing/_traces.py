"""Small hand-built traces: algorithms, point-to-point, slot policy, and the 2-rank overlap workload."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.model import DEPS_SCHEMA, Trace, deps_table, ops_table
from etstore.store import Store

_MIB = 1 << 20

# ---------------------------------------------------------------- hand-built algorithm traces


def trace_from_nodes(nodes: list[dict[str, Any]], edges: list[tuple[int, int, int]], **params: Any) -> Trace:
    """An algorithm trace from node dicts (rank, id, type, ...) and (rank, src, dst) edges; no attrs.

    ``params`` override the defaults (a 2-GPU in-place all-reduce of 2 chunks per loop).
    """
    cols: dict[str, list[Any]] = {}
    for k in {k for n in nodes for k in n}:
        cols[k] = [n.get(k) for n in nodes]
    cols.setdefault("name", [n.get("name", "") for n in nodes])
    ops = ops_table(cols)
    deps = (
        deps_table([e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges])
        if edges
        else DEPS_SCHEMA.empty_table()
    )
    base: dict[str, Any] = {"collective": "allreduce", "ngpus": 2, "nchunksperloop": 2, "inplace": True}
    base.update(params)
    return Trace(ops=ops, deps=deps, name="hand", kind="algorithm", params=base)


def _node(rank: int, id_: int, typ: str, name: str, off: int, **kw: Any) -> dict[str, Any]:
    """One chunk node of a 2-chunk algorithm."""
    return {
        "rank": rank,
        "id": id_,
        "type": typ,
        "name": name,
        "msg_chunk_cnt": 1,
        "chunk_offset": off,
        "total_chunk_cnt": 2,
        **kw,
    }


def two_rank_allreduce(reduce: bool = True) -> tuple[list[dict[str, Any]], list[tuple[int, int, int]]]:
    """Nodes and edges of a 2-rank all-reduce written by hand (input of :func:`trace_from_nodes`).

    Rank r sends chunk 1-r, receives chunk r and reduces it in (one fused step), sends
    the total back and receives the other total. Buffers default to ``i`` at
    ``chunk_offset``; ids 0 send, 1 recv, 2 reduce (when ``reduce``), 3 send, 4 recv,
    chained in that order on one threadblock.
    """
    nodes: list[dict[str, Any]] = []
    edges: list[tuple[int, int, int]] = []
    for r in (0, 1):
        p, mine, other = 1 - r, r, 1 - r
        send = {"comm_dst": p, "comm_tag": 0, "tb_id": 0}
        recv = {"comm_src": p, "comm_tag": 0, "tb_id": 0}
        nodes += [
            _node(r, 0, "COMM_SEND_NODE", "send0", other, **send, local_time_step=0),
            _node(r, 1, "COMM_RECV_NODE", "recv1", mine, **recv, local_time_step=1),
        ]
        if reduce:
            nodes.append(_node(r, 2, "COMP_NODE", "reduce", mine, tb_id=0, local_time_step=1))
        nodes += [
            _node(r, 3, "COMM_SEND_NODE", "send3", mine, **send, local_time_step=2),
            _node(r, 4, "COMM_RECV_NODE", "recv4", other, **recv, local_time_step=3),
        ]
        chain = [0, 1, 2, 3, 4] if reduce else [0, 1, 3, 4]
        edges += [(r, a, b) for a, b in pairwise(chain)]
    return nodes, edges


def p2p_trace(size: int, src: int = 0, dst: int = 1, tag: int = 0) -> Trace:
    """One message of ``size`` bytes: a send (id 1) on ``src`` and its receive (id 1) on ``dst``."""
    ops = ops_table(
        {
            "rank": [src, dst],
            "id": [1, 1],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [dst, None],
            "comm_src": [None, src],
            "comm_tag": [tag, tag],
            "comm_size": [size, size],
        }
    )
    return Trace(ops, name="p2p")


def slot_policy_trace() -> Trace:
    """One rank where a compute-slot policy decides the order: X, P and Q compete for the GPU.

    X (GPU, 10 µs) holds the compute slot; the CPU chain c1 (1 µs) → c2 (1 µs) makes
    P (3 µs) ready at 1 µs and Q (3 µs) at 2 µs, both waiting for X.
    """
    ops = ops_table(
        {
            "rank": [0] * 5,
            "id": [1, 2, 3, 4, 5],
            "name": ["X", "c1", "c2", "P", "Q"],
            "type": ["COMP_NODE"] * 5,
            "duration_micros": [10, 1, 1, 3, 3],
            "is_cpu_op": [False, True, True, False, False],
        }
    )
    return Trace(ops, deps=deps_table([0, 0, 0], [2, 3, 2], [3, 5, 4]), name="policy")


# ---------------------------------------------------------------- the 2-rank overlap workload

_COMM = ("comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name", "chunk_offset")
_Rows = Callable[[int, int], list[tuple[Any, ...]]]


def _two_ranks(rows_of: _Rows, edges: list[tuple[int, int, str]], **trace: Any) -> tuple[Trace, pa.Table]:
    """Both ranks from ``rows_of(rank, peer)`` rows (id, name, type, µs, comm, parent) and the
    same edges, with the lineage (rank, id, parent_id) the rows name."""
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "id", "name", "type", "duration_micros", *_COMM)}
    d: dict[str, list[Any]] = {"rank": [], "src": [], "dst": [], "kind": []}
    lineage: dict[str, list[int]] = {"rank": [], "id": [], "parent_id": []}
    for r in (0, 1):
        for i, name, typ, dur, comm, parent in rows_of(r, 1 - r):
            for k, v in (("rank", r), ("id", i), ("name", name), ("type", typ), ("duration_micros", dur)):
                cols[k].append(v)
            for k in _COMM:
                cols[k].append(comm.get(k))
            for k, v in (("rank", r), ("id", i), ("parent_id", parent)):
                lineage[k].append(v)
        for s, t, kind in edges:
            for k, v in (("rank", r), ("src", s), ("dst", t), ("kind", kind)):
                d[k].append(v)
    deps = deps_table(np.asarray(d["rank"]), d["src"], d["dst"], d["kind"])
    lin = pa.table(
        {
            "rank": pa.array(lineage["rank"], pa.int32()),
            "id": pa.array(lineage["id"], pa.uint64()),
            "parent_id": pa.array(lineage["parent_id"], pa.uint64()),
        }
    )
    return Trace(ops_table(cols), deps, **trace), lin


def hand_workload() -> Trace:
    """A 2-rank workload whose overlap and reorder opportunities can be worked out by hand.

    Both ranks identical, peer p = 1 - r (tests/app/test_overlap.py derives the timeline)::

        id name            type  duration  deps
        0  fwd             COMP  10 µs     -
        1  grad_allreduce  COLL  1 MiB     data 0
        2  indep           COMP  20 µs     data 0, ctrl 1
        3  apply           COMP   5 µs     data 1, ctrl 2
        4  stats           COMP  30 µs     ctrl 3
        5  send_act        SEND  1 MiB     data 0, ctrl 4     (to p, tag 7)
        6  recv_act        RECV  1 MiB     data 0             (from p, tag 7)
        7  final           COMP   1 µs     data 5, data 6, ctrl 4
    """

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        ar = {"comm_type": "ALL_REDUCE", "comm_size": _MIB, "pg_name": ""}
        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (1, "grad_allreduce", "COMM_COLL_NODE", 0, ar, 1),
            (2, "indep", "COMP_NODE", 20, {}, 2),
            (3, "apply", "COMP_NODE", 5, {}, 3),
            (4, "stats", "COMP_NODE", 30, {}, 4),
            (5, "send_act", "COMM_SEND_NODE", 0, {"comm_dst": p, "comm_tag": 7, "comm_size": _MIB}, 5),
            (6, "recv_act", "COMM_RECV_NODE", 0, {"comm_src": p, "comm_tag": 7, "comm_size": _MIB}, 6),
            (7, "final", "COMP_NODE", 1, {}, 7),
        ]

    edges = [
        (0, 1, "data"),
        (0, 2, "data"),
        (1, 2, "ctrl"),
        (1, 3, "data"),
        (2, 3, "ctrl"),
        (3, 4, "ctrl"),
        (0, 5, "data"),
        (4, 5, "ctrl"),
        (0, 6, "data"),
        (5, 7, "data"),
        (6, 7, "data"),
        (4, 7, "ctrl"),
    ]
    return _two_ranks(rows, edges, name="hand")[0]


def hand_parent() -> Trace:
    """fwd (10 µs) → 1 MiB all-reduce → apply (6 µs) on 2 ranks: the parent of :func:`hand_expanded`."""

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        ar = {"comm_type": "ALL_REDUCE", "comm_size": _MIB, "pg_name": ""}
        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (1, "allreduce", "COMM_COLL_NODE", 0, ar, 1),
            (3, "apply", "COMP_NODE", 6, {}, 3),
        ]

    return _two_ranks(rows, [(0, 1, "data"), (1, 3, "data")], name="parent")[0]


def hand_expanded() -> tuple[Trace, pa.Table]:
    """:func:`hand_parent` with its all-reduce expanded by hand, and the lineage to the parent.

    The all-reduce becomes a 2-rank reduce-scatter + all-gather (chunk slot r is this
    rank's half, p the peer's; 512 KiB messages)::

        0 fwd 10 µs | 10 rs_send slot p | 11 rs_recv slot r | 12 rs_reduce 2 µs slot r
        13 ag_send slot r | 14 ag_recv slot p | 3 apply 6 µs (data 13, 14)
    """

    def rows(r: int, p: int) -> list[tuple[Any, ...]]:
        def msg(peer_key: str, tag: int, slot: int) -> dict[str, Any]:
            return {peer_key: p, "comm_tag": tag, "comm_size": _MIB // 2, "chunk_offset": slot}

        return [
            (0, "fwd", "COMP_NODE", 10, {}, 0),
            (10, "rs_send", "COMM_SEND_NODE", 0, msg("comm_dst", 100, p), 1),
            (11, "rs_recv", "COMM_RECV_NODE", 0, msg("comm_src", 100, r), 1),
            (12, "rs_reduce", "COMP_NODE", 2, {"chunk_offset": r}, 1),
            (13, "ag_send", "COMM_SEND_NODE", 0, msg("comm_dst", 101, r), 1),
            (14, "ag_recv", "COMM_RECV_NODE", 0, msg("comm_src", 101, p), 1),
            (3, "apply", "COMP_NODE", 6, {}, 3),
        ]

    edges = [(0, 10, "data"), (0, 11, "data"), (11, 12, "data"), (12, 13, "data"), (0, 14, "data")]
    edges += [(13, 3, "data"), (14, 3, "data")]
    return _two_ranks(rows, edges, name="expanded", kind="expanded")


def ingest_hand_expanded(store: Store) -> str:
    """Store :func:`hand_parent` as ``parent`` and :func:`hand_expanded` under it; the expanded name."""
    store.ingest(hand_parent(), name="parent")
    trace, lineage = hand_expanded()
    return store.ingest(trace, name="expanded", parent="parent", lineage=lineage).trace.name
