"""Per-rank dependency graphs and the transforms the finders and the rewrites share.

One :class:`RankGraph` per rank holds its ops as local rows ``0..n-1`` (file order)
and its edges. On it: a topological order, bitset reachability (what the rewrite check
asks), the overlap and reorder bypasses (in place, reporting which (communication,
compute) pairs they free; their reachability questions are answered where edges changed,
:mod:`etstore.analysis._reach`); the chunk consumers of expanded collectives are in
:mod:`etstore.analysis._chunks`. :mod:`etstore.app.overlap` runs these to find
opportunities and :mod:`etstore.analysis.rewrite` runs the same code to apply them,
so what is found is what gets applied.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.analysis._reach import Lists, NewGraph, lost_ancestors, reaches
from etstore.dag import generations
from etstore.errors import RewriteError
from etstore.model import Trace

__all__ = [
    "COMM_TYPES",
    "MESSAGE_TYPES",
    "Applied",
    "Edge",
    "EdgeArrays",
    "RankEdges",
    "RankGraph",
    "has_bit",
    "iter_graphs_with_arrays",
    "iter_rank_edges",
    "iter_rank_graphs",
    "overlap_rank",
    "rank_graphs",
    "reach",
    "reorder_rank",
    "string_codes",
    "topo_order",
]

# ops whose issue order the rewrites keep: sends and collectives (receives wait for their sender)
COMM_TYPES = ("COMM_SEND_NODE", "COMM_COLL_NODE")
# ops a reordered send never moves past in file order
MESSAGE_TYPES = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")

Edge = tuple[int, int]


# ---------------------------------------------------------------- per-rank graphs


@dataclass
class RankGraph:
    """One rank's ops (local rows ``0..n-1`` in file order) and its edge set."""

    rank: int
    first: int  # row of local op 0 in ``trace.ops``
    ids: np.ndarray
    types: list[str]
    edges: dict[Edge, str]  # (src, dst) -> kind, insertion order = original order

    @property
    def n(self) -> int:
        return len(self.ids)

    def arrays(self, kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Edge endpoints as two int arrays (only ``kind`` edges when given)."""
        pairs = self.edges if kind is None else [e for e, k in self.edges.items() if k == kind]
        flat = np.fromiter(itertools.chain.from_iterable(pairs), dtype=np.int64, count=2 * len(pairs))
        return flat[0::2], flat[1::2]

    def preds(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in self.edges:
            out[v].append(u)
        return out

    def succs(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in self.edges:
            out[u].append(v)
        return out


def rank_graphs(trace: Trace, ranks: Collection[int] | None = None) -> list[RankGraph]:
    """Split ``trace`` into per-rank graphs over local rows (only ``ranks`` when given).
    O(V + E log E), in numpy but for the edge dicts' construction. A caller that looks at one
    rank at a time should take :func:`iter_rank_graphs`."""
    return list(iter_rank_graphs(trace, ranks))


def iter_rank_graphs(trace: Trace, ranks: Collection[int] | None = None) -> Iterator[RankGraph]:
    """:func:`rank_graphs` one rank at a time, in rank order.

    Why: an edge dict is ~150k Python objects a 100k-op rank; holding every rank's at once
    (64 at 6M ops) makes each full garbage collection walk all of them, and a pass allocates
    enough to run dozens. Built lazily, the collector only ever sees the rank looked at.
    """
    for g, _ in iter_graphs_with_arrays(trace, ranks):
        yield g


def iter_graphs_with_arrays(
    trace: Trace, ranks: Collection[int] | None = None
) -> Iterator[tuple[RankGraph, EdgeArrays]]:
    """:func:`iter_rank_graphs` with each graph's :class:`EdgeArrays` as built, for a pass
    that starts on it at once (``arrays=`` of :func:`overlap_rank`, :func:`reorder_rank`)."""
    codes, names = string_codes(trace.ops["type"])
    shared = np.asarray(names, dtype=object)  # one str object per distinct type, for all ranks
    for e in iter_rank_edges(trace, ranks):
        a, b = e.first, e.first + len(e.ids)
        src, dst, kind = _dedup(e.src, e.dst, e.kind, e.kinds, len(e.ids))
        values = np.asarray(e.kinds, dtype=object)[kind].tolist()
        edges = dict(zip(zip(src.tolist(), dst.tolist(), strict=True), values, strict=True))
        g = RankGraph(e.rank, a, e.ids, shared[codes[a:b]].tolist(), edges)
        yield g, EdgeArrays(src, dst, kind, e.kinds, codes[a:b], names)


class EdgeArrays(NamedTuple):
    """A rank's edges as arrays in its dict's order, and its ops' types coded: what a pass
    reads of a :class:`RankGraph` before changing it (numpy masks instead of a scan of
    Python strings)."""

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray  # code of each edge's kind, into ``kinds``
    kinds: list[str]
    type: np.ndarray  # code of each op's type, into ``types``
    types: list[str]

    @classmethod
    def of(cls, g: RankGraph) -> EdgeArrays:
        """Read back from ``g`` as it is now."""
        src, dst = g.arrays()
        kinds = list(dict.fromkeys(g.edges.values()))
        at = {k: i for i, k in enumerate(kinds)}
        kind = np.fromiter((at[k] for k in g.edges.values()), dtype=np.int64, count=len(g.edges))
        types = list(dict.fromkeys(g.types))
        at = {t: i for i, t in enumerate(types)}
        return cls(src, dst, kind, kinds, np.fromiter((at[t] for t in g.types), np.int64, g.n), types)

    def of_kind(self, *kinds: str) -> np.ndarray:
        """Which edges are of one of ``kinds``."""
        return np.isin(self.kind, [i for i, k in enumerate(self.kinds) if k in kinds])

    def of_type(self, types: Collection[str]) -> np.ndarray:
        """Which ops are of one of ``types``."""
        return np.isin(self.type, [i for i, t in enumerate(self.types) if t in types])


class RankEdges(NamedTuple):
    """One rank's ops and edges as arrays: what :class:`RankGraph` is built from, for a
    caller that needs no edge dict (the chunk finder)."""

    rank: int
    first: int  # row of local op 0 in ``trace.ops``
    ids: np.ndarray
    src: np.ndarray  # local rows, in ``trace.deps`` order (duplicates kept)
    dst: np.ndarray
    kind: np.ndarray  # index into ``kinds`` of each edge's kind
    kinds: list[str]


def iter_rank_edges(trace: Trace, ranks: Collection[int] | None = None) -> Iterator[RankEdges]:
    """Each rank's (only ``ranks`` when given) ops and edges, in rank order. O(V + E log E)
    for the sort of the deps by rank, then O(V + E) a rank, in numpy."""
    deps = trace.deps
    d_rank = deps["rank"].to_numpy()
    d_src, d_dst = deps["src"].to_numpy(), deps["dst"].to_numpy()
    d_kind, kinds = string_codes(deps["kind"])
    if len(d_rank) > 1 and not bool(np.all(d_rank[1:] >= d_rank[:-1])):  # stored deps are by rank
        order = np.argsort(d_rank, kind="stable")
        d_rank, d_src, d_dst, d_kind = d_rank[order], d_src[order], d_dst[order], d_kind[order]
    all_ids = trace.ops["id"].to_numpy()
    for r, (a, b) in trace.rank_slices().items():
        if ranks is not None and r not in ranks:
            continue
        ids = all_ids[a:b]
        key = d_rank.dtype.type(r)  # a Python int would cast the whole column, on every rank
        lo, hi = np.searchsorted(d_rank, key, "left"), np.searchsorted(d_rank, key, "right")
        src, dst = _local_rows(ids, d_src[lo:hi]), _local_rows(ids, d_dst[lo:hi])
        yield RankEdges(r, a, ids, src, dst, d_kind[lo:hi], kinds)


def _local_rows(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The rows of ``ids`` holding ``wanted`` (all present): ids in file order usually ascend,
    and then need no sort."""
    if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return np.searchsorted(ids, wanted)
    sorter = np.argsort(ids, kind="stable")
    return sorter[np.searchsorted(ids, wanted, sorter=sorter)]


def string_codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A string column (edge kinds, op types) as an int code per row and the strings coded:
    a few distinct strings, not one Python object per row."""
    if not len(column):
        return np.zeros(0, dtype=np.int64), []
    enc = pc.dictionary_encode(column.combine_chunks())
    names = enc.dictionary.to_pylist()
    indices = enc.indices
    if indices.null_count:  # a null string: coded as one more value, None
        indices = pc.fill_null(indices, len(names))
        names.append(None)
    return indices.to_numpy().astype(np.int64), names


def _dedup(
    src: np.ndarray, dst: np.ndarray, kind: np.ndarray, kinds: list[str], n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each edge ``(src, dst)`` once, in order of first appearance, with its kind's code: a
    data edge wins over a duplicate of another kind, else the first one's kind holds."""
    if not len(src):
        return src.astype(np.int64), dst.astype(np.int64), kind
    key = src.astype(np.int64) * max(n, 1) + dst
    ordered = np.sort(key)
    if not (ordered[1:] == ordered[:-1]).any():  # the usual case: no duplicate
        return src, dst, kind
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    data = np.asarray([k == "data" for k in kinds], dtype=bool)
    is_data = np.zeros(len(first), dtype=bool)
    np.logical_or.at(is_data, inv, data[kind])
    got = kind[first]
    if data.any():
        got[is_data] = int(np.argmax(data))
    keep = np.argsort(first, kind="stable")
    return src[first[keep]], dst[first[keep]], got[keep]


def topo_order(g: RankGraph, arrays: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
    """A topological order of the rank (file order when it already is one); ``arrays``, its
    edges' endpoints when the caller has them (:meth:`RankGraph.arrays`).

    Raises
    ------
    RewriteError
        The rank's dependencies form a cycle.
    """
    src, dst = g.arrays() if arrays is None else arrays
    if len(src) == 0 or bool(np.all(src < dst)):
        return list(range(g.n))
    gen = generations(g.n, src, dst)
    if (gen < 0).any():
        bad = int(np.flatnonzero(gen < 0)[0])
        raise RewriteError(
            f"rank {g.rank}: dependency cycle through op {int(g.ids[bad])}; break it before rewriting"
        )
    order: list[int] = np.argsort(gen, kind="stable").tolist()
    return order


def reach(
    g: RankGraph,
    order: Sequence[int],
    sources: Sequence[int],
    *,
    kind: str | None = None,
    backward: bool = False,
) -> list[int]:
    """Per op, a bitset (Python int) of the sources it is reachable from (itself included).

    ``backward=True`` walks edges in reverse: bit ``j`` of op ``v`` then says ``v`` is
    an ancestor of ``sources[j]``. Only ``kind`` edges are walked when given.

    Notes
    -----
    O((V + E) · K / w) for K sources and word size w: one pass in topological order,
    OR-ing the bitsets of each op's predecessors.
    """
    bits = [0] * g.n
    for j, s in enumerate(sources):
        bits[s] |= 1 << j
    into: list[list[int]] = [[] for _ in range(g.n)]
    for (u, v), k in g.edges.items():
        if kind is None or k == kind:
            if backward:
                into[u].append(v)
            else:
                into[v].append(u)
    for v in reversed(order) if backward else order:
        acc = bits[v]
        for u in into[v]:
            acc |= bits[u]
        bits[v] = acc
    return bits


def has_bit(bits: int, j: int) -> bool:
    return bool((bits >> j) & 1)


# ---------------------------------------------------------------- overlap / reorder


@dataclass(frozen=True)
class Applied:
    """What one rank's overlap or reorder rewrite did: ``freed[(comm, compute)]`` pairs."""

    freed: list[tuple[int, int]]  # (comm local row, compute local row) no longer ordered
    moved: dict[int, int]  # comm local row -> local row it moves in front of (reorder)
    preds: dict[int, list[int]] = field(default_factory=dict)  # freed comm op -> its preds now


class _Pass:
    """What the overlap and reorder passes share: the rank's order and adjacency, data
    reachability for the candidate test, and the edges they change."""

    def __init__(self, g: RankGraph, arrays: EdgeArrays | None = None) -> None:
        self.g = g
        a = EdgeArrays.of(g) if arrays is None else arrays
        src, dst = a.src, a.dst
        if len(src) == 0 or bool(np.all(src < dst)):  # file order is a topological order
            self.pos: list[int] = list(range(g.n))
        else:
            self.pos = np.argsort(np.asarray(topo_order(g, (src, dst))), kind="stable").tolist()
        self.preds, self.succs = Lists(dst, src, g.n), Lists(src, dst, g.n)
        self.arrays = a
        self.comm_mask = a.of_type(COMM_TYPES)
        self.comm: list[bool] = self.comm_mask.tolist()
        self.removed: set[Edge] = set()  # bypassed (possibly put back by another bypass)
        self.changed: set[Edge] = set()  # every edge added or removed

    def ctrl_edges(self, src_types: Collection[str], dst_types: Collection[str]) -> list[Edge]:
        """The ctrl edges from an op of ``src_types`` to one of ``dst_types``, in edge order."""
        a = self.arrays
        hit = a.of_kind("ctrl") & a.of_type(src_types)[a.src] & a.of_type(dst_types)[a.dst]
        return list(zip(a.src[hit].tolist(), a.dst[hit].tolist(), strict=True))

    def data_reaches(self, u: int, v: int) -> bool:
        """``v`` is ``u`` or needs its data (through data edges of the original graph: the
        passes change only ctrl edges, so the original lists with the edges still of kind data;
        a list of each kind would cost more to build than these few searches)."""
        edges, succs, preds = self.g.edges, self.succs, self.preds

        def dsucc(x: int) -> list[int]:
            return [y for y in succs[x] if edges.get((x, y)) == "data"]

        def dpred(y: int) -> list[int]:
            return [x for x in preds[y] if edges.get((x, y)) == "data"]

        return reaches(u, v, dsucc, dpred, self.pos)

    def finish(self, counted: np.ndarray, *, edges: bool = True) -> tuple[NewGraph, dict[int, set[int]]]:
        """Add ctrl edges so every pair of comm ops ordered before stays ordered (in place),
        then: the graph as it is, and per op the ``counted`` ancestors it no longer has. With
        ``edges=False`` (overlap only) the order is restored up to reachability: an edge only
        between comm ops a path joins through no other comm op (:meth:`links`)."""
        g = self.g
        new = NewGraph(self.preds, self.succs, g.edges)
        new.touch(self.changed)
        pos = self.pos

        mine = counted.tolist()
        if not edges:
            added = []
            for c, ws in itertools.groupby(self.links(), key=lambda e: e[0]):
                to = [w for _, w in ws]
                got = new.forward(c, max(pos[w] for w in to), pos)  # one search for all of c's
                added += [(c, w) for w in to if w not in got]
            g.edges.update(dict.fromkeys(added, "ctrl"))
            new.touch(added)
            return new, lost_ancestors(self.preds, self.succs, new, g.edges, pos, self.removed, mine)
        either = (self.comm_mask | counted).tolist()
        lost = lost_ancestors(self.preds, self.succs, new, g.edges, pos, self.removed, either)
        added = []
        for v in sorted(v for v in lost if self.comm[v]):
            for c in sorted(c for c in lost[v] if self.comm[c]):
                if (c, v) not in g.edges:
                    g.edges[(c, v)] = "ctrl"
                    added.append((c, v))
        if added:  # the order kept changes what is lost: ask again
            new.touch(added)
            return new, lost_ancestors(self.preds, self.succs, new, g.edges, pos, self.removed, mine)
        kept = {b: {c for c in got if mine[c]} for b, got in lost.items()}
        return new, {b: got for b, got in kept.items() if got}

    def links(self) -> list[Edge]:
        """Pairs of comm ops the finder restores the order of, where lost: from each comm op
        whose out-edges were bypassed (overlap's collectives) to each comm op a path from it
        reaches through no other comm op. Restoring those restores what every op reaches: a
        path between two comm ops runs through comm ops each next two of which are such a
        pair, and only a pair starting at a bypassed op can have lost its order. One edge per
        collective and next comm op, where restoring every lost pair takes one per collective
        and later comm op."""
        out = []
        for c in sorted({u for u, _ in self.removed}):
            seen = {c}
            walk = [c]
            while walk:
                for w in self.succs[walk.pop()]:
                    if w not in seen:
                        seen.add(w)
                        if self.comm[w]:
                            out.append((c, w))
                        else:
                            walk.append(w)
        return out


def overlap_rank(
    g: RankGraph, only: Collection[int] | None = None, *, edges: bool = True, arrays: EdgeArrays | None = None
) -> Applied:
    """Bypass ctrl edges collective → independent compute on one rank (in place); with
    ``only``, from those collectives (local rows) alone: one opportunity. ``edges=False``
    (the finder: what it frees, not the rewritten rank) keeps the comm order by fewer edges
    (:meth:`_Pass.links`): the rewrite adds one per collective and later comm op it no longer
    reaches, quadratic on a rank whose gradient all-reduces only the optimizer step reads.
    ``arrays``: ``g``'s as built (:func:`iter_graphs_with_arrays`), when ``g`` is unchanged since.

    Notes
    -----
    O(V + E) for the rank, plus one step per bypassed (collective, compute) pair, each pair
    at most once, times the collective's in-degree, plus the searches of :mod:`_reach`: the
    independence test of each pair looked at and the ancestors lost near the bypassed edges
    (a few ops each on a trace's ranks; more where much is freed).
    """
    st = _Pass(g, arrays)
    preds = st.preds

    def candidate(u: int, v: int) -> bool:
        return (
            g.types[u] == "COMM_COLL_NODE"
            and g.types[v] == "COMP_NODE"
            and (only is None or u in only)
            and not st.data_reaches(u, v)
        )

    work = [e for e in st.ctrl_edges(("COMM_COLL_NODE",), ("COMP_NODE",)) if candidate(*e)]
    bypassed = st.removed
    while work:
        u, v = work.pop()
        if g.edges.get((u, v)) != "ctrl":
            continue
        del g.edges[(u, v)]
        bypassed.add((u, v))
        st.changed.add((u, v))
        for p in preds[u]:
            if (p, v) not in g.edges and (p, v) not in bypassed:  # once per pair, as in reorder_rank
                g.edges[(p, v)] = "ctrl"
                st.changed.add((p, v))
                if candidate(p, v):
                    work.append((p, v))
    if not bypassed:
        return Applied([], {})
    _, lost = st.finish(st.arrays.of_type(("COMM_COLL_NODE",)), edges=edges)
    freed = [(c, v) for v in sorted(lost) if g.types[v] == "COMP_NODE" for c in sorted(lost[v])]
    return Applied(freed, {})


def reorder_rank(
    g: RankGraph, only: Collection[int] | None = None, *, arrays: EdgeArrays | None = None
) -> Applied:
    """Bypass ctrl edges independent compute → send/collective on one rank (in place); with
    ``only``, to those sends/collectives (local rows) alone: one opportunity. ``arrays``:
    ``g``'s as built (:func:`iter_graphs_with_arrays`), when ``g`` is unchanged since.

    Notes
    -----
    O(V + E) for the rank, plus one step per bypassed (compute, communication) pair, each
    pair at most once, times the degrees of its endpoints, plus the searches of
    :mod:`_reach` (as in :func:`overlap_rank`).
    """
    st = _Pass(g, arrays)
    preds, succs = st.preds, st.succs

    def candidate(x: int, s: int) -> bool:
        return (
            g.types[x] == "COMP_NODE"
            and g.types[s] in COMM_TYPES
            and (only is None or s in only)
            and not st.data_reaches(x, s)
        )

    work = [e for e in st.ctrl_edges(("COMP_NODE",), COMM_TYPES) if candidate(*e)]
    passed: dict[int, list[int]] = {}
    bypassed = st.removed
    changed = st.changed
    while work:
        x, s = work.pop()
        if g.edges.get((x, s)) != "ctrl":
            continue
        del g.edges[(x, s)]
        bypassed.add((x, s))
        changed.add((x, s))
        passed.setdefault(s, []).append(x)
        for b in succs[s]:
            if (x, b) not in g.edges:  # what waited for S still waits for X
                g.edges[(x, b)] = "ctrl"
                changed.add((x, b))
        for p in preds[x]:
            # S already passed P: putting the edge back would only have it bypassed again (once
            # per path from P to X, exponentially many on a diamond-rich rank)
            if (p, s) not in g.edges and (p, s) not in bypassed:
                g.edges[(p, s)] = "ctrl"
                changed.add((p, s))
                if candidate(p, s):
                    work.append((p, s))
    if not bypassed:
        return Applied([], {})
    new, lost = st.finish(st.arrays.of_type(("COMP_NODE",)))
    freed = [(s, v) for s in sorted(lost) if st.comm[s] for v in sorted(lost[s])]  # by send, then compute op
    # file order: in front of the earliest compute op it passed, never past another message op
    moved: dict[int, int] = {}
    msg_rows: list[int] = np.flatnonzero(st.arrays.of_type(MESSAGE_TYPES)).tolist()
    for s, xs in passed.items():
        target = min(xs)
        at = bisect_left(msg_rows, s)  # msg_rows ascend: the last message op before s, in O(log n)
        prev_msg = msg_rows[at - 1] if at else -1
        target = max(target, prev_msg + 1)
        if target < s:
            moved[s] = target
    into = {s: list(new.pred(s)) for s in dict.fromkeys(s for s, _ in freed)}
    return Applied(freed, moved, into)
