"""A simulation run's timeline as Chrome trace-event JSON (Perfetto UI, chrome://tracing).

Reads one run's ``op_timings`` (with the stored trace's ``ops`` for communication
fields and ``messages`` for send → receive pairs), ``collectives`` and ``link_util``
through a :class:`~etstore.store.warehouse.Warehouse` and lays them out as
:mod:`etstore.formats.chrome_trace` describes:

- per rank a process (``pid`` = rank) with compute, comm and other tracks; every op
  of the run is one complete event from ``start_ns`` to ``end_ns`` (µs in the file);
- each message is a flow from the send's start to its receive; the pieces of each
  collective instance (the k-th collective op of a process group on each member rank)
  are one flow across the member ranks;
- a ``collectives`` process with one slice per collective instance (its span, type,
  algorithm, size and bus bandwidth, GB/s with GB = 10^9 as in ``collectives``);
- a ``network`` process with one counter per directed link: its utilisation over the
  run (``link_util`` holds one value per link, so the counter steps from that value at
  0 to 0 at the makespan).

A run's simulated time starts at 0, so its timeline needs no rebasing. A trace's own
timeline (recorded times: threads, streams, launches, the critical path) is
:mod:`etstore.report.recorded_timeline`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import UnknownTraceError
from etstore.formats.chrome_trace import chrome_trace_document, track_of_types, write_chrome_trace
from etstore.store.warehouse import Warehouse

__all__ = ["COLLECTIVES_TRACK", "run_timeline", "write_run_timeline"]

COLLECTIVES_TRACK = 3001
"""Thread id of the collective-instance track on the ``collectives`` process."""

_OPS_SQL = """
SELECT t.rank, t.id, t.name, t.type, t.start_ns, t.end_ns, t.wait_ns,
    o.comm_type, o.comm_size, o.pg_name, o.uid,
    CASE WHEN t.type = 'COMM_COLL_NODE' THEN row_number() OVER (
        PARTITION BY t.rank, coalesce(o.pg_name, ''), t.type ORDER BY t.id) - 1 END AS coll_seq
FROM op_timings t LEFT JOIN ops o ON o.trace = t.trace AND o.rank = t.rank AND o.id = t.id
WHERE t.run_id = $r AND t.start_ns IS NOT NULL AND t.end_ns IS NOT NULL
    AND NOT isnan(t.start_ns) AND NOT isnan(t.end_ns)
ORDER BY t.rank, t.start_ns, t.id
"""


def run_timeline(warehouse: Warehouse, run_id: int) -> dict[str, Any]:
    """The trace-event document of one recorded simulation run.

    Parameters
    ----------
    warehouse
        The warehouse holding the run (a store's ``warehouse``).
    run_id
        The run (``runs.run_id``).

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``; one
        complete event per op of ``op_timings`` that was scheduled, ``otherData`` names
        the run, its trace and topology and the units.

    Raises
    ------
    UnknownTraceError
        No run ``run_id`` is recorded.
    QueryError
        The warehouse lacks the metrics tables.

    Notes
    -----
    O(V log V + M + C + L) for V timed ops, M messages, C collective instances and L links.
    """
    run = warehouse.query(
        "SELECT trace, topology, congestion, total_ns FROM runs WHERE run_id = $r", {"r": run_id}
    ).to_pylist()
    if not run:
        raise UnknownTraceError(f"no simulation run {run_id} is recorded (see the runs table)")
    info = run[0]
    ops = warehouse.query(_OPS_SQL, {"r": run_id}).to_arrow()
    top = int(pc.max(ops["rank"]).as_py()) + 1 if ops.num_rows else 0
    coll_pid, net_pid = top, top + 1
    instances = _instances(warehouse, run_id)
    slices = pa.concat_tables([_op_slices(ops), _instance_slices(instances, coll_pid)])
    flows = pa.concat_tables(
        [_message_flows(warehouse, info["trace"], ops), _collective_flows(ops, first_id=1 << 40)]
    )
    return chrome_trace_document(
        slices,
        flows=flows,
        counters=_link_counters(warehouse, run_id, net_pid, float(info["total_ns"] or 0.0)),
        process_names={
            **{r: f"rank {r}" for r in range(top)},
            coll_pid: "collectives",
            net_pid: "network",
        },
        track_names={COLLECTIVES_TRACK: "instances"},
        other_data={
            "run_id": run_id,
            "trace": info["trace"],
            "topology": info["topology"],
            "congestion": info["congestion"],
            "makespan_ns": info["total_ns"],
            "time_unit": "us (simulated)",
            "bandwidth_unit": "GB/s, GB = 10^9",
        },
    )


def write_run_timeline(warehouse: Warehouse, run_id: int, out: str | Path) -> Path:
    """Write :func:`run_timeline` to ``out`` (``.json`` appended when missing); returns the file.

    Raises
    ------
    UnknownTraceError
        No run ``run_id`` is recorded.
    OSError
        The file cannot be written.
    """
    return write_chrome_trace(run_timeline(warehouse, run_id), out)


def _op_slices(ops: pa.Table) -> pa.Table:
    """One slice per timed op, on its rank's compute / comm / other track."""
    start = ops["start_ns"].to_numpy(zero_copy_only=False)
    end = ops["end_ns"].to_numpy(zero_copy_only=False)
    args = [
        json.dumps({k: v for k, v in zip(_ARG_KEYS, row, strict=True) if v is not None})
        for row in zip(*(ops[c].to_pylist() for c in _ARG_KEYS), strict=True)
    ]
    types = ops["type"]
    cat = pc.if_else(
        pc.starts_with(types, "COMM_"), "comm", pc.if_else(pc.equal(types, "COMP_NODE"), "compute", "other")
    )
    return pa.table(
        {
            "pid": ops["rank"].cast(pa.int64()),
            "track": pa.array(track_of_types(types)),
            "name": ops["name"],
            "cat": cat,
            "ts_us": pa.array(start / 1e3),
            "dur_us": pa.array(np.maximum(end - start, 0.0) / 1e3),
            "args": pa.array(args, pa.string()),
        }
    )


_ARG_KEYS = ("id", "type", "comm_type", "comm_size", "pg_name", "wait_ns")


def _instances(warehouse: Warehouse, run_id: int) -> pa.Table:
    return warehouse.query(
        "SELECT coll_seq, pg_name, comm_type, algorithm, group_size, size_bytes, start_ns, time_ns, "
        "busbw_gb_per_s FROM collectives WHERE run_id = $r ORDER BY start_ns, pg_name, coll_seq",
        {"r": run_id},
    ).to_arrow()


def _instance_slices(instances: pa.Table, pid: int) -> pa.Table:
    """One slice per collective instance on the ``collectives`` process."""
    rows = instances.to_pylist()
    return pa.table(
        {
            "pid": pa.array([pid] * len(rows), pa.int64()),
            "track": pa.array([COLLECTIVES_TRACK] * len(rows), pa.int64()),
            "name": pa.array(
                [f"{r['comm_type']} {r['pg_name'] or ''}#{r['coll_seq']}" for r in rows], pa.string()
            ),
            "cat": pa.array(["collective"] * len(rows), pa.string()),
            "ts_us": pa.array([float(r["start_ns"]) / 1e3 for r in rows], pa.float64()),
            "dur_us": pa.array([max(float(r["time_ns"]), 0.0) / 1e3 for r in rows], pa.float64()),
            "args": pa.array(
                [
                    json.dumps({k: r[k] for k in ("algorithm", "group_size", "size_bytes", "busbw_gb_per_s")})
                    for r in rows
                ],
                pa.string(),
            ),
        }
    )


def _flows(flow_id: np.ndarray, step: np.ndarray, row: np.ndarray, ts: np.ndarray, name: str) -> pa.Table:
    return pa.table(
        {
            "flow_id": pa.array(flow_id.astype(np.int64)),
            "step": pa.array(step.astype(np.int64)),
            "slice": pa.array(row.astype(np.int64)),
            "ts_us": pa.array(ts.astype(np.float64)),
            "name": pa.array([name] * len(row), pa.string()),
            "cat": pa.array([name] * len(row), pa.string()),
        }
    )


def _message_flows(warehouse: Warehouse, trace: str, ops: pa.Table) -> pa.Table:
    """Send → receive flows of the stored trace's messages whose two ops were timed."""
    msgs = warehouse.query(
        "SELECT send_uid, recv_uid FROM messages WHERE trace = $t ORDER BY send_uid", {"t": trace}
    ).to_arrow()
    uid = pc.fill_null(ops["uid"], -1).to_numpy(zero_copy_only=False)
    order = np.argsort(uid, kind="stable")
    known = uid[order]

    def rows_of(col: str) -> tuple[np.ndarray, np.ndarray]:
        want = pc.fill_null(msgs[col], -2).to_numpy(zero_copy_only=False)
        pos = np.clip(np.searchsorted(known, want), 0, max(len(known) - 1, 0))
        found = (known[pos] == want) if len(known) else np.zeros(len(want), bool)
        return order[pos] if len(known) else pos, found

    send, s_ok = rows_of("send_uid")
    recv, r_ok = rows_of("recv_uid")
    ok = s_ok & r_ok
    send, recv = send[ok], recv[ok]
    start = ops["start_ns"].to_numpy(zero_copy_only=False) / 1e3
    end = ops["end_ns"].to_numpy(zero_copy_only=False) / 1e3
    recv_ts = np.clip(start[send], start[recv], end[recv])
    k = len(send)
    ids = np.arange(k)
    return _flows(
        np.concatenate([ids, ids]),
        np.concatenate([np.zeros(k), np.ones(k)]),
        np.concatenate([send, recv]),
        np.concatenate([start[send], recv_ts]),
        "message",
    )


def _collective_flows(ops: pa.Table, *, first_id: int) -> pa.Table:
    """One flow per collective instance through its member ranks' collective ops, by start time."""
    seq = ops["coll_seq"].to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(~np.isnan(seq.astype(np.float64))) if len(seq) else np.empty(0, np.int64)
    if not len(rows):
        empty = np.empty(0)
        return _flows(empty, empty, empty, empty, "collective")
    pg = pc.fill_null(ops["pg_name"], "").to_numpy(zero_copy_only=False)[rows].astype(str)
    start = ops["start_ns"].to_numpy(zero_copy_only=False)[rows] / 1e3
    key_seq = seq[rows].astype(np.int64)
    _, group = np.unique(
        np.stack([np.unique(pg, return_inverse=True)[1], key_seq], axis=1), axis=0, return_inverse=True
    )
    group = group.reshape(-1)
    order = np.lexsort((start, group))
    g = group[order]
    first = np.ones(len(g), dtype=bool)
    first[1:] = g[1:] != g[:-1]
    starts = np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))
    step = np.arange(len(g)) - starts
    sizes = np.bincount(g)
    keep = sizes[g] > 1  # a collective on one rank has nothing to connect
    return _flows(g[keep] + first_id, step[keep], rows[order][keep], start[order][keep], "collective")


def _link_counters(warehouse: Warehouse, run_id: int, pid: int, total_ns: float) -> pa.Table:
    """Each link's utilisation as a counter: its value from 0, back to 0 at the makespan."""
    links = warehouse.query(
        "SELECT src, dst, utilization FROM link_util WHERE run_id = $r ORDER BY src, dst", {"r": run_id}
    ).to_pylist()
    names = [f"link {r['src']}->{r['dst']}" for r in links]
    values = [float(r["utilization"] or 0.0) for r in links]
    n = len(links)
    return pa.table(
        {
            "pid": pa.array([pid] * 2 * n, pa.int64()),
            "name": pa.array(names + names, pa.string()),
            "series": pa.array(["utilization"] * 2 * n, pa.string()),
            "ts_us": pa.array([0.0] * n + [total_ns / 1e3] * n, pa.float64()),
            "value": pa.array(values + [0.0] * n, pa.float64()),
        }
    )
