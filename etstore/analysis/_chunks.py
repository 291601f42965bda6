"""Chunk consumers of expanded collectives, and the arithmetic that splits them into pieces.

A compute op consuming an expanded collective's output could start when its first chunks
land (``docs/overlap.md``, *chunk*). :func:`rank_chunks` finds a rank's consumers and which
expansion ops write each chunk slot, as arrays over the whole rank;
:func:`chunk_consumers` gives them as :class:`ChunkConsumer` objects (what the rewrite
splits) and :func:`chunk_timelines` when each could start and end split (what the finder
estimates). Both used to be loops per consumer and per written slot, with a scan of the
rank's writers per collective: most of the chunk finder's time on a 6M-op trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.analysis._rankgraph import RankGraph
from etstore.analysis.split import SplitCost
from etstore.model import Trace

__all__ = [
    "ChunkConsumer",
    "ChunkInputs",
    "RankChunks",
    "Timeline",
    "chunk_consumers",
    "chunk_timelines",
    "group_slots",
    "piece_count",
    "rank_chunks",
    "split_durations",
]


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


@dataclass(frozen=True)
class RankChunks:
    """One rank's chunk consumers as arrays of local rows (:func:`rank_chunks`)."""

    rank: int
    consumer: np.ndarray  # consumers, ascending
    coll: np.ndarray  # uint64: the collective (parent trace id) each one's expansion expands
    inside: np.ndarray  # the expansion predecessors of all consumers, by consumer then row
    inside_at: np.ndarray  # consumer i's are inside[inside_at[i] : inside_at[i + 1]]
    outside: np.ndarray  # the consumers' other predecessors (duplicates possible)
    outside_of: np.ndarray  # index of the consumer each of ``outside`` precedes
    w_coll: np.ndarray  # the writers of those collectives' slots (a reduce-scatter's own share
    w_slot: np.ndarray  # only): collective, slot and local row, by row, then slot
    w_row: np.ndarray

    def only(self, keep: np.ndarray) -> RankChunks:
        """These with only the consumers ``keep`` marks (the writers as they are)."""
        idx = np.flatnonzero(keep)
        lo, hi = self.inside_at[idx], self.inside_at[idx + 1]
        inside_at = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=inside_at[1:])
        at = np.repeat(lo, hi - lo) + np.arange(inside_at[-1]) - np.repeat(inside_at[:-1], hi - lo)
        renum = np.full(len(self.consumer), -1, dtype=np.int64)
        renum[idx] = np.arange(len(idx))
        pre = renum[self.outside_of] >= 0
        return replace(
            self,
            consumer=self.consumer[idx],
            coll=self.coll[idx],
            inside=self.inside[at],
            inside_at=inside_at,
            outside=self.outside[pre],
            outside_of=renum[self.outside_of[pre]],
        )


class ChunkInputs:
    """What :func:`rank_chunks` reads of the whole trace, read once: the chunk columns of
    ``trace.ops`` and the expansion lineage (``rank``, ``id``, ``coll_id``, and optionally
    ``coll_type``, ``group_pos``, ``group_size``) sorted by rank."""

    def __init__(self, trace: Trace, expansions: pa.Table) -> None:
        ops = trace.ops
        self.off = pc.fill_null(ops["chunk_offset"], -1).to_numpy()
        self.cnt = pc.fill_null(ops["msg_chunk_cnt"], 1).to_numpy()
        self.total = pc.fill_null(ops["total_chunk_cnt"], 0).to_numpy()
        self.shares = _own_shares(expansions)
        e_rank = expansions["rank"].to_numpy()
        by = np.argsort(e_rank, kind="stable")
        self.e_rank = e_rank[by]
        self.e_id = expansions["id"].to_numpy()[by]
        self.e_coll = expansions["coll_id"].to_numpy()[by]

    def of_rank(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """The rank's expansion ops' ids and the collective each expands."""
        key = self.e_rank.dtype.type(rank)  # a Python int would cast the whole column, every rank
        lo, hi = np.searchsorted(self.e_rank, key, "left"), np.searchsorted(self.e_rank, key, "right")
        return self.e_id[lo:hi], self.e_coll[lo:hi]


def rank_chunks(
    inputs: ChunkInputs,
    rank: int,
    first: int,
    ids: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    is_comp: np.ndarray,
    is_send: np.ndarray,
) -> RankChunks | None:
    """A rank's chunk consumers (None: it has none): ops ``ids`` (rows ``first`` on of the
    trace), edges ``src -> dst`` (local rows; duplicates allowed), which ops are compute ops and
    which sends.

    A consumer is a ``COMP_NODE`` outside every expansion with a predecessor in exactly one
    expansion whose writers cover at least two of the rank's output slots (``chunk_offset``
    .. ``+ msg_chunk_cnt``). With columns ``coll_type``, ``group_pos`` and ``group_size``
    (:func:`etstore.app.overlap.expansions_of`), a reduce-scatter's output on a rank is only
    its own share of the chunks (the others pass through it as partial sums, forwarded on,
    that no consumer may read); every other collective leaves every slot a result.

    Notes
    -----
    O(V + E log E) for the rank, in numpy.
    """
    n = len(ids)
    e_id, e_coll = inputs.of_rank(rank)
    if not len(e_id) or not n:
        return None
    # the rank's expansion ops as local rows, and the collective each expands
    sorter = np.argsort(ids, kind="stable")
    at = np.minimum(np.searchsorted(ids, e_id, sorter=sorter), n - 1)
    hit = ids[sorter[at]] == e_id
    is_exp = np.zeros(n, dtype=bool)
    is_exp[sorter[at[hit]]] = True
    coll_of = np.zeros(n, dtype=np.uint64)
    coll_of[sorter[at[hit]]] = e_coll[hit]
    # expansion op -> compute op outside, each edge once: by consumer, then predecessor
    into = is_exp[src] & ~is_exp[dst] & is_comp[dst]
    key = np.unique(dst[into].astype(np.int64) * n + src[into])
    ev, eu = key // n, key % n
    ec = coll_of[eu]
    by = np.lexsort((ec, ev))
    pv, pc_ = ev[by], ec[by]
    new = np.ones(len(pv), dtype=bool)
    new[1:] = (pv[1:] != pv[:-1]) | (pc_[1:] != pc_[:-1])
    pv, pc_ = pv[new], pc_[new]  # each (consumer, collective) once
    cand, start, count = np.unique(pv, return_index=True, return_counts=True)
    one = count == 1  # a predecessor in exactly one expansion
    cand, coll = cand[one], pc_[start[one]]
    w_coll, w_slot, w_row = _writers(inputs, rank, first, is_exp, is_send, coll_of, np.unique(coll))
    # consumers whose collective's writers cover two slots or more
    _, g_coll, _ = _slot_groups(w_coll, w_slot)
    colls, slots = np.unique(g_coll, return_counts=True)
    at = np.minimum(np.searchsorted(colls, coll), max(len(colls) - 1, 0))
    keep = (slots[at] >= 2) & (colls[at] == coll) if len(colls) else np.zeros(len(coll), dtype=bool)
    if not keep.any():
        return None
    consumer, coll = cand[keep], coll[keep]
    sel = np.isin(ev, consumer)
    inside_at = np.zeros(len(consumer) + 1, dtype=np.int64)
    count = np.searchsorted(ev, consumer, "right") - np.searchsorted(ev, consumer, "left")
    np.cumsum(count, out=inside_at[1:])
    of = np.full(n, -1, dtype=np.int64)
    of[consumer] = np.arange(len(consumer))
    pre = (of[dst] >= 0) & ~is_exp[src]
    return RankChunks(rank, consumer, coll, eu[sel], inside_at, src[pre], of[dst[pre]], w_coll, w_slot, w_row)


def _slot_groups(w_coll: np.ndarray, w_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The writers by (collective, slot): their order, and each group's collective and first
    place in that order."""
    by = np.lexsort((w_slot, w_coll))
    c, s = w_coll[by], w_slot[by]
    new = np.ones(len(by), dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (s[1:] != s[:-1])
    starts = np.flatnonzero(new)
    return by, c[starts], starts


def _writers(
    inputs: ChunkInputs,
    rank: int,
    first: int,
    is_exp: np.ndarray,
    is_send: np.ndarray,
    coll_of: np.ndarray,
    want: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per collective of ``want``, its rank's output slots and the expansion ops (local rows)
    that write each, as ``(collective, slot, row)`` arrays: receives and reductions with a
    ``chunk_offset``, keeping a reduce-scatter's own share only."""
    ks = np.flatnonzero(is_exp & np.isin(coll_of, want))
    rows = first + ks
    keep = ~is_send[ks] & (inputs.off[rows] >= 0)
    ks, rows = ks[keep], rows[keep]
    cnt = np.maximum(inputs.cnt[rows].astype(np.int64), 1)
    op = np.repeat(np.arange(len(ks)), cnt)  # one entry per (op, slot), slots ascending per op
    slot = inputs.off[rows].astype(np.int64)[op] + np.arange(len(op)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    coll = coll_of[ks][op]
    s_rank, s_coll, s_pos, s_size = inputs.shares
    key = s_rank.dtype.type(rank)
    lo, hi = np.searchsorted(s_rank, key, "left"), np.searchsorted(s_rank, key, "right")
    pos = np.full(len(op), -1, dtype=np.int64)
    size = np.zeros(len(op), dtype=np.int64)
    if hi > lo:  # the collectives whose output here is the rank's share
        at = np.minimum(np.searchsorted(s_coll[lo:hi], coll), hi - lo - 1)
        hit = s_coll[lo:hi][at] == coll
        pos[hit], size[hit] = s_pos[lo:hi][at[hit]], s_size[lo:hi][at[hit]]
    total = inputs.total[rows].astype(np.int64)[op]
    share = np.where((size != 0) & (total != 0), total // np.where(size != 0, size, 1), 0)
    own = (share > 0) & (pos * share <= slot) & (slot < (pos + 1) * share)
    ok = (size == 0) | own
    return coll[ok], slot[ok], ks[op][ok]


def _own_shares(expansions: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (rank, collective) whose output on a rank is its share (reduce-scatter): the rank's
    place in the group and the group's size; ``rank, coll_id, pos, size`` arrays sorted by
    rank, then collective."""
    none = np.zeros(0, dtype=np.int64)
    if "coll_type" not in expansions.column_names:
        return none, none.astype(np.uint64), none, none
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
    rank = got["rank"].to_numpy().astype(np.int64)
    coll = got["coll_id"].to_numpy().astype(np.uint64)
    by = np.lexsort((coll, rank))
    pos = got["group_pos_last"].to_numpy().astype(np.int64)
    size = got["group_size_last"].to_numpy().astype(np.int64)
    return rank[by], coll[by], pos[by], size[by]


def chunk_consumers(trace: Trace, graphs: Sequence[RankGraph], expansions: pa.Table) -> list[ChunkConsumer]:
    """Consumers of expanded collectives that could start per chunk, on ``graphs``, by rank
    then consumer (:func:`rank_chunks`). ``expansions`` has columns ``rank``, ``id`` (an op of
    ``trace``) and ``coll_id`` (the collective it expands, in the parent trace).

    Notes
    -----
    O(V + E log E) over the trace, plus each consumer's slots.
    """
    if expansions.num_rows == 0:
        return []
    inputs = ChunkInputs(trace, expansions)
    out: list[ChunkConsumer] = []
    for g in graphs:
        types = np.asarray(g.types, dtype=object)
        src, dst = g.arrays()
        rc = rank_chunks(
            inputs, g.rank, g.first, g.ids, src, dst, types == "COMP_NODE", types == "COMM_SEND_NODE"
        )
        if rc is None:
            continue
        wanted = set(rc.coll.tolist())
        writers: dict[int, dict[int, list[int]]] = {}
        for c, sl, k in zip(rc.w_coll.tolist(), rc.w_slot.tolist(), rc.w_row.tolist(), strict=True):
            if c in wanted:
                writers.setdefault(c, {}).setdefault(sl, []).append(k)
        at = rc.inside_at.tolist()
        inside = rc.inside.tolist()
        for i, (v, c) in enumerate(zip(rc.consumer.tolist(), rc.coll.tolist(), strict=True)):
            out.append(ChunkConsumer(g.rank, c, v, writers[c], inside[at[i] : at[i + 1]]))
    return out


@dataclass(frozen=True)
class Timeline:
    """A split consumer's estimate (:func:`chunk_timelines`): its slots in arrival order with
    when each lands, the slot groups of its pieces, when the first piece starts and the last
    ends."""

    consumer: int  # index into the rank's consumers
    chunks: list[list[float]]  # [slot, arrival ns], by arrival then slot
    pieces: list[list[int]]
    start_ns: float
    end_ns: float
    gain_ns: float  # how much earlier it ends than it did


def chunk_timelines(
    rc: RankChunks,
    end_of: np.ndarray,
    duration_us: np.ndarray,
    splits: np.ndarray,
    *,
    max_pieces: int,
    unit_ns: float,
    split: SplitCost,
) -> list[Timeline]:
    """When each consumer of ``rc`` (its duration ``duration_us``, whether it ``splits``)
    could start and end split into pieces, with the rank's ops ending at ``end_of`` (local
    rows): each piece starts once its chunks have landed and the piece before it has ended
    (the first, once its other inputs have; the last, once every expansion input has).
    Only the consumers split in two pieces or more that would end earlier. All consumers at
    once, a step per piece: the arithmetic of one consumer at a time (``docs/overlap.md``,
    *chunk*) on arrays, in the same order, so the same floats."""
    # when each (collective, slot) lands: its last writer's end
    by, g_coll, starts = _slot_groups(rc.w_coll, rc.w_slot)
    arrival = np.maximum.reduceat(end_of[rc.w_row[by]], starts)
    g_slot = rc.w_slot[by][starts]
    colls, c_first, c_count = np.unique(g_coll, return_index=True, return_counts=True)
    at = np.searchsorted(colls, rc.coll)
    nslots = c_count[at]
    k = np.maximum(1, np.minimum(np.minimum(nslots, max_pieces), duration_us.astype(np.int64)))
    live = np.flatnonzero((k >= 2) & splits)
    if not len(live):
        return []
    nslots, k, d_us = nslots[live], k[live], duration_us[live].astype(np.int64)
    # each live consumer's slots, by arrival then slot
    offs = np.cumsum(nslots) - nslots
    owner = np.repeat(np.arange(len(live)), nslots)
    idx = np.repeat(c_first[at[live]], nslots) + np.arange(len(owner)) - np.repeat(offs, nslots)
    order = np.lexsort((g_slot[idx], arrival[idx], owner))
    slot, land = g_slot[idx][order], arrival[idx][order]
    # the latest end among the consumer's other inputs (0 without), and its expansion inputs
    e = np.full(len(rc.consumer), -np.inf)
    np.maximum.at(e, rc.outside_of, end_of[rc.outside])
    e = np.where(np.isneginf(e), 0.0, e)[live]
    inside_end = np.maximum.reduceat(end_of[rc.inside], rc.inside_at[:-1])[live]
    q, rem = nslots // k, nslots % k
    first_start = np.zeros(len(live))
    for j in range(int(k.max())):
        on = j < k
        lo = j * q + np.minimum(j, rem)
        last = offs + lo + q + (j < rem) - 1  # slots ascend in arrival: a group's last lands last
        start = np.maximum(e, land[np.where(on, last, offs)])
        start = np.where(on & (j == k - 1), np.maximum(start, inside_end), start)
        if j == 0:
            first_start = start
        e = np.where(on, start + split.piece(d_us, k, j) * unit_ns, e)
    gain = end_of[rc.consumer[live]] - e
    slots, lands, ks = slot.tolist(), land.tolist(), k.tolist()
    at_, ns, who = offs.tolist(), nslots.tolist(), live.tolist()
    first_ns, end_ns, gain_ns = first_start.tolist(), e.tolist(), gain.tolist()
    out = []
    for i in np.flatnonzero(gain > 0).tolist():
        a, b = at_[i], at_[i] + ns[i]
        mine = slots[a:b]
        chunks = [[s, x] for s, x in zip(mine, lands[a:b], strict=True)]
        out.append(Timeline(who[i], chunks, group_slots(mine, ks[i]), first_ns[i], end_ns[i], gain_ns[i]))
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
