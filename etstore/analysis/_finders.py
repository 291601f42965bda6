"""The finders' work on the trace itself, apart from the store's part.

:mod:`etstore.app.overlap` asks the store which ranks and consumers to look at (Cypher)
and turns pairs into gains (SQL); between the two, this: what the overlap and reorder
passes free on each rank (:func:`freed_pairs`, the same passes the rewrites apply) and the
pipelined timeline of each chunk consumer (:func:`chunk_rows`). Each is linear in the
trace but for what the passes touch (:mod:`etstore.analysis._reach`), so a finder scales with
the ops it looks at, not with ops × sends.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.analysis._rankgraph import (
    chunk_consumers,
    group_slots,
    overlap_rank,
    piece_count,
    rank_graphs,
    reorder_rank,
)
from etstore.analysis._reach import Lists
from etstore.analysis.lanes import op_times
from etstore.analysis.split import SplitCost
from etstore.model import Trace

__all__ = ["chunk_rows", "freed_pairs"]


def freed_pairs(
    trace: Trace, ranks: Collection[int], kind: str, progress: Callable[[int, int], None] | None = None
) -> tuple[pa.Table, pa.Table]:
    """What the ``kind`` (``overlap`` or ``reorder``) pass frees on ``ranks``; ``progress(done,
    total)`` after each rank (a 6M-op trace takes tens of seconds).

    Returns the pairs, ``rank``, ``coll_id`` (overlap) or ``comm_id`` (reorder),
    ``compute_id``, ``compute_row`` (the compute op's row on its rank), in the pass's order;
    and for reorder each freed op's predecessors once it is applied (``rank``, ``comm_id``,
    ``pred_id``; empty for overlap). The tables the gain SQL joins.
    """
    key = "coll_id" if kind == "overlap" else "comm_id"
    cols: dict[str, list[np.ndarray]] = {"rank": [], key: [], "compute_id": [], "compute_row": []}
    into: dict[str, list[np.ndarray]] = {"rank": [], "comm_id": [], "pred_id": []}
    for done, g in enumerate(rank_graphs(trace, ranks) if ranks else [], 1):
        applied = overlap_rank(g, edges=False) if kind == "overlap" else reorder_rank(g)
        if progress is not None:
            progress(done, len(ranks))
        if not applied.freed:
            continue
        f = np.asarray(applied.freed, dtype=np.int64)
        cols["rank"].append(np.full(len(f), g.rank, dtype=np.int32))
        cols[key].append(g.ids[f[:, 0]])
        cols["compute_id"].append(g.ids[f[:, 1]])
        cols["compute_row"].append(f[:, 1])
        comm = [s for s, ps in applied.preds.items() for _ in ps]
        pred = [p for ps in applied.preds.values() for p in ps]
        into["rank"].append(np.full(len(comm), g.rank, dtype=np.int32))
        into["comm_id"].append(g.ids[np.asarray(comm, dtype=np.int64)])
        into["pred_id"].append(g.ids[np.asarray(pred, dtype=np.int64)])
    types = {"rank": pa.int32(), key: pa.uint64(), "compute_id": pa.uint64(), "compute_row": pa.int64()}
    pairs = pa.table({k: pa.array(_joined(cols[k]), t) for k, t in types.items()})
    types = {"rank": pa.int32(), "comm_id": pa.uint64(), "pred_id": pa.uint64()}
    preds = pa.table({k: pa.array(_joined(into[k]), t) for k, t in types.items()})
    return pairs, preds


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def chunk_rows(
    trace: Trace,
    timings: pa.Table,
    expansions: pa.Table,
    wanted: Collection[tuple[int, int]],
    *,
    max_pieces: int,
    unit_ns: float,
    split: SplitCost,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """The ``chunk`` rows of the consumers ``wanted`` (``(rank, id)``) that gain: each
    consumer's pieces, when each could start and end, from ``timings`` (``docs/overlap.md``,
    *chunk*); ``progress(done, total)`` as consumers are looked at. O(V + E) for the ranks of
    ``wanted``, plus each consumer's slots and edges."""
    if expansions.num_rows == 0 or not wanted:
        return []
    parent = expansions["parent_trace"][0].as_py()
    graphs = rank_graphs(trace, {r for r, _ in wanted})
    by_rank = {g.rank: g for g in graphs}
    into: dict[int, Lists] = {}  # per rank, each op's predecessors, built when first needed
    durations = trace.ops["duration_micros"].to_numpy()
    names = trace.ops["name"]
    times: tuple[np.ndarray, np.ndarray] | None = None
    out = []
    seen = 0
    for cc in chunk_consumers(trace, graphs, expansions):
        g = by_rank[cc.rank]
        cid = int(g.ids[cc.consumer])
        if (cc.rank, cid) not in wanted:
            continue
        seen += 1
        if progress is not None and (seen % 256 == 0 or seen == len(wanted)):
            progress(seen, len(wanted))
        if times is None:
            times = op_times(trace, timings)
        start_ns, end_of = times[0], times[1][g.first : g.first + g.n]
        arrival = {s: max(float(end_of[w]) for w in ws) for s, ws in cc.writers.items()}
        slots = sorted(arrival, key=lambda s: (arrival[s], s))
        d_us = int(durations[g.first + cc.consumer])
        k = piece_count(len(slots), d_us, max_pieces)
        if k < 2 or not split.splits(str(names[g.first + cc.consumer].as_py())):
            continue
        groups = group_slots(slots, k)
        durs = split.pieces(d_us, k)
        inside = set(cc.expansion_preds)
        if g.rank not in into:
            src, dst = g.arrays()
            into[g.rank] = Lists(dst, src, g.n)
        outside = [u for u in into[g.rank][cc.consumer] if u not in inside]
        e = max((float(end_of[u]) for u in outside), default=0.0)
        starts = []
        for j, grp in enumerate(groups):
            start = max(e, max(arrival[s] for s in grp))
            if j == k - 1:
                start = max(start, max(float(end_of[u]) for u in inside))
            starts.append(start)
            e = start + durs[j] * unit_ns
        orig_start, orig_end = float(start_ns[g.first + cc.consumer]), float(end_of[cc.consumer])
        gain = orig_end - e
        if gain <= 0:
            continue
        out.append(
            {
                "kind": "chunk",
                "rank": cc.rank,
                "op_id": cc.coll_id,
                "other_id": cid,
                "gain_ns": float(gain),
                "detail": {
                    "parent_trace": parent,
                    "chunks": [[s, arrival[s]] for s in slots],
                    "pieces": groups,
                    "start_ns": orig_start,
                    "end_ns": orig_end,
                    "chunked_start_ns": starts[0],
                    "chunked_end_ns": e,
                    "start_gain_ns": orig_start - starts[0],
                },
            }
        )
    return out
