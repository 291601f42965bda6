"""Feature table sets: declared beside their feature, every one created with the store, applied
again once per connection when the feature writes, never written by a read-only open."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import duckdb
import pytest

import etstore.app
from etstore.app.measured import MEASURED_TABLES
from etstore.app.tuner import TUNER_TABLES
from etstore.errors import StoreError
from etstore.store import EmbeddedStore, tables
from etstore.store import warehouse as warehouse_module
from etstore.store.schema import CATALOG_DDL, TRACE_DDL, TRACE_TABLES
from etstore.store.tables import TableSet, declared, table_set
from etstore.store.warehouse import Warehouse


def _names(wh: Warehouse) -> set[str]:
    return {str(r[0]) for r in wh.query("SELECT table_name FROM information_schema.tables")}


def test_every_set_of_app_is_declared_once_and_names_its_own_tables() -> None:
    found: dict[str, TableSet] = {}
    for info in pkgutil.iter_modules(etstore.app.__path__, "etstore.app."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, TableSet) and value.__class__ is TableSet:
                assert found.setdefault(value.name, value) is value, value.name
    assert sorted(found) == sorted(declared())
    assert all(table_set(name) is found[name] for name in declared())
    owners: dict[str, str] = {}
    core = {*TRACE_TABLES, *(ddl.split()[5] for ddl in (*TRACE_DDL, *CATALOG_DDL))}
    for name, tset in found.items():
        for table in (*tset.tables, *tset.views):
            assert table not in core and owners.setdefault(table, name) == name, table
        assert all(f"IF NOT EXISTS {t} (" in ddl for t, ddl in tset.tables.items())
        assert all(f"OR REPLACE VIEW {v} AS" in ddl for v, ddl in tset.views.items())
        assert set(tset.requires) <= set(found)


def test_a_wrong_declaration_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StoreError, match="no warehouse table set named 'nosuch'"):
        table_set("nosuch")
    monkeypatch.setitem(tables._DECLARED, "bogus", "etstore.app.measured:MEASURED_TABLES")
    with pytest.raises(StoreError, match="holds no TableSet named 'bogus'"):
        table_set("bogus")


def test_a_store_holding_every_set_opens_without_loading_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.duckdb"
    Warehouse.open(path).close()

    def refuse(name: str) -> TableSet:
        raise AssertionError(f"loaded {name}")

    with monkeypatch.context() as m:
        m.setattr(warehouse_module, "table_set", refuse)
        Warehouse.open(path).close()
    # a set the store lacks (one added to etstore since the store was made) comes with the next open
    with Warehouse.open(path) as w:
        w.execute("DROP TABLE measurements")
        w.execute("DELETE FROM etstore_table_sets WHERE name = 'measured'")
    with Warehouse.open(path, read_only=True) as r:  # a reader writes nothing
        assert "measurements" not in _names(r)
        r.ensure(MEASURED_TABLES)
        assert "measurements" not in _names(r)
    with Warehouse.open(path) as w:
        assert "measurements" in _names(w)
        assert w.query("SELECT count(*) FROM etstore_table_sets").scalar() == len(declared())


def test_ensure_applies_a_set_once_per_connection_and_not_after_a_rollback() -> None:
    with Warehouse(duckdb.connect()) as wh:
        with pytest.raises(KeyError), wh.transaction():
            wh.ensure(MEASURED_TABLES)
            assert "measured_runs" in _names(wh)
            raise KeyError("boom")
        assert "measured_runs" not in _names(wh)
        wh.ensure(MEASURED_TABLES)
        assert "measured_runs" in _names(wh)
        before = wh.statements
        wh.ensure(MEASURED_TABLES)
        assert wh.statements == before


def test_ensure_creates_the_sets_a_set_requires() -> None:
    with Warehouse(duckdb.connect()) as wh:
        wh.ensure(TUNER_TABLES)  # v_tuner_vs_sim reads the simulator's sweep_points
        assert {"tuner_steps", "v_tuner_vs_sim", "sweep_points", "runs"} <= _names(wh)
        assert {r[0] for r in wh.query("SELECT name FROM etstore_table_sets")} == {"runs", "tuner"}
        assert wh.query("SELECT count(*) FROM v_tuner_vs_sim").scalar() == 0


def test_a_new_store_read_only_answers_every_table_empty(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "new", read_only=True) as store:  # its first open creates it
        for table in ("measurements", "v_tuner_best", "v_measured_vs_sim", "v_collective_busbw"):
            assert store.sql(f"SELECT count(*) FROM {table}").scalar() == 0
    with Warehouse.empty_read_only() as empty:
        assert empty.query("SELECT count(*) FROM comparisons").scalar() == 0
