"""The thread-lane and wait-lookup examples in the modules' docstrings run and hold."""

from __future__ import annotations

import doctest

import numpy as np

from etstore.ingest import _torch_lanes, _torch_sync
from etstore.ingest._torch_lanes import thread_lanes


def test_docstring_examples() -> None:
    for module in (_torch_lanes, _torch_sync):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__


def test_one_thread_has_no_cross_thread_wait_and_adds_up_to_its_wall_time() -> None:
    """Gaps on a single thread are its own untraced time: no wait, each op holds the thread."""
    n = 2000
    start = np.arange(n, dtype=np.int64) * 300
    lanes = thread_lanes(
        rows=np.arange(n),
        thread=np.zeros(n, dtype=np.int64),
        after=2 * np.arange(n),
        start=start,
        end=start + 10,
        timed=np.ones(n, bool),
        released_at=np.full(n, -1),
        keep_own=np.zeros(n, bool),
    )
    assert len(lanes.src) == n - 1 and (lanes.dst - lanes.src == 1).all()
    assert lanes.dur.sum() == start[-1] + 10 - start[0]
