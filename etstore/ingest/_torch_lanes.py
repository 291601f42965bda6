"""Host threads of a recorded rank as lanes: the order each thread ran its ops, and their thread time.

A thread runs one op at a time. Its ops (ET nodes linked with Kineto, plus the blocking
runtime calls of :mod:`._torch_sync`) form one chain in the order they ran, and each lasts
its *thread time*: from its start to the start of the next op of its thread. A wrapper
holds the thread until its first child starts, a leaf until its next sibling does, so a
thread's chain adds up to its recorded wall time, untraced time between ops (Python, the
dispatcher) included. Where the thread waited on something the model represents, the
wait is a dependency instead of a duration:

* a blocking call keeps only the part after the device activity that released it ended;
* a thread that recorded nothing and resumed within :data:`WAKE_US` of another thread's op
  ending was blocked on it (the caller of ``backward()`` on the autograd engine's thread, a
  ``wait()`` on gloo's worker): that op precedes the one the thread resumed with, and the op
  before the gap keeps only its own time;
* a communication call keeps its own recorded time.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from etstore.ingest._torch_sync import Lanes

__all__ = ["WAKE_US", "ThreadLanes", "thread_lanes"]

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
    ([2, 6, 1, 10, 50], [(0, 1), (1, 2), (2, 3), (4, 3)])
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
    nxt = np.empty_like(t_start)
    nxt[:-1] = t_start[1:]
    last = np.ones(n, dtype=bool)
    last[:-1] = t_key[1:] != t_key[:-1]
    thread_end = np.maximum.reduceat(t_end, np.flatnonzero(np.r_[True, last[:-1]]))
    nxt[last] = np.maximum(thread_end, t_start[last])
    dur = np.maximum(nxt - t_start, 0)
    rel = released_at[t]
    waits = rel >= 0
    dur[waits] = np.maximum(nxt[waits] - np.maximum(t_start[waits], rel[waits]), 0)
    own = keep_own[t]
    dur[own] = (t_end - t_start)[own]
    a, b = _cross_thread_waits(t_key, t_start, t_end)
    src.append(rows[t[a]])
    dst.append(rows[t[b]])
    dur[b - 1] = np.minimum(dur[b - 1], (t_end - t_start)[b - 1])  # its own time, not the wait
    return ThreadLanes(np.concatenate(src), np.concatenate(dst), rows[t], dur)


def _cross_thread_waits(key: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(a, b)`` (ops in run order by thread): ``b``'s thread was idle before ``b``
    until ``a``, the latest-ending op of another thread inside the gap, ended within
    :data:`WAKE_US` of ``b``'s start."""
    b_pos = np.flatnonzero(key[1:] == key[:-1]) + 1
    b_pos = b_pos[start[b_pos] > end[b_pos - 1]]
    if not len(b_pos):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    i = Lanes(key, end).last_besides_many(key[b_pos], start[b_pos])
    e = end[np.maximum(i, 0)]
    ok = (i >= 0) & (e > end[b_pos - 1]) & (start[b_pos] - e <= WAKE_US)
    return i[ok], b_pos[ok]
