"""The warehouse API: queries, writes, transactions, registered Arrow views, errors, schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from etstore.app.runs import RUN_TABLES, SCHEMA_VERSION
from etstore.errors import QueryError, StoreError
from etstore.store import EmbeddedStore, _trace_rows
from etstore.store.warehouse import Warehouse
from etstore.testing import assert_trace_equal
from etstore.workloads import transformer


@pytest.fixture
def wh() -> Iterator[Warehouse]:
    with Warehouse(duckdb.connect()) as w:
        w.create_schema()
        yield w


def test_append_by_name_and_next_id(wh: Warehouse) -> None:
    assert wh.next_id("sweep_points", "sweep_id") == 1
    # columns in any order, a subset of the table's; the others get their defaults
    wh.append("sweep_points", pa.table({"time_ns": [2.0, 1.0], "sweep_id": [4, 4]}))
    wh.append("sweep_points", pa.table({"sweep_id": pa.array([], pa.int64())}))  # empty: nothing
    assert list(wh.query("SELECT sweep_id, time_ns, topology FROM sweep_points ORDER BY time_ns")) == [
        (4, 1.0, None),
        (4, 2.0, None),
    ]
    assert wh.next_id("sweep_points", "sweep_id") == 5


def test_transaction_commits_or_rolls_back(wh: Warehouse) -> None:
    with wh.transaction():
        wh.execute("INSERT INTO sweep_points (sweep_id) VALUES (1)")
        with wh.transaction():  # joins the outer one
            wh.execute("INSERT INTO sweep_points (sweep_id) VALUES (2)")
    with pytest.raises(KeyError), wh.transaction():
        wh.execute("INSERT INTO sweep_points (sweep_id) VALUES (3)")
        with wh.transaction():
            wh.execute("INSERT INTO sweep_points (sweep_id) VALUES (4)")
        raise KeyError("boom")
    with pytest.raises(StoreError, match="Constraint Error"), wh.transaction():
        wh.execute("INSERT INTO runs (run_id, trace) VALUES (1, 'a')")
        wh.execute("INSERT INTO runs (run_id, trace) VALUES (1, 'b')")
    assert [r[0] for r in wh.query("SELECT sweep_id FROM sweep_points ORDER BY 1")] == [1, 2]
    assert wh.query("SELECT count(*) FROM runs").scalar() == 0
    with wh.transaction():  # usable again after a failure
        wh.execute("INSERT INTO runs (run_id, trace) VALUES (1, 'a')")
    assert wh.query("SELECT count(*) FROM runs").scalar() == 1


def test_registered_views_last_for_the_block(wh: Warehouse) -> None:
    with wh.registered(a=pa.table({"x": [1, 2]}), b=pa.table({"x": [2, 3]})):
        assert wh.query("SELECT count(*) FROM a JOIN b USING (x)").scalar() == 1
    with pytest.raises(QueryError, match="SQL error: Catalog Error"):
        wh.query("SELECT * FROM a")


def test_errors_carry_the_engine_message(wh: Warehouse) -> None:
    with pytest.raises(QueryError, match=r"SQL error: Parser Error.*\(query: 'SELEC 1'\)"):
        wh.query("SELEC 1")
    with pytest.raises(StoreError, match=r"SQL error: Catalog Error.*nosuch"):
        wh.execute("DELETE FROM nosuch")
    with pytest.raises(StoreError, match="nosuch"):
        wh.append("nosuch", pa.table({"x": [1]}))
    with pytest.raises(QueryError, match="nosuch"):
        wh.next_id("nosuch", "x")


def test_open_file_schema_and_read_only(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    with Warehouse.open(path) as w:
        tables = {r[0] for r in w.query("SELECT table_name FROM information_schema.tables")}
        assert {*RUN_TABLES.tables, *RUN_TABLES.views} <= tables
        w.execute("INSERT INTO runs (run_id, trace) VALUES (7, 't')")
    with Warehouse.open(path, read_only=True) as r:
        assert r.query("SELECT run_id FROM runs").scalar() == 7
        with pytest.raises(StoreError, match="read-only"):
            r.execute("DELETE FROM runs")
    with Warehouse.open(path) as w:
        w.execute("INSERT INTO etstore_sim_schema VALUES ($v)", {"v": SCHEMA_VERSION + 1})
    # metrics a newer etstore wrote: refused where runs are written, and nothing changes
    with Warehouse.open(path) as w, pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        w.ensure(RUN_TABLES)
    with Warehouse.open(path) as w:  # a store that does not record the set: refused at open
        w.execute("DELETE FROM etstore_table_sets WHERE name = 'runs'")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Warehouse.open(path)
    (tmp_path / "junk.duckdb").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot open the DuckDB warehouse"):
        Warehouse.open(tmp_path / "junk.duckdb")


def _metrics_of_schema_1(path: Path) -> None:
    """A warehouse as etstore wrote it with metrics schema 1: rates with GB = 2^30."""
    with duckdb.connect(str(path)) as con:
        for table, ddl in RUN_TABLES.tables.items():
            if table != "etstore_sim_schema":
                con.execute(ddl)
        con.execute("CREATE TABLE etstore_sim_schema (version INTEGER)")
        con.execute("INSERT INTO etstore_sim_schema VALUES (1)")
        # 1 MiB in 20,031 ns: algbw 52.35 bytes per ns, stored as 48.75 "GB/s" with GB = 2^30
        con.execute(
            "INSERT INTO collectives (run_id, trace, size_bytes, time_ns, algbw_gb_per_s, busbw_gb_per_s) "
            "VALUES (1, 't', 1048576, 20031, 1048576 / 20031 * 1e9 / 2^30, 2 * 1048576 / 20031 * 1e9 / 2^30)"
        )
        con.execute(
            "INSERT INTO sweep_points (sweep_id, size_bytes, time_ns, algbw_gb_per_s, busbw_gb_per_s) "
            "VALUES (1, 1048576, 20031, 1048576 / 20031 * 1e9 / 2^30, 1048576 / 20031 * 1e9 / 2^30)"
        )
        con.execute("INSERT INTO link_util (run_id, link, bandwidth_gb_per_s) VALUES (1, 0, 50)")


def test_rates_of_metrics_schema_1_become_gb_of_ten_to_the_nine(tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    _metrics_of_schema_1(path)
    with Warehouse.open(path, read_only=True) as r:  # read-only: left as it is
        assert r.query("SELECT algbw_gb_per_s FROM collectives").scalar() == pytest.approx(48.75, abs=0.01)
    algbw = 1048576 / 20031  # bytes per ns = GB/s with GB = 10^9, as nccl-tests
    for _ in range(2):  # the first writable open rescales, once
        with Warehouse.open(path) as w:
            rates = w.query(
                "SELECT c.algbw_gb_per_s AS c_alg, c.busbw_gb_per_s AS c_bus, s.algbw_gb_per_s AS s_alg, "
                "s.busbw_gb_per_s AS s_bus, l.bandwidth_gb_per_s AS link FROM collectives c, sweep_points s, "
                "link_util l"
            ).to_pylist()
            assert list(rates[0].values()) == pytest.approx([algbw, 2 * algbw, algbw, algbw, 50.0], rel=1e-12)
            assert w.query("SELECT max(version) FROM etstore_sim_schema").scalar() == SCHEMA_VERSION == 2


def test_opportunities_of_an_older_store_get_their_numbers_column(tmp_path: Path) -> None:
    """A store written before opportunities were numbered keeps its rows; the column is added
    (NULL in them) on the first writable open, and the finders' rows fill it."""
    path = tmp_path / "w.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE opportunities (trace VARCHAR, kind VARCHAR, rank INTEGER, op_id UBIGINT, "
            "other_id UBIGINT, gain_ns DOUBLE, detail VARCHAR)"
        )
        con.execute("INSERT INTO opportunities VALUES ('t', 'overlap', 0, 1, 2, 5.0, '{}')")
    with Warehouse.open(path) as w:
        assert w.query("SELECT id, gain_ns FROM opportunities").to_pylist() == [{"id": None, "gain_ns": 5.0}]


def test_a_load_read_range_by_range_is_the_trace_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load`` reads a content's rows a key range at a time (memory: one range beside the
    result); with ranges of 7 rows, a trace of several ranks, deps and missing deps comes back
    exactly, in order, also after another content was stored between (keys stay per content)."""

    monkeypatch.setattr(_trace_rows, "_LOAD_ROWS", 7)
    first, second = (
        transformer(ranks=4, layers=2, tp=2, name="a"),
        transformer(ranks=8, layers=3, tp=4, name="b"),
    )
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(first)
        s.ingest(second)
        for trace in (first, second):
            got = s.load(trace.name)
            assert got.num_ops > 7 and got.deps.num_rows > 7
            assert_trace_equal(got, trace)


def test_opportunities_numbered_as_opportunity_are_renamed_id(tmp_path: Path) -> None:
    """A store that numbered its opportunities in a column ``opportunity`` keeps the numbers,
    now under ``id`` (what ``overlap --format json`` and ``rewrite --opportunity`` call them)."""
    path = tmp_path / "w.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE opportunities (trace VARCHAR, kind VARCHAR, rank INTEGER, op_id UBIGINT, "
            "other_id UBIGINT, gain_ns DOUBLE, detail VARCHAR, opportunity INTEGER)"
        )
        con.execute("INSERT INTO opportunities VALUES ('t', 'overlap', 0, 1, 2, 5.0, '{}', 3)")
    with Warehouse.open(path) as w:
        assert w.query("SELECT id, gain_ns FROM opportunities").to_pylist() == [{"id": 3, "gain_ns": 5.0}]
