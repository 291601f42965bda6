"""The finders' work on the trace itself, apart from the store's part.

:mod:`etstore.app.overlap` asks the store which ranks and consumers to look at (Cypher)
and turns pairs into gains (SQL); between the two, this: what the overlap and reorder
passes free on each rank (:func:`freed_pairs`, the same passes the rewrites apply) and the
pipelined timeline of each chunk consumer (:func:`chunk_rows`, all of a rank's at once:
:mod:`etstore.analysis._chunks`). Each is linear in the trace but for what the passes touch
(:mod:`etstore.analysis._reach`), so a finder scales with the ops it looks at, not with ops ×
sends. Ranks are built one at a time, with the garbage collector paused while they are looked
at: at 6M ops the cost of a finder was as much in those as in the passes themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.analysis._chunks import ChunkInputs, chunk_timelines, rank_chunks
from etstore.analysis._rankgraph import (
    Applied,
    RankGraph,
    iter_graphs_with_arrays,
    iter_rank_edges,
    overlap_rank,
    reorder_rank,
    string_codes,
)
from etstore.analysis.lanes import op_times
from etstore.analysis.split import SplitCost
from etstore.gcpause import gc_paused
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
    with gc_paused():  # the passes, and the edge dicts they run on: ~100k fresh tuples a rank
        for done, (g, applied) in enumerate(_passes(trace, ranks, kind), 1):
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


def _passes(trace: Trace, ranks: Collection[int], kind: str) -> Iterator[tuple[RankGraph, Applied]]:
    """Each rank of ``ranks`` with what the ``kind`` pass did to it, one rank alive at a time."""
    for g, built in iter_graphs_with_arrays(trace, ranks) if ranks else []:
        if kind == "overlap":
            yield g, overlap_rank(g, edges=False, arrays=built)
        else:
            yield g, reorder_rank(g, arrays=built)


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
    *chunk*); ``progress(done, total)`` every 256 consumers looked at, and at the last. O(V + E
    log E) for the ranks of ``wanted``, in numpy (:mod:`etstore.analysis._chunks`), plus a row
    per consumer that gains."""
    if expansions.num_rows == 0 or not wanted:
        return []
    with gc_paused():
        return _chunk_rows(trace, timings, expansions, wanted, max_pieces, unit_ns, split, progress)


def _chunk_rows(
    trace: Trace,
    timings: pa.Table,
    expansions: pa.Table,
    wanted: Collection[tuple[int, int]],
    max_pieces: int,
    unit_ns: float,
    split: SplitCost,
    progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:
    parent = expansions["parent_trace"][0].as_py()
    want = _by_rank(wanted)
    inputs = ChunkInputs(trace, expansions)
    codes, types = string_codes(trace.ops["type"])
    comp = codes == (types.index("COMP_NODE") if "COMP_NODE" in types else -1)
    send = codes == (types.index("COMM_SEND_NODE") if "COMM_SEND_NODE" in types else -1)
    durations = trace.ops["duration_micros"].to_numpy()
    times: tuple[np.ndarray, np.ndarray] | None = None
    can_split: dict[str, bool] = {}
    out = []
    seen = 0
    for e in iter_rank_edges(trace, want):
        a, n = e.first, len(e.ids)
        rc = rank_chunks(inputs, e.rank, a, e.ids, e.src, e.dst, comp[a : a + n], send[a : a + n])
        if rc is None:
            continue
        mine = np.isin(e.ids[rc.consumer], want[e.rank])
        before, seen = seen, seen + int(mine.sum())
        if progress is not None and seen > before:  # as if one at a time: every 256, and at the last
            for done in dict.fromkeys([*range(before - before % 256 + 256, seen + 1, 256), seen]):
                if done % 256 == 0 or done == len(wanted):
                    progress(done, len(wanted))
        if not mine.all():
            rc = rc.only(mine)
        if not len(rc.consumer):
            continue
        if times is None:
            times = _op_times(trace, timings)
        rows = a + rc.consumer
        # a take on the rank's slice: on the whole (chunked) column it cost 10 ms a rank
        names = trace.ops["name"].slice(a, n).take(pa.array(rc.consumer)).to_pylist()
        for name in set(names).difference(can_split):
            can_split[name] = split.splits(str(name))
        found = chunk_timelines(
            rc,
            times[1][a : a + n],
            durations[rows],
            np.asarray([can_split[x] for x in names], dtype=bool),
            max_pieces=max_pieces,
            unit_ns=unit_ns,
            split=split,
        )
        start_ns, end_ns = times[0][rows].tolist(), times[1][rows].tolist()
        colls, ids = rc.coll.tolist(), e.ids[rc.consumer].tolist()
        for t in found:
            i = t.consumer
            out.append(
                {
                    "kind": "chunk",
                    "rank": e.rank,
                    "op_id": colls[i],
                    "other_id": ids[i],
                    "gain_ns": t.gain_ns,
                    "detail": {
                        "parent_trace": parent,
                        "chunks": t.chunks,
                        "pieces": t.pieces,
                        "start_ns": start_ns[i],
                        "end_ns": end_ns[i],
                        "chunked_start_ns": t.start_ns,
                        "chunked_end_ns": t.end_ns,
                        "start_gain_ns": start_ns[i] - t.start_ns,
                    },
                }
            )
    return out


def _op_times(trace: Trace, timings: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~etstore.analysis.lanes.op_times`, without its join where ``timings`` are the
    trace's ops in its own row order (a run's timings as recorded are): the join was a sixth of
    the chunk finder's time at 6M ops."""
    ops = trace.ops
    if timings.num_rows == ops.num_rows and timings.num_rows:
        rank, ids = timings["rank"].to_numpy(), timings["id"].to_numpy()
        if np.array_equal(rank, ops["rank"].to_numpy()) and np.array_equal(ids, ops["id"].to_numpy()):
            return (
                timings["start_ns"].to_numpy().astype(np.float64),
                timings["end_ns"].to_numpy().astype(np.float64),
            )
    return op_times(trace, timings)


def _by_rank(pairs: Collection[tuple[int, int]]) -> dict[int, np.ndarray]:
    """``(rank, id)`` pairs as each rank's ids."""
    both = np.array(list(pairs), dtype=np.uint64).reshape(-1, 2)
    rank, ids = both[:, 0].astype(np.int64), both[:, 1]
    by = np.argsort(rank, kind="stable")
    ranks, at = np.unique(rank[by], return_index=True)
    return dict(zip(ranks.tolist(), np.split(ids[by], at[1:]), strict=True))
