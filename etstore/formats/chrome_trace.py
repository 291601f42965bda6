"""Chrome trace-event JSON out: the timeline Perfetto UI and chrome://tracing open.

The document is the trace-event format's JSON object form::

    {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}

with, per rank, one process (``pid`` = rank, named ``rank N``) whose threads are
*tracks*: compute ops on ``compute`` tracks, communication ops on ``comm`` tracks and
anything else on ``other`` tracks. Ops of one kind that overlap in time go to extra
tracks of that kind (``comm 2``, ``comm 3``, ...) so that every track holds disjoint
complete (``"ph": "X"``) events, which both viewers require. Messages (a send and the
receive it pairs with) and the pieces of one collective on several ranks are flow
events (``"s"`` → ``"t"`` … → ``"f"``, bound to the enclosing slices); per-link values
(utilisation) are counter events (``"C"``) on a ``network`` process. Times are µs (the
format's unit), as floats.

:func:`chrome_trace_document` builds a document from columnar slices, flows and
counters; :func:`trace_timeline` does it for a stored trace that carries timestamps
(``start_time_micros``, e.g. read from a PyTorch/Kineto-derived ``.et``);
:func:`write_chrome_trace` writes either. The simulator's runs get theirs from
:mod:`etstore.report.timeline`.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import match_messages
from etstore.errors import OptionError
from etstore.model import Trace

__all__ = [
    "COMM_TRACK",
    "COMPUTE_TRACK",
    "OTHER_TRACK",
    "chrome_trace_document",
    "trace_timeline",
    "track_of_types",
    "write_chrome_trace",
]

COMPUTE_TRACK = 1
"""Thread id of a rank's first compute track (more compute tracks follow: 2, 3, ...)."""
COMM_TRACK = 1001
"""Thread id of a rank's first communication track."""
OTHER_TRACK = 2001
"""Thread id of a rank's first track for other ops (memory, metadata)."""

_TRACK_NAMES = {COMPUTE_TRACK: "compute", COMM_TRACK: "comm", OTHER_TRACK: "other"}


def track_of_types(types: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The base track of each op type: compute for ``COMP_NODE``, comm for ``COMM_*``, else other.

    Notes
    -----
    O(n), vectorised.
    """
    comp = pc.fill_null(pc.equal(types, "COMP_NODE"), False).to_numpy(zero_copy_only=False)
    comm = pc.fill_null(pc.starts_with(types, "COMM_"), False).to_numpy(zero_copy_only=False)
    return np.where(comp, COMPUTE_TRACK, np.where(comm, COMM_TRACK, OTHER_TRACK)).astype(np.int64)


def _lanes(pid: np.ndarray, base: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Thread id of each slice: its base track, or base + k when it overlaps slices already placed.

    Interval partitioning per (pid, base track): slices sorted by start take the lowest
    lane whose last slice has ended; O(n log lanes).
    """
    tid = base.copy()
    order = np.lexsort((-end, start, base, pid))
    heap: list[tuple[float, int]] = []
    free: list[int] = []
    used = 0
    key: tuple[int, int] | None = None
    for i in order:
        k = (int(pid[i]), int(base[i]))
        if k != key:
            key, heap, free, used = k, [], [], 0
        while heap and heap[0][0] <= start[i]:
            heapq.heappush(free, heapq.heappop(heap)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, used = used, used + 1
        heapq.heappush(heap, (float(end[i]), lane))
        tid[i] = base[i] + lane
    return tid


def chrome_trace_document(
    slices: pa.Table,
    *,
    flows: pa.Table | None = None,
    counters: pa.Table | None = None,
    process_names: Mapping[int, str] | None = None,
    track_names: Mapping[int, str] | None = None,
    other_data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A trace-event JSON document from columnar slices, flows and counters.

    Parameters
    ----------
    slices
        One row per complete event: ``pid`` (int), ``track`` (a base track:
        :data:`COMPUTE_TRACK`, :data:`COMM_TRACK`, :data:`OTHER_TRACK` or any other
        thread id), ``name``, ``cat`` (strings), ``ts_us``, ``dur_us`` (floats, µs) and
        ``args`` (a JSON object as a string, or null). Overlapping slices of one track
        are spread over extra tracks.
    flows
        One row per flow step: ``flow_id`` (int), ``step`` (0 for the start, 1, 2, ...;
        the last step of a flow ends it), ``slice`` (the row of ``slices`` the step binds
        to), ``ts_us`` (inside that slice), ``name`` and ``cat``.
    counters
        One row per counter sample: ``pid``, ``name`` (the counter), ``series`` (the
        value's name), ``ts_us`` and ``value``.
    process_names
        Name of each pid (default ``rank <pid>``).
    track_names
        Names of further base tracks (thread ids at least 1000 apart), beside
        ``compute``, ``comm`` and ``other``.
    other_data
        Free-form metadata (``otherData``): the source, units, ...

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``.

    Raises
    ------
    OptionError
        A slice has a negative duration, or a flow step names a slice that does not
        exist.

    Notes
    -----
    O(S log S + F + C) for S slices, F flow steps and C counter samples.
    """
    pid = slices["pid"].to_numpy(zero_copy_only=False).astype(np.int64)
    ts = slices["ts_us"].to_numpy(zero_copy_only=False).astype(np.float64)
    dur = slices["dur_us"].to_numpy(zero_copy_only=False).astype(np.float64)
    if len(dur) and float(dur.min()) < 0:
        raise OptionError(f"timeline: slice {int(np.argmin(dur))} has a negative duration ({dur.min()} µs)")
    tid = _lanes(pid, slices["track"].to_numpy(zero_copy_only=False).astype(np.int64), ts, ts + dur)
    names = slices["name"].to_pylist()
    cats = slices["cat"].to_pylist()
    args: list[str | None] = (
        slices["args"].to_pylist() if "args" in slices.column_names else [None] * len(pid)
    )
    events: list[dict[str, Any]] = _metadata(
        pid, tid, process_names or {}, {**_TRACK_NAMES, **(track_names or {})}
    )
    for i in range(len(pid)):
        ev: dict[str, Any] = {
            "name": names[i] or "",
            "cat": cats[i] or "op",
            "ph": "X",
            "pid": int(pid[i]),
            "tid": int(tid[i]),
            "ts": float(ts[i]),
            "dur": float(dur[i]),
        }
        text = args[i]
        if text:
            ev["args"] = json.loads(text)
        events.append(ev)
    if flows is not None and flows.num_rows:
        events.extend(_flow_events(flows, pid, tid, len(pid)))
    if counters is not None and counters.num_rows:
        events.extend(
            {"name": n, "ph": "C", "pid": int(p), "ts": float(t), "args": {s: float(v)}}
            for p, n, s, t, v in zip(
                *(counters[c].to_pylist() for c in ("pid", "name", "series", "ts_us", "value")), strict=True
            )
        )
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": dict(other_data or {})}


def _metadata(
    pid: np.ndarray, tid: np.ndarray, names: Mapping[int, str], tracks: Mapping[int, str]
) -> list[dict[str, Any]]:
    """Process and thread name (and sort order) events for every pid and tid used."""
    out: list[dict[str, Any]] = []
    for p in sorted({int(x) for x in np.unique(pid)} | set(names)):
        out.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": p,
                "tid": 0,
                "args": {"name": names.get(p, f"rank {p}")},
            }
        )
        out.append({"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0, "args": {"sort_index": p}})
    pairs = np.unique(np.stack([pid, tid], axis=1), axis=0) if len(pid) else np.empty((0, 2), np.int64)
    for p, t in pairs:
        base = max((b for b in tracks if b <= t), default=None)
        if base is None or t - base >= 1000:
            label = f"track {t}"
        else:
            label = tracks[base] if t == base else f"{tracks[base]} {t - base + 1}"
        out.append({"name": "thread_name", "ph": "M", "pid": int(p), "tid": int(t), "args": {"name": label}})
        out.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": int(p),
                "tid": int(t),
                "args": {"sort_index": int(t)},
            }
        )
    return out


def _flow_events(flows: pa.Table, pid: np.ndarray, tid: np.ndarray, n: int) -> Iterable[dict[str, Any]]:
    """``s``/``t``/``f`` events of each flow, in step order, bound to their slices' tracks."""
    fid = flows["flow_id"].to_numpy(zero_copy_only=False).astype(np.int64)
    step = flows["step"].to_numpy(zero_copy_only=False).astype(np.int64)
    row = flows["slice"].to_numpy(zero_copy_only=False).astype(np.int64)
    ts = flows["ts_us"].to_numpy(zero_copy_only=False).astype(np.float64)
    if len(row) and (row.min() < 0 or row.max() >= n):
        raise OptionError(f"timeline: a flow step names slice {int(row.max())}, but there are {n} slices")
    names = flows["name"].to_pylist()
    cats = flows["cat"].to_pylist()
    order = np.lexsort((step, fid))
    last = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        last[:-1] = fid[order][1:] != fid[order][:-1]
    for pos, i in enumerate(order):
        first = step[i] == 0
        ph = "s" if first else ("f" if last[pos] else "t")
        ev: dict[str, Any] = {
            "name": names[i] or "flow",
            "cat": cats[i] or "flow",
            "ph": ph,
            "id": int(fid[i]),
            "pid": int(pid[row[i]]),
            "tid": int(tid[row[i]]),
            "ts": float(ts[i]),
        }
        if ph != "s":
            ev["bp"] = "e"
        yield ev


def trace_timeline(trace: Trace) -> dict[str, Any]:
    """The timeline of a trace that carries timestamps (``start_time_micros``).

    Each op is a slice from ``start_time_micros`` for ``duration_micros`` µs (times as
    recorded, not shifted); each send and the receive it pairs with
    (:func:`~etstore.dag.match_messages`) is a flow from the send's start to the
    receive.

    Parameters
    ----------
    trace
        The trace; at least one op needs a non-zero ``start_time_micros``.

    Returns
    -------
    dict
        The trace-event document (:func:`chrome_trace_document`).

    Raises
    ------
    OptionError
        No op has a timestamp (every ``start_time_micros`` is 0 or missing): a
        generated or algorithm trace has no timeline of its own; simulate it and write
        the run's timeline instead.

    Notes
    -----
    O(V log V + E) for V ops and E matched messages.
    """
    ops = trace.ops
    start = pc.fill_null(ops["start_time_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    if not len(start) or not start.any():
        raise OptionError(
            f"trace {trace.name!r} has no timestamps (start_time_micros is 0 on every op); "
            "simulate it and write the run's timeline instead"
        )
    dur = pc.fill_null(ops["duration_micros"], 0).to_numpy(zero_copy_only=False).astype(np.float64)
    args = [
        json.dumps(
            {k: v for k, v in (("id", i), ("type", t), ("comm_type", c), ("comm_size", s)) if v is not None}
        )
        for i, t, c, s in zip(
            *(ops[c].to_pylist() for c in ("id", "type", "comm_type", "comm_size")), strict=True
        )
    ]
    types = ops["type"]
    slices = pa.table(
        {
            "pid": ops["rank"],
            "track": track_of_types(types),
            "name": ops["name"],
            "cat": pc.if_else(
                pc.starts_with(types, "COMM_"),
                "comm",
                pc.if_else(pc.equal(types, "COMP_NODE"), "compute", "other"),
            ),
            "ts_us": start,
            "dur_us": dur,
            "args": pa.array(args, pa.string()),
        }
    )
    match = match_messages(trace)
    send, recv = match.send_row, match.recv_row
    recv_ts = np.clip(np.maximum(start[recv], start[send]), start[recv], start[recv] + dur[recv])
    k = len(send)
    flows = pa.table(
        {
            "flow_id": np.concatenate([np.arange(k), np.arange(k)]),
            "step": np.concatenate([np.zeros(k, np.int64), np.ones(k, np.int64)]),
            "slice": np.concatenate([send, recv]),
            "ts_us": np.concatenate([start[send], recv_ts]),
            "name": pa.array(["message"] * (2 * k), pa.string()),
            "cat": pa.array(["message"] * (2 * k), pa.string()),
        }
    )
    return chrome_trace_document(
        slices,
        flows=flows,
        other_data={"source": trace.source or trace.name, "trace": trace.name, "time_unit": "us"},
    )


def write_chrome_trace(doc: Mapping[str, Any] | Trace, out: str | Path) -> Path:
    """Write a trace-event document (or a timestamped trace's timeline) as JSON.

    Parameters
    ----------
    doc
        A document from :func:`chrome_trace_document` / :func:`trace_timeline`, or a
        :class:`~etstore.model.Trace` (its :func:`trace_timeline`).
    out
        The file; ``.json`` is appended when ``out`` has no ``.json`` suffix.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    OptionError
        ``doc`` is a trace without timestamps.
    OSError
        The file cannot be written.

    Notes
    -----
    O(events); compact JSON, one event per line.
    """
    document = trace_timeline(doc) if isinstance(doc, Trace) else doc
    path = Path(out)
    if path.suffix != ".json":
        path = path.with_name(path.name + ".json")
    events = document.get("traceEvents", [])
    head = {k: v for k, v in document.items() if k != "traceEvents"}
    with path.open("w", encoding="utf-8") as fh:
        fh.write('{"traceEvents": [\n')
        fh.write(",\n".join(json.dumps(ev, separators=(",", ":")) for ev in events))
        fh.write("\n]")
        for key, value in head.items():
            fh.write(f", {json.dumps(key)}: {json.dumps(value, default=str)}")
        fh.write("}\n")
    return path
