"""Store format versions: this etstore records its own, upgrades formats 1 and 2 in place, refuses newer."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from etstore.errors import StoreError
from etstore.store import open_store
from etstore.store._identity import upgraded_identity
from etstore.store._sqlite_catalog import Catalog
from etstore.store.catalog import FORMAT_VERSION
from etstore.store.upgrade import main as upgrade_main
from etstore.store.warehouse import Warehouse

DATA = Path(__file__).parent / "data" / "format1-store.tar.xz"
DATA2 = Path(__file__).parent / "data" / "format2-store.tar.xz"
# what the format-1 store holds (tests/store/data/README.md): name -> (kind, ops, parent)
STORED = {
    "transformer": ("workload", 20, None),
    "ring-allreduce-2r-1c": ("algorithm", 10, None),
    "transformer-expanded": ("expanded", 28, "transformer"),
    "ll": ("algorithm", 1120, None),
}


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "old"
    path.mkdir()
    with tarfile.open(DATA) as tar:
        tar.extractall(path, filter="data")
    return path


@pytest.fixture
def format2_store(tmp_path: Path) -> Path:
    path = tmp_path / "old2"
    path.mkdir()
    with tarfile.open(DATA2) as tar:
        tar.extractall(path, filter="data")
    return path


def _version(path: Path) -> int | None:
    """The store's format: the warehouse's record (format 3 on), else the SQLite catalog's."""
    if not (path / "catalog.sqlite").exists():
        with Warehouse.open(path / "warehouse.duckdb", read_only=True) as wh:
            return int(wh.query("SELECT max(version) FROM store_format").scalar())
    return Catalog(path / "catalog.sqlite", create=False).format_version()


def test_a_new_store_records_its_format(tmp_path: Path) -> None:
    with open_store(tmp_path / "s", write=True):
        pass
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if not p.name.startswith("lock")) == [
        "listing.json",
        "warehouse.duckdb",
    ]  # one database: no catalog beside it, no graph until a Cypher query needs it
    assert _version(tmp_path / "s") == FORMAT_VERSION == 3


def test_read_only_open_of_format1_says_what_to_run(old_store: Path) -> None:
    assert _version(old_store) == 1
    with pytest.raises(StoreError, match=rf"format 1 .*python -m etstore.store.upgrade {old_store}$"):
        open_store(old_store, read_only=True)
    assert _version(old_store) == 1  # untouched


def _check_upgraded(path: Path, shared_fixture_xml: Path) -> None:
    from etstore.formats import read_trace

    with open_store(path, read_only=True) as s:
        got = {t.name: (t.kind, t.ops, t.parent) for t in s.traces()}
        assert got == STORED
        rows = s.sql("SELECT trace, count(*) AS n FROM ops GROUP BY trace ORDER BY trace").to_pylist()
        assert {r["trace"]: r["n"] for r in rows} == {k: v[1] for k, v in STORED.items()}
        lineage = s.sql("SELECT trace, parent_trace, count(*) AS n FROM lineage GROUP BY ALL").to_pylist()
        assert lineage == [{"trace": "transformer-expanded", "parent_trace": "transformer", "n": 10}]
        becomes = s.cypher(
            "MATCH (t:Trace {name: $p}), (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace_id = t.trace_id "
            "RETURN count(*)",
            {"p": "transformer"},
        ).scalar()
        assert becomes == 10
        assert s.load("ll").num_ops == 1120
    # the same file read again is the same algorithm, under its old name
    with open_store(path, write=True) as s:
        again = s.ingest(read_trace(shared_fixture_xml), name="ll")
        assert not again.created


def test_writable_open_upgrades_in_place(old_store: Path, shared_fixture: Callable[[str], Path]) -> None:
    xml = shared_fixture("msccl/allreduce_1step_mccl_8_2_131072_LL.xml")
    assert upgrade_main([str(old_store)]) == 0
    assert _version(old_store) == FORMAT_VERSION
    assert not (old_store / "catalog.sqlite").exists() and not (old_store / "graph").exists()
    _check_upgraded(old_store, xml)


def test_format2_upgrades_in_place(format2_store: Path, shared_fixture: Callable[[str], Path]) -> None:
    xml = shared_fixture("msccl/allreduce_1step_mccl_8_2_131072_LL.xml")
    assert _version(format2_store) == 2
    before = Catalog(format2_store / "catalog.sqlite", create=False)
    times = before.name_times()
    before.close()
    with pytest.raises(StoreError, match=rf"format 2 .*python -m etstore.store.upgrade {format2_store}$"):
        open_store(format2_store, read_only=True)
    assert upgrade_main([str(format2_store)]) == 0
    assert _version(format2_store) == FORMAT_VERSION
    with open_store(format2_store, read_only=True) as s:
        infos = {t.name: t for t in s.traces()}
        assert infos["second"].trace_id == infos["transformer"].trace_id  # one content, two names
        assert {n: t.created for n, t in infos.items()} == times  # each name keeps its time
        two = s.cypher(
            "MATCH (t:Trace), (o:Op) WHERE o.trace_id = t.trace_id AND t.name IN ['second', 'transformer'] "
            "RETURN t.name AS name, count(o) AS n ORDER BY name"
        ).to_pylist()
        assert two == [{"name": "second", "n": 20}, {"name": "transformer", "n": 20}]
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 20 + 10 + 28 + 1120  # each content once
    stored = {**STORED, "second": STORED["transformer"]}
    with open_store(format2_store, write=True) as s:
        assert {t.name: (t.kind, t.ops, t.parent) for t in s.traces()} == stored
        s.remove("second")
    _check_upgraded(format2_store, xml)


def test_a_format2_upgrade_cut_after_its_commit_is_finished(format2_store: Path) -> None:
    """The DuckDB version record is the commit point: the SQLite files left behind go next open."""
    assert upgrade_main([str(format2_store)]) == 0
    with tarfile.open(DATA2) as tar:  # put the old catalog back, as if removing it was cut short
        tar.extract("catalog.sqlite", format2_store, filter="data")
    with open_store(format2_store, write=True) as s:
        assert len(s.traces()) == 5
    assert not (format2_store / "catalog.sqlite").exists()


def test_an_upgrade_cut_short_is_finished_by_the_next_open(
    old_store: Path, shared_fixture: Callable[[str], Path]
) -> None:
    xml = shared_fixture("msccl/allreduce_1step_mccl_8_2_131072_LL.xml")
    # the warehouse step done, the catalog step not (a crash between the two transactions)
    legacy = Catalog(old_store / "catalog.sqlite", create=False).legacy_traces()
    trace_id_of = {r.name: r.trace_id for r in legacy}
    table = pa.table(
        {
            "name": [r.name for r in legacy],
            "trace_id": pa.array([r.trace_id for r in legacy], pa.int64()),
            "parent_trace_id": pa.array([trace_id_of.get(r.parent or "") for r in legacy], pa.int64()),
            "content_hash": [upgraded_identity(r.content_hash, r.kind, json.loads(r.params)) for r in legacy],
        }
    )
    Warehouse.open(old_store / "warehouse.duckdb", legacy=table).close()
    assert _version(old_store) == 1
    with open_store(old_store, write=True):
        pass
    assert _version(old_store) == FORMAT_VERSION
    _check_upgraded(old_store, xml)


def test_a_newer_format_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path / "s", write=True):
        pass
    with Warehouse.open(tmp_path / "s" / "warehouse.duckdb") as wh:
        wh.execute("UPDATE store_format SET version = 99")
    for read_only in (False, True):
        with pytest.raises(StoreError, match="store format 99, written by a newer etstore"):
            open_store(tmp_path / "s", read_only=read_only)


def test_a_format1_warehouse_alone_is_not_guessed_at(old_store: Path) -> None:
    with pytest.raises(StoreError, match="trace tables of store format 1"):
        Warehouse.open(old_store / "warehouse.duckdb")
