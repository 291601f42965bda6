"""etstore.testing: the trace assert names the first difference; the hand-built inputs hold."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.formats.msccl_xml import parse_msccl_xml
from etstore.model import Trace
from etstore.testing import (
    assert_trace_equal,
    hand_expanded,
    hand_workload,
    ring_allreduce_xml,
    trace_from_nodes,
    two_rank_allreduce,
)


def _with_duration(t: Trace, rank: int, op_id: int, micros: int) -> Trace:
    hit = pc.and_(pc.equal(t.ops["rank"], rank), pc.equal(t.ops["id"], op_id))
    col = pc.if_else(hit, pa.scalar(micros, pa.uint64()), t.ops["duration_micros"])
    return t.replace(
        ops=t.ops.set_column(t.ops.schema.get_field_index("duration_micros"), "duration_micros", col)
    )


def test_row_order_does_not_matter() -> None:
    t = hand_workload()
    backwards = pa.array(range(t.ops.num_rows - 1, -1, -1))
    assert_trace_equal(
        t, t.replace(ops=t.ops.take(backwards), deps=t.deps.take(pa.array([1, 0, *range(2, t.num_deps)])))
    )


def test_first_differing_rank_id_and_column_is_named() -> None:
    t = hand_workload()
    other = _with_duration(_with_duration(t, 1, 3, 6), 1, 7, 2)
    with pytest.raises(AssertionError, match=r"^ops: rank 1, id 3, column 'duration_micros': 5 != 6$"):
        assert_trace_equal(t, other)
    assert_trace_equal(t, other, columns=["name", "type"])  # only the columns asked for


def test_missing_rows_columns_and_deps_are_named() -> None:
    t = hand_workload()
    with pytest.raises(AssertionError, match=r"^ops: \{'rank': 0, 'id': 0\} is only in the left trace"):
        assert_trace_equal(t, t.replace(ops=t.ops.slice(1)))
    with pytest.raises(AssertionError, match=r"columns only in the left trace \['pg_name'\]"):
        assert_trace_equal(t, t.replace(ops=t.ops.drop(["pg_name"])))
    with pytest.raises(AssertionError, match=r"^deps: \{'rank': 0, 'dst': 1, 'src': 0, 'kind': 'data'\}"):
        assert_trace_equal(t, t.replace(deps=t.deps.slice(1)))
    assert_trace_equal(t, t.replace(deps=t.deps.slice(1)), check_deps=False)


def test_hand_built_inputs() -> None:
    t = hand_workload()
    assert (t.num_ops, t.num_deps, t.num_ranks) == (16, 24, 2)
    expanded, lineage = hand_expanded()
    assert expanded.kind == "expanded" and lineage.num_rows == expanded.num_ops == 14
    nodes, edges = two_rank_allreduce()
    assert trace_from_nodes(nodes, edges).num_ops == 10 and len(edges) == 8
    ring = parse_msccl_xml(ring_allreduce_xml(4))
    assert ring.num_ranks == 4 and ring.num_ops == 4 * (4 * 3 + 3)  # 4n-4 steps, n-1 of them rrc (two nodes)
