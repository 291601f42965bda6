"""Per-rank dependency graphs and the transforms the finders and the rewrites share.

One :class:`RankGraph` per rank holds its ops as local rows ``0..n-1`` (file order)
and its edges. On it: a topological order, bitset reachability (what the rewrite check
asks), the overlap and reorder bypasses (in place, reporting which (communication,
compute) pairs they free; their reachability questions are answered where edges changed,
:mod:`etstore.analysis._reach`), and the chunk consumers of expanded collectives with the
arithmetic that splits them into pieces. :mod:`etstore.app.overlap` runs these to find
opportunities and :mod:`etstore.analysis.rewrite` runs the same code to apply them,
so what is found is what gets applied.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

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
    "ChunkConsumer",
    "Edge",
    "RankGraph",
    "chunk_consumers",
    "group_slots",
    "has_bit",
    "overlap_rank",
    "piece_count",
    "rank_graphs",
    "reach",
    "reorder_rank",
    "split_durations",
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
    O(V + E log E), in numpy but for the edge dicts' construction."""
    out = []
    deps = trace.deps
    d_rank = deps["rank"].to_numpy()
    order = np.argsort(d_rank, kind="stable")
    d_rank = d_rank[order]
    d_src = deps["src"].to_numpy()[order]
    d_dst = deps["dst"].to_numpy()[order]
    d_kind = _kinds(deps["kind"])[order]
    all_ids = trace.ops["id"].to_numpy()
    for r, (a, b) in trace.rank_slices().items():
        if ranks is not None and r not in ranks:
            continue
        ids = all_ids[a:b]
        key = d_rank.dtype.type(r)  # a Python int would cast the whole column, on every rank
        lo, hi = np.searchsorted(d_rank, key, "left"), np.searchsorted(d_rank, key, "right")
        sorter = np.argsort(ids, kind="stable")
        edges: dict[Edge, str] = {}
        if hi > lo:
            s = sorter[np.searchsorted(ids, d_src[lo:hi], sorter=sorter)]
            d = sorter[np.searchsorted(ids, d_dst[lo:hi], sorter=sorter)]
            edges = _edge_dict(s, d, d_kind[lo:hi], b - a)
        out.append(RankGraph(r, a, ids, trace.ops["type"].slice(a, b - a).to_pylist(), edges))
    return out


def _kinds(kind: pa.ChunkedArray) -> np.ndarray:
    """The edge kinds as an object array (through the few distinct strings, not one per edge)."""
    if kind.null_count or not len(kind):
        return np.asarray(kind.to_pylist(), dtype=object)
    enc = pc.dictionary_encode(kind.combine_chunks())
    return np.asarray(enc.dictionary.to_pylist(), dtype=object)[enc.indices.to_numpy()]


def _edge_dict(src: np.ndarray, dst: np.ndarray, kind: np.ndarray, n: int) -> dict[Edge, str]:
    """``(src, dst) -> kind`` in order of first appearance; a data edge wins over a duplicate
    of another kind, else the first one's kind holds."""
    key = src.astype(np.int64) * max(n, 1) + dst
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    if len(first) < len(key):
        is_data = np.zeros(len(first), dtype=bool)
        np.logical_or.at(is_data, inv, kind == "data")
        kinds = kind[first]
        kinds[is_data] = "data"
        keep = np.argsort(first, kind="stable")
        src, dst, kind = src[first[keep]], dst[first[keep]], kinds[keep]
    return dict(zip(zip(src.tolist(), dst.tolist(), strict=True), kind.tolist(), strict=True))


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

    def __init__(self, g: RankGraph) -> None:
        self.g = g
        src, dst = g.arrays()
        self.pos: list[int] = np.argsort(np.asarray(topo_order(g, (src, dst))), kind="stable").tolist()
        self.preds, self.succs = Lists(dst, src, g.n), Lists(src, dst, g.n)
        self.kinds = np.asarray(list(g.edges.values()), dtype=object)
        data = self.kinds == "data"
        self.dpreds, self.dsuccs = Lists(dst[data], src[data], g.n), Lists(src[data], dst[data], g.n)
        self.src, self.dst = src, dst
        self.comm = [t in COMM_TYPES for t in g.types]
        self.removed: set[Edge] = set()  # bypassed (possibly put back by another bypass)
        self.changed: set[Edge] = set()  # every edge added or removed

    def ctrl_edges(self, src_types: Collection[str], dst_types: Collection[str]) -> list[Edge]:
        """The ctrl edges from an op of ``src_types`` to one of ``dst_types``, in edge order."""
        codes = {t: k for k, t in enumerate(dict.fromkeys(self.g.types))}
        code = np.asarray([codes[t] for t in self.g.types], dtype=np.int64)
        ok_src = np.asarray([t in src_types for t in codes], dtype=bool)
        ok_dst = np.asarray([t in dst_types for t in codes], dtype=bool)
        if not len(code):
            return []
        hit = (self.kinds == "ctrl") & ok_src[code[self.src]] & ok_dst[code[self.dst]]
        return list(zip(self.src[hit].tolist(), self.dst[hit].tolist(), strict=True))

    def data_reaches(self, u: int, v: int) -> bool:
        """``v`` is ``u`` or needs its data (through data edges of the original graph)."""
        return reaches(u, v, self.dsuccs.__getitem__, self.dpreds.__getitem__, self.pos)

    def finish(self, counted: list[bool], *, edges: bool = True) -> tuple[NewGraph, dict[int, set[int]]]:
        """Add ctrl edges so every pair of comm ops ordered before stays ordered (in place),
        then: the graph as it is, and per op the ``counted`` ancestors it no longer has. With
        ``edges=False`` (overlap only) the order is restored up to reachability: an edge only
        between comm ops a path joins through no other comm op (:meth:`links`)."""
        g = self.g
        new = NewGraph(self.preds, self.succs, g.edges)
        new.touch(self.changed)
        pos = self.pos

        def now(a: int, b: int) -> bool:
            return reaches(a, b, new.succ, new.pred, pos)

        if not edges:
            added = [e for e in self.links() if not now(*e)]
            g.edges.update(dict.fromkeys(added, "ctrl"))
            new.touch(added)
            return new, lost_ancestors(self.preds, self.succs, now, g.edges, pos, self.removed, counted)
        either = [a or b for a, b in zip(self.comm, counted, strict=True)]
        lost = lost_ancestors(self.preds, self.succs, now, g.edges, pos, self.removed, either)
        added = []
        for v in sorted(v for v in lost if self.comm[v]):
            for c in sorted(c for c in lost[v] if self.comm[c]):
                if (c, v) not in g.edges:
                    g.edges[(c, v)] = "ctrl"
                    added.append((c, v))
        if added:  # the order kept changes what is lost: ask again
            new.touch(added)
            return new, lost_ancestors(self.preds, self.succs, now, g.edges, pos, self.removed, counted)
        mine = {b: {c for c in got if counted[c]} for b, got in lost.items()}
        return new, {b: got for b, got in mine.items() if got}

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


def overlap_rank(g: RankGraph, only: Collection[int] | None = None, *, edges: bool = True) -> Applied:
    """Bypass ctrl edges collective → independent compute on one rank (in place); with
    ``only``, from those collectives (local rows) alone: one opportunity. ``edges=False``
    (the finder: what it frees, not the rewritten rank) keeps the comm order by fewer edges
    (:meth:`_Pass.links`): the rewrite adds one per collective and later comm op it no longer
    reaches, quadratic on a rank whose gradient all-reduces only the optimizer step reads.

    Notes
    -----
    O(V + E) for the rank, plus one step per bypassed (collective, compute) pair, each pair
    at most once, times the collective's in-degree, plus the searches of :mod:`_reach`: the
    independence test of each pair looked at and the ancestors lost near the bypassed edges
    (a few ops each on a trace's ranks; more where much is freed).
    """
    st = _Pass(g)
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
    _, lost = st.finish([t == "COMM_COLL_NODE" for t in g.types], edges=edges)
    freed = [(c, v) for v in sorted(lost) if g.types[v] == "COMP_NODE" for c in sorted(lost[v])]
    return Applied(freed, {})


def reorder_rank(g: RankGraph, only: Collection[int] | None = None) -> Applied:
    """Bypass ctrl edges independent compute → send/collective on one rank (in place); with
    ``only``, to those sends/collectives (local rows) alone: one opportunity.

    Notes
    -----
    O(V + E) for the rank, plus one step per bypassed (compute, communication) pair, each
    pair at most once, times the degrees of its endpoints, plus the searches of
    :mod:`_reach` (as in :func:`overlap_rank`).
    """
    st = _Pass(g)
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
    new, lost = st.finish([t == "COMP_NODE" for t in g.types])
    freed = [(s, v) for s in sorted(lost) if st.comm[s] for v in sorted(lost[s])]  # by send, then compute op
    # file order: in front of the earliest compute op it passed, never past another message op
    moved: dict[int, int] = {}
    msg_rows = [i for i, t in enumerate(g.types) if t in MESSAGE_TYPES]
    for s, xs in passed.items():
        target = min(xs)
        at = bisect_left(msg_rows, s)  # msg_rows ascend: the last message op before s, in O(log n)
        prev_msg = msg_rows[at - 1] if at else -1
        target = max(target, prev_msg + 1)
        if target < s:
            moved[s] = target
    into = {s: list(new.pred(s)) for s in dict.fromkeys(s for s, _ in freed)}
    return Applied(freed, moved, into)


# ---------------------------------------------------------------- chunk-split


@dataclass(frozen=True)
class ChunkConsumer:
    """A compute op consuming one expanded collective's output on one rank.

    ``writers[slot]`` are the local rows of the expansion ops that write that chunk
    slot (receives and reductions; sends only read). ``expansion_preds`` are the
    consumer's predecessors inside the expansion.
    """

    rank: int
    coll_id: int
    consumer: int  # local row
    writers: dict[int, list[int]]
    expansion_preds: list[int]


def chunk_consumers(trace: Trace, graphs: Sequence[RankGraph], expansions: pa.Table) -> list[ChunkConsumer]:
    """Consumers of expanded collectives that could start per chunk.

    ``expansions`` has columns ``rank``, ``id`` (an op of ``trace``) and ``coll_id``
    (the collective it expands, in the parent trace). A consumer is a ``COMP_NODE``
    outside every expansion with a predecessor in exactly one expansion whose
    writers cover at least two of the rank's output slots (``chunk_offset`` ..
    ``+ msg_chunk_cnt``). With columns ``coll_type``, ``group_pos`` and ``group_size``
    (:func:`etstore.app.overlap.expansions_of`), a reduce-scatter's output on a rank is
    only its own share of the chunks (the others pass through it as partial sums, forwarded
    on, that no consumer may read); every other collective leaves every slot a result.

    Notes
    -----
    O(V + E) over the trace.
    """
    if expansions.num_rows == 0:
        return []
    off_all = pc.fill_null(trace.ops["chunk_offset"], -1).to_numpy()
    cnt_all = pc.fill_null(trace.ops["msg_chunk_cnt"], 1).to_numpy()
    total_all = pc.fill_null(trace.ops["total_chunk_cnt"], 0).to_numpy()
    shares = _own_shares(expansions)
    e_rank = expansions["rank"].to_numpy()
    by = np.argsort(e_rank, kind="stable")
    e_rank = e_rank[by]
    e_id = expansions["id"].to_numpy()[by]
    e_coll = expansions["coll_id"].to_numpy()[by]
    out: list[ChunkConsumer] = []
    for g in graphs:
        key = e_rank.dtype.type(g.rank)  # as in rank_graphs: no cast of the column per rank
        lo, hi = np.searchsorted(e_rank, key, "left"), np.searchsorted(e_rank, key, "right")
        if lo == hi or not g.n:
            continue
        # the rank's expansion ops as local rows, and the collective each expands
        sorter = np.argsort(g.ids, kind="stable")
        at = np.minimum(np.searchsorted(g.ids, e_id[lo:hi], sorter=sorter), g.n - 1)
        hit = g.ids[sorter[at]] == e_id[lo:hi]
        is_exp = np.zeros(g.n, dtype=bool)
        is_exp[sorter[at[hit]]] = True
        coll_of = np.zeros(g.n, dtype=np.uint64)
        coll_of[sorter[at[hit]]] = e_coll[lo:hi][hit]
        src, dst = g.arrays()
        is_comp = np.asarray(g.types, dtype=object) == "COMP_NODE"
        into = is_exp[src] & ~is_exp[dst] & is_comp[dst]  # expansion op -> compute op outside
        inside: dict[int, list[int]] = {}
        colls: dict[int, set[int]] = {}
        for u, v, c in zip(src[into].tolist(), dst[into].tolist(), coll_of[src[into]].tolist(), strict=True):
            inside.setdefault(v, []).append(u)
            colls.setdefault(v, set()).add(c)
        one = {v: next(iter(cs)) for v, cs in colls.items() if len(cs) == 1}
        writers_of = _writers(g, is_exp, coll_of, set(one.values()), off_all, cnt_all, total_all, shares)
        for v in sorted(one):
            writers = writers_of.get(one[v], {})
            if len(writers) >= 2:
                out.append(ChunkConsumer(g.rank, one[v], v, writers, sorted(inside[v])))
    return out


def _writers(
    g: RankGraph,
    is_exp: np.ndarray,
    coll_of: np.ndarray,
    colls: set[int],
    off_all: np.ndarray,
    cnt_all: np.ndarray,
    total_all: np.ndarray,
    shares: dict[tuple[int, int], tuple[int, int]],
) -> dict[int, dict[int, list[int]]]:
    """Per collective of ``colls``, its rank's output slots and the expansion ops (local rows,
    ascending) that write each: receives and reductions with a ``chunk_offset``, keeping a
    reduce-scatter's own share only."""
    out: dict[int, dict[int, list[int]]] = {}
    if not colls:
        return out
    want = np.fromiter(colls, dtype=np.uint64, count=len(colls))
    ks = np.flatnonzero(is_exp & np.isin(coll_of, want))
    rows = g.first + ks
    sends = np.asarray([g.types[k] == "COMM_SEND_NODE" for k in ks.tolist()], dtype=bool)
    keep = ~sends & (off_all[rows] >= 0) if len(ks) else np.zeros(0, dtype=bool)
    ks, rows = ks[keep], rows[keep]
    cnt = np.maximum(cnt_all[rows].astype(np.int64), 1)
    op = np.repeat(np.arange(len(ks)), cnt)  # one entry per (op, slot), slots ascending per op
    slot = off_all[rows].astype(np.int64)[op] + np.arange(len(op)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    coll = coll_of[ks][op]
    pos = np.full(len(op), -1, dtype=np.int64)
    size = np.zeros(len(op), dtype=np.int64)
    for c in np.unique(coll).tolist():
        if (g.rank, c) in shares:
            pos[coll == c], size[coll == c] = shares[(g.rank, c)]
    total = total_all[rows].astype(np.int64)[op]
    share = np.where((size != 0) & (total != 0), total // np.where(size != 0, size, 1), 0)
    own = (share > 0) & (pos * share <= slot) & (slot < (pos + 1) * share)
    ok = (size == 0) | own
    for c, sl, k in zip(coll[ok].tolist(), slot[ok].tolist(), ks[op][ok].tolist(), strict=True):
        out.setdefault(c, {}).setdefault(sl, []).append(k)
    return out


def _own_shares(expansions: pa.Table) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (rank, collective) whose output on a rank is its share (reduce-scatter): the rank's
    place in the group and the group's size."""
    if "coll_type" not in expansions.column_names:
        return {}
    rs = expansions.filter(
        pc.and_(
            pc.equal(expansions["coll_type"], "REDUCE_SCATTER"),
            pc.and_(pc.greater_equal(expansions["group_pos"], 0), pc.not_equal(expansions["group_size"], 0)),
        )
    )
    rows = rs.select(["rank", "coll_id", "group_pos", "group_size"]).group_by(
        ["rank", "coll_id"], use_threads=False
    )
    got = rows.aggregate([("group_pos", "last"), ("group_size", "last")])
    cols = (got[k].to_pylist() for k in ("rank", "coll_id", "group_pos_last", "group_size_last"))
    return {(int(r), int(c)): (int(p), int(n)) for r, c, p, n in zip(*cols, strict=True)}


def split_durations(total: int, pieces: int) -> list[int]:
    """``total`` split into ``pieces`` integers that sum to it, the first ones larger by 1."""
    q, rem = divmod(int(total), pieces)
    return [q + 1 if j < rem else q for j in range(pieces)]


def group_slots(slots: Sequence[int], pieces: int) -> list[list[int]]:
    """Consecutive slots (already in arrival order) grouped into ``pieces`` near-equal groups."""
    sizes = split_durations(len(slots), pieces)
    out, at = [], 0
    for s in sizes:
        out.append(list(slots[at : at + s]))
        at += s
    return out


def piece_count(num_slots: int, duration_micros: int, max_pieces: int) -> int:
    """Pieces of a split consumer: one per slot, at most ``max_pieces``, each ≥ 1 µs."""
    return max(1, min(num_slots, max_pieces, int(duration_micros)))
