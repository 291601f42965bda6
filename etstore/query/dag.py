"""Vectorized DAG passes over row-indexed graphs: generations, cycles, longest path.

Nodes are ``0..n-1`` (rows of an ops table); edges are two int arrays
``src → dst``. Each pass walks topological generations (Kahn's algorithm one
frontier at a time), so the Python-level loop runs once per generation, not once
per node.
"""

from __future__ import annotations

import numpy as np

from etstore.model import Trace, op_rows

__all__ = ["break_cycles", "cycle_members", "generations", "longest_path", "trace_edges"]


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
    import networkx as nx

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
