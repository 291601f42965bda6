"""Vectorized DAG passes over row-indexed graphs: edges, message matching, generations,
cycles, longest path.

Nodes are ``0..n-1`` (rows of an ops table); edges are two int arrays
``src → dst``. Each pass walks topological generations (Kahn's algorithm one
frontier at a time), so the Python-level loop runs once per generation, not once
per node, and a round touches only its own generation's nodes and edges: traces
hundreds of thousands of generations deep stay linear.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.model import Trace, op_rows
from etstore.progress import ProgressFn

__all__ = [
    "Endpoints",
    "MessageMatch",
    "break_cycles",
    "cycle_members",
    "find_cycle",
    "generations",
    "heaviest_paths",
    "longest_path",
    "match_messages",
    "message_endpoints",
    "pair_endpoints",
    "trace_edges",
    "walk_back",
]


def _csr(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst[order]


class _Ticker:
    """Calls ``progress(phase, done, total)`` each time ``done`` passes another 1% of ``total``.

    The per-generation loops run hundreds of thousands of rounds on deep traces; a call
    per round would cost more than the round.
    """

    def __init__(self, progress: ProgressFn | None, phase: str, total: int) -> None:
        self.progress, self.phase, self.total = progress, phase, total
        self.step = max(1, total // 100)
        self.next = 0 if progress is not None else sys.maxsize  # no callback: one comparison a round
        self.last = -1

    def __call__(self, done: int) -> None:
        if done >= self.next and self.progress is not None:
            self.progress(self.phase, done, self.total)
            self.next, self.last = done + self.step, done

    def finish(self) -> None:
        """The phase is over: report it done (once)."""
        if self.progress is not None and self.last != self.total:
            self.progress(self.phase, self.total, self.total)
            self.last = self.total


def generations(
    n: int, src: np.ndarray, dst: np.ndarray, *, progress: ProgressFn | None = None
) -> np.ndarray:
    """Topological generation of each node (-1 for nodes on or behind a cycle).

    Generation 0 holds the nodes without in-edges; a node is in generation ``g + 1``
    when its last predecessor to be placed is in generation ``g``.

    Parameters
    ----------
    n
        Number of nodes ``0..n-1``.
    src, dst
        Edges ``src[i] -> dst[i]`` (int arrays of equal length).
    progress
        Called as ``progress("order", nodes placed, n)`` every 1% or so.

    Examples
    --------
    >>> generations(4, np.array([0, 1, 0]), np.array([1, 2, 2])).tolist()
    [0, 1, 2, 0]

    Notes
    -----
    Kahn's algorithm one frontier at a time: O(V + E) element work in all, plus a
    constant number of numpy calls per generation (tens of µs), so a trace
    ``D`` generations deep pays O(D) of Python on top; nothing per round is O(V).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    gen = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return gen
    tick = _Ticker(progress, "order", n)
    indeg = np.bincount(dst, minlength=n)
    outdeg = np.bincount(src, minlength=n)
    indptr, targets_of = _csr(n, src, dst)
    zero = indeg.dtype.type(0)
    frontier = np.flatnonzero(indeg == 0)
    g = placed = 0
    while frontier.size:
        gen[frontier] = g
        g += 1
        placed += frontier.size
        tick(placed)
        if frontier.size == 1:  # a chain: its out-edges are one slice
            v = frontier[0]
            targets = targets_of[indptr[v] : indptr[v + 1]]
        else:  # every out-edge of the frontier: ragged ranges of the CSR, gathered at once
            counts = outdeg[frontier]
            ends = counts.cumsum()
            targets = targets_of[np.repeat(indptr[frontier] - ends + counts, counts) + np.arange(ends[-1])]
        if targets.size == 0:
            break
        np.subtract.at(indeg, targets, 1)
        ready = targets[indeg[targets] == zero]
        if ready.size > 1:  # a node reached by several frontier edges is listed once
            ready = np.sort(ready)
            ready = ready[np.concatenate(([True], ready[1:] != ready[:-1]))]
        frontier = ready
    tick.finish()
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


def heaviest_paths(
    gen: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    weight: np.ndarray,
    *,
    progress: ProgressFn | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the weight of the heaviest path ending there and its predecessor on that path.

    Parameters
    ----------
    gen
        A layering of the nodes in which every edge goes to a later layer:
        :func:`generations` of this graph or of any graph that contains its edges
        (one pass over a trace's generations serves its subgraphs too). Nodes with
        ``gen < 0`` are left out, with the edges that touch them.
    src, dst
        Edges ``src[i] -> dst[i]``.
    weight
        Node weights.
    progress
        Called as ``progress("path", nodes done, nodes)`` every 1% or so.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``finish`` (float64): ``weight[v]`` plus the largest ``finish`` of ``v``'s
        predecessors (``-inf`` for nodes left out); ``pred`` (int64): the predecessor
        that attains it, the first such edge in the order given, or -1.

    Raises
    ------
    OptionError
        An edge does not go to a later layer of ``gen``.

    Examples
    --------
    >>> src, dst = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
    >>> finish, pred = heaviest_paths(np.array([0, 1, 1, 2]), src, dst, np.array([1, 5, 2, 1]))
    >>> finish.tolist(), pred.tolist()
    ([1.0, 6.0, 3.0, 7.0], [-1, 0, 0, 1])

    Notes
    -----
    O(V + E log E): nodes are renumbered layer by layer and in-edges sorted by their
    node, so each layer is one ``maximum.reduceat`` over a contiguous slice; the
    predecessors follow afterwards from one comparison over all edges.
    """
    gen = np.asarray(gen, dtype=np.int64)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = len(gen)
    finish = np.full(n, -np.inf)
    pred = np.full(n, -1, dtype=np.int64)
    order = np.argsort(gen, kind="stable")[int(np.count_nonzero(gen < 0)) :]  # node at each position
    m = len(order)
    if m == 0:
        return finish, pred
    from_gen, to_gen = gen[src], gen[dst]
    ok = (from_gen >= 0) & (to_gen >= 0)
    if bool(np.any(ok & (from_gen >= to_gen))):
        raise OptionError("heaviest_paths: an edge does not go to a later generation")
    del from_gen, to_gen
    at = _positions(n, order)
    into, come_from = at[dst[ok]], at[src[ok]]
    del at, ok
    indeg = np.bincount(into, minlength=m)
    # a node without in-edges reads one from slot m, which holds 0.0: its finish is its weight
    lone = np.flatnonzero(indeg == 0).astype(into.dtype)
    into = np.concatenate([into, lone])
    come_from = np.concatenate([come_from, np.full(len(lone), m, dtype=into.dtype)])
    by_dst = np.argsort(into, kind="stable")  # ties keep the edge order
    edge_dst, edge_src = into[by_dst], come_from[by_dst]
    del into, come_from, by_dst, lone
    first_edge = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.maximum(indeg, 1), out=first_edge[1:])
    layer_of = gen[order]
    bounds = np.zeros(int(layer_of[-1]) + 2, dtype=np.int64)
    np.cumsum(np.bincount(layer_of), out=bounds[1:])
    local = first_edge[:m] - first_edge[bounds[layer_of]]  # a node's first in-edge within its layer
    del layer_of, indeg
    fin = np.empty(m + 1)
    fin[m] = 0.0
    best = np.empty(m)
    w = np.asarray(weight, dtype=np.float64)[order]
    tick = _Ticker(progress, "path", m)
    starts, edge_at = bounds.tolist(), first_edge[bounds].tolist()
    for a, b, ea, eb in zip(starts[:-1], starts[1:], edge_at[:-1], edge_at[1:], strict=True):
        layer_best = np.maximum.reduceat(fin[edge_src[ea:eb]], local[a:b])
        best[a:b] = layer_best
        np.add(layer_best, w[a:b], out=fin[a:b])
        tick(b)
    tick.finish()
    del local, w
    # the edge attaining each maximum; those from slot m name no predecessor
    hit = (fin[edge_src] == best[edge_dst]) & (edge_src != m)
    hits = np.flatnonzero(hit)
    del hit
    first = np.ones(len(hits), dtype=bool)
    first[1:] = edge_dst[hits[1:]] != edge_dst[hits[:-1]]
    hits = hits[first]
    finish[order] = fin[:m]
    pred[order[edge_dst[hits]]] = order[edge_src[hits]]
    return finish, pred


def _positions(n: int, order: np.ndarray) -> np.ndarray:
    """Position of each node in ``order`` (-1 where absent), in the narrowest int that holds it."""
    at = np.full(n, -1, dtype=np.int32 if len(order) < np.iinfo(np.int32).max else np.int64)
    at[order] = np.arange(len(order), dtype=at.dtype)
    return at


def walk_back(pred: np.ndarray, last: int) -> np.ndarray:
    """The chain of ``pred`` links that ends at ``last``, first node first.

    >>> walk_back(np.array([-1, 0, 1, 0]), 2).tolist()
    [0, 1, 2]
    """
    links = np.ascontiguousarray(pred, dtype=np.int64).data  # Python ints one at a time, no list
    path = [last]
    while links[path[-1]] >= 0:
        path.append(links[path[-1]])
    return np.asarray(path[::-1], dtype=np.int64)


def longest_path(
    n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """Weight-maximal path in a DAG (node weights).

    Returns ``(length, path_rows, finish)`` where ``finish[v]`` is the heaviest
    path weight ending at ``v``. Nodes on cycles are ignored (call
    :func:`generations` first to report them). The path ends at the first node
    with the largest ``finish`` and steps back along the first edge (in the order
    given) that attains each maximum.

    Examples
    --------
    >>> src, dst = np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3])
    >>> length, rows, _ = longest_path(4, src, dst, np.array([1, 5, 2, 1]))
    >>> length, rows.tolist()
    (7.0, [0, 1, 3])

    Notes
    -----
    O(V + E log E) with one numpy round per generation (:func:`generations`,
    :func:`heaviest_paths`).
    """
    if n == 0:
        return 0.0, np.zeros(0, dtype=np.int64), np.zeros(0)
    gen = generations(n, src, dst)
    finish, pred = heaviest_paths(gen, src, dst, weight)
    last = int(np.argmax(finish))
    return float(finish[last]), walk_back(pred, last), finish


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
    O((S + R) log(S + R)): one sort of both sides together by (src, dst, tag, occurrence), where
    a send followed by a receive of the same key is a pair (a key occurs at most once per side),
    then a sort of the pairs. Numpy alone: a join in Arrow would load its query engine, which
    costs an ingest more than the pairing itself.
    """
    ns = len(sends.row)
    keys = [np.concatenate((a, b)) for a, b in zip(sends[:4], recvs[:4], strict=True)]
    side = np.concatenate((np.zeros(ns, dtype=np.int8), np.ones(len(recvs.row), dtype=np.int8)))
    order = np.lexsort((side, *reversed(keys)))  # by src, dst, tag, nth; a send before its receive
    same = np.ones(max(len(order) - 1, 0), dtype=bool)
    for k in keys:
        ks = k[order]
        same &= ks[1:] == ks[:-1]
    send, recv = order[:-1][same], order[1:][same] - ns
    send_row, recv_row = sends.row[send], recvs.row[recv]
    by_send = np.argsort(send_row, kind="stable")
    return send_row[by_send], recv_row[by_send], sends.tag[send][by_send].astype(np.int64)


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
