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

__all__ = ["SYNC_CALLS", "Device", "HostWaits", "Lanes", "device_columns", "device_waits", "host_waits"]

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


class Device(NamedTuple):
    """Device activities as columns (start-time order), with their launching runtime calls."""

    start: np.ndarray  # int64 µs
    end: np.ndarray  # int64 µs
    stream: np.ndarray  # int64
    launch_ts: np.ndarray  # int64 µs, -1 where the launch call is unknown
    launch_end: np.ndarray  # int64 µs
    launch_tid: list[Any]  # the launching call's thread, None where unknown


def device_columns(device: Sequence[Mapping[str, Any]], launch: Sequence[Mapping[str, Any] | None]) -> Device:
    """:class:`Device` of Kineto device events and the runtime calls that launched them."""
    start = np.asarray([_us(e.get("ts")) for e in device], dtype=np.int64)
    l_ts = np.asarray([_us(c.get("ts")) if c is not None else -1 for c in launch], dtype=np.int64)
    return Device(
        start=start,
        end=start + np.asarray([_us(e.get("dur")) for e in device], dtype=np.int64),
        stream=np.asarray([_stream(e) for e in device], dtype=np.int64),
        launch_ts=l_ts,
        launch_end=l_ts
        + np.asarray([_us(c.get("dur")) if c is not None else 0 for c in launch], dtype=np.int64),
        launch_tid=[c.get("tid") if c is not None else None for c in launch],
    )


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


class Lanes:
    """Items grouped by lane (a stream, a thread), each lane sorted by a key (an end time):
    the last item of a lane at or before a time, of one lane or of every other lane.

    O(n log n) to build, O(log n) per lane and question, so a trace with many waits asks in
    O(w · lanes · log n) instead of scanning every item per wait.

    >>> lanes = Lanes(np.array([7, 7, 9]), np.array([10, 30, 20]))
    >>> lanes.last(7, 25), lanes.last(9, 19), lanes.last_besides(7, 25)
    (0, -1, 2)
    """

    def __init__(self, lane: np.ndarray, key: np.ndarray) -> None:
        self.key = key
        order = np.lexsort((np.arange(len(lane)), key, lane))
        self._lanes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        ordered = lane[order]
        cut = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(lane) else np.zeros(0, np.int64)
        for lo, hi in zip(cut.tolist(), [*cut[1:].tolist(), len(lane)][: len(cut)], strict=True):
            rows = order[lo:hi]
            self._lanes[int(lane[rows[0]])] = (rows, key[rows])

    def last(self, lane: int, t: int, skip: Callable[[int], bool] | None = None) -> int:
        """The item of ``lane`` with the greatest key ≤ ``t`` (passing over items ``skip``
        refuses), or -1."""
        rows, keys = self._lanes.get(lane, (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))
        i = int(np.searchsorted(keys, t, "right")) - 1
        while i >= 0 and skip is not None and skip(int(rows[i])):
            i -= 1
        return int(rows[i]) if i >= 0 else -1

    def last_besides_many(self, lane: np.ndarray, t: np.ndarray) -> np.ndarray:
        """:meth:`last_besides` for many questions at once (no ``skip``): one search per lane."""
        best = np.full(len(t), -1, dtype=np.int64)
        best_key = np.zeros(len(t), dtype=self.key.dtype)
        for other, (rows, keys) in self._lanes.items():
            i = np.searchsorted(keys, t, "right") - 1
            found = (i >= 0) & (lane != other)
            cand = rows[np.maximum(i, 0)]
            better = found & ((best < 0) | (self.key[cand] > best_key))
            best = np.where(better, cand, best)
            best_key = np.where(better, self.key[cand], best_key)
        return best

    def last_besides(self, lane: int | None, t: int, skip: Callable[[int], bool] | None = None) -> int:
        """:meth:`last` over every lane but ``lane`` (every lane when None): the latest of them."""
        best = -1
        for other in self._lanes:
            if other != lane:
                i = self.last(other, t, skip)
                if i >= 0 and (best < 0 or self.key[i] > self.key[best]):
                    best = i
        return best


def host_waits(
    runtime: Sequence[Mapping[str, Any]], device: Device, innermost: Callable[[Any, int], int]
) -> HostWaits:
    """Each blocking runtime call inside a linked op, with the device activity that released it.

    ``runtime`` are the runtime calls with ``tid`` keyed as ``(pid, tid)``; ``device`` the
    kept device activities; ``innermost(tid, t)`` gives the ET row holding time ``t`` on
    thread ``tid`` (-1 when none). The releaser is the activity launched before the call
    that ended last inside it: on the stream the thread launched on last for a stream
    synchronize, on any stream for the others.
    """
    d_end, d_stream = device.end, device.stream
    l_ts = np.where(device.launch_ts >= 0, device.launch_ts, 1 << 62)
    tid_codes: dict[Any, int] = {}
    l_tid = np.asarray([tid_codes.setdefault(t, len(tid_codes)) for t in device.launch_tid], dtype=np.int64)
    by_end = Lanes(d_stream, d_end)
    by_launch = Lanes(l_tid, l_ts)
    names: list[str] = []
    rows, starts, durs, owns, rels = [], [], [], [], []
    raws: list[dict[str, Any]] = []
    for call in sorted((e for e in runtime if e.get("name") in SYNC_CALLS), key=lambda e: _us(e.get("ts"))):
        ts, dur = _us(call.get("ts")), _us(call.get("dur"))
        row = innermost(call.get("tid"), ts)
        if row < 0 or dur <= 0:
            continue

        def launched_later(i: int, ts: int = ts) -> bool:
            return bool(l_ts[i] >= ts)

        stream = None
        if call.get("name") in _STREAM_SYNCS and call.get("tid") in tid_codes:
            last = by_launch.last(tid_codes[call.get("tid")], ts - 1)
            stream = int(d_stream[last]) if last >= 0 else None
        if stream is not None:
            rel = by_end.last(stream, ts + dur + 1, launched_later)
        else:
            rel = by_end.last_besides(None, ts + dur + 1, launched_later)
        if rel >= 0 and d_end[rel] <= ts:
            rel = -1  # done before the call: it did not block on it
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
    device: Device,
    syncs: Sequence[Mapping[str, Any]] = (),
    record_calls: Mapping[int, Mapping[str, Any]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``(src, dst)`` between device activities on different streams: ``dst`` waited for ``src``.

    ``syncs`` are Kineto ``cuda_sync`` "Stream Wait Event" events (with
    ``wait_on_stream``, ``wait_on_cuda_event_record_corr_id`` and the wait call's
    ``correlation``) and ``record_calls`` the runtime calls by correlation; where they are
    given the wait is read from them, otherwise it is inferred from each activity's idle gap.
    """
    start, end, stream, l_ts, l_end = (
        device.start,
        device.end,
        device.stream,
        device.launch_ts,
        device.launch_end,
    )
    n = len(start)
    recorded = [s for s in syncs if (s.get("args") or {}).get("wait_on_stream") is not None]
    if recorded and record_calls is not None:
        return _recorded_waits(recorded, record_calls, stream, l_ts)
    prev_end = np.full(n, -1, dtype=np.int64)
    last: dict[int, int] = {}
    for i in np.argsort(start, kind="stable").tolist():
        s = int(stream[i])
        if s in last:
            prev_end[i] = end[last[s]]
        last[s] = i
    could = np.maximum(l_end, prev_end)
    held = np.flatnonzero((l_ts >= 0) & (start - could >= HELD_US))
    j = Lanes(stream, end).last_besides_many(stream[held], start[held] + 1)
    k = np.maximum(j, 0)
    ok = (j >= 0) & (end[k] >= could[held]) & (start[k] < start[held])
    return j[ok], held[ok]


def _recorded_waits(
    syncs: Sequence[Mapping[str, Any]],
    record_calls: Mapping[int, Mapping[str, Any]],
    stream: np.ndarray,
    l_ts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Waits as Kineto recorded them: the waiting stream's first activity launched after the
    wait depends on the awaited stream's last activity launched before the event's record."""
    src: list[int] = []
    dst: list[int] = []
    by_launch = Lanes(stream, l_ts)
    later = Lanes(stream, -l_ts)  # the first launched after t is the last at or before -t - 1 here
    for s in syncs:
        args = s.get("args") or {}
        rec = record_calls.get(int(args.get("wait_on_cuda_event_record_corr_id", -1)))
        call = record_calls.get(int(args.get("correlation", -1)))
        if rec is None or call is None:
            continue
        before = by_launch.last(int(args.get("wait_on_stream", -1)), _us(rec.get("ts")) - 1)
        after = later.last(_stream(s), -_us(call.get("ts")) - 1)
        if before >= 0 and after >= 0 and l_ts[before] >= 0:
            src.append(before)
            dst.append(after)
    return np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
