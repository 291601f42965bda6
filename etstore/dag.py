"""Vectorized DAG passes over row-indexed graphs: edges, message matching, generations,
cycles, longest path.

Nodes are ``0..n-1`` (rows of an ops table); edges are two int arrays
``src → dst``. Each pass walks topological generations (Kahn's algorithm one
frontier at a time), so the Python-level loop runs once per generation, not once
per node.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.model import Trace, op_rows

__all__ = [
    "MessageMatch",
    "break_cycles",
    "cycle_members",
    "find_cycle",
    "generations",
    "longest_path",
    "match_messages",
    "trace_edges",
]


def _csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst[order]


def _expand(indptr: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Positions in the CSR index array of every out-edge of ``nodes``."""
    starts = indptr[nodes]
    counts = indptr[nodes + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return np.arange(total, dtype=np.int64) + offsets


def generations(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Topological generation of each node (-1 for nodes on or behind a cycle).

    Notes
    -----
    O(V + E log E) overall; one numpy round per generation.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    gen = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return gen
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    indptr, targets_of = _csr(n, src, dst)
    frontier = np.flatnonzero(indeg == 0)
    g = 0
    while frontier.size:
        gen[frontier] = g
        targets = targets_of[_expand(indptr, frontier)]
        if targets.size == 0:
            break
        uniq, counts = np.unique(targets, return_counts=True)
        indeg[uniq] -= counts
        frontier = uniq[indeg[uniq] == 0]
        g += 1
    return gen


def trace_edges(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Dependency edges of ``trace`` as row indices ``(src, dst)`` into ``trace.ops``."""
    d = trace.deps
    if trace.num_ops == 0 or d.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rank = d["rank"].to_numpy()
    return op_rows(trace.ops, rank, d["src"].to_numpy()), op_rows(trace.ops, rank, d["dst"].to_numpy())


def cycle_members(trace: Trace, edges: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Rows of ops that sit on a dependency cycle or wait behind one (empty if acyclic).

    ``edges`` are :func:`trace_edges` when the caller already has them (ingest does).
    """
    src, dst = trace_edges(trace) if edges is None else edges
    if len(src) == 0 or bool(np.all(src < dst)):
        return np.zeros(0, dtype=np.int64)  # every edge points forward in file order: acyclic
    return np.flatnonzero(generations(trace.num_ops, src, dst) < 0)


def find_cycle(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One directed cycle of the graph, as its nodes in edge order (empty if it is acyclic).

    Parameters
    ----------
    n
        Number of nodes ``0..n-1``.
    src, dst
        Edges ``src[i] -> dst[i]`` (int arrays of equal length).

    Returns
    -------
    numpy.ndarray
        int64 nodes ``c[0] -> c[1] -> ... -> c[-1] -> c[0]``, each step an edge of
        the graph (one node for a self-loop); empty when there is no cycle.

    Notes
    -----
    Deterministic: among the nodes :func:`generations` cannot place (each has an
    unplaced predecessor), starts at the lowest-numbered one and steps to the
    lowest-numbered unplaced predecessor until a node repeats; the repeat closes
    the cycle. O(V + E log E) for the generations, then O(V) for the walk.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if n == 0 or len(src) == 0:
        return np.zeros(0, dtype=np.int64)
    unplaced = generations(n, src, dst) < 0
    if not unplaced.any():
        return np.zeros(0, dtype=np.int64)
    inner = unplaced[src] & unplaced[dst]
    pred = np.full(n, n, dtype=np.int64)
    np.minimum.at(pred, dst[inner], src[inner])
    seen = np.full(n, -1, dtype=np.int64)
    path: list[int] = []
    i = int(np.argmax(unplaced))
    while seen[i] < 0:
        seen[i] = len(path)
        path.append(i)
        i = int(pred[i])
    return np.asarray(path[int(seen[i]) :][::-1], dtype=np.int64)


def longest_path(
    n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Weight-maximal path in a DAG (node weights).

    Returns ``(length, path_rows, finish)`` where ``finish[v]`` is the heaviest
    path weight ending at ``v``. Nodes on cycles are ignored (call
    :func:`generations` first to report them).

    Notes
    -----
    O(V + E log E): each generation takes ``max`` over its in-edges at once.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    weight = np.asarray(weight, dtype=np.float64)
    if n == 0:
        return 0.0, np.zeros(0, dtype=np.int64), np.zeros(0)
    gen = generations(n, src, dst)
    ok = (gen[src] >= 0) & (gen[dst] >= 0)
    src, dst = src[ok], dst[ok]
    finish = np.where(gen >= 0, weight, -np.inf)
    pred = np.full(n, -1, dtype=np.int64)
    order = np.argsort(gen[dst], kind="stable")
    src, dst = src[order], dst[order]
    edge_gen = gen[dst]
    bounds = np.searchsorted(edge_gen, np.arange(1, int(gen.max()) + 2))
    start = 0
    for end in bounds:
        if end == start:
            continue
        s, d = src[start:end], dst[start:end]
        best = np.full(n, -np.inf)
        np.maximum.at(best, d, finish[s])
        uniq = np.unique(d)
        # the predecessor that attains the max (the first one in edge order)
        hit = finish[s] == best[d]
        first = np.unique(d[hit], return_index=True)
        pred[first[0]] = s[hit][first[1]]
        finish[uniq] = best[uniq] + weight[uniq]
        start = end
    last = int(np.argmax(finish))
    path = [last]
    while pred[path[-1]] >= 0:
        path.append(int(pred[path[-1]]))
    return float(finish[last]), np.asarray(path[::-1], dtype=np.int64), finish


def break_cycles(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Mask of edges to keep so the graph becomes acyclic.

    Inside each strongly connected component (and for self-loops) the edges that
    point backwards in row order are dropped; row (file) order is what producers
    meant as issue order, so the rest stays as it was. Only the nodes Kahn's
    algorithm could not place are examined.

    Notes
    -----
    O(V + E) for the generations, plus Tarjan's SCC on the unresolved part only.
    """
    import networkx as nx  # heavy; only graphs with a cycle get here

    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    keep = src != dst
    gen = generations(n, src[keep], dst[keep])
    stuck = gen < 0
    if not stuck.any():
        return keep
    sel = np.flatnonzero(keep & stuck[src] & stuck[dst])
    g = nx.DiGraph()
    g.add_edges_from(zip(src[sel].tolist(), dst[sel].tolist(), strict=True))
    comp = np.full(n, -1, dtype=np.int64)
    for i, members in enumerate(nx.strongly_connected_components(g)):
        if len(members) > 1:
            comp[list(members)] = i
    same = (comp[src] >= 0) & (comp[src] == comp[dst])
    return keep & ~(same & (src > dst))


class MessageMatch(NamedTuple):
    """Sends paired with the receives they deliver to, as rows of the ops table."""

    send_row: np.ndarray
    """Row of each matched ``COMM_SEND_NODE``, ascending."""
    recv_row: np.ndarray
    """Row of the ``COMM_RECV_NODE`` it pairs with."""
    tag: np.ndarray
    """The message tag (0 where the op has none)."""
    unmatched_sends: int
    unmatched_recvs: int


def _occurrence(keys: list[np.ndarray]) -> np.ndarray:
    """For rows in file order, the index of each row among earlier rows with the same key."""
    n = len(keys[0])
    order = np.lexsort((np.arange(n), *reversed(keys)))  # keys[0] is the primary sort key
    same = np.zeros(n, dtype=bool)
    if n > 1:
        eq = np.ones(n - 1, dtype=bool)
        for k in keys:
            ks = k[order]
            eq &= ks[1:] == ks[:-1]
        same[1:] = eq
    starts = np.maximum.accumulate(np.where(same, 0, np.arange(n)))
    occ = np.empty(n, dtype=np.int64)
    occ[order] = np.arange(n) - starts
    return occ


def match_messages(trace: Trace) -> MessageMatch:
    """Pair every send with its receive as ASTRA-sim does.

    Sends from rank s to rank d with tag t pair with receives on d from s with tag t,
    the n-th send with the n-th receive, in issue (file) order. Ops without a peer
    are never matched.

    Notes
    -----
    O(V log V): two lexsorts and a join on (src, dst, tag, occurrence).
    """
    ops = trace.ops
    typ = ops["type"]
    rows = np.arange(ops.num_rows, dtype=np.int64)
    is_send = pc.equal(typ, "COMM_SEND_NODE").to_numpy(zero_copy_only=False)
    is_recv = pc.equal(typ, "COMM_RECV_NODE").to_numpy(zero_copy_only=False)
    rank = ops["rank"].to_numpy().astype(np.int64)

    def peer(col: str, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        arr = ops[col].filter(pa.array(mask))
        valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
        return pc.fill_null(arr, -1).to_numpy().astype(np.int64), valid

    s_dst, s_ok = peer("comm_dst", is_send)
    s_tag = pc.fill_null(ops["comm_tag"].filter(pa.array(is_send)), 0).to_numpy().astype(np.int64)
    s_src = rank[is_send]
    s_row = rows[is_send]
    r_src, r_ok = peer("comm_src", is_recv)
    r_tag = pc.fill_null(ops["comm_tag"].filter(pa.array(is_recv)), 0).to_numpy().astype(np.int64)
    r_dst = rank[is_recv]
    r_row = rows[is_recv]
    s_src, s_dst, s_tag, s_row = s_src[s_ok], s_dst[s_ok], s_tag[s_ok], s_row[s_ok]
    r_src, r_dst, r_tag, r_row = r_src[r_ok], r_dst[r_ok], r_tag[r_ok], r_row[r_ok]
    sends = pa.table(
        {
            "s": s_src,
            "d": s_dst,
            "t": s_tag,
            "n": _occurrence([s_src, s_dst, s_tag]),
            "send_row": s_row,
        }
    )
    recvs = pa.table(
        {
            "s": r_src,
            "d": r_dst,
            "t": r_tag,
            "n": _occurrence([r_src, r_dst, r_tag]),
            "recv_row": r_row,
        }
    )
    joined = sends.join(recvs, ["s", "d", "t", "n"], join_type="inner")
    joined = joined.sort_by("send_row")
    send_row = joined["send_row"].to_numpy()
    recv_row = joined["recv_row"].to_numpy()
    return MessageMatch(
        send_row,
        recv_row,
        joined["t"].to_numpy().astype(np.int64),
        int(is_send.sum()) - joined.num_rows,
        int(is_recv.sum()) - joined.num_rows,
    )
