"""A trace's own timeline (recorded timestamps) as Chrome trace-event JSON for Perfetto UI.

Where :mod:`etstore.report.timeline` draws a simulation run, this draws a trace whose ops
carry the times they ran at: a PyTorch ET + Kineto recording, a Kineto trace, or any trace
with ``start_time_micros``. The layout:

- **Time** starts at the trace's start: the earliest drawn op is at ``ts`` 0 (µs), and
  ``otherData["origin_us"]`` is that op's start on the trace's own clock (Unix-epoch µs
  for Kineto). Ops with no time of their own (no Kineto record and ``start_time_micros``
  0; without Kineto records, those at 0 that last nothing or are metadata: the ET's
  process and thread nodes) are not drawn; ``otherData["not_drawn"]`` counts them.
- **A trace whose ops carry their Kineto record** (``kineto_event``): one process per rank
  (``pid`` = rank) and in it one track per CPU thread (``thread <Kineto tid>``, the
  threads in the order they first ran) and one per GPU stream (``stream <n>``, the
  device ops' ``args.stream``). Each op is the slice Kineto recorded (``ts``, ``dur``);
  a thread's ops nest as they did (a wrapper holds its children). Each dependency from a
  CPU op to a device op (the launch of a kernel, memcpy or memset) is a flow arrow:
  ``"s"`` inside the launching op where none of its children runs (at the device op's
  start, else the latest such moment before it), ``"f"`` at the device op's start.
- **Any other timed trace**: the type tracks of
  :func:`etstore.formats.chrome_trace.trace_timeline` (``compute``, ``comm``, ``other``;
  overlapping ops spread over ``comm 2``, ...) and its message flows, rebased.
- **The critical path** (:func:`etstore.analysis.critical_path`) is a process of its own,
  ``critical path``, with one track: its steps end to end from where its first op
  started, each lasting the op's ``duration_micros`` (a recorded CPU op's thread time), so
  the track's slices add up to ``length_micros``. The ops on it carry their step
  (``critical_path_step``) in their own slices' args.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.analysis import critical_path
from etstore.errors import OptionError
from etstore.formats.chrome_trace import trace_timeline, write_chrome_trace
from etstore.formats.kineto import KINETO_ATTR
from etstore.model import Trace, decode_attrs

__all__ = ["CRITICAL_PATH_TRACK", "recorded_timeline", "write_recorded_timeline"]

CRITICAL_PATH_TRACK = 1
"""Thread id of the one track of the ``critical path`` process."""

_ARG_KEYS = ("id", "type", "comm_type", "comm_size", "pg_name", "duration_micros")


def recorded_timeline(trace: Trace) -> dict[str, Any]:
    """The trace-event document of a trace's own timeline, from its start.

    Parameters
    ----------
    trace
        A trace whose ops carry times: a Kineto record per op (``kineto_event``, as
        :func:`~etstore.formats.pytorch_et.read_pytorch_et` and the Kineto reader keep
        it), or a non-zero ``start_time_micros`` on some op.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``: one
        process per rank (``pid`` = rank) with a track per thread and stream (Kineto
        records) or per op type (otherwise), launch or message flows, and a
        ``critical path`` process (``pid`` = the last rank + 1). ``otherData`` holds
        ``trace``, ``source``, ``time_unit`` (``"us"``), ``origin_us`` (the trace-clock
        time of ``ts`` 0), ``layout`` (``"threads and streams"`` or ``"op types"``),
        ``not_drawn`` (``{"ops": n, "types": {type: n}}``), ``critical_path_us`` and
        ``critical_path_dropped_edges``.

    Raises
    ------
    OptionError
        No op has a time (every ``start_time_micros`` is 0 and no op has a Kineto
        record): simulate the trace and write the run's timeline instead.

    Notes
    -----
    O(V log V + E) for V ops and E dependencies, plus the critical path's
    O(V + E log E). Each Kineto record is decoded once (one JSON parse per op).
    """
    ops = trace.ops
    records = _kineto_records(ops)
    start = pc.fill_null(ops["start_time_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    if not any(r is not None for r in records) and not start.any():
        raise OptionError(
            f"trace {trace.name!r} has no timestamps (start_time_micros is 0 on every op); "
            "simulate it and write the run's timeline instead"
        )
    path = critical_path(trace)
    if any(r is not None for r in records):
        doc, ts, drawn = _by_threads_and_streams(trace, records, path.path)
        layout = "threads and streams"
    else:
        doc, ts, drawn = _by_op_types(trace, start)
        layout = "op types"
    top = max(trace.ranks, default=-1) + 1
    doc["traceEvents"].extend(_path_events(ops, path.path, ts, drawn, top))
    types = ops["type"].filter(pa.array(~drawn)).to_pylist() if ops.num_rows else []
    doc["otherData"].update(
        {
            "trace": trace.name,
            "source": trace.source or trace.name,
            "time_unit": "us",
            "layout": layout,
            "not_drawn": {"ops": len(types), "types": dict(Counter(str(t) for t in types))},
            "critical_path_us": path.length_micros,
            "critical_path_dropped_edges": path.dropped_edges,
        }
    )
    return doc


def write_recorded_timeline(trace: Trace, out: str | Path) -> Path:
    """Write :func:`recorded_timeline` to ``out`` (``.json`` appended when missing); returns the file.

    Raises
    ------
    OptionError
        The trace has no timestamps (nothing is written).
    OSError
        The file cannot be written.
    """
    return write_chrome_trace(recorded_timeline(trace), out)


def _kineto_records(ops: pa.Table) -> list[dict[str, Any] | None]:
    """Each op's Kineto record (``kineto_event``, parsed), or None."""
    out: list[dict[str, Any] | None] = []
    for blob in ops["attrs"].to_pylist() if "attrs" in ops.column_names else [None] * ops.num_rows:
        text = decode_attrs(blob).get(KINETO_ATTR) if blob else None
        out.append(json.loads(text) if text else None)
    return out


# ---------------------------------------------------------------- threads and streams


def _by_threads_and_streams(
    trace: Trace, records: Sequence[dict[str, Any] | None], path: pa.Table
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The document of a trace with Kineto records, each op's rebased start and whether it is drawn."""
    ops = trace.ops
    n = ops.num_rows
    rank = ops["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    device = pc.fill_null(pc.equal(ops["is_cpu_op"], False), False).to_numpy(zero_copy_only=False)
    start = pc.fill_null(ops["start_time_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    length = pc.fill_null(ops["duration_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    ts = np.zeros(n)
    dur = np.zeros(n)
    drawn = np.zeros(n, dtype=bool)
    lane: list[tuple[int, str, Any]] = [(0, "", None)] * n
    for i, rec in enumerate(records):
        if rec is not None:
            ts[i], dur[i], drawn[i] = float(rec["ts"]), max(float(rec.get("dur") or 0.0), 0.0), True
            if device[i]:
                stream = (rec.get("args") or {}).get("stream", rec.get("tid"))
                lane[i] = (int(rank[i]), "stream", stream)
            else:
                lane[i] = (int(rank[i]), "thread", rec.get("tid"))
        elif start[i] > 0:  # timed, but linked to no Kineto record
            ts[i], dur[i], drawn[i] = start[i], length[i], True
            lane[i] = (int(rank[i]), "no Kineto record", None)
    origin = float(ts[drawn].min()) if drawn.any() else 0.0
    ts = np.where(drawn, ts - origin, 0.0)
    tid, names = _track_ids(lane, ts, drawn)
    end, parent = _nest(tid, rank, ts, ts + dur, drawn)
    step = _path_steps(ops, path)
    events = _metadata(sorted(set(rank[drawn].tolist())), names)
    arg_cols = [ops[c].to_pylist() if c in ops.column_names else [None] * n for c in _ARG_KEYS]
    op_names = ops["name"].to_pylist()
    for i in np.flatnonzero(drawn).tolist():
        args = {k: col[i] for k, col in zip(_ARG_KEYS, arg_cols, strict=True) if col[i] is not None}
        if i in step:
            args["critical_path_step"] = step[i]
        events.append(
            {
                "name": op_names[i] or "",
                "cat": lane[i][1] if lane[i][1] != "no Kineto record" else "op",
                "ph": "X",
                "pid": int(rank[i]),
                "tid": int(tid[i]),
                "ts": float(ts[i]),
                "dur": float(end[i] - ts[i]),
                "args": args,
            }
        )
    events.extend(_launch_flows(trace, device, drawn, rank, tid, ts, end, parent))
    doc = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"origin_us": origin}}
    return doc, ts, drawn


def _track_ids(
    lane: Sequence[tuple[int, str, Any]], ts: np.ndarray, drawn: np.ndarray
) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
    """Per op its track id within its rank (threads by first start, then streams by number, then
    unlinked ops) and each (rank, track id)'s name."""
    first: dict[tuple[int, str, Any], float] = {}
    for i in np.flatnonzero(drawn).tolist():
        key = lane[i]
        first[key] = min(first.get(key, np.inf), float(ts[i]))
    kind_order = {"thread": 0, "stream": 1, "no Kineto record": 2}

    def order(key: tuple[int, str, Any]) -> tuple[Any, ...]:
        r, kind, value = key
        by = first[key] if kind == "thread" else 0.0
        return (r, kind_order[kind], by, isinstance(value, str), value if value is not None else 0)

    ids: dict[tuple[int, str, Any], int] = {}
    names: dict[tuple[int, int], str] = {}
    rank_of = None
    for key in sorted(first, key=order):
        if key[0] != rank_of:
            rank_of, k = key[0], 0
        k += 1
        ids[key] = k
        names[(key[0], k)] = key[1] if key[2] is None else f"{key[1]} {key[2]}"
    tid = np.array([ids.get(key, 0) if drawn[i] else 0 for i, key in enumerate(lane)], dtype=np.int64)
    return tid, names


def _nest(
    tid: np.ndarray, rank: np.ndarray, start: np.ndarray, end: np.ndarray, drawn: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each slice's end, cut where it would outlast the slice it starts in (a track's slices must
    nest), and that enclosing slice's row (-1 for none): one sweep per track, O(S log S)."""
    end = end.copy()
    parent = np.full(len(end), -1, dtype=np.int64)
    rows = np.flatnonzero(drawn)
    order = rows[np.lexsort((-end[rows], start[rows], tid[rows], rank[rows]))]
    stack: list[int] = []
    key: tuple[int, int] | None = None
    for i in order.tolist():
        k = (int(rank[i]), int(tid[i]))
        if k != key:
            key, stack = k, []
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            end[i] = min(end[i], end[stack[-1]])
        stack.append(i)
    return end, parent


def _launch_flows(
    trace: Trace,
    device: np.ndarray,
    drawn: np.ndarray,
    rank: np.ndarray,
    tid: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    parent: np.ndarray,
) -> list[dict[str, Any]]:
    """A flow from each CPU op to each device op it launched (a dependency CPU → device)."""
    deps = trace.deps
    if not deps.num_rows:
        return []
    d_rank = deps["rank"].to_numpy(zero_copy_only=False).astype(np.int64)
    src = _rows_of(trace.ops, d_rank, deps["src"].to_numpy(zero_copy_only=False).astype(np.int64))
    dst = _rows_of(trace.ops, d_rank, deps["dst"].to_numpy(zero_copy_only=False).astype(np.int64))
    ok = (src >= 0) & (dst >= 0)
    src, dst = src[ok], dst[ok]
    launch = ~device[src] & device[dst] & drawn[src] & drawn[dst]
    src, dst = src[launch], dst[launch]
    if not len(src):
        return []
    pairs = np.unique(np.stack([src, dst], axis=1), axis=0)
    children: dict[int, list[int]] = {}
    for child in np.flatnonzero(np.isin(parent, pairs[:, 0])).tolist():  # in row order
        children.setdefault(int(parent[child]), []).append(child)
    events: list[dict[str, Any]] = []
    for flow_id, (a, b) in enumerate(pairs.tolist()):
        kids = sorted(children.get(a, []), key=lambda c: start[c])
        at = _launch_point(a, float(start[b]), start, end, kids)
        common = {"name": "launch", "cat": "launch", "id": flow_id}
        events.append({**common, "ph": "s", "pid": int(rank[a]), "tid": int(tid[a]), "ts": at})
        events.append(
            {**common, "ph": "f", "bp": "e", "pid": int(rank[b]), "tid": int(tid[b]), "ts": float(start[b])}
        )
    return events


def _rows_of(ops: pa.Table, rank: np.ndarray, ident: np.ndarray) -> np.ndarray:
    """Row of ``ops`` of each (rank, id), -1 where there is none (one hash join)."""
    want = pa.table(
        {"rank": pa.array(rank, pa.int64()), "id": pa.array(ident, pa.int64()), "q": np.arange(len(rank))}
    )
    have = pa.table(
        {
            "rank": ops["rank"].cast(pa.int64()),
            "id": ops["id"].cast(pa.int64()),
            "row": np.arange(ops.num_rows),
        }
    )
    joined = want.join(have, ["rank", "id"], join_type="left outer")
    out = np.full(len(rank), -1, dtype=np.int64)
    out[joined["q"].to_numpy()] = pc.fill_null(joined["row"], -1).to_numpy(zero_copy_only=False)
    return out


def _launch_point(op: int, target: float, start: np.ndarray, end: np.ndarray, kids: Sequence[int]) -> float:
    """A time inside ``op`` and outside its children, at ``target`` (the launched op's start) or
    the latest such time before it (where none, the earliest after it)."""
    lo, hi = float(start[op]), float(end[op])
    target = min(max(target, lo), hi)
    gaps, at = [], lo
    for c in kids:  # in start order
        gaps.append((at, float(start[c])))
        at = max(at, float(end[c]))
    gaps.append((at, hi))
    gaps = [(a, b) for a, b in gaps if b > a]
    if not gaps:
        return target
    for a, b in gaps:
        if a < target < b:
            return target
    before = [g for g in gaps if g[1] <= target]
    a, b = before[-1] if before else gaps[0]
    margin = min((b - a) / 2, 0.5)
    return b - margin if before else a + margin


# ---------------------------------------------------------------- op types (no Kineto records)


def _by_op_types(trace: Trace, start: np.ndarray) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The document of :func:`~etstore.formats.chrome_trace.trace_timeline` for the timed ops, rebased."""
    ops = trace.ops
    length = pc.fill_null(ops["duration_micros"], 0).to_numpy(zero_copy_only=False)
    meta = pc.fill_null(pc.equal(ops["type"], "METADATA_NODE"), False).to_numpy(zero_copy_only=False)
    drawn = ~((start == 0) & ((length == 0) | meta))
    doc = trace_timeline(trace.replace(ops=ops.filter(pa.array(drawn))))
    origin = float(start[drawn].min())
    for ev in doc["traceEvents"]:
        if "ts" in ev:
            ev["ts"] = float(ev["ts"]) - origin
    doc["otherData"]["origin_us"] = origin
    return doc, np.where(drawn, start - origin, 0.0), drawn


# ---------------------------------------------------------------- the critical path


def _path_steps(ops: pa.Table, path: pa.Table) -> dict[int, int]:
    """Row of ``ops`` → its step on the critical path."""
    rows = _path_rows(ops, path)
    return {int(r): int(s) for r, s in zip(rows, path["step"].to_pylist(), strict=True) if r >= 0}


def _path_rows(ops: pa.Table, path: pa.Table) -> np.ndarray:
    """Row of ``ops`` of each step of ``path``."""
    return _rows_of(
        ops,
        path["rank"].to_numpy(zero_copy_only=False).astype(np.int64),
        path["id"].to_numpy(zero_copy_only=False).astype(np.int64),
    )


def _path_events(
    ops: pa.Table, path: pa.Table, ts: np.ndarray, drawn: np.ndarray, pid: int
) -> list[dict[str, Any]]:
    """The ``critical path`` process: its steps end to end from where the first drawn one started.

    A step of an op that is not drawn and lasts nothing (a metadata node) is left out.
    """
    rows = _path_rows(ops, path)
    offset = path["start_micros"].to_numpy(zero_copy_only=False).astype(np.float64)
    dur = pc.fill_null(path["duration_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    seen = (rows >= 0) & drawn[np.maximum(rows, 0)] if len(rows) else np.zeros(0, dtype=bool)
    keep = seen | (dur > 0)
    if not keep.any():
        return []
    first = int(np.argmax(seen)) if seen.any() else 0
    base = max(float(ts[rows[first]]) - float(offset[first]), 0.0) if seen.any() else 0.0
    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "critical path"}},
        {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
        {
            "name": "thread_name",
            "ph": "M",
            "pid": pid,
            "tid": CRITICAL_PATH_TRACK,
            "args": {"name": "critical path"},
        },
    ]
    cols = {c: path[c].to_pylist() for c in ("step", "rank", "id", "name", "type", "via")}
    for k in np.flatnonzero(keep).tolist():
        events.append(
            {
                "name": cols["name"][k] or "",
                "cat": "critical path",
                "ph": "X",
                "pid": pid,
                "tid": CRITICAL_PATH_TRACK,
                "ts": base + float(offset[k]),
                "dur": float(dur[k]),
                "args": {c: cols[c][k] for c in ("step", "rank", "id", "type", "via")},
            }
        )
    return events


def _metadata(ranks: Sequence[int], tracks: Mapping[tuple[int, int], str]) -> list[dict[str, Any]]:
    """Process names (``rank N``) and sort order, and each track's name and sort order."""
    out: list[dict[str, Any]] = []
    for r in ranks:
        out.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}})
    for (r, t), name in sorted(tracks.items()):
        out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": t, "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": r, "tid": t, "args": {"sort_index": t}})
    return out
