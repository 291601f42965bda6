"""compare() (etstore/app/compare.py): both runs recorded, per-rank and total differences in
``comparisons``; compare_traces() and differences() (etstore/sim/compare.py) compute them.

The hand workload (tests/app/test_overlap.py) takes 141131 ns on ring:2 and its
overlap rewrite 121131 ns on both ranks (indep hides under the all-reduce).
"""

from __future__ import annotations

import dataclasses

import pyarrow.compute as pc
import pytest

from etstore.analysis.rewrite import rewrite
from etstore.app.compare import compare
from etstore.app.rewrite import rewrite_stored
from etstore.errors import ConfigError, TopologyError, UnknownTraceError
from etstore.sim import simulate
from etstore.sim.compare import DIFFERENCES_SCHEMA, compare_traces, differences
from etstore.store import EmbeddedStore
from etstore.testing import hand_workload
from etstore.topology import parse_topology


def _count(store: EmbeddedStore, table: str) -> int:
    n = store.sql(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = $t", {"t": table}
    ).scalar()
    return int(store.sql(f"SELECT count(*) FROM {table}").scalar()) if n else 0


def test_compare_records_runs_and_differences(store: EmbeddedStore) -> None:
    store.ingest(hand_workload(), name="hand")
    b = rewrite_stored(store, "hand", "overlap").trace.name
    cmp = compare(store, "hand", b, "ring:2")
    assert (cmp.total_a_ns, cmp.total_b_ns, cmp.diff_ns) == (141131.0, 121131.0, -20000.0)
    rows = cmp.table.to_pylist()
    assert [(r["rank"], r["total_a_ns"], r["total_b_ns"], r["diff_ns"]) for r in rows] == [
        (0, 141131.0, 121131.0, -20000.0),
        (1, 141131.0, 121131.0, -20000.0),
        (None, 141131.0, 121131.0, -20000.0),
    ]
    assert rows[0]["speedup"] == pytest.approx(141131 / 121131)
    # exposed communication drops by what indep now hides: 20000 ns per rank
    assert rows[0]["exposed_comm_a_ns"] - rows[0]["exposed_comm_b_ns"] == 20000.0
    assert rows[2]["exposed_comm_a_ns"] == 2 * rows[0]["exposed_comm_a_ns"]
    runs = store.sql("SELECT run_id, trace, total_ns FROM runs ORDER BY run_id").to_pylist()
    assert [(r["run_id"], r["trace"], r["total_ns"]) for r in runs] == [
        (cmp.run_a, "hand", 141131.0),
        (cmp.run_b, b, 121131.0),
    ]
    stored = store.sql(
        "SELECT trace_a, trace_b, run_a, run_b, topology, congestion, count(*) AS n FROM comparisons "
        "WHERE comparison_id = $c GROUP BY ALL",
        {"c": cmp.comparison_id},
    ).to_pylist()
    assert stored == [
        {
            "trace_a": "hand",
            "trace_b": b,
            "run_a": cmp.run_a,
            "run_b": cmp.run_b,
            "topology": cmp.topology,
            "congestion": "unaware",
            "n": 3,
        }
    ]
    again = compare(store, "hand", b, "ring:2", congestion="aware")
    assert again.comparison_id == cmp.comparison_id + 1 and _count(store, "runs") == 4


def test_bad_input_writes_nothing(store: EmbeddedStore) -> None:
    store.ingest(hand_workload(), name="hand")
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        compare(store, "hand", "nope", "ring:2")
    with pytest.raises(TopologyError, match="unknown kind 'zz'"):
        compare(store, "hand", "hand", "zz:2")
    with pytest.raises(ConfigError, match="congestion 'some'"):
        compare(store, "hand", "hand", "ring:2", congestion="some")
    assert _count(store, "runs") == 0 and _count(store, "comparisons") == 0


def test_compare_traces_needs_no_store_and_gives_the_recorded_table(store: EmbeddedStore) -> None:
    """The pure half: two traces in, the same per-rank table compare() records, nothing written."""
    a = hand_workload()
    b = rewrite(a, "overlap", name="hand-overlap")
    pure = compare_traces(a, b, "ring:2")
    assert (pure.a.total_ns, pure.b.total_ns, pure.topology, pure.congestion) == (
        141131.0,
        121131.0,
        "ring:2,bw=50,lat=500",
        "unaware",
    )
    assert pure.table.schema == DIFFERENCES_SCHEMA
    store.ingest(a, name="hand")
    store.ingest(b, name="hand-overlap")
    recorded = store.sql(
        "SELECT * EXCLUDE (comparison_id, trace_a, trace_b, run_a, run_b, topology, congestion, created_at) "
        "FROM comparisons WHERE comparison_id = $c ORDER BY rank NULLS LAST",
        {"c": compare(store, "hand", "hand-overlap", "ring:2").comparison_id},
    ).to_arrow()
    assert recorded.to_pylist() == pure.table.to_pylist()


def test_differences_leave_a_side_null_where_a_rank_is_missing() -> None:
    ring = parse_topology("ring:2")
    full = simulate(hand_workload(), ring)
    one = full.ranks.filter(pc.equal(full.ranks["rank"], 0))
    half = dataclasses.replace(full, ranks=one)
    rows = differences(full, half).to_pylist()
    assert [r["rank"] for r in rows] == [0, 1, None]
    assert rows[1]["total_b_ns"] is None and rows[1]["diff_ns"] is None and rows[1]["speedup"] is None
    assert rows[2]["exposed_comm_b_ns"] == rows[0]["exposed_comm_b_ns"]  # the total sums what is there
    assert rows[2]["exposed_comm_a_ns"] == 2 * rows[0]["exposed_comm_a_ns"]
