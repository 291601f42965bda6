"""The critical path of a simulated schedule: the chain of constraints that set the makespan.

:func:`etstore.analysis.critical_path` weighs the stored trace's own durations; a
simulated run also has waits (for a message, a slow peer in a collective, a busy
slot). Walking back from the op that ends last, each step goes to what released
the current op: the matching send when a receive waited for its message, the
last member to join when a collective waited for a peer, else the dependency (or,
when the op waited for its NPU slot, the op that freed it) that ended last.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from etstore.analysis.critical_path import path_table
from etstore.report._data import RunInfo, has_table, query
from etstore.store.warehouse import Warehouse

__all__ = ["critical_path_steps", "schedule_critical_path"]

log = logging.getLogger(__name__)

_ROWS = (
    "WITH t AS (SELECT rank, id, row_number() OVER (ORDER BY rank, id) - 1 AS row "
    "FROM op_timings WHERE run_id = $run)"
)


def _edges(
    warehouse: Warehouse, run: RunInfo
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of (dep src, dep dst), (send, recv) and (collective op, instance) from the store's tables."""
    p = {"run": run.run_id, "trace": run.trace}
    empty = np.zeros(0, dtype=np.int64)
    dsrc = ddst = msend = mrecv = crow = cinst = empty
    if has_table(warehouse, "deps"):
        d = query(
            warehouse,
            f"""{_ROWS} SELECT a.row AS src, b.row AS dst FROM deps d
            JOIN t a ON a.rank = d.rank AND a.id = d.src JOIN t b ON b.rank = d.rank AND b.id = d.dst
            WHERE d.trace = $trace""",
            p,
        )
        dsrc, ddst = d["src"].to_numpy().astype(np.int64), d["dst"].to_numpy().astype(np.int64)
    if has_table(warehouse, "messages") and has_table(warehouse, "ops"):
        m = query(
            warehouse,
            f"""{_ROWS}, o AS (SELECT uid, rank, id FROM ops WHERE trace = $trace)
            SELECT a.row AS send, b.row AS recv FROM messages m
            JOIN o so ON so.uid = m.send_uid JOIN o ro ON ro.uid = m.recv_uid
            JOIN t a ON a.rank = so.rank AND a.id = so.id JOIN t b ON b.rank = ro.rank AND b.id = ro.id
            WHERE m.trace = $trace""",
            p,
        )
        msend, mrecv = m["send"].to_numpy().astype(np.int64), m["recv"].to_numpy().astype(np.int64)
    if has_table(warehouse, "ops"):
        c = query(
            warehouse,
            f"""{_ROWS}, c AS (
                SELECT rank, id, uid,
                    CASE WHEN pg_name IS NULL OR pg_name IN ('', '0') THEN '' ELSE pg_name END AS grp
                FROM ops WHERE trace = $trace AND type = 'COMM_COLL_NODE')
            SELECT t.row, dense_rank() OVER (ORDER BY c.grp, c.k) - 1 AS inst
            FROM (SELECT *, row_number() OVER (PARTITION BY rank, grp ORDER BY uid) AS k FROM c) c
            JOIN t USING (rank, id)""",
            p,
        )
        crow, cinst = c["row"].to_numpy().astype(np.int64), c["inst"].to_numpy().astype(np.int64)
    return dsrc, ddst, msend, mrecv, crow, cinst


def _best_by(target: np.ndarray, cand: np.ndarray, key: np.ndarray, n: int) -> np.ndarray:
    """Per target row, the candidate with the largest key (-1 where none); first wins ties."""
    best = np.full(n, -1, dtype=np.int64)
    if len(target) == 0:
        return best
    order = np.lexsort((-np.arange(len(target)), key, target))
    last = np.concatenate([target[order][1:] != target[order][:-1], [True]])
    best[target[order][last]] = cand[order][last]
    return best


def schedule_critical_path(warehouse: Warehouse, run: RunInfo, *, tolerance_ns: float = 1e-6) -> pa.Table:
    """Walk the run's binding constraints back from the op that ends last.

    Parameters
    ----------
    warehouse
        The metrics: the run's ``op_timings`` and, when the trace is
        stored, its ``ops``, ``deps`` and ``messages`` (without them only the
        slot order on each rank is followed).
    run
        The run (from :func:`~etstore.report._data.run_infos`).
    tolerance_ns
        Times closer than this count as equal.

    Returns
    -------
    pyarrow.Table
        A path table (:func:`~etstore.analysis.critical_path.path_table`) in time order:
        ``step``, ``rank``, ``id``, ``name``, ``type``, ``start_ns``, ``end_ns``,
        ``row`` (the op's position in the run's ``op_timings`` ordered by ``(rank, id)``),
        ``via`` (``start``, ``dep`` — a dependency or the slot, ``msg`` — the send a
        receive waited for, ``peer`` — the collective member that joined last).

    Notes
    -----
    O(V + E) numpy passes plus O(path) for the walk; V ops, E deps + messages.
    """
    t = query(
        warehouse,
        "SELECT rank, id, name, type, start_ns, end_ns FROM op_timings WHERE run_id = $run ORDER BY rank, id",
        {"run": run.run_id},
    )
    n = t.num_rows
    if n == 0:
        return _as_path(t, np.zeros(0, dtype=np.int64), [])
    rank = t["rank"].to_numpy().astype(np.int64)
    start = t["start_ns"].to_numpy()
    end = t["end_ns"].to_numpy()
    dsrc, ddst, msend, mrecv, crow, cinst = _edges(warehouse, run)

    dep_pred = _best_by(ddst, dsrc, end[dsrc], n)
    # slot predecessor: the op of the same rank that ended last at or before this op started
    span = float(max(end.max(), start.max(), 1.0)) * 2.0 + 1.0
    by_end = np.lexsort((end, rank))
    keys = rank[by_end] * span + end[by_end]
    pos = np.searchsorted(keys, rank * span + start + tolerance_ns, side="right") - 1
    ok = pos >= 0
    ok[ok] = rank[by_end[pos[ok]]] == rank[ok]
    slot_pred = np.where(ok, by_end[np.maximum(pos, 0)], -1)
    slot_pred[slot_pred == np.arange(n)] = -1
    msg_pred = np.full(n, -1, dtype=np.int64)
    msg_pred[mrecv] = msend
    peer_pred = np.full(n, -1, dtype=np.int64)
    if len(crow):
        last_join = _best_by(cinst, crow, start[crow], int(cinst.max()) + 1)
        peer_pred[crow] = last_join[cinst]
    peer_pred[peer_pred == np.arange(n)] = -1

    rows: list[int] = []
    via: list[str] = []
    seen = np.zeros(n, dtype=bool)
    v = int(np.argmax(end))
    how = "end"
    while v >= 0 and not seen[v]:
        seen[v] = True
        rows.append(v)
        via.append(how)
        s = start[v]
        nxt, how = -1, "start"
        m, p = int(msg_pred[v]), int(peer_pred[v])
        if m >= 0 and end[m] > s + tolerance_ns and not seen[m]:
            nxt, how = m, "msg"
        elif p >= 0 and start[p] > s + tolerance_ns and not seen[p]:
            nxt, how = p, "peer"
        else:
            d, q = int(dep_pred[v]), int(slot_pred[v])
            if d >= 0 and seen[d]:
                d = -1
            if q >= 0 and seen[q]:
                q = -1
            if d >= 0 and (q < 0 or end[d] + tolerance_ns >= end[q]):
                nxt, how = d, "dep"
            elif q >= 0:
                nxt, how = q, "dep"
        v = nxt
    rows.reverse()
    # the reason a step is reached is recorded on the op found before it in the walk
    reached = ["start", *via[::-1][:-1]]
    log.debug("critical path of run %d: %d ops", run.run_id, len(rows))
    return _as_path(t, np.asarray(rows, dtype=np.int64), reached)


def _as_path(timings: pa.Table, rows: np.ndarray, via: list[str]) -> pa.Table:
    """The path table of ``rows`` of the run's timings, with their simulated start, end and row."""
    take = pa.array(rows)
    return path_table(
        timings,
        rows,
        via,
        start_ns=timings["start_ns"].take(take),
        end_ns=timings["end_ns"].take(take),
        row=take,
    )


def critical_path_steps(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """When each step of a critical path holds the path: its segment on the timeline, forward in time.

    A step holds the path from the later of its own start and the end of the step before
    it, to its end. A receive that started early and waited for its message holds it from
    the send's end; a collective member that waited for the last one to join holds it
    from that member's end (both ran the collective until then). So the segments follow
    one another: each starts where the one before ended or later, never earlier.

    Parameters
    ----------
    start_ns, end_ns
        Each step's start and end, in path order (ns, or any one time unit).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Per step, the segment's start and end: ``seg_end[i] >= seg_start[i] >= seg_end[i - 1]``.

    Notes
    -----
    O(path): one running maximum.
    """
    s = np.asarray(start_ns, dtype=np.float64)
    e = np.asarray(end_ns, dtype=np.float64)
    seg_end = np.maximum.accumulate(np.maximum(s, e)) if len(s) else np.zeros(0)
    seg_start = np.maximum(s, np.concatenate([[-np.inf], seg_end[:-1]]))
    return seg_start, seg_end
