"""Lanes of a recorded trace, and the one rewrite that is legal on them: hoisting ops in a lane.

A recorded trace (PyTorch ET + Kineto) runs on *lanes*: each CPU thread and each GPU stream
is a chain of ``thread`` / ``stream`` dependencies in the order it ran
(:class:`~etstore.model.DepKind`). Those edges only say where the lane put an op; every
other kind (``data``, ``overwrite``, ``launch``, ``wait``, ``group``) holds whatever the order.

So the rewrites of a recording are *hoists*: a set of ops moves earlier in its own lane, in
front of an op ``W``, keeping their relative order, when none of them needs ``W`` or an op
that stays behind — through any path that does not run along this lane. The lane's time
while ``W`` was held (waiting for a collective, a kernel, another thread) is where they run.
A hoist never drops a dependency of another kind, so the program's meaning is kept; it
cannot make a cycle (an op that reached back to ``W`` would have been one in the
recording).

:func:`hoist_candidates` finds, per lane, the ops held after an idle gap and the ops behind
them that could fill it; :func:`apply_hoists` rewires the lanes. The gain of each is what
the simulator says (:mod:`etstore.app.overlap` replays the trace with it alone applied).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etstore.errors import RewriteError
from etstore.model import LANE_KINDS, Trace, deps_table, op_rows

__all__ = [
    "Hoist",
    "Lanes",
    "apply_hoists",
    "check_hoist",
    "hoist_candidates",
    "lanes_of",
    "op_times",
]

MAX_MOVERS = 4096
"""At most this many ops move in front of one held op (the rest stay, in order)."""


@dataclass(frozen=True)
class Lanes:
    """The lanes of a trace as rows of ``trace.ops``: each op's lane (-1: none), the op before
    and after it in its lane (-1: none), and every edge as rows with its kind."""

    lane: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray  # object array of kind strings
    on_lane: np.ndarray  # per edge: a thread/stream edge
    out_order: np.ndarray  # edge indices by source row
    out_starts: np.ndarray  # per row: where its out-edges start in out_order (n + 1 entries)

    def order(self, lane_head: int) -> list[int]:
        """The rows of the lane starting at ``lane_head``, in order."""
        out = []
        r = lane_head
        while r >= 0:
            out.append(r)
            r = int(self.next[r])
        return out


def lanes_of(trace: Trace) -> Lanes:
    """The lanes of ``trace`` from its ``thread`` and ``stream`` edges.

    Raises
    ------
    RewriteError
        The trace has no lanes (not a recording), or a lane edge forks (an op with two
        predecessors or successors in lane order).
    """
    deps = trace.deps
    n = trace.num_ops
    rank = deps["rank"].to_numpy().astype(np.int64)
    src = op_rows(trace.ops, rank, deps["src"].to_numpy())
    dst = op_rows(trace.ops, rank, deps["dst"].to_numpy())
    kind = np.asarray(deps["kind"].to_pylist(), dtype=object)
    on_lane = np.isin(kind, list(LANE_KINDS))
    if not on_lane.any():
        raise RewriteError(f"trace {trace.name!r} has no thread or stream order: it is not a recording")
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)
    ls, ld = src[on_lane], dst[on_lane]
    if len(np.unique(ld)) < len(ld) or len(np.unique(ls)) < len(ls):
        raise RewriteError(f"trace {trace.name!r}: a thread or stream order forks; its lanes are not chains")
    prev[ld] = ls
    nxt[ls] = ld
    lane = np.full(n, -1, dtype=np.int64)
    on = np.zeros(n, dtype=bool)
    on[ls] = True
    on[ld] = True
    for head in np.flatnonzero(on & (prev < 0)).tolist():
        r = head
        while r >= 0:
            lane[r] = head
            r = int(nxt[r])
    out_order = np.argsort(src, kind="stable")
    out_starts = np.searchsorted(src[out_order], np.arange(n + 1))
    return Lanes(lane, prev, nxt, src, dst, kind, on_lane, out_order, out_starts)


@dataclass(frozen=True)
class Hoist:
    """Ops ``moved`` (rows, in lane order) to run just before the held op ``before``."""

    before: int
    moved: tuple[int, ...]
    gap_ns: float  # how long the lane was idle before ``before``
    moved_ns: float  # the moved ops' simulated time

    @property
    def estimate_ns(self) -> float:
        """At most the gap they fill, at most their own time."""
        return min(self.gap_ns, self.moved_ns)


def _off_lane(lanes: Lanes, lane: int) -> np.ndarray:
    """Per edge: usable by a walk that must leave ``lane`` other than along it (any edge but
    ``lane``'s own order; another lane's order is a dependency)."""
    return ~lanes.on_lane | (lanes.lane[lanes.src] != lane)


def _reach(seen: np.ndarray, start: int, lanes: Lanes, usable: np.ndarray) -> None:
    """Mark in ``seen`` the rows reachable from ``start`` (itself included) along ``usable``
    edges. A row already marked is not walked again: what it reaches is marked too, as long as
    every mark came from the same ``usable`` edges (edges stay on a rank)."""
    if seen[start]:
        return
    seen[start] = True
    frontier = np.asarray([start], dtype=np.int64)
    while len(frontier):
        edges = np.concatenate(
            [lanes.out_order[lanes.out_starts[f] : lanes.out_starts[f + 1]] for f in frontier.tolist()]
        )
        nxt = lanes.dst[edges[usable[edges]]] if len(edges) else edges
        nxt = np.unique(nxt[~seen[nxt]])
        seen[nxt] = True
        frontier = nxt


def hoist_candidates(
    trace: Trace,
    lanes: Lanes,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    *,
    min_gap_ns: float = 1000.0,
    limit: int = 64,
) -> list[Hoist]:
    """Hoists that could fill the idle gaps of the lanes, largest estimate first.

    Parameters
    ----------
    trace, lanes
        A recorded trace and :func:`lanes_of` it.
    start_ns, end_ns
        Each op's simulated start and end (rows of ``trace.ops``).
    min_gap_ns
        Only gaps at least this long.
    limit
        At most this many hoists (the largest gaps are looked at first).

    The ops behind the held op ``w`` are taken in lane order: one moves when it needs neither
    ``w`` nor an op that stays (through a path off this lane), and when what it needs has
    ended early enough for it to run before ``w`` started (in the simulated timeline, after
    the movers before it at their new place): it runs in the gap. Moving an op that could not
    end before ``w`` starts would hold ``w``. Each op takes part in at most one hoist (moved
    or held; the one found first, in a larger gap), so the hoists are independent changes.

    Notes
    -----
    O(G · (V + E)) for G gaps looked at (one walk from each held op per rank).
    """
    held = np.flatnonzero(lanes.prev >= 0)
    gap = start_ns[held] - end_ns[lanes.prev[held]]
    keep = gap >= min_gap_ns
    held, gap = held[keep], gap[keep]
    order = np.argsort(-gap, kind="stable")[: 4 * limit]
    n = trace.num_ops
    dur = end_ns - start_ns
    off = np.flatnonzero(~lanes.on_lane)  # each op's predecessors off the lanes, by op
    off = off[np.argsort(lanes.dst[off], kind="stable")]
    p_starts, p_src = np.searchsorted(lanes.dst[off], np.arange(n + 1)), lanes.src[off]
    taken = np.zeros(n, dtype=bool)
    out: list[Hoist] = []
    for w, g in zip(held[order].tolist(), gap[order].tolist(), strict=True):
        if taken[w]:  # already moved, or held, by a larger hoist
            continue
        # the walk leaves the held op's lane only through edges of other kinds or other lanes
        use = _off_lane(lanes, int(lanes.lane[w]))
        needs = np.zeros(n, dtype=bool)
        _reach(needs, w, lanes, use)
        moved: list[int] = []
        at = float(end_ns[lanes.prev[w]])  # where the lane falls idle
        end = end_ns.copy()  # with the movers' new ends
        r = int(lanes.next[w])
        while r >= 0 and len(moved) < MAX_MOVERS and at < start_ns[w]:
            preds = p_src[p_starts[r] : p_starts[r + 1]]
            ready = max(float(end[preds].max()) if len(preds) else 0.0, at)
            if not needs[r] and not taken[r] and ready + dur[r] <= start_ns[w]:  # it runs in the gap
                moved.append(r)
                at = ready + float(dur[r])
                end[r] = at
            elif not needs[r]:  # it stays behind ``w``: so does what needs it
                _reach(needs, r, lanes, use)
            r = int(lanes.next[r])
        if not moved:
            continue
        taken[moved] = True
        taken[w] = True
        out.append(Hoist(w, tuple(moved), float(g), float(dur[moved].sum())))
        if len(out) >= limit:
            break
    out.sort(key=lambda h: -h.estimate_ns)
    return out


_NEEDS = {
    "data": "reads data written by",
    "overwrite": "overwrites bytes read by",
    "launch": "is launched by",
    "wait": "waits for",
    "group": "follows, in its process group,",
    "ctrl": "follows",
}


def check_hoist(trace: Trace, lanes: Lanes, hoist: Hoist) -> None:
    """Refuse a hoist that moves an op ahead of something it needs.

    A moved op may pass, in its lane, only ops it does not need through any path off the
    lane: not the held op, not an op that stays behind it.

    Raises
    ------
    RewriteError
        Names the rank, the op that cannot move, what it needs and why (the dependency kind).
    """
    lane = int(lanes.lane[hoist.before])
    moved = set(hoist.moved)
    stays = [hoist.before]  # the held op and what stays between it and the last moved op
    if lane >= 0:
        span = lanes.order(lane)
        place = {r: k for k, r in enumerate(span)}
        last = max((place.get(m, -1) for m in moved), default=-1)
        stays += [r for r in span[place[hoist.before] + 1 : last + 1] if r not in moved]
    n = trace.num_ops
    use = _off_lane(lanes, lane)
    needs = np.zeros(n, dtype=bool)
    for x in stays:
        _reach(needs, x, lanes, use)
    ids, ranks = trace.ops["id"].to_numpy(), trace.ops["rank"].to_numpy()
    for m in hoist.moved:
        if lanes.lane[m] != lane:
            raise RewriteError(f"rank {ranks[m]}: op {ids[m]} is not in the lane of op {ids[hoist.before]}")
        if needs[m]:
            into = [e for e in np.flatnonzero(use & (lanes.dst == m)).tolist() if needs[lanes.src[e]]]
            into.sort(key=lambda e: lanes.src[e] not in stays)  # name an op that stays, if one is direct
            src, kind = int(lanes.src[into[0]]), str(lanes.kind[into[0]])
            raise RewriteError(
                f"rank {ranks[m]}: op {ids[m]} cannot move in front of op {ids[hoist.before]}: it "
                f"{_NEEDS.get(kind, 'needs')} op {ids[src]} ({kind})"
            )


def apply_hoists(trace: Trace, lanes: Lanes, hoists: Iterable[Hoist], *, name: str | None = None) -> Trace:
    """``trace`` with each hoist's ops moved in front of its held op in their lane.

    Only ``thread``/``stream`` edges change: the lane is re-chained in its new order; every
    other dependency is kept as it was. Rows keep their place in ``trace.ops``. Each hoist
    is checked first (:func:`check_hoist`).

    Raises
    ------
    RewriteError
        A hoist moves an op ahead of what it needs, two hoists move the same op, or a moved
        op is not in its held op's lane.
    """
    hoists = list(hoists)
    for h in hoists:
        check_hoist(trace, lanes, h)
    nxt = lanes.next.copy()
    prev = lanes.prev.copy()
    moved_all: set[int] = set()
    for h in hoists:
        lane = int(lanes.lane[h.before])
        if any(int(lanes.lane[m]) != lane for m in h.moved):
            raise RewriteError(f"a hoist in front of row {h.before} moves an op of another lane")
        if moved_all & set(h.moved):
            raise RewriteError(f"two hoists move the same op (in front of row {h.before})")
        moved_all |= set(h.moved)
        for m in h.moved:  # unlink
            p, q = int(prev[m]), int(nxt[m])
            if p >= 0:
                nxt[p] = q
            if q >= 0:
                prev[q] = p
        p = int(prev[h.before])
        chain = [*h.moved, h.before]
        if p >= 0:
            nxt[p] = chain[0]
        prev[chain[0]] = p
        for a, b in itertools.pairwise(chain):
            nxt[a] = b
            prev[b] = a
    keep = ~lanes.on_lane
    kept = trace.deps.filter(pa.array(keep))
    lane_src = np.flatnonzero(nxt >= 0)
    lane_dst = nxt[lane_src]
    # a lane edge's kind: the kind its old edge into the destination had, else its source's
    kind_of = {int(d): k for d, k in zip(lanes.dst[lanes.on_lane], lanes.kind[lanes.on_lane], strict=True)}
    kind_from = {int(s): k for s, k in zip(lanes.src[lanes.on_lane], lanes.kind[lanes.on_lane], strict=True)}
    kinds = [
        kind_of.get(int(d), kind_from.get(int(s), "thread")) for s, d in zip(lane_src, lane_dst, strict=True)
    ]
    ops = trace.ops
    rank = ops["rank"].to_numpy()
    ids = ops["id"].to_numpy()
    new = deps_table(rank[lane_src], ids[lane_src], ids[lane_dst], kinds)
    deps = pa.concat_tables([kept, new]).sort_by([("rank", "ascending"), ("dst", "ascending")])
    out = trace.replace(deps=_renumbered(deps))
    return out.replace(name=name) if name else out


def _renumbered(deps: pa.Table) -> pa.Table:
    """``pos`` recomputed within each (rank, dst, kind) in the table's order."""
    return deps_table(
        deps["rank"].to_numpy(), deps["src"].to_numpy(), deps["dst"].to_numpy(), deps["kind"].to_pylist()
    )


def op_times(trace: Trace, timings: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Simulated ``start_ns`` and ``end_ns`` of each row of ``trace.ops`` from op timings
    (``rank``, ``id``, ``start_ns``, ``end_ns``); ops the timings lack (or the simulator's own
    ops the timings have beyond the trace) get 0 / are ignored."""
    keys = pa.table(
        {"rank": trace.ops["rank"], "id": trace.ops["id"], "row": pa.array(np.arange(trace.num_ops))}
    )
    t = timings.select(["rank", "id", "start_ns", "end_ns"])
    t = t.cast(
        pa.schema(
            [("rank", pa.int32()), ("id", pa.uint64()), ("start_ns", pa.float64()), ("end_ns", pa.float64())]
        )
    )
    joined = keys.join(t, ["rank", "id"], join_type="inner")
    start = np.zeros(trace.num_ops)
    end = np.zeros(trace.num_ops)
    rows = joined["row"].to_numpy()
    start[rows] = joined["start_ns"].to_numpy()
    end[rows] = joined["end_ns"].to_numpy()
    return start, end
