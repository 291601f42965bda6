"""The warehouse API: queries, writes, transactions, registered Arrow views, errors, schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from etstore.errors import QueryError, StoreError
from etstore.store.warehouse import SCHEMA_VERSION, TABLES, Warehouse


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
        assert set(TABLES) <= {r[0] for r in w.query("SELECT table_name FROM information_schema.tables")}
        w.execute("INSERT INTO runs (run_id, trace) VALUES (7, 't')")
    with Warehouse.open(path, read_only=True) as r:
        assert r.query("SELECT run_id FROM runs").scalar() == 7
        with pytest.raises(StoreError, match="read-only"):
            r.execute("DELETE FROM runs")
    with Warehouse.open(path) as w:
        w.execute("INSERT INTO etstore_sim_schema VALUES ($v)", {"v": SCHEMA_VERSION + 1})
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Warehouse.open(path)
    (tmp_path / "junk.duckdb").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError, match="cannot open the DuckDB warehouse"):
        Warehouse.open(tmp_path / "junk.duckdb")
