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
    "Endpoints",
    "MessageMatch",
    "break_cycles",
    "cycle_members",
    "find_cycle",
    "generations",
    "longest_path",
    "match_messages",
    "message_endpoints",
    "pair_endpoints",
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


class Endpoints(NamedTuple):
    """The sends or the receives of some ranks, as the columns messages are paired on."""

    src: np.ndarray  # int32, sending rank
    dst: np.ndarray  # int32, receiving rank
    tag: np.ndarray  # int32 (0 where the op has none)
    nth: np.ndarray  # int32, occurrence among earlier ops of the same (src, dst, tag), in issue order
    row: np.ndarray  # int64, row in the ops table (plus the caller's offset)


def message_endpoints(trace: Trace, row_offset: int = 0) -> tuple[Endpoints, Endpoints, int, int]:
    """The sends and receives of ``trace`` that name a peer, and the numbers of all sends and
    receives (peerless ones included).

    Every (src, dst, tag) group of sends lives on one rank (its src), every group of
    receives on one rank (its dst), so endpoints of disjoint rank ranges can be taken
    range by range and paired later (:func:`pair_endpoints`) as if taken at once.
    """
    ops = trace.ops
    typ = ops["type"]
    rows = np.arange(row_offset, row_offset + ops.num_rows, dtype=np.int64)
    is_send = pc.equal(typ, "COMM_SEND_NODE").to_numpy(zero_copy_only=False)
    is_recv = pc.equal(typ, "COMM_RECV_NODE").to_numpy(zero_copy_only=False)
    rank = ops["rank"].to_numpy().astype(np.int32)

    def side(mask: np.ndarray, peer_col: str, sending: bool) -> Endpoints:
        keep = pa.array(mask)
        peer_arr = ops[peer_col].filter(keep)
        ok = pc.is_valid(peer_arr).to_numpy(zero_copy_only=False)
        peer = pc.fill_null(peer_arr, -1).to_numpy().astype(np.int32)[ok]
        tag = pc.fill_null(ops["comm_tag"].filter(keep), 0).to_numpy().astype(np.int32)[ok]
        own = rank[mask][ok]
        src, dst = (own, peer) if sending else (peer, own)
        return Endpoints(src, dst, tag, _occurrence([src, dst, tag]).astype(np.int32), rows[mask][ok])

    sends = side(is_send, "comm_dst", True)
    recvs = side(is_recv, "comm_src", False)
    return sends, recvs, int(is_send.sum()), int(is_recv.sum())


def pair_endpoints(sends: Endpoints, recvs: Endpoints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(send_row, recv_row, tag)`` of every send that meets its receive, by ascending send row:
    the n-th send from s to d with tag t meets the n-th receive on d from s with tag t.

    Notes
    -----
    O(S + R) expected: one hash join on (src, dst, tag, occurrence), then a sort of the pairs.
    """
    left = pa.table({"s": sends.src, "d": sends.dst, "t": sends.tag, "n": sends.nth, "send_row": sends.row})
    right = pa.table({"s": recvs.src, "d": recvs.dst, "t": recvs.tag, "n": recvs.nth, "recv_row": recvs.row})
    joined = left.join(right, ["s", "d", "t", "n"], join_type="inner").sort_by("send_row")
    return (
        joined["send_row"].to_numpy(),
        joined["recv_row"].to_numpy(),
        joined["t"].to_numpy().astype(np.int64),
    )


def match_messages(trace: Trace) -> MessageMatch:
    """Pair every send with its receive as ASTRA-sim does.

    Sends from rank s to rank d with tag t pair with receives on d from s with tag t,
    the n-th send with the n-th receive, in issue (file) order. Ops without a peer
    are never matched.

    Notes
    -----
    O(V log V): two lexsorts and a join on (src, dst, tag, occurrence).
    """
    sends, recvs, n_sends, n_recvs = message_endpoints(trace)
    send_row, recv_row, tag = pair_endpoints(sends, recvs)
    return MessageMatch(send_row, recv_row, tag, n_sends - len(send_row), n_recvs - len(send_row))
