"""The edge rows an ingest computes beside its inserts: dependency uids (a shortcut for ids
``0 .. n-1`` per rank) and message pairs (numpy alone), each equal to the general way."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from etstore.dag import Endpoints, _occurrence, pair_endpoints
from etstore.model import Trace, deps_table, op_rows, ops_table
from etstore.store.graph import dep_edges


def _trace(ids_per_rank: list[list[int]], deps: list[tuple[int, int, int]]) -> Trace:
    rank = [r for r, ids in enumerate(ids_per_rank) for _ in ids]
    ids = [i for ids in ids_per_rank for i in ids]
    ops = ops_table({"rank": rank, "id": ids, "name": ["x"] * len(ids), "type": ["COMP_NODE"] * len(ids)})
    r, s, d = zip(*deps, strict=True) if deps else ((), (), ())
    return Trace(ops=ops, deps=deps_table(np.array(r, dtype=np.int32), s, d))


def _general(trace: Trace, base: int) -> tuple[list[int], list[int]]:
    rank = trace.deps["rank"].to_numpy()
    return (
        (base + op_rows(trace.ops, rank, trace.deps["src"].to_numpy())).tolist(),
        (base + op_rows(trace.ops, rank, trace.deps["dst"].to_numpy())).tolist(),
    )


@pytest.mark.parametrize(
    ("ids_per_rank", "deps"),
    [
        ([[0, 1, 2], [0, 1]], [(0, 0, 1), (0, 1, 2), (1, 0, 1), (0, 0, 2)]),  # dense
        ([[0, 1, 2], [1, 2]], [(0, 0, 1), (1, 1, 2)]),  # rank 1 starts at id 1
        ([[0, 2, 3]], [(0, 0, 2), (0, 2, 3)]),  # a gap
        ([[2, 0, 1]], [(0, 0, 1), (0, 1, 2)]),  # out of order
        ([[0, 1], [], [0, 1, 2]], [(2, 0, 2), (0, 0, 1)]),  # an empty rank, deps out of rank order
        ([[0, 1, 2]], []),
    ],
)
def test_dep_edges_equal_the_general_lookup(
    ids_per_rank: list[list[int]], deps: list[tuple[int, int, int]]
) -> None:
    trace = _trace(ids_per_rank, deps)
    base = 5 << 40
    got = dep_edges(trace, base)
    if not deps:
        assert got.num_rows == 0
        return
    assert (got["from"].to_pylist(), got["to"].to_pylist()) == _general(trace, base)
    assert got["kind"].to_pylist() == trace.deps["kind"].to_pylist()


def _endpoints(rng: np.random.Generator, n: int) -> Endpoints:
    src, dst, tag = (rng.integers(0, 3, n).astype(np.int32) for _ in range(3))
    nth = _occurrence([src, dst, tag]).astype(np.int32) if n else np.zeros(0, np.int32)
    return Endpoints(src, dst, tag, nth, rng.permutation(10 * n + 1)[:n].astype(np.int64))


def _joined(sends: Endpoints, recvs: Endpoints) -> tuple[list[int], list[int], list[int]]:
    """The pairs as a hash join on (src, dst, tag, occurrence) gives them, by send row."""
    left = pa.table({"s": sends.src, "d": sends.dst, "t": sends.tag, "n": sends.nth, "send_row": sends.row})
    right = pa.table({"s": recvs.src, "d": recvs.dst, "t": recvs.tag, "n": recvs.nth, "recv_row": recvs.row})
    j = left.join(right, ["s", "d", "t", "n"], join_type="inner").sort_by("send_row")
    return j["send_row"].to_pylist(), j["recv_row"].to_pylist(), j["t"].to_pylist()


def test_pair_endpoints_equals_a_join() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        sends, recvs = _endpoints(rng, int(rng.integers(0, 40))), _endpoints(rng, int(rng.integers(0, 40)))
        send_row, recv_row, tag = pair_endpoints(sends, recvs)
        assert (send_row.tolist(), recv_row.tolist(), tag.tolist()) == _joined(sends, recvs)
        assert tag.dtype == np.int64
