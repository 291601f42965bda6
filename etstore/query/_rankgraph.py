"""Per-rank dependency graphs and the transforms the finders and the rewrites share.

One :class:`RankGraph` per rank holds its ops as local rows ``0..n-1`` (file order)
and its edges. On it: a topological order, bitset reachability, the overlap and
reorder bypasses (in place, reporting which (communication, compute) pairs they
free), and the chunk consumers of expanded collectives with the arithmetic that
splits them into pieces. :mod:`etstore.query.overlap` runs these to find
opportunities and :mod:`etstore.query.rewrite` runs the same code to apply them,
so what is found is what gets applied.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        pairs = [e for e, k in self.edges.items() if kind is None or k == kind]
        if not pairs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a = np.asarray(pairs, dtype=np.int64)
        return a[:, 0], a[:, 1]

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


def rank_graphs(trace: Trace) -> list[RankGraph]:
    """Split ``trace`` into per-rank graphs over local rows. O(V + E log V)."""
    out = []
    deps = trace.deps
    d_rank = deps["rank"].to_numpy()
    order = np.argsort(d_rank, kind="stable")
    d_rank = d_rank[order]
    d_src = deps["src"].to_numpy()[order]
    d_dst = deps["dst"].to_numpy()[order]
    d_kind = (
        np.asarray(deps["kind"].to_pylist(), dtype=object)[order] if deps.num_rows else np.zeros(0, object)
    )
    types = trace.ops["type"].to_pylist()
    all_ids = trace.ops["id"].to_numpy()
    for r, (a, b) in trace.rank_slices().items():
        ids = all_ids[a:b]
        lo, hi = np.searchsorted(d_rank, r, "left"), np.searchsorted(d_rank, r, "right")
        sorter = np.argsort(ids, kind="stable")
        edges: dict[Edge, str] = {}
        if hi > lo:
            s = sorter[np.searchsorted(ids, d_src[lo:hi], sorter=sorter)]
            d = sorter[np.searchsorted(ids, d_dst[lo:hi], sorter=sorter)]
            for u, v, k in zip(s.tolist(), d.tolist(), d_kind[lo:hi].tolist(), strict=True):
                if (u, v) not in edges or k == "data":  # a data edge wins over a ctrl duplicate
                    edges[(u, v)] = k
        out.append(RankGraph(r, a, ids, types[a:b], edges))
    return out


def topo_order(g: RankGraph) -> list[int]:
    """A topological order of the rank (file order when it already is one).

    Raises
    ------
    RewriteError
        The rank's dependencies form a cycle.
    """
    src, dst = g.arrays()
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


def set_bits(bits: int) -> Iterator[int]:
    """The indices of the set bits of ``bits``, lowest first (one step per set bit, not per bit)."""
    while bits:
        low = bits & -bits
        yield low.bit_length() - 1
        bits ^= low


# ---------------------------------------------------------------- overlap / reorder


@dataclass(frozen=True)
class Applied:
    """What one rank's overlap or reorder rewrite did: ``freed[(comm, compute)]`` pairs."""

    freed: list[tuple[int, int]]  # (comm local row, compute local row) no longer ordered
    moved: dict[int, int]  # comm local row -> local row it moves in front of (reorder)


def _restore_comm_order(g: RankGraph, order: Sequence[int], comm: list[int], before: list[int]) -> None:
    """Add ctrl edges so every pair of comm ops ordered before stays ordered (in place)."""
    after = reach(g, order, comm)
    for v in comm:
        lost = before[v] & ~after[v]
        j = 0
        while lost:
            if lost & 1 and comm[j] != v:
                g.edges.setdefault((comm[j], v), "ctrl")
            lost >>= 1
            j += 1


def overlap_rank(g: RankGraph, only: Collection[int] | None = None) -> Applied:
    """Bypass ctrl edges collective → independent compute on one rank (in place); with
    ``only``, from those collectives (local rows) alone: one opportunity.

    Notes
    -----
    O((V + E) · K / w) for K communication ops on the rank, plus one step per
    bypassed (collective, compute) pair, each pair at most once, times the collective's
    in-degree.
    """
    order = topo_order(g)
    comm = [i for i, t in enumerate(g.types) if t in COMM_TYPES]
    col = {c: j for j, c in enumerate(comm)}
    desc_data = reach(g, order, comm, kind="data")
    desc_all = reach(g, order, comm)
    preds = g.preds()

    def candidate(u: int, v: int) -> bool:
        return (
            g.types[u] == "COMM_COLL_NODE"
            and g.types[v] == "COMP_NODE"
            and not has_bit(desc_data[v], col[u])
            and (only is None or u in only)
        )

    work = [e for e, k in g.edges.items() if k == "ctrl" and candidate(*e)]
    bypassed: set[Edge] = set()
    while work:
        u, v = work.pop()
        if g.edges.get((u, v)) != "ctrl":
            continue
        del g.edges[(u, v)]
        bypassed.add((u, v))
        for p in preds[u]:
            if (p, v) not in g.edges and (p, v) not in bypassed:  # once per pair, as in reorder_rank
                g.edges[(p, v)] = "ctrl"
                if candidate(p, v):
                    work.append((p, v))
    _restore_comm_order(g, order, comm, desc_all)
    desc_new = reach(g, order, comm)
    freed = [
        (comm[j], v)
        for v in range(g.n)
        if g.types[v] == "COMP_NODE"
        for j in set_bits(desc_all[v] & ~desc_new[v])
        if g.types[comm[j]] == "COMM_COLL_NODE"
    ]
    return Applied(freed, {})


def reorder_rank(g: RankGraph, only: Collection[int] | None = None) -> Applied:
    """Bypass ctrl edges independent compute → send/collective on one rank (in place); with
    ``only``, to those sends/collectives (local rows) alone: one opportunity.

    Notes
    -----
    O((V + E) · K / w) for K communication ops on the rank, plus one step per
    bypassed (compute, communication) pair, each pair at most once, times the degrees of
    its endpoints.
    """
    order = topo_order(g)
    comm = [i for i, t in enumerate(g.types) if t in COMM_TYPES]
    col = {c: j for j, c in enumerate(comm)}
    anc_data = reach(g, order, comm, kind="data", backward=True)
    anc_all = reach(g, order, comm, backward=True)
    desc_all = reach(g, order, comm)
    preds, succs = g.preds(), g.succs()

    def candidate(x: int, s: int) -> bool:
        return (
            g.types[x] == "COMP_NODE"
            and g.types[s] in COMM_TYPES
            and not has_bit(anc_data[x], col[s])
            and (only is None or s in only)
        )

    work = [e for e, k in g.edges.items() if k == "ctrl" and candidate(*e)]
    passed: dict[int, list[int]] = {}
    bypassed: set[Edge] = set()
    while work:
        x, s = work.pop()
        if g.edges.get((x, s)) != "ctrl":
            continue
        del g.edges[(x, s)]
        bypassed.add((x, s))
        passed.setdefault(s, []).append(x)
        for b in succs[s]:
            g.edges.setdefault((x, b), "ctrl")  # what waited for S still waits for X
        for p in preds[x]:
            # S already passed P: putting the edge back would only have it bypassed again (once
            # per path from P to X, exponentially many on a diamond-rich rank)
            if (p, s) not in g.edges and (p, s) not in bypassed:
                g.edges[(p, s)] = "ctrl"
                if candidate(p, s):
                    work.append((p, s))
    _restore_comm_order(g, order, comm, desc_all)
    anc_new = reach(g, order, comm, backward=True)
    lost = [
        (j, v) for v in range(g.n) if g.types[v] == "COMP_NODE" for j in set_bits(anc_all[v] & ~anc_new[v])
    ]
    freed = [(comm[j], v) for j, v in sorted(lost)]  # by send, then compute op
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
    return Applied(freed, moved)


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
    (:func:`etstore.query.overlap.expansions_of`), a reduce-scatter's output on a rank is
    only its own share of the chunks (the others pass through it as partial sums, forwarded
    on, that no consumer may read); every other collective leaves every slot a result.

    Notes
    -----
    O(V + E) over the trace.
    """
    off_all = pc.fill_null(trace.ops["chunk_offset"], -1).to_numpy()
    cnt_all = pc.fill_null(trace.ops["msg_chunk_cnt"], 1).to_numpy()
    total_all = pc.fill_null(trace.ops["total_chunk_cnt"], 0).to_numpy()
    own = _own_slots(expansions)
    by_rank: dict[int, dict[int, int]] = {}
    for r, i, c in zip(
        expansions["rank"].to_pylist(),
        expansions["id"].to_pylist(),
        expansions["coll_id"].to_pylist(),
        strict=True,
    ):
        by_rank.setdefault(int(r), {})[int(i)] = int(c)
    out: list[ChunkConsumer] = []
    for g in graphs:
        of = by_rank.get(g.rank)
        if not of:
            continue
        local_of = {k: of[int(i)] for k, i in enumerate(g.ids.tolist()) if int(i) in of}
        preds = g.preds()
        writers_of: dict[int, dict[int, list[int]]] = {}
        for k, c in local_of.items():
            row = g.first + k
            if g.types[k] == "COMM_SEND_NODE" or off_all[row] < 0:
                continue
            keep = own.get((g.rank, c))
            for slot in range(int(off_all[row]), int(off_all[row]) + max(int(cnt_all[row]), 1)):
                if keep is not None and not keep(slot, int(total_all[row])):
                    continue
                writers_of.setdefault(c, {}).setdefault(slot, []).append(k)
        for v in range(g.n):
            if v in local_of or g.types[v] != "COMP_NODE":
                continue
            inside = [u for u in preds[v] if u in local_of]
            colls = {local_of[u] for u in inside}
            if len(colls) != 1:
                continue
            c = colls.pop()
            writers = writers_of.get(c, {})
            if len(writers) >= 2:
                out.append(ChunkConsumer(g.rank, c, v, writers, sorted(inside)))
    return out


def _own_slots(expansions: pa.Table) -> dict[tuple[int, int], Callable[[int, int], bool]]:
    """Per (rank, collective): whether slot ``s`` of ``total`` is the rank's own output, for
    the collectives whose output is a share (reduce-scatter)."""
    if "coll_type" not in expansions.column_names:
        return {}
    out: dict[tuple[int, int], Callable[[int, int], bool]] = {}
    for r, c, t, p, n in zip(
        *(expansions[k].to_pylist() for k in ("rank", "coll_id", "coll_type", "group_pos", "group_size")),
        strict=True,
    ):
        if t == "REDUCE_SCATTER" and p is not None and p >= 0 and n:

            def mine(s: int, total: int, p: int = int(p), n: int = int(n)) -> bool:
                share = total // n if total else 0
                return share > 0 and p * share <= s < (p + 1) * share

            out[(int(r), int(c))] = mine
    return out


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
