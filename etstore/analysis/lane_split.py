"""Chunk-level overlap on an expanded recording: a consumer split into per-chunk pieces in its lane.

``etstore expand`` of a recording turns a collective into its algorithm's sends, receives and
reductions, and records which chunks each consumer of it reads and which op wrote each
chunk's final value (``params["chunk_reads"]``, :mod:`etstore.algorithms._chunk_reads`). A
consumer that reads chunks landing at different times (a ring all-reduce finishes the rank's
own chunk a step before the others) can start on the first ones if it splits along the bytes
the chunks cut: an elementwise op, a GEMM along the rows of the chunked operand. An op that
reduces across them (softmax, a norm: :data:`~etstore.analysis.split.NO_SPLIT`) does not.

The split, made in the consumer ``X``'s lane (its CPU thread or GPU stream):

* pieces ``X.chunk1 .. X.chunk{k-1}`` are new ops; ``X`` keeps its id, every dependency it had
  and the last piece's time. Piece ``j`` reads group ``j`` of the chunks in arrival order: it
  depends on their final writers, and on every other input of ``X`` (what it reads, and the
  readers of what it overwrites). A consumer that writes into the collective's buffer (in
  place) also waits for the algorithm's sends of the chunks it writes.
* the pieces go into the lane where it began waiting for the collective: in front of the op
  held by a ``wait`` on it (a ``wait_tensor``), else, when the lane ran inside the collective
  (it left from the collective's last op), right after the op it entered by. So the lane
  waits for chunk 1, works on it, waits for chunk 2, ... then for the whole collective as
  recorded. No dependency is dropped; a split that would close a cycle (the lane runs, between
  that place and ``X``, something ``X`` needs) is not proposed.

What a piece costs is :class:`~etstore.analysis.split.SplitCost` (a launch per piece after the
first, an interference factor beside communication), the op's time shared by the bytes each
piece reads. The gain is what the replay says (:mod:`etstore.app.overlap` measures each
opportunity as :func:`etstore.analysis.hoists.find_hoists` does).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.algorithms._chunk_reads import NODE_ATTR, READS_COLUMNS
from etstore.analysis._rowwise import map_cuts, rowwise
from etstore.analysis.hoists import measure_by_place
from etstore.analysis.lanes import Lanes, _reach, lanes_of, op_times
from etstore.analysis.split import SplitCost
from etstore.errors import RewriteError
from etstore.model import Trace, decode_attrs, deps_table, op_row_map, op_rows
from etstore.progress import ProgressFn
from etstore.sim.config import SimConfig
from etstore.sim.replay import Replay, replay
from etstore.topology import Topology

__all__ = [
    "ChunkSplit",
    "SplitOpportunity",
    "apply_splits",
    "find_splits",
    "split_candidates",
    "splits_from_detail",
]

_WALK = 512
"""At most this many lane ops are looked at behind a consumer for where its lane began waiting
(and ahead of it for the next op of a chain)."""

_CHAIN = 4
"""At most this many ops after a split consumer are cut with it."""


@dataclass(frozen=True)
class ChunkSplit:
    """Consumer ``op`` (a row) split into pieces; ``groups`` are the writer rows each piece waits
    for in arrival order (the last piece is ``op`` itself), ``after`` the sends each must follow,
    ``pieces_us`` their times, ``at`` the lane row the pieces go after (-1: before ``before``)
    and ``before`` the lane row they go in front of (-1: after ``at``)."""

    op: int
    block: int
    groups: tuple[tuple[int, ...], ...]
    after: tuple[tuple[int, ...], ...]
    pieces_us: tuple[int, ...]
    at: int
    before: int
    arrival_ns: tuple[float, ...]
    estimate_ns: float
    chain: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (row, pieces_us) of each op cut after it

    def detail(self, trace: Trace) -> dict[str, Any]:
        """The split by op ids (what an opportunity's ``detail`` keeps, and applies back)."""
        ids = trace.ops["id"].to_numpy()
        rank = int(trace.ops["rank"][self.op].as_py())
        return {
            "rank": rank,
            "op": int(ids[self.op]),
            "block": self.block,
            "op_us": int(trace.ops["duration_micros"][self.op].as_py() or 0),
            "at": int(ids[self.at]) if self.at >= 0 else None,
            "before": int(ids[self.before]) if self.before >= 0 else None,
            "pieces": [
                {
                    "writers": [int(ids[w]) for w in g],
                    "after": [int(ids[s]) for s in a],
                    "us": us,
                    "arrival_ns": t,
                }
                for g, a, us, t in zip(self.groups, self.after, self.pieces_us, self.arrival_ns, strict=True)
            ],
            "chain": [
                {
                    "op": int(ids[y]),
                    "op_us": int(trace.ops["duration_micros"][y].as_py() or 0),
                    "pieces_us": list(us),
                }
                for y, us in self.chain
            ],
            "estimate_ns": self.estimate_ns,
        }


@dataclass(frozen=True)
class SplitOpportunity:
    """One consumer split on every rank where it applies, and what the replay says it gains."""

    splits: tuple[ChunkSplit, ...]
    consumer: str  # the split op's name
    gain_ns: float  # makespan taken off on top of the opportunities before it
    alone_gain_ns: float  # makespan taken off with it alone applied
    estimate_ns: float

    def detail(self, trace: Trace, cost: SplitCost) -> dict[str, Any]:
        """What is split, by op id per rank, and the numbers (the ``detail`` JSON of its row)."""
        return {
            "consumer": self.consumer,
            "splits": [s.detail(trace) for s in self.splits],
            "split_cost": cost.to_params(),
            "estimate_ns": self.estimate_ns,
            "alone_gain_ns": self.alone_gain_ns,
            "measured": True,
        }


def find_splits(
    trace: Trace,
    *,
    topo: Topology | None = None,
    config: SimConfig | None = None,
    cost: SplitCost | None = None,
    max_pieces: int = 8,
    limit: int = 32,
    progress: ProgressFn | None = None,
    base: Replay | None = None,
) -> tuple[Replay, list[SplitOpportunity]]:
    """The replay of an expanded recording and its chunk opportunities, measured as
    :func:`~etstore.analysis.hoists.find_hoists` measures hoists: the same consumer on every
    rank is one opportunity, each replayed on top of the ones taken before it (and alone)."""
    base = base or replay(trace, topo, config=config)
    start, end = op_times(trace, base.result.ops)
    lanes = lanes_of(trace)
    found = split_candidates(trace, lanes, start, end, cost=cost, max_pieces=max_pieces)
    measured = measure_by_place(
        trace,
        base,
        lanes,
        found,
        row=lambda sp: sp.op,
        estimate=lambda sp: sp.estimate_ns,
        apply=lambda sps: apply_splits(trace, lanes, sps),
        limit=limit,
        topo=topo,
        config=config,
        progress=progress,
    )
    return base, [SplitOpportunity(tuple(sps), n, g, a, e) for n, sps, g, a, e in measured]


def _reads(trace: Trace) -> dict[str, np.ndarray] | None:
    reads = trace.params.get("chunk_reads")
    if not reads or not reads.get("op") or any(c not in reads for c in READS_COLUMNS):
        return None
    return {c: np.asarray(reads[c], dtype=np.int64) for c in READS_COLUMNS}


def split_candidates(
    trace: Trace,
    lanes: Lanes,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    *,
    cost: SplitCost | None = None,
    max_pieces: int = 8,
) -> list[ChunkSplit]:
    """Splits of the consumers of an expanded recording whose chunks land at different times,
    largest estimate first (module docstring).

    ``start_ns``/``end_ns`` are each row's replayed times. The estimate is how much earlier
    the consumer's first piece could start (its start less its first chunks' arrival), at most
    the time of the pieces before the last.
    """
    reads = _reads(trace)
    blocks = trace.params.get("collective_blocks") or {}
    if reads is None or not blocks.get("rank"):
        return []
    cost = cost or SplitCost()
    ops = trace.ops
    x_rows = op_rows(ops, reads["rank"], reads["op"])
    w_rows = op_rows(ops, reads["rank"], reads["writer"])
    names = ops["name"].to_pylist()
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    types = ops["type"].to_numpy(zero_copy_only=False)
    chunk_lo = ops["chunk_offset"].to_numpy(zero_copy_only=False)
    chunk_n = ops["msg_chunk_cnt"].to_numpy(zero_copy_only=False)
    into = np.argsort(lanes.dst, kind="stable")
    in_starts = np.searchsorted(lanes.dst[into], np.arange(trace.num_ops + 1))
    attrs = ops["attrs"]

    def node_of(row: int) -> str | None:
        value = decode_attrs(attrs[row].as_py()).get(NODE_ATTR)
        return value if isinstance(value, str) else None

    by: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, (x, b) in enumerate(zip(x_rows.tolist(), reads["block"].tolist(), strict=True)):
        by[(x, b)].append(k)
    out: list[ChunkSplit] = []
    for (x, b), ks in by.items():
        if lanes.lane[x] < 0 or not cost.splits(names[x]) or dur[x] < 2:
            continue
        first, count = int(blocks["first_id"][b]), int(blocks["ops"][b])
        r = int(blocks["rank"][b])
        members = set(
            op_rows(ops, np.full(count, r), np.arange(first, first + count, dtype=np.uint64)).tolist()
        )
        arrive: dict[int, float] = {}
        nbytes: dict[int, int] = defaultdict(int)
        slots: dict[int, set[int]] = defaultdict(set)
        spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for k in ks:
            w = int(w_rows[k])
            arrive[w] = float(end_ns[w])
            nbytes[w] += int(reads["hi"][k] - reads["lo"][k])
            slots[w].add(int(reads["slot"][k]))
            spans[w].append((int(reads["lo"][k]), int(reads["hi"][k])))
        times = sorted(set(arrive.values()))
        if len(times) < 2 or start_ns[x] - times[0] < 1000.0:
            continue
        kmax = int(min(max_pieces, dur[x], len(times)))
        if kmax < 2:
            continue
        bins = np.array_split(np.asarray(times), kmax)
        groups = [tuple(sorted(w for w, t in arrive.items() if bn[0] <= t <= bn[-1])) for bn in bins]
        weights = [sum(nbytes[w] for w in g) for g in groups]
        pieces = cost.pieces(int(dur[x]), len(groups), weights)
        writes = bool(reads["writes"][ks[0]])
        after = []
        for g in groups:
            s = set().union(*(slots[w] for w in g))
            after.append(
                tuple(
                    sorted(
                        m
                        for m in members
                        if writes
                        and types[m] == "COMM_SEND_NODE"
                        and chunk_lo[m] is not None
                        and any(int(chunk_lo[m]) <= q < int(chunk_lo[m]) + int(chunk_n[m] or 1) for q in s)
                    )
                )
            )
        at, before = _place(x, members, lanes, start_ns, in_starts, into)
        if (at, before) == (-1, -1):
            continue
        need = {
            int(lanes.src[e]) for e in into[in_starts[x] : in_starts[x + 1]].tolist() if not lanes.on_lane[e]
        }
        need -= members
        need |= set(groups[0]) | set(after[0])
        later = _after(at, before, lanes)
        if any(later[q] for q in need - {x}):
            continue  # X itself would wait for what the lane runs after its pieces
        storages = {int(v) for v in reads["storage"][ks].tolist()}
        chain: list[tuple[int, tuple[int, ...]]] = []
        if len(storages) == 1:
            pieces_at = [sorted(iv for w in g for iv in spans[w]) for g in groups]
            cut = _chain(x, storages.pop(), pieces_at, names, node_of, lanes, dur, cost)
            ahead_ns, gap_ns = 1000.0 * sum(pieces[:-1]), times[-1] - times[0]
            for y, us in cut:  # as far as the pieces ahead fit the wait and close no cycle
                ahead_ns += 1000.0 * sum(us[:-1])
                reads_y = {
                    int(lanes.src[e])
                    for e in into[in_starts[y] : in_starts[y + 1]].tolist()
                    if not lanes.on_lane[e]
                } - {x, *(c for c, _ in chain)}
                if ahead_ns > gap_ns or any(later[q] for q in reads_y):
                    break
                chain.append((y, us))
        ahead_us = sum(pieces[:-1]) + sum(sum(us[:-1]) for _, us in chain)
        gain = min(float(start_ns[x]) - times[0], 1000.0 * ahead_us)
        out.append(
            ChunkSplit(
                x, int(b), tuple(groups), tuple(after), tuple(pieces), at, before,
                tuple(float(bn[-1]) for bn in bins), gain, tuple(chain),
            )
        )  # fmt: skip
    out.sort(key=lambda s: -s.estimate_ns)
    return out


def _chain(
    x: int,
    storage: int,
    pieces_at: list[list[tuple[int, int]]],
    names: Sequence[str],
    node_of: Callable[[int], str | None],
    lanes: Lanes,
    dur: np.ndarray,
    cost: SplitCost,
) -> list[tuple[int, tuple[int, ...]]]:
    """The ops after ``x`` in its lane that its pieces' cuts reach (:mod:`._rowwise`): each is
    the first after the one before it that reads that one's whole output and cuts along it
    where that one's pieces cut it (ops between, a wrapper reading it, stay where they are);
    ``(row, pieces_us)`` of each, at most :data:`_CHAIN` of them."""
    lo = min(a for iv in pieces_at for a, _ in iv)
    hi = max(b for iv in pieces_at for _, b in iv)
    read, cur = (storage, lo, hi), x
    out: list[tuple[int, tuple[int, ...]]] = []
    for _ in range(_CHAIN):
        got = rowwise(names[cur], node_of(cur), read)
        if got is None:
            break
        grain, o = got
        mapped = []
        for iv in pieces_at:
            cuts = map_cuts([v - read[1] for pair in iv for v in pair], read[2] - read[1], o[2] - o[1], grain)
            if cuts is None:
                return out
            mapped.append([(o[1] + cuts[i], o[1] + cuts[i + 1]) for i in range(0, len(cuts), 2)])
        edges = lanes.out_order[lanes.out_starts[cur] : lanes.out_starts[cur + 1]].tolist()
        feeds = {int(lanes.dst[e]) for e in edges if lanes.kind[e] == "data"}
        y, steps = int(lanes.next[cur]), 0
        while (
            y >= 0
            and steps < _WALK
            and not (y in feeds and cost.splits(names[y]) and rowwise(names[y], node_of(y), o))
        ):
            y, steps = int(lanes.next[y]), steps + 1  # the next op that reads it whole and cuts along it
        if y < 0 or steps >= _WALK or dur[y] < len(mapped):
            break
        weights = [sum(b - a for a, b in iv) for iv in mapped]
        out.append((y, tuple(cost.pieces(int(dur[y]), len(mapped), weights))))
        cur, read, pieces_at = y, o, mapped
    return out


def _place(
    x: int, members: set[int], lanes: Lanes, start_ns: np.ndarray, in_starts: np.ndarray, into: np.ndarray
) -> tuple[int, int]:
    """Where in ``x``'s lane its lane began waiting for the collective: ``(at, -1)`` to go
    right after the lane op ``at`` it entered the collective by, ``(-1, before)`` to go in
    front of the op held by a wait on it, ``(-1, x)`` when nothing held the lane."""
    first_start = min(float(start_ns[m]) for m in members)
    place = (-1, x)
    o, steps = x, 0
    while o >= 0 and steps < _WALK:
        p = int(lanes.prev[o])
        if p in members:  # the lane ran inside the collective and left from its last op
            entry = [m for m in members if lanes.prev[m] >= 0 or lanes.next[m] >= 0]
            entered = [m for m in entry if m != p and lanes.next[m] < 0]
            return (entered[0], -1) if entered else (-1, -1)
        edges = into[in_starts[o] : in_starts[o + 1]]
        if any(int(lanes.src[e]) in members and lanes.kind[e] != "data" for e in edges.tolist()):
            place = (-1, o)  # held by a wait on the collective
        if p < 0 or start_ns[p] < first_start:
            break
        o, steps = p, steps + 1
    return place


def _after(at: int, before: int, lanes: Lanes) -> np.ndarray:
    """Per row: whether the lane's place for the pieces (after ``at``, else in front of
    ``before``) comes before it through any edges, so a piece must not wait for it."""
    seen = np.zeros(len(lanes.lane), dtype=bool)
    start = int(lanes.next[at]) if at >= 0 else before
    if start >= 0:
        _reach(seen, start, lanes, np.ones(len(lanes.src), dtype=bool))
    return seen


def splits_from_detail(trace: Trace, detail: Mapping[str, Any]) -> list[ChunkSplit]:
    """The splits an opportunity's ``detail`` names, as rows of ``trace``.

    Raises
    ------
    KeyError
        An op the detail names is not in ``trace``.
    """
    rows = op_row_map(trace.ops)
    out = []
    for s in detail["splits"]:
        r = int(s["rank"])
        row = rows[(r, int(s["op"]))]
        out.append(
            ChunkSplit(
                row,
                int(s["block"]),
                tuple(tuple(rows[(r, int(w))] for w in p["writers"]) for p in s["pieces"]),
                tuple(tuple(rows[(r, int(w))] for w in p["after"]) for p in s["pieces"]),
                tuple(int(p["us"]) for p in s["pieces"]),
                rows[(r, int(s["at"]))] if s.get("at") is not None else -1,
                rows[(r, int(s["before"]))] if s.get("before") is not None else -1,
                tuple(float(p.get("arrival_ns", 0.0)) for p in s["pieces"]),
                float(s.get("estimate_ns", 0.0)),
                tuple(
                    (rows[(r, int(c["op"]))], tuple(int(u) for u in c["pieces_us"]))
                    for c in s.get("chain", [])
                ),
            )
        )
    return out


def _block_rows(trace: Trace, block: int) -> set[int]:
    """Rows of the ops of entry ``block`` of ``params["collective_blocks"]``."""
    blocks = trace.params["collective_blocks"]
    first, count = int(blocks["first_id"][block]), int(blocks["ops"][block])
    ids = np.arange(first, first + count, dtype=np.uint64)
    return set(op_rows(trace.ops, np.full(count, int(blocks["rank"][block])), ids).tolist())


def apply_splits(
    trace: Trace, lanes: Lanes, splits: Sequence[ChunkSplit], *, name: str | None = None
) -> Trace:
    """``trace`` with each consumer split into its pieces (module docstring).

    New pieces get fresh ids after the rank's largest and names ``<name>.chunk<j>``; the
    consumer keeps its id and every dependency, with the last piece's time, and follows its
    pieces (what reads its result reads theirs). ``params["split_pieces"]`` says which op each
    piece comes from (``rank``, ``id``, ``op``).

    Raises
    ------
    RewriteError
        A consumer split twice, an op that does not split, or pieces that do not read the
        chunks their consumer reads.
    """
    _check(trace, splits)
    ops = trace.ops
    ids = ops["id"].to_numpy().astype(np.int64)
    ranks = ops["rank"].to_numpy().astype(np.int64)
    names = ops["name"].to_pylist()
    next_id = {int(r): int(ids[ranks == r].max()) + 1 for r in np.unique(ranks).tolist()}
    into = np.argsort(lanes.dst, kind="stable")
    in_starts = np.searchsorted(lanes.dst[into], np.arange(trace.num_ops + 1))
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64).copy()
    lane_kind = {
        int(d): str(k) for d, k in zip(lanes.dst[lanes.on_lane], lanes.kind[lanes.on_lane], strict=True)
    }
    new_rows: list[int] = []  # the row each new op copies
    new_ids: list[int] = []
    new_names: list[str] = []
    new_dur: list[int] = []
    edges: list[tuple[int, int, int, str]] = []  # (rank, src id, dst id, kind)
    behind: dict[int, list[int]] = defaultdict(list)  # row -> new op ids right after it in its lane
    ahead: dict[int, list[int]] = defaultdict(list)  # row -> new op ids right in front of it
    for s in splits:
        x, r = s.op, int(ranks[s.op])
        block = _block_rows(trace, s.block)
        inputs = [
            (int(ids[lanes.src[e]]), str(lanes.kind[e]))
            for e in into[in_starts[x] : in_starts[x + 1]].tolist()
            if not lanes.on_lane[e] and int(lanes.src[e]) not in block
        ]

        def piece(row: int, j: int, us: int, needs: list[tuple[int, str]], r: int = r) -> int:
            pid = next_id[r]
            next_id[r] += 1
            new_rows.append(row)
            new_ids.append(pid)
            new_names.append(f"{names[row]}.chunk{j + 1}")
            new_dur.append(int(us))
            edges.extend((r, src, pid, k) for src, k in needs)
            return pid

        made = [
            piece(
                x,
                j,
                us,
                [*inputs, *((int(ids[w]), "data") for w in g), *((int(ids[q]), "overwrite") for q in a)],
            )
            for j, (g, a, us) in enumerate(zip(s.groups[:-1], s.after[:-1], s.pieces_us[:-1], strict=True))
        ]
        levels, before_op = [made], x
        for y, pieces_us in s.chain:  # each cut op: piece j reads piece j of the op before it
            others = [
                (int(ids[lanes.src[e]]), str(lanes.kind[e]))
                for e in into[in_starts[y] : in_starts[y + 1]].tolist()
                if not lanes.on_lane[e] and int(lanes.src[e]) != before_op
            ]
            levels.append(
                [
                    piece(y, j, us, [*others, (p, "data")])
                    for j, (us, p) in enumerate(zip(pieces_us[:-1], levels[-1], strict=True))
                ]
            )
            dur[y] = int(pieces_us[-1])
            before_op = y
        for op, level in zip([x, *(y for y, _ in s.chain)], levels, strict=True):
            edges.append((r, level[-1], int(ids[op]), "data"))  # the result is whole when every piece is done
        dur[x] = int(s.pieces_us[-1])
        # in the lane: chunk 1 through the chain, then chunk 2, ...
        (behind[s.at] if s.at >= 0 else ahead[s.before]).extend(
            p for step in zip(*levels, strict=True) for p in step
        )
    # the lanes, re-chained with the pieces in their places
    lane_rows = np.flatnonzero((lanes.next >= 0) | (lanes.prev >= 0)).tolist()
    for row in lane_rows:
        r, q = int(ranks[row]), int(lanes.next[row])
        if q >= 0:  # the lane edge row -> q, with what goes between
            chain = [int(ids[row]), *behind.get(row, []), *ahead.get(q, []), int(ids[q])]
            kind = lane_kind.get(q, "thread")
        else:
            chain = [int(ids[row]), *behind.get(row, [])]
            kind = lane_kind.get(row, "thread")
        if lanes.prev[row] < 0 and ahead.get(row):  # a lane's first op with pieces in front
            edges += [
                (r, a, b, lane_kind.get(q, "thread"))
                for a, b in itertools.pairwise([*ahead[row], int(ids[row])])
            ]
        edges += [(r, a, b, kind) for a, b in itertools.pairwise(chain)]
    kept = trace.deps.filter(pa.array(~lanes.on_lane))
    e_rank, e_src, e_dst, e_kind = (list(c) for c in zip(*edges, strict=True))
    added = deps_table(e_rank, e_src, e_dst, e_kind)
    both = pa.concat_tables([kept.drop_columns(["pos"]), added.drop_columns(["pos"])])
    order = np.lexsort((both["dst"].to_numpy(), both["rank"].to_numpy()))
    both = both.take(pa.array(order))
    deps = deps_table(both["rank"], both["src"], both["dst"], both["kind"].to_pylist())
    copies = ops.take(pa.array(np.asarray(new_rows, dtype=np.int64)))
    f = ops.schema.field("duration_micros")
    for col, values in (("id", new_ids), ("name", new_names), (f.name, new_dur)):
        at = copies.schema.get_field_index(col)
        copies = copies.set_column(at, col, pa.array(values, ops.schema.field(col).type))
    ops = ops.set_column(ops.schema.get_field_index(f.name), f.name, pa.array(dur, f.type))
    both_ops = pa.concat_tables([ops, copies])
    both_ops = both_ops.take(pa.array(np.lexsort((both_ops["id"].to_numpy(), both_ops["rank"].to_numpy()))))
    pieces = {"rank": [int(ranks[x]) for x in new_rows], "id": new_ids, "op": [int(ids[x]) for x in new_rows]}
    out = trace.replace(ops=both_ops, deps=deps, params={**trace.params, "split_pieces": pieces})
    return out.replace(name=name) if name else out


def _check(trace: Trace, splits: Sequence[ChunkSplit]) -> None:
    """Refuse a split that is not one: an op split twice, an op that does not split, pieces
    that do not cover the chunks the op reads or wait for others."""
    reads = _reads(trace)
    ids, ranks = trace.ops["id"].to_numpy(), trace.ops["rank"].to_numpy()
    names = trace.ops["name"].to_pylist()
    seen: set[int] = set()
    for s in splits:
        where = f"rank {ranks[s.op]}: op {ids[s.op]} ({names[s.op]})"
        if s.op in seen:
            raise RewriteError(f"{where} is split twice")
        seen.add(s.op)
        for op in (s.op, *(y for y, _ in s.chain)):
            if not SplitCost().splits(names[op]):
                raise RewriteError(
                    f"rank {ranks[op]}: op {ids[op]} ({names[op]}) reduces across the chunks it reads: "
                    "it does not split"
                )
        if any(len(us) != len(s.groups) for _, us in s.chain):
            raise RewriteError(f"{where}: an op cut after it has not one piece per chunk group")
        if reads is None:
            raise RewriteError(f"{where}: the trace records no chunk reads (not an expanded recording)")
        mine = (
            (reads["rank"] == int(ranks[s.op]))
            & (reads["op"] == int(ids[s.op]))
            & (reads["block"] == s.block)
        )
        writers = set(reads["writer"][mine].tolist())
        given = {int(ids[w]) for g in s.groups for w in g}
        if given != writers or len(s.pieces_us) != len(s.groups) or len(s.groups) < 2:
            raise RewriteError(
                f"{where}: its pieces wait for ops {sorted(given)}, not the final writers "
                f"{sorted(writers)} of the chunks it reads"
            )
