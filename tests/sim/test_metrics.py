"""Metrics in a real DuckDB file: schema, one run, joins with stored ops, sweeps, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from etstore.app.runs import RUN_TABLES, SCHEMA_VERSION, create_schema, record_run, record_sweep
from etstore.errors import StoreError
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, collective_workload, simulate, sweep
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology


def _workload() -> Trace:
    size = 1 << 20
    ops = ops_table(
        {
            "rank": [0, 0, 0, 1, 1],
            "id": [1, 2, 3, 1, 2],
            "name": ["fwd", "send", "bwd", "recv", "fwd"],
            "type": ["COMP_NODE", "COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE", "COMP_NODE"],
            "duration_micros": [5, 0, 2, 0, 30],
            "comm_dst": [None, 1, None, None, None],
            "comm_src": [None, None, None, 0, None],
            "comm_tag": [None, 4, None, 4, None],
            "comm_size": [None, size, None, size, None],
        }
    )
    return Trace(ops, deps=deps_table([0, 0], [1, 2], [2, 3]), name="tiny")


@pytest.fixture
def wh(tmp_path: Path) -> Iterator[Warehouse]:
    """A warehouse over a plain DuckDB file (not a store), no tables yet."""
    with Warehouse(duckdb.connect(str(tmp_path / "warehouse.duckdb"))) as w:
        yield w


def test_schema_is_created_once(wh: Warehouse) -> None:
    create_schema(wh)
    create_schema(wh)
    tables = {r[0] for r in wh.query("SELECT table_name FROM information_schema.tables")}
    assert set(RUN_TABLES.tables) <= tables
    assert list(wh.query("SELECT count(*), max(version) FROM etstore_sim_schema")) == [(1, SCHEMA_VERSION)]


def test_record_run_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    res = simulate(_workload(), Topology.ring(2), config=SimConfig(scheduling_policy="FIFO"))
    with Warehouse(duckdb.connect(str(path))) as wh:
        rid = record_run(wh, res, trace_name="tiny", params={"note": "baseline"})
    assert rid == 1
    with duckdb.connect(str(path)) as con:  # a fresh connection: it was committed to the file
        run = con.execute(
            "SELECT trace, topology, num_npus, congestion, scheduling_policy, total_ns, num_ops, "
            "params FROM runs WHERE run_id = $r",
            {"r": rid},
        ).fetchall()[0]
        assert run[:7] == ("tiny", res.topology, 2, "unaware", "FIFO", res.total_ns, 5)
        params = json.loads(run[7])
        assert params["user"] == {"note": "baseline"}
        assert params["config"]["scheduling_policy"] == "FIFO"
        n = con.execute("SELECT count(*) FROM op_timings WHERE run_id = $r", {"r": rid}).fetchall()[0][0]
        assert n == 5
        # durations and waits are consistent with the times
        bad = con.execute(
            "SELECT count(*) FROM op_timings WHERE duration_ns <> end_ns - start_ns "
            "OR wait_ns <> start_ns - ready_ns"
        ).fetchall()[0][0]
        assert bad == 0
        # the breakdown identity holds in SQL
        rows = con.execute(
            "SELECT rank, total_ns, compute_ns + exposed_comm_ns + idle_ns FROM rank_breakdown "
            "WHERE run_id = $r ORDER BY rank",
            {"r": rid},
        ).fetchall()
        assert [r[0] for r in rows] == [0, 1]
        assert all(abs(r[1] - r[2]) < 1e-6 for r in rows)
        links = con.execute(
            "SELECT count(*), sum(bytes), sum(messages) FROM link_util WHERE run_id = $r", {"r": rid}
        ).fetchall()[0]
        assert links == (2, float(1 << 20), 1)


def test_op_timings_join_the_stores_ops(wh: Warehouse) -> None:
    tr = _workload()
    # the store keeps ops in DuckDB with columns trace, rank, id, ...
    stored = tr.ops.select(["rank", "id", "name", "type", "duration_micros"])
    stored = stored.add_column(0, "trace", pa.array(["tiny"] * stored.num_rows))
    with wh.registered(incoming=stored):
        wh.execute("CREATE TABLE ops AS SELECT * FROM incoming")
    res = simulate(tr, Topology.ring(2))
    rid = record_run(wh, res, trace_name="tiny")
    got = list(
        wh.query(
            "SELECT o.rank, o.id, o.duration_micros, t.start_ns, t.end_ns FROM ops o "
            "JOIN op_timings t USING (trace, rank, id) WHERE t.run_id = $r AND o.type = 'COMP_NODE' "
            "ORDER BY o.rank, o.id",
            {"r": rid},
        )
    )
    assert len(got) == 3
    for _rank, _id, micros, start, end in got:
        assert end - start == micros * 1000
    # the receive's wait: recv posted at 0, message 20031 ns after the 5 us compute
    recv_end = wh.query(
        "SELECT end_ns FROM op_timings WHERE run_id = $r AND rank = 1 AND id = 1", {"r": rid}
    ).scalar()
    assert recv_end == 5000 + 20031


def test_collectives_table_has_busbw(wh: Warehouse) -> None:
    res = simulate(collective_workload("allreduce", 8, 1 << 20), Topology.ring(8))
    rid = record_run(wh, res)
    (row,) = wh.query(
        "SELECT comm_type, algorithm, group_size, size_bytes, time_ns, busbw_gb_per_s, "
        "algbw_gb_per_s * 2 * 7 / 8 FROM collectives WHERE run_id = $r",
        {"r": rid},
    )
    assert row[:5] == ("ALL_REDUCE", "native", 8, 1 << 20, 117780.0)
    assert row[5] == pytest.approx(row[6])


# The ring all-reduce of S = 8 MiB over ring:8 with bw=50 (GB = 2^30, an input) and lat=500,
# by hand: 2(n-1) = 14 steps each send S/n = 1 MiB, 500 + 2^20 / (50 * 2^30 / 10^9) =
# 20,031.25 -> 20,031 ns on the integer clock; the 7 reduce-scatter steps each also reduce
# 1 MiB at local-mem-bw 50 GB/s (GB = 10^9), one write and two reads: 3 * floor(2^20 / 50) =
# 62,913 ns. t = 14 * 20,031 + 7 * 62,913 = 720,825 ns, and nccl-tests' busbw (GB = 10^9) is
# S * 2(n-1)/n / t = 8,388,608 * 1.75 B / 720,825 ns = 20.3656 GB/s (18.967 were it GB = 2^30).
RING_S, RING_N, RING_T_NS = 8 << 20, 8, 720_825.0
RING_ALGBW = 8_388_608 / 720_825  # 11.6375 bytes per ns = GB/s with GB = 10^9
RING_BUSBW = 8_388_608 * 2 * 7 / 8 / 720_825  # 20.3656


def test_stored_busbw_of_a_ring_allreduce_is_nccl_tests_gb(wh: Warehouse) -> None:
    res = simulate(
        collective_workload("allreduce", RING_N, RING_S),
        Topology.from_spec("ring:8,bw=50,lat=500"),
        algorithms={"allreduce": "ring"},
    )
    rid = record_run(wh, res, trace_name="ar")
    for source in ("collectives", "v_collective_busbw"):
        (row,) = wh.query(
            f"SELECT time_ns, algbw_gb_per_s, busbw_gb_per_s FROM {source} WHERE run_id = $r", {"r": rid}
        ).to_pylist()
        assert row["time_ns"] == RING_T_NS
        assert row["algbw_gb_per_s"] == pytest.approx(RING_ALGBW, rel=1e-12)
        assert row["busbw_gb_per_s"] == pytest.approx(RING_BUSBW, rel=1e-12)
    assert res.summary()["mean_busbw_gb_per_s"] == pytest.approx(RING_BUSBW, rel=1e-12)


def test_sweep_points_busbw_of_a_ring_allreduce_is_nccl_tests_gb(wh: Warehouse) -> None:
    pts = sweep([RING_S], ["ring"], ["ring:8,bw=50,lat=500"])
    sid = record_sweep(wh, pts)
    for source in ("sweep_points", "v_sweep_busbw"):
        (row,) = wh.query(
            f"SELECT time_ns, algbw_gb_per_s, busbw_gb_per_s FROM {source} WHERE sweep_id = $s", {"s": sid}
        ).to_pylist()
        assert row["time_ns"] == RING_T_NS
        assert row["algbw_gb_per_s"] == pytest.approx(RING_ALGBW, rel=1e-12)
        assert row["busbw_gb_per_s"] == pytest.approx(RING_BUSBW, rel=1e-12)


def test_link_throughput_view_is_nccl_tests_gb(wh: Warehouse) -> None:
    # the tiny workload's one message: 1 MiB over link 0 -> 1 in a run of total_ns
    rid = record_run(wh, simulate(_workload(), Topology.ring(2)))
    (row,) = wh.query(
        "SELECT bytes, total_ns, gb_per_s, gib_per_s FROM v_link_utilization WHERE run_id = $r AND bytes > 0",
        {"r": rid},
    ).to_pylist()
    assert row["bytes"] == 1 << 20
    assert row["gb_per_s"] == pytest.approx((1 << 20) / row["total_ns"], rel=1e-12)  # bytes per ns
    assert row["gib_per_s"] == pytest.approx(row["gb_per_s"] * 1e9 / 2**30, rel=1e-12)


def test_run_ids_increase_and_a_taken_id_is_refused(wh: Warehouse) -> None:
    res = simulate(_workload(), Topology.ring(2))
    assert record_run(wh, res) == 1
    assert record_run(wh, res) == 2
    assert record_run(wh, res, run_id=10) == 10
    with pytest.raises(StoreError, match="cannot record simulation run of 'tiny'"):
        record_run(wh, res, run_id=10)
    # the failed run left nothing behind
    assert wh.query("SELECT count(*) FROM op_timings WHERE run_id = 10").scalar() == 5
    assert wh.query("SELECT count(*) FROM runs").scalar() == 3


def test_record_sweep(wh: Warehouse) -> None:
    pts = sweep([1 << 16, 1 << 20], ["native"], [Topology.ring(4)])
    sid = record_sweep(wh, pts, params={"experiment": "t"})
    assert sid == 1
    rows = list(
        wh.query(
            "SELECT size_bytes, busbw_gb_per_s, params FROM sweep_points WHERE sweep_id = 1 "
            "ORDER BY size_bytes"
        )
    )
    assert [r[0] for r in rows] == [1 << 16, 1 << 20]
    assert rows[0][1] < rows[1][1]  # bigger messages amortize latency
    assert json.loads(rows[0][2]) == {"experiment": "t"}
    assert record_sweep(wh, pts) == 2


def test_newer_schema_is_refused(wh: Warehouse) -> None:
    create_schema(wh)
    wh.execute("INSERT INTO etstore_sim_schema VALUES (99)")
    with pytest.raises(StoreError, match=f"schema version 99; this etstore writes version {SCHEMA_VERSION}"):
        create_schema(wh)
