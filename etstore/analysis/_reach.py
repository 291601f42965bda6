"""Reachability the rank rewrites ask about, answered where it changes, not everywhere.

The overlap and reorder rewrites (:mod:`etstore.analysis._rankgraph`) ask two things: is op
``u`` an ancestor of op ``v`` (through data edges only, for a few pairs), and which
ancestors did each op lose when edges were bypassed. A bitset per op with a bit per send or
collective answers both for every pair at once, in O(V · K / w) per rank: on an expanded
rank (125k ops, 40k sends) that is most of a finder's time and grows as ops × sends. Here a
pair is answered by a search bounded by a topological order (:func:`reaches`) and the lost
ancestors are found from the removed edges outward (:func:`lost_ancestors`), so the work is
proportional to the part of the graph the rewrite touched.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

__all__ = ["Lists", "NewGraph", "lost_ancestors", "reaches"]

Adj = Callable[[int], Sequence[int]]


class Lists:
    """Per op, its neighbours along edge arrays (``key[i] -> other[i]``), in edge order: one
    flat list sliced when asked (a list per op of a 125k-op rank costs more than the passes
    that look at a few ops' neighbours)."""

    def __init__(self, key: np.ndarray, other: np.ndarray, n: int) -> None:
        order = np.argsort(key, kind="stable")
        self._other: list[int] = other[order].tolist()
        start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(key, minlength=n), out=start[1:])
        self._start: list[int] = start.tolist()

    def __getitem__(self, u: int) -> list[int]:
        return self._other[self._start[u] : self._start[u + 1]]


def reaches(u: int, v: int, succ: Adj, pred: Adj, pos: Sequence[int]) -> bool:
    """Whether ``v`` is reachable from ``u`` (``u == v`` included).

    ``pos`` is a topological order's position of each op: every edge goes to a larger
    position, so a path from ``u`` to ``v`` stays strictly between them. Searches from both
    ends, a level at a time on the smaller frontier, and stops when they meet or either side
    has nothing left: O(nodes between them that either side reaches), usually a handful.
    """
    if u == v:
        return True
    pu, pv = pos[u], pos[v]
    if pu > pv:
        return False
    fwd, bwd = {u}, {v}
    ff, bf = [u], [v]
    while ff and bf:
        nxt: list[int] = []
        if len(ff) <= len(bf):
            for x in ff:
                for y in succ(x):
                    if y in bwd:
                        return True
                    if pos[y] < pv and y not in fwd:
                        fwd.add(y)
                        nxt.append(y)
            ff = nxt
        else:
            for x in bf:
                for y in pred(x):
                    if y in fwd:
                        return True
                    if pos[y] > pu and y not in bwd:
                        bwd.add(y)
                        nxt.append(y)
            bf = nxt
    return False


class NewGraph:
    """A rank's edges after a rewrite, as adjacency: the original lists, but at the ops whose
    edges changed, rebuilt from the current edges when first asked."""

    def __init__(self, preds: Lists, succs: Lists, edges: Mapping[tuple[int, int], str]) -> None:
        self._preds, self._succs, self._edges = preds, succs, edges
        self._xp: dict[int, set[int]] = {}  # per op, the changed edges into it
        self._xs: dict[int, set[int]] = {}
        self._np: dict[int, list[int]] = {}
        self._ns: dict[int, list[int]] = {}

    def touch(self, changed: Collection[tuple[int, int]]) -> None:
        """Note edges added or removed since (tens of thousands a rank: no set made and
        thrown away per edge, no cache to clear before one is built)."""
        xs, xp = self._xs, self._xp
        for u, v in changed:
            got = xs.get(u)
            if got is None:
                xs[u] = {v}
            else:
                got.add(v)
            got = xp.get(v)
            if got is None:
                xp[v] = {u}
            else:
                got.add(u)
        if self._ns or self._np:
            for u, v in changed:
                self._ns.pop(u, None)
                self._np.pop(v, None)

    def succ(self, u: int) -> Sequence[int]:
        got = self._ns.get(u)
        if got is None:
            more = self._xs.get(u)
            if more is None:
                return self._succs[u]
            edges, had = self._edges, self._succs[u]
            got = [v for v in had if (u, v) in edges]
            got += [v for v in more.difference(had) if (u, v) in edges]
            self._ns[u] = got
        return got

    def pred(self, v: int) -> Sequence[int]:
        got = self._np.get(v)
        if got is None:
            more = self._xp.get(v)
            if more is None:
                return self._preds[v]
            edges, had = self._edges, self._preds[v]
            got = [u for u in had if (u, v) in edges]
            got += [u for u in more.difference(had) if (u, v) in edges]
            self._np[v] = got
        return got

    def forward(self, u: int, limit: int, pos: Sequence[int]) -> set[int]:
        """The ops ``u`` reaches now (itself included) placed at most ``limit``: every edge
        follows ``pos``, so no path leaves that window and comes back."""
        seen = {u}
        walk = [u]
        while walk:
            for y in self.succ(walk.pop()):
                if y not in seen and pos[y] <= limit:
                    seen.add(y)
                    walk.append(y)
        return seen


def lost_ancestors(
    preds: Lists,
    succs: Lists,
    now: NewGraph,
    edges: Mapping[tuple[int, int], str],
    pos: Sequence[int],
    removed: Collection[tuple[int, int]],
    counted: Sequence[bool],
) -> dict[int, set[int]]:
    """Per op, the ``counted`` ops that were its ancestors through the original edges
    (``preds``/``succs``) and are not now (``now``: the current adjacency; ``edges``, the
    current edges), ops that lost none left out.

    Every current edge must follow ``pos``, and reach nothing the original edges did not (the
    rewrites only add edges the original order implied). Which ancestors ``b`` lost follows
    from its original predecessors ``p``: through an edge still there, what ``p`` lost (less
    what ``b`` still reaches another way); through a ``removed`` edge, ``p`` and its ancestors,
    walked back from ``p`` until an op ``b`` still reaches, which brings what that op lost. So
    only the targets of removed edges and the successors of ops that lost something are
    visited, in topological order; whether ``b`` still reaches an op is searched for
    (:func:`reaches`) only where its current predecessors leave it open (:func:`_still`).
    """
    lost: dict[int, set[int]] = {}
    at = {pos[b]: b for _, b in removed}
    heap = sorted(at)
    while heap:
        b = at[heapq.heappop(heap)]
        found: set[int] = set()
        maybe: set[int] = set()
        seen: set[int] = set()
        walk: list[int] = []
        for p in preds[b]:
            if (p, b) in edges:
                had = lost.get(p)
                if had:
                    maybe |= had
            elif p not in seen:
                seen.add(p)
                walk.append(p)
        into: Sequence[int] | None = None  # b's current predecessors, when first needed
        while walk:
            w = walk.pop()
            if (w, b) not in edges:
                into = now.pred(b) if into is None else into
                if not _still(w, b, into, now, pos, None):
                    if counted[w]:
                        found.add(w)
                    for q in preds[w]:
                        if q not in seen:
                            seen.add(q)
                            walk.append(q)
                    continue
            had = lost.get(w)
            if had:
                maybe |= had
        for c in maybe:
            if c not in found and (c, b) not in edges:
                into = now.pred(b) if into is None else into
                if not _still(c, b, into, now, pos, lost):
                    found.add(c)
        if not found:
            continue
        lost[b] = found
        for c in succs[b]:
            if (b, c) in edges and pos[c] not in at:
                at[pos[c]] = c
                heapq.heappush(heap, pos[c])
    return lost


def _still(
    a: int,
    b: int,
    into: Sequence[int],
    now: NewGraph,
    pos: Sequence[int],
    lost: Mapping[int, set[int]] | None,
) -> bool:
    """Whether ``a`` still reaches ``b`` (``a != b``, not by an edge ``a -> b``), ``into`` being
    ``b``'s current predecessors: only through one of them placed after ``a`` (each edge
    follows ``pos``) and, with ``lost`` (``a`` counted), not one known to have lost ``a``.
    Most of the lost ancestors' questions end there, or at the edge ``a -> b``, without a
    search (:func:`reaches`): asked for every op visited, the searches were a third of a
    finder's time; on the expanded transformers, one question in eight still needs one."""
    pa = pos[a]
    for q in into:
        if pos[q] > pa and (lost is None or a not in lost.get(q, ())):
            return reaches(a, b, now.succ, now.pred, pos)
    return False
