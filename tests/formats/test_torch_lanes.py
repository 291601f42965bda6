"""The thread-lane and wait-lookup examples in the modules' docstrings run and hold."""

from __future__ import annotations

import doctest

import numpy as np

from etstore.formats import _torch_lanes, _torch_sync
from etstore.formats._torch_lanes import thread_lanes


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


Ops = dict[int, tuple[int, int]]
Edges = set[tuple[int, int]]


def _lanes(**kw: object) -> tuple[Ops, Edges]:
    """Run :func:`thread_lanes` on small arrays: ``{row: (start, dur)}`` and the edges."""
    n = len(kw["start"])  # type: ignore[arg-type]
    args = {
        "rows": np.arange(n),
        "after": 2 * np.arange(n),
        "timed": np.ones(n, bool),
        "released_at": np.full(n, -1),
        "keep_own": np.zeros(n, bool),
    }
    args.update({k: np.asarray(v) for k, v in kw.items()})
    lanes = thread_lanes(**args)  # type: ignore[arg-type]
    ops = dict(
        zip(lanes.rows.tolist(), zip(lanes.start.tolist(), lanes.dur.tolist(), strict=True), strict=True)
    )
    return ops, set(zip(lanes.src.tolist(), lanes.dst.tolist(), strict=True))


def test_a_call_that_stalls_before_its_synchronize_exchanges_after_it() -> None:
    """gloo on CUDA tensors: a collective record (0..1000) whose worker stalled 600 µs (a
    profiler buffer flush) before its stream synchronize (600..610), exchanged (610..950)
    and copied back (950..990). The exchange follows the synchronize, though the stall is the
    longer uncovered stretch; the stall is the synchronize's own time."""
    got, edges = _lanes(
        thread=[0, 0, 0],
        after=[0, 1, 4],
        start=[0, 600, 950],
        end=[1000, 610, 990],
        keep_own=[True, False, False],
        is_sync=[False, True, False],
    )
    assert got == {1: (600, 10), 0: (610, 340), 2: (950, 40)}
    assert edges == {(1, 0), (0, 2)}


def test_a_worker_run_follows_what_preceded_its_call_and_owns_its_pick_up() -> None:
    """The caller's thread (0) runs op 0 (0..10), then the call 1 (10..500, descheduled after it
    enqueued the work); gloo's worker (thread 1) picks the work up at 60 and records it as
    op 2 (60..300). The record follows op 0, not the whole call, and starts where the call
    began: its 50 µs pick-up is its own time."""
    got, edges = _lanes(
        thread=[0, 0, 1],
        start=[0, 10, 60],
        end=[10, 500, 300],
        keep_own=[False, False, True],
        issuer=[-1, -1, 1],
    )
    assert got[2] == (10, 290)
    assert (0, 2) in edges and (1, 2) not in edges


def test_a_slow_wake_up_on_a_loaded_machine_is_still_a_release() -> None:
    """Thread 0 idles from 10 to 100,000 waiting for thread 1's op (20..92,000), and resumes
    8 ms after it ended (a loaded machine): within a tenth of its idle time, so a release.
    Resuming 95 ms after the end of a 1 ms op is not."""
    got, edges = _lanes(thread=[0, 0, 1], start=[0, 100_000, 20], end=[10, 100_010, 92_000])
    assert (2, 1) in edges and got[1] == (100_000, 8_010)
    got, edges = _lanes(thread=[0, 0, 1], start=[0, 100_000, 20], end=[10, 100_010, 5_000])
    assert (2, 1) not in edges and got[1] == (100_000, 100_000)


def test_a_thread_resumes_at_its_first_recorded_event_of_any_kind() -> None:
    """Thread 0 waits for thread 1's op (ends 1,000) and resumes with a runtime call at 1,050
    (``activity``), its next op only at 1,200: a release, though 200 µs after the end."""
    kw = {"thread": [0, 0, 1], "start": [0, 1_200, 300], "end": [100, 1_250, 1_000]}
    _, edges = _lanes(**kw)
    assert (2, 1) not in edges
    got, edges = _lanes(**kw, activity=(np.array([0, 0, 0]), np.array([0, 1_050, 1_200])))
    assert (2, 1) in edges and got[1] == (1_200, 250)


def test_an_op_reading_another_threads_data_waited_for_it() -> None:
    """Thread 0 runs A (0..10), then B (300..310), which reads what thread 1's W (5..100) wrote.
    B resumed 200 µs after W ended (an untraced wait() with a slow wake-up: beyond both
    wake-up bounds), yet it could not start before W ended: its thread time starts at W's
    end (210 µs), not where A left the thread (300 µs, which would count the wait)."""
    args = dict(
        rows=np.array([0, 1, 2]),
        thread=np.array([0, 0, 1]),
        after=np.array([0, 2, 4]),
        start=np.array([0, 300, 5]),
        end=np.array([10, 310, 100]),
        timed=np.ones(3, bool),
        released_at=np.full(3, -1),
        keep_own=np.zeros(3, bool),
    )
    assert thread_lanes(**args).dur.tolist() == [10, 300, 95]
    lanes = thread_lanes(**args, data_release=np.array([-1, 100, -1]))
    assert lanes.dur.tolist() == [10, 210, 95]
