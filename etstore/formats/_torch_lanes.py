"""Host threads of a recorded rank as lanes: the order each thread ran its ops, and their thread time.

A thread runs one op at a time. Its ops (ET nodes linked with Kineto, plus the blocking
runtime calls of :mod:`._torch_sync`) form one chain in the order they ran. Each op ends, in
the replay, where its thread left it in the recording: a leaf at its own end, a wrapper
where its first child starts (its trailing time after the children belongs to the last of
them). Its *thread time* runs from where the previous op of its thread ended to that point,
so the untraced time before an op (Python, the dispatcher) is part of it, the thread's chain
adds up to its recorded wall time, and whatever depends on an op from another lane (a
kernel it launched, gloo work it enqueued) waits for the op itself, not for the gap after it.

Where the thread waited on something the model represents, the wait is a dependency, not
time: an op that was released by another lane starts its thread time at the release, not
where the previous op ended. Releases come from

* a blocking call: the device activity it waited for (:func:`._torch_sync.host_waits`);
* a thread that recorded nothing and resumed within :data:`WAKE_US` of another thread's op
  ending (or within a tenth of the time the thread was idle: wake-ups are slow on a loaded
  machine): that op (the caller of ``backward()`` on
  the autograd engine's thread; DDP's wait for its bucket's all-reduce). A thread's first
  op was released by the last op of another thread to end before it, and its thread time
  starts there. A thread
  resumes at its first recorded event of any kind (a runtime call, such as the
  ``cudaStreamWaitEvent`` of a ``wait()`` on gloo's CUDA work, counts);
* a wait call (``c10d::wait``, ``_c10d_functional::wait_tensor``, an awaitable's ``wait()``)
  that returned within :data:`WAKE_US` of another thread's op ending inside it: that op (a
  ``wait()`` on gloo's worker thread);
* the data it reads: an op that reads what an op of another thread wrote could not start
  before that op ended, however long the thread took to wake up (DDP's copy back of a
  broadcast, after an untraced ``wait()``).

A communication call keeps its own recorded time. Where the thread ran other ops inside it
(gloo on CUDA tensors: a stream synchronize before the exchange, the copy back to the device
after it), the call is its exchange alone: the longest stretch of it that no nested op covers
after its last blocking call (the exchange needs the data the call waited for; time before
that call, a profiler's buffer flush holding the CUDA runtime say, is the call's own). The
nested ops before that stretch run before the call on its thread, the ones after it after,
each with its own thread time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from etstore.formats._torch_sync import Lanes

__all__ = ["WAKE_US", "ThreadLanes", "issuers", "run_threads", "thread_lanes"]

WAKE_US = 100
"""A thread that resumes this long (µs) after another thread's op ended was waiting for it."""


class ThreadLanes(NamedTuple):
    """Chain edges ``src → dst`` and their kind (``thread``: run order; ``launch``: a worker's
    run after what preceded its call; ``wait``: a thread released by another's op), each timed
    row's duration and start (the recorded one; a communication call's exchange where it ran
    nested ops)."""

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    rows: np.ndarray
    dur: np.ndarray
    start: np.ndarray


def thread_lanes(
    rows: np.ndarray,
    thread: np.ndarray,
    after: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    timed: np.ndarray,
    released_at: np.ndarray,
    keep_own: np.ndarray,
    is_wait: np.ndarray | None = None,
    is_sync: np.ndarray | None = None,
    activity: tuple[np.ndarray, np.ndarray] | None = None,
    issuer: np.ndarray | None = None,
    data_release: np.ndarray | None = None,
) -> ThreadLanes:
    """The thread chains of ``rows`` and the thread time of their timed ones.

    Parameters (arrays indexed like ``rows``)
    ----------
    rows
        Executing ops of the rank, in the rank's row numbering.
    thread
        Each op's thread (an integer code).
    after
        Where each op sits in its thread: ET ops by entry order ``2 · row``, a blocking call
        ``2 · p + 1`` just after the op ``p`` that started last before it.
    start, end
        Recorded interval (µs) of each op.
    timed
        Whether the op has recorded times (a linked ET op, a blocking call).
    released_at
        For a blocking call, when the activity that released it ended; -1 for other ops.
    keep_own
        Ops that keep their recorded time (communication calls).
    is_wait
        Wait calls, released by what they waited for (default: none).
    is_sync
        Blocking runtime calls (default: those with a ``released_at``).
    activity
        Every recorded event of the threads, as ``(thread, start)`` sorted by both: where a
        thread resumed after an idle gap (default: at its next op).
    issuer
        For a backend's record of running a call on another thread (gloo's worker), the
        call's index, else -1: the record's run (its first nested op, else the record)
        follows what ran before the call on the call's thread, and its thread time starts
        where the call began (or the worker's previous op ended), so the worker's pick-up
        latency is the run's own time.
    data_release
        For each op, the latest recorded end of an op of another thread whose data it reads
        (-1: none): the op could not start before that data existed, so a thread idle until
        then was waiting for it, as for a release (default: none).

    Examples
    --------
    A wrapper (0..10) with a child (2..5) and a later op (8..9); a second thread's op ends
    at 150 and the first thread resumes at 160, idle since 9. The second thread's first op
    was started by the last op to end before it, the wrapper (at 10, after its last
    descendant, the op at 8..9), and its wake-up is its time:

    >>> lanes = thread_lanes(
    ...     rows=np.array([0, 1, 2, 3, 4]), thread=np.array([0, 0, 0, 0, 1]),
    ...     after=np.array([0, 2, 4, 6, 8]), start=np.array([0, 2, 8, 160, 100]),
    ...     end=np.array([10, 5, 9, 170, 150]), timed=np.ones(5, bool),
    ...     released_at=np.full(5, -1), keep_own=np.zeros(5, bool))
    >>> lanes.dur.tolist()
    [2, 3, 4, 20, 140]
    >>> list(zip(lanes.src.tolist(), lanes.dst.tolist(), lanes.kind.tolist()))
    [(0, 1, 'thread'), (1, 2, 'thread'), (2, 3, 'thread'), (4, 3, 'wait'), (2, 4, 'wait')]

    A communication call (0..100) that synchronized (1..3) before its exchange and copied
    back (90..95) after it is the exchange, 3..90, between the two:

    >>> lanes = thread_lanes(
    ...     rows=np.array([0, 1, 2]), thread=np.zeros(3, int), after=np.array([0, 1, 4]),
    ...     start=np.array([0, 1, 90]), end=np.array([100, 3, 95]), timed=np.ones(3, bool),
    ...     released_at=np.full(3, -1), keep_own=np.array([True, False, False]))
    >>> list(zip(lanes.src.tolist(), lanes.dst.tolist()))
    [(1, 0), (0, 2)]
    >>> list(zip(lanes.rows.tolist(), lanes.start.tolist(), lanes.dur.tolist()))
    [(1, 1, 2), (0, 3, 87), (2, 90, 5)]
    """
    whole_end = end
    sync = released_at >= 0 if is_sync is None else is_sync
    start, end, after, head, tail = _exchanges(thread, after, start, end, timed, keep_own, sync)
    by = np.lexsort((start, after, thread))
    seq, key = rows[by], thread[by]
    same = key[1:] == key[:-1]
    src, dst = [seq[:-1][same]], [seq[1:][same]]
    t = by[timed[by]]
    t_key, t_start, t_end = thread[t], start[t], end[t]
    n = len(t)
    if not n:
        kind = np.full(len(src[0]), "thread", dtype=object)
        return ThreadLanes(src[0], dst[0], kind, rows[t], np.zeros(0, dtype=np.int64), start[t])
    first = np.ones(n, dtype=bool)
    first[1:] = t_key[1:] != t_key[:-1]
    last = np.r_[first[1:], True]
    # where the thread leaves each op: its end, or the next op's start if that comes first
    left = np.minimum(t_end, np.r_[t_start[1:], 0])
    left[last] = np.maximum(np.maximum.reduceat(t_end, np.flatnonzero(first)), t_start[last])
    begin = np.r_[0, left[:-1]]
    begin[first] = t_start[first]
    release = released_at[t].copy()
    if data_release is not None:  # it read what another thread wrote: it waited for it
        release = np.maximum(release, data_release[t])
    pos = np.full(len(rows), -1, dtype=np.int64)
    pos[t] = np.arange(n)
    h = np.zeros(0, dtype=np.int64)
    if issuer is not None:  # a worker runs a call's work once the call has begun (and enqueued it)
        rec = np.flatnonzero((issuer >= 0) & timed)
        call = pos[issuer[rec]]
        rec, call = rec[call >= 0], call[call >= 0]
        h = pos[head[rec]]
        release[h] = np.maximum(release[h], t_start[call])
        begin[h] = np.where(first[h], np.minimum(begin[h], release[h]), begin[h])
        has_pred = (call > 0) & ~first[call]  # after what ran before the call on its thread
        src.append(rows[t[call[has_pred] - 1]])
        dst.append(rows[head[rec[has_pred]]])
    # a thread waiting on a call is released when the whole call ends, after its last nested op
    a, b = _cross_thread_waits(
        t_key, t_start, whole_end[t], None if is_wait is None else is_wait[t], activity
    )
    release[b] = np.maximum(release[b], whole_end[t[a]])
    begin[b] = np.where(first[b], np.minimum(begin[b], release[b]), begin[b])  # its wake-up is its time
    # ... after the last op its thread started before it ended (a wrapper's last descendant)
    by_start = np.lexsort((t_start, t_key))
    last_in = np.searchsorted(
        np.rec.fromarrays([t_key[by_start], t_start[by_start]]),
        np.rec.fromarrays([t_key[a], whole_end[t[a]]]),
    )
    a = np.maximum(by_start[np.maximum(last_in - 1, 0)], pos[tail[t[a]]])
    dur = np.maximum(left - np.maximum(begin, release), 0)
    own = keep_own[t]
    # a worker's record that starts its run begins where the worker could have picked it up
    picked = h[own[h]]
    t_start[picked] = np.minimum(t_start[picked], np.maximum(begin[picked], release[picked]))
    dur[own] = (t_end - t_start)[own]
    src.append(rows[t[a]])
    dst.append(rows[t[b]])
    kinds = ["thread"] + ["launch"] * (len(src) - 2) + ["wait"]
    kind = np.concatenate([np.full(len(s), k, dtype=object) for s, k in zip(src, kinds, strict=True)])
    return ThreadLanes(np.concatenate(src), np.concatenate(dst), kind, rows[t], dur, t_start)


def _exchanges(
    thread: np.ndarray,
    after: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    timed: np.ndarray,
    own: np.ndarray,
    blocking: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``start, end, after`` with each communication call that ran nested ops on its thread
    narrowed to its exchange, the longest stretch its nested ops leave uncovered after the
    last nested ``blocking`` call, and ordered by start among them (see the module's note); and
    per op the ops that start and finish its run on its thread (a call's first and last nested
    op, else the op itself)."""
    head = np.arange(len(start))
    tail = np.arange(len(start))
    calls = np.flatnonzero(own & timed)
    if not len(calls):
        return start, end, after, head, tail
    start, end, after = start.copy(), end.copy(), after.copy()
    # the timed ops of each thread by start: a call's nested ops are a range of them
    by = np.flatnonzero(timed)
    by = by[np.lexsort((start[by], thread[by]))]
    keys = np.rec.fromarrays([thread[by], start[by]])
    lo = np.searchsorted(keys, np.rec.fromarrays([thread[calls], start[calls]]), "left")
    hi = np.searchsorted(keys, np.rec.fromarrays([thread[calls], end[calls]]), "right")
    for c, a, z in zip(calls.tolist(), lo.tolist(), hi.tolist(), strict=True):
        if z - a <= 1:  # only the call itself
            continue
        s, e = int(start[c]), int(end[c])
        inner = by[a:z]
        inner = inner[(end[inner] <= e) & (after[inner] > after[c])]
        if not len(inner):
            continue
        bounds = [s]
        for i in inner[np.argsort(start[inner], kind="stable")].tolist():
            if start[i] >= bounds[-1]:  # a top-level nested op: the stretch before it is uncovered
                bounds += [int(start[i]), int(end[i])]
            else:
                bounds[-1] = max(bounds[-1], int(end[i]))
        bounds.append(e)
        gaps = np.diff(np.asarray(bounds))[::2]
        waited = end[inner[blocking[inner]]]
        if len(waited):  # only stretches after the last wait for the call's data
            gaps = np.where(np.asarray(bounds[::2]) >= waited.max(), gaps, -1)
        k = int(np.argmax(gaps))
        by_start = inner[np.lexsort((np.arange(len(inner)), start[inner]))]
        if k > 0:  # nested ops before the exchange: the first of them starts the call's run
            head[c] = by_start[0]
        if k < len(gaps) - 1:  # nested ops after the exchange: the last of them finishes it
            tail[c] = by_start[-1]
        start[c], end[c] = bounds[2 * k], bounds[2 * k + 1]
        after[inner] = after[c]
    return start, end, after, head, tail


def _cross_thread_waits(
    key: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    is_wait: np.ndarray | None,
    activity: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(a, b)`` (ops in run order by thread): ``b`` was released by ``a``, the
    latest-ending op of another thread, ended within :data:`WAKE_US` before ``b``'s thread
    resumed (at its first event in ``activity`` after the gap, else at ``b``): after an idle
    gap before ``b``, or, for a wait call, before ``b`` returned, inside it."""
    by_end = Lanes(key, end)
    first = np.r_[True, key[1:] != key[:-1]]
    idle_from = np.r_[0, end[:-1]]  # where the thread went idle: its previous op's end
    b_pos = np.flatnonzero(first | (start > idle_from))
    idle_from = np.where(first[b_pos], np.iinfo(np.int64).min // 4, idle_from[b_pos])
    resume = start[b_pos].copy()
    if activity is not None and len(activity[0]) and len(b_pos):
        code, ts = activity
        j = np.searchsorted(
            np.rec.fromarrays([code, ts]), np.rec.fromarrays([key[b_pos], idle_from]), "right"
        )
        jj = np.minimum(j, len(ts) - 1)
        hit = (j < len(ts)) & (code[jj] == key[b_pos])
        resume = np.where(hit, np.minimum(resume, ts[jj]), resume)
    i = by_end.last_besides_many(key[b_pos], resume)
    e = end[np.maximum(i, 0)]
    # on a loaded machine a wake-up takes longer: an op that ended while this thread was idle
    # released it if the thread resumed within a tenth of its idle time after that
    inside = ~first[b_pos] & (resume - e <= (resume - idle_from) // 10)
    # a thread's first op was started by someone: the last op of another thread to end before it
    ok = (i >= 0) & (e > idle_from) & ((resume - e <= WAKE_US) | inside | first[b_pos])
    src, dst = [i[ok]], [b_pos[ok]]
    if is_wait is not None and is_wait.any():
        w = np.flatnonzero(is_wait)
        i = by_end.last_besides_many(key[w], end[w])
        e = end[np.maximum(i, 0)]
        ok = (i >= 0) & (e > start[w]) & (end[w] - e <= WAKE_US)
        src.append(i[ok])
        dst.append(w[ok])
    return np.concatenate(src), np.concatenate(dst)


def run_threads(et_tids: np.ndarray, kineto: np.ndarray) -> np.ndarray:
    """The thread each ET row ran on: its Kineto thread where linked (gloo runs its collectives
    on a worker thread that the ET files under the caller's), else the Kineto thread most of
    its ET thread's linked rows ran on, else its ET thread (codes after the Kineto ones)."""
    out = kineto.copy()
    spare = int(kineto.max(initial=-1)) + 1
    for tid in np.unique(et_tids[kineto < 0]).tolist():
        mine = (et_tids == tid) & (kineto >= 0)
        free = (et_tids == tid) & (kineto < 0)
        if mine.any():
            out[free] = np.bincount(kineto[mine]).argmax()
        else:
            out[free], spare = spare, spare + 1
    return out


def issuers(issued_by: dict[int, int], seq: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """Per position of ``seq``: the position of the call whose work that record ran on another
    thread (gloo's worker), else -1."""
    at = np.full(int(seq.max(initial=-1)) + 1, -1, dtype=np.int64)
    at[seq] = np.arange(len(seq))
    out = np.full(len(seq), -1, dtype=np.int64)
    for record, call in issued_by.items():
        if (
            record < len(at)
            and call < len(at)
            and at[record] >= 0
            and at[call] >= 0
            and tids[record] != tids[call]
        ):
            out[at[record]] = at[call]
    return out
