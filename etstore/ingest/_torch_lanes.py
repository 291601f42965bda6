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
  ending: that op (the caller of ``backward()`` on the autograd engine's thread);
* a wait call (``c10d::wait``, ``_c10d_functional::wait_tensor``, an awaitable's ``wait()``)
  that returned within :data:`WAKE_US` of another thread's op ending inside it: that op (a
  ``wait()`` on gloo's worker thread).

A communication call keeps its own recorded time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from etstore.ingest._torch_sync import Lanes

__all__ = ["WAKE_US", "ThreadLanes", "run_threads", "thread_lanes"]

WAKE_US = 100
"""A thread that resumes this long (µs) after another thread's op ended was waiting for it."""


class ThreadLanes(NamedTuple):
    """Chain edges ``src → dst`` (run order, cross-thread waits) and each timed row's duration."""

    src: np.ndarray
    dst: np.ndarray
    rows: np.ndarray
    dur: np.ndarray


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

    Examples
    --------
    A wrapper (0..10) with a child (2..5) and a later op (8..9); a second thread's op ends
    at 150 and the first thread resumes at 160, idle since 9:

    >>> lanes = thread_lanes(
    ...     rows=np.array([0, 1, 2, 3, 4]), thread=np.array([0, 0, 0, 0, 1]),
    ...     after=np.array([0, 2, 4, 6, 8]), start=np.array([0, 2, 8, 160, 100]),
    ...     end=np.array([10, 5, 9, 170, 150]), timed=np.ones(5, bool),
    ...     released_at=np.full(5, -1), keep_own=np.zeros(5, bool))
    >>> lanes.dur.tolist(), list(zip(lanes.src.tolist(), lanes.dst.tolist()))
    ([2, 3, 4, 20, 50], [(0, 1), (1, 2), (2, 3), (4, 3)])
    """
    by = np.lexsort((start, after, thread))
    seq, key = rows[by], thread[by]
    same = key[1:] == key[:-1]
    src, dst = [seq[:-1][same]], [seq[1:][same]]
    t = by[timed[by]]
    t_key, t_start, t_end = thread[t], start[t], end[t]
    n = len(t)
    if not n:
        return ThreadLanes(src[0], dst[0], rows[t], np.zeros(0, dtype=np.int64))
    first = np.ones(n, dtype=bool)
    first[1:] = t_key[1:] != t_key[:-1]
    last = np.r_[first[1:], True]
    # where the thread leaves each op: its end, or the next op's start if that comes first
    left = np.minimum(t_end, np.r_[t_start[1:], 0])
    left[last] = np.maximum(np.maximum.reduceat(t_end, np.flatnonzero(first)), t_start[last])
    begin = np.r_[0, left[:-1]]
    begin[first] = t_start[first]
    release = released_at[t].copy()
    a, b = _cross_thread_waits(t_key, t_start, t_end, None if is_wait is None else is_wait[t])
    release[b] = np.maximum(release[b], t_end[a])
    dur = np.maximum(left - np.maximum(begin, release), 0)
    own = keep_own[t]
    dur[own] = (t_end - t_start)[own]
    src.append(rows[t[a]])
    dst.append(rows[t[b]])
    return ThreadLanes(np.concatenate(src), np.concatenate(dst), rows[t], dur)


def _cross_thread_waits(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, is_wait: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(a, b)`` (ops in run order by thread): ``b`` was released by ``a``, the
    latest-ending op of another thread, ended within :data:`WAKE_US` before ``b``'s thread
    resumed: before ``b`` started, after an idle gap, or, for a wait call, before ``b``
    returned, inside it."""
    by_end = Lanes(key, end)
    b_pos = np.flatnonzero(key[1:] == key[:-1]) + 1
    b_pos = b_pos[start[b_pos] > end[b_pos - 1]]
    i = by_end.last_besides_many(key[b_pos], start[b_pos])
    e = end[np.maximum(i, 0)]
    ok = (i >= 0) & (e > end[b_pos - 1]) & (start[b_pos] - e <= WAKE_US)
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
