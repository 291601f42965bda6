"""What a recorded host thread or GPU stream waited for, read from its Kineto trace.

A CPU op's recorded time includes the time it spent blocked in a synchronizing runtime
call (``cudaStreamSynchronize`` behind ``.item()`` or a device-to-host copy,
``cudaDeviceSynchronize``, a blocking ``cudaMemcpy``). A replay must not run that wait as
work: the wait ends when the device work it waits for ends, which the replay models
already. So each such call becomes a *host wait*: the device activity that released it
(the one it waited for that ended last before it returned) and the call's own time, the
part after the release.

A kernel that started later than both its launch and its stream's previous activity was
held by a cross-stream wait (``cudaStreamWaitEvent``: the compute stream waiting for an
NCCL stream, or the reverse). Newer Kineto traces record those waits as ``cuda_sync``
events naming the awaited event's record; older ones (the DLRM set) do not, and then the
waiting activity is tied to the activity on another stream that ended last before it
started, within its idle gap: the recording's own evidence of what released it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["SYNC_CALLS", "HostWaits", "device_waits", "host_waits"]

# runtime calls that block the calling host thread until device work ends
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
_STREAM_SYNCS = frozenset({"cudaStreamSynchronize", "cuStreamSynchronize", "hipStreamSynchronize"})
# a device activity that starts this long (µs) after it could have is taken as held by a wait
HELD_US = 3


class HostWaits(NamedTuple):
    """Blocking runtime calls of linked threads, one row each (in time order)."""

    names: list[str]
    row: np.ndarray  # int64: the innermost linked ET row whose interval holds the call
    start_us: np.ndarray  # int64
    dur_us: np.ndarray  # int64: the whole call as recorded
    own_us: np.ndarray  # int64: the part after the awaited activity ended (all of it if none)
    releaser: np.ndarray  # int64: index of the awaited device activity, -1 if none
    raw: list[dict[str, Any]]


def _us(value: Any) -> int:
    return round(float(value or 0))


def host_waits(
    runtime: Sequence[Mapping[str, Any]],
    device: Sequence[Mapping[str, Any]],
    launch: Sequence[Mapping[str, Any] | None],
    innermost: Callable[[Any, int], int],
) -> HostWaits:
    """Each blocking runtime call inside a linked op, with the device activity that released it.

    ``runtime`` are the runtime calls with ``tid`` keyed as ``(pid, tid)``; ``device`` the
    kept device activities (start-time order) and ``launch`` their launching runtime
    calls; ``innermost(tid, t)`` gives the ET row holding time ``t`` on
    thread ``tid`` (-1 when none). For a stream synchronize the awaited stream is the one
    the thread launched on last; for the others any stream counts.
    """
    d_start = np.asarray([_us(e.get("ts")) for e in device], dtype=np.int64)
    d_end = d_start + np.asarray([_us(e.get("dur")) for e in device], dtype=np.int64)
    d_stream = np.asarray([_stream(e) for e in device], dtype=np.int64)
    l_tid = [c.get("tid") if c is not None else None for c in launch]
    l_ts = np.asarray([_us(c.get("ts")) if c is not None else 1 << 62 for c in launch], dtype=np.int64)
    names: list[str] = []
    rows, starts, durs, owns, rels = [], [], [], [], []
    raws: list[dict[str, Any]] = []
    for call in sorted((e for e in runtime if e.get("name") in SYNC_CALLS), key=lambda e: _us(e.get("ts"))):
        ts, dur = _us(call.get("ts")), _us(call.get("dur"))
        row = innermost(call.get("tid"), ts)
        if row < 0 or dur <= 0:
            continue
        before = l_ts < ts
        if call.get("name") in _STREAM_SYNCS:
            mine = np.flatnonzero(before & np.asarray([t == call.get("tid") for t in l_tid], dtype=bool))
            if len(mine):
                last = mine[np.argmax(l_ts[mine])]
                before &= d_stream == d_stream[last]
        cand = np.flatnonzero(before & (d_end <= ts + dur + 1) & (d_end > ts))
        rel = int(cand[np.argmax(d_end[cand])]) if len(cand) else -1
        own = dur if rel < 0 else int(min(dur, max(0, ts + dur - int(d_end[rel]))))
        names.append(str(call.get("name")))
        rows.append(row)
        starts.append(ts)
        durs.append(dur)
        owns.append(own)
        rels.append(rel)
        tid = call.get("tid")
        raws.append(dict(call, tid=tid[1] if isinstance(tid, tuple) else tid))  # as the file had it
    i64 = np.int64
    return HostWaits(
        names,
        np.asarray(rows, dtype=i64),
        np.asarray(starts, dtype=i64),
        np.asarray(durs, dtype=i64),
        np.asarray(owns, dtype=i64),
        np.asarray(rels, dtype=i64),
        raws,
    )


def _stream(e: Mapping[str, Any]) -> int:
    args = e.get("args") or {}
    return int(args.get("stream", e.get("tid", 0)) or 0)


def device_waits(
    device: Sequence[Mapping[str, Any]],
    launch: Sequence[Mapping[str, Any] | None],
    syncs: Sequence[Mapping[str, Any]] = (),
    record_calls: Mapping[int, Mapping[str, Any]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``(src, dst)`` between device activities on different streams: ``dst`` waited for ``src``.

    ``syncs`` are Kineto ``cuda_sync`` "Stream Wait Event" events (with
    ``wait_on_stream``, ``wait_on_cuda_event_record_corr_id`` and the wait call's
    ``correlation``) and ``record_calls`` the runtime calls by correlation; where they are
    given the wait is read from them, otherwise it is inferred from each activity's idle gap.
    """
    n = len(device)
    src: list[int] = []
    dst: list[int] = []
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    start = np.asarray([_us(e.get("ts")) for e in device], dtype=np.int64)
    end = start + np.asarray([_us(e.get("dur")) for e in device], dtype=np.int64)
    stream = np.asarray([_stream(e) for e in device], dtype=np.int64)
    l_ts = np.asarray([_us(c.get("ts")) if c is not None else -1 for c in launch], dtype=np.int64)
    l_end = l_ts + np.asarray([_us(c.get("dur")) if c is not None else 0 for c in launch], dtype=np.int64)
    recorded = [s for s in syncs if (s.get("args") or {}).get("wait_on_stream") is not None]
    if recorded and record_calls is not None:
        return _recorded_waits(recorded, record_calls, start, end, stream, l_ts)
    prev_end = np.full(n, -1, dtype=np.int64)
    last: dict[int, int] = {}
    for i in np.argsort(start, kind="stable").tolist():
        s = int(stream[i])
        if s in last:
            prev_end[i] = end[last[s]]
        last[s] = i
    for i in range(n):
        could = max(int(l_end[i]), int(prev_end[i]))
        if l_ts[i] < 0 or start[i] - could < HELD_US:
            continue
        cand = np.flatnonzero(
            (stream != stream[i]) & (end <= start[i] + 1) & (end >= could) & (start < start[i])
        )
        if len(cand):
            src.append(int(cand[np.argmax(end[cand])]))
            dst.append(i)
    return np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)


def _recorded_waits(
    syncs: Sequence[Mapping[str, Any]],
    record_calls: Mapping[int, Mapping[str, Any]],
    start: np.ndarray,
    end: np.ndarray,
    stream: np.ndarray,
    l_ts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Waits as Kineto recorded them: the waiting stream's next activity after the wait
    depends on the awaited stream's last activity launched before the event's record."""
    src: list[int] = []
    dst: list[int] = []
    for s in syncs:
        args = s.get("args") or {}
        on = int(args.get("wait_on_stream", -1))
        rec = record_calls.get(int(args.get("wait_on_cuda_event_record_corr_id", -1)))
        call = record_calls.get(int(args.get("correlation", -1)))
        if rec is None or call is None:
            continue
        r_ts, w_ts, waiting = _us(rec.get("ts")), _us(call.get("ts")), _stream(s)
        before = np.flatnonzero((stream == on) & (l_ts >= 0) & (l_ts < r_ts))
        after = np.flatnonzero((stream == waiting) & (l_ts > w_ts))
        if len(before) and len(after):
            src.append(int(before[np.argmax(l_ts[before])]))
            dst.append(int(after[np.argmin(l_ts[after])]))
    return np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
