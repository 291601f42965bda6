"""The heaviest path computed unit of ranks by unit (``_batched_path``) is the in-memory pass's,
op for op, however the ranks are cut into units and grouped: on random traces whose dependencies
and messages close cycles within and across ranks, with ties everywhere, and on an expanded
trace whose messages go back and forth between units."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from etstore.algorithms.expand import expand
from etstore.analysis import critical_path
from etstore.analysis._batched_path import BatchedPath, PathBatch, batched_heaviest_path
from etstore.dag import match_messages, trace_edges
from etstore.errors import CycleError
from etstore.model import Trace, deps_table, ops_table
from etstore.workloads import transformer


def _units(
    trace: Trace, ranks_per_unit: int
) -> tuple[list[tuple[int, int]], Callable[[int], PathBatch], np.ndarray, np.ndarray]:
    """``trace`` cut into units of ``ranks_per_unit`` ranks: their bounds, a loader, and the messages
    between units (what the stored reader gives)."""
    slices = list(trace.rank_slices().items())
    groups = [slices[i : i + ranks_per_unit] for i in range(0, len(slices), ranks_per_unit)]
    bounds = [(g[0][1][0], g[-1][1][1]) for g in groups]
    src, dst = trace_edges(trace)
    m = match_messages(trace)
    weight = trace.ops["duration_micros"].to_numpy().astype(np.float64)
    starts = np.asarray([lo for lo, _ in bounds])
    unit_of = lambda rows: np.searchsorted(starts, rows, side="right") - 1  # noqa: E731

    def load(u: int) -> PathBatch:
        lo, hi = bounds[u]
        dep = unit_of(dst) == u
        msg = (unit_of(m.send_row) == u) & (unit_of(m.recv_row) == u)
        ranks = np.asarray([r for r, _ in groups[u]], dtype=np.int32)
        return PathBatch(
            weight=weight[lo:hi],
            dep_src=src[dep] - lo,
            dep_dst=dst[dep] - lo,
            msg_send=m.send_row[msg] - lo,
            msg_recv=m.recv_row[msg] - lo,
            ranks=ranks,
            rank_starts=np.asarray([a for _, (a, _) in groups[u]] + [hi]) - lo,
        )

    cross = unit_of(m.send_row) != unit_of(m.recv_row)
    return bounds, load, m.send_row[cross], m.recv_row[cross]


def _batched(
    trace: Trace, ranks_per_unit: int, max_group_ops: int | None = None, **kw: object
) -> BatchedPath:
    bounds, load, send, recv = _units(trace, ranks_per_unit)
    return batched_heaviest_path(bounds, load, send, recv, max_group_ops=max_group_ops, name=trace.name, **kw)  # type: ignore[arg-type]


def _assert_same(trace: Trace, got: BatchedPath) -> None:
    want = critical_path(trace)
    assert got.length_micros == want.length_micros
    assert got.dropped_edges == want.dropped_edges
    ops = trace.ops
    assert [(ops["rank"][int(v)].as_py(), ops["id"][int(v)].as_py()) for v in got.rows] == list(
        zip(want.path["rank"].to_pylist(), want.path["id"].to_pylist(), strict=True)
    )
    assert got.ranks.tolist() == want.per_rank["rank"].to_pylist()
    assert got.rank_length_micros.tolist() == want.per_rank["length_micros"].to_pylist()
    assert got.rank_ops.tolist() == want.per_rank["ops"].to_pylist()


def _random_trace(rng: np.random.Generator) -> Trace:
    """Ranks of random ops and dependencies (any direction: cycles within a rank), sends and
    receives to any rank with two tags (cycles across ranks), durations 0-2 µs (ties)."""
    cols: dict[str, list[object]] = {
        k: [] for k in ("rank", "id", "name", "type", "duration_micros", "comm_src", "comm_dst", "comm_tag")
    }
    d_rank, d_src, d_dst = [], [], []
    ranks = int(rng.integers(1, 7))
    backward = bool(rng.integers(0, 2))
    for r in range(ranks):
        n = int(rng.integers(1, 15))
        for i in range(n):
            kind = str(rng.choice(["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"], p=[0.5, 0.25, 0.25]))
            peer = int(rng.integers(0, ranks))
            cols["rank"].append(r)
            cols["id"].append(i)
            cols["name"].append(f"r{r}.{i}")
            cols["type"].append(kind)
            cols["comm_src"].append(peer if kind == "COMM_RECV_NODE" else None)
            cols["comm_dst"].append(peer if kind == "COMM_SEND_NODE" else None)
            cols["comm_tag"].append(int(rng.integers(0, 2)) if kind != "COMP_NODE" else None)
            cols["duration_micros"].append(int(rng.integers(0, 3)))
        for _ in range(int(rng.integers(0, 2 * n + 1))):
            a, b = rng.integers(0, n, 2).tolist()
            if not backward:
                if a == b:
                    continue
                a, b = min(a, b), max(a, b)
            d_rank.append(r)
            d_src.append(a)
            d_dst.append(b)
    return Trace(ops=ops_table(cols), deps=deps_table(d_rank, d_src, d_dst), name="random")


@pytest.mark.parametrize("seed", range(80))
def test_random_traces_however_cut_and_grouped(seed: int) -> None:
    trace = _random_trace(np.random.default_rng(seed))
    try:
        critical_path(trace, on_cycle="raise")
        refusal = None
    except CycleError as exc:
        refusal = str(exc)
    for per, cap in ((100, None), (1, None), (2, None), (1, 12), (1, 40)):
        _assert_same(trace, _batched(trace, per, cap))
        if refusal is None:
            continue
        with pytest.raises(CycleError) as raised:
            _batched(trace, per, cap, on_cycle="raise", where=lambda rows: _where(trace, rows))
        assert str(raised.value) == refusal


def _where(trace: Trace, rows: np.ndarray) -> str:
    ops = trace.ops
    return ", ".join(f"rank {ops['rank'][int(i)]} id {ops['id'][int(i)]}" for i in rows)


def test_messages_back_and_forth_between_units_merge_them() -> None:
    """Every layer's tensor-parallel ring sends back from rank 1 to rank 0: one rank a unit takes
    a sweep a layer; grouping the units that wait on each other takes three."""
    trace = expand(transformer(ranks=8, tp=2, layers=30, seed=0), "ring").trace
    alone = _batched(trace, 1)
    _assert_same(trace, alone)
    assert alone.sweeps > 30 and alone.largest_group_ops < trace.num_ops // 4
    grouped = _batched(trace, 1, trace.num_ops // 2)
    _assert_same(trace, grouped)
    assert grouped.sweeps <= 3 and grouped.largest_group_ops <= trace.num_ops // 2
    at_once = _batched(trace, 1, trace.num_ops)  # more messages back than units: grouped upfront
    _assert_same(trace, at_once)
    assert (at_once.sweeps, at_once.solves, at_once.largest_group_ops) == (1, 1, trace.num_ops)


def test_messages_forward_take_one_sweep() -> None:
    """A pipeline: each rank sends to the next; one rank a unit, one sweep, one solve each."""
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1, 1, 2, 2],
            "id": [0, 1, 0, 1, 2, 0, 1],
            "name": ["a", "send", "recv", "b", "send", "recv", "c"],
            "type": [
                *("COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMM_SEND_NODE"),
                *("COMM_RECV_NODE", "COMP_NODE"),
            ],
            "duration_micros": [4, 1, 1, 2, 1, 1, 8],
            "comm_dst": [None, 1, None, None, 2, None, None],
            "comm_src": [None, None, 0, None, None, 1, None],
        }
    )
    trace = Trace(ops=ops, deps=deps_table([0, 1, 1, 2], [0, 0, 1, 0], [1, 1, 2, 1]), name="pipe")
    got = _batched(trace, 1)
    _assert_same(trace, got)
    assert (got.sweeps, got.solves, got.length_micros) == (1, 3, 4 + 1 + 1 + 2 + 1 + 1 + 8)


def test_no_ops() -> None:
    got = batched_heaviest_path([], lambda u: pytest.fail("nothing to load"), np.zeros(0), np.zeros(0))
    assert (got.length_micros, len(got.rows), len(got.ranks), got.sweeps) == (0.0, 0, 0, 0)
