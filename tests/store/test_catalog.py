"""The embedded catalog in DuckDB: trace ids are never reused, a content and its names commit with
their rows in one transaction, a name is unique even between writers, and what an interrupted
writer left is found. A store of format 2 keeps its catalog in SQLite: that is still read."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import pytest

from etstore.errors import StoreError
from etstore.store import EmbeddedStore
from etstore.store import _sqlite_catalog as legacy
from etstore.store.catalog import FORMAT_VERSION, Catalog, ContentRecord, NameRecord
from etstore.store.schema import CONTENT_TABLES
from etstore.workloads import transformer


def _claim(catalog: Catalog, digest: str = "h", kind: str = "workload") -> ContentRecord:
    """A new content, committed loading."""
    with catalog.wh.transaction():
        return catalog.claim(ContentRecord(content_hash=digest, kind=kind))


def _commit(catalog: Catalog, rec: ContentRecord, name: str) -> NameRecord:
    """``rec`` ready with its first name ``name``, in one transaction."""
    assert rec.trace_id is not None
    made = NameRecord(name, rec.trace_id)
    with catalog.wh.transaction():
        catalog.ready(rec)
        catalog.add_name(made, rec, {})
    return made


def _rows_of(s: EmbeddedStore, trace_id: int) -> dict[str, int]:
    """How many rows each content table (and the lineage) holds of content ``trace_id``."""
    return {
        t: int(s.sql(f"SELECT count(*) FROM {t} WHERE trace_id = $t", {"t": trace_id}).scalar())
        for t in (*CONTENT_TABLES, "trace_lineage")
    }


# ---------------------------------------------------------------- trace ids


def test_trace_ids_increase_and_are_never_reused(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        cat = s.catalog
        assert [_claim(cat, d).trace_id for d in ("a", "b", "c")] == [1, 2, 3]
        with s.warehouse.transaction():
            cat.delete_content(3)  # the newest goes: its id is not given out again
        assert cat.content(3) is None and _claim(cat, "d").trace_id == 4
        assert s.sql("SELECT version, last_trace_id FROM store_format").to_pylist() == [
            {"version": FORMAT_VERSION, "last_trace_id": 4}
        ]
    with EmbeddedStore(tmp_path / "s") as s:  # the sweep removed them all; the count goes on
        assert s.sql("SELECT count(*) FROM contents").scalar() == 0
        assert _claim(s.catalog).trace_id == 5


def test_no_id_the_graph_index_still_holds_is_given_out(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=1, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == a.num_ops + b.num_ops
        s.remove("b")  # the graph index holds id 2 until the next Cypher query
        # a store whose own record lags the index (as one upgraded from format 2 may)
        s.warehouse.execute("UPDATE store_format SET last_trace_id = 1")
        assert s.sql("SELECT trace_id FROM graph_index ORDER BY 1").to_pylist() == [
            {"trace_id": 1},
            {"trace_id": 2},
        ]
        assert s.ingest(b, name="c").trace.trace_id == 3
        got = s.cypher(
            "MATCH (x:Trace), (o:Op) WHERE o.trace_id = x.trace_id "
            "RETURN x.name AS t, count(o) AS n ORDER BY t"
        ).to_pylist()
        assert got == [{"t": "a", "n": a.num_ops}, {"t": "c", "n": b.num_ops}]


def test_two_writers_claiming_at_once_never_share_an_id(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        other = s.warehouse.sibling()  # a second connection: its own transactions
        try:
            with s.warehouse.transaction():
                mine = s.catalog.claim(ContentRecord(content_hash="x", kind="workload"))
                with pytest.raises(StoreError, match="Conflict"), other.transaction():
                    Catalog(other).claim(ContentRecord(content_hash="y", kind="workload"))
            assert mine.trace_id == 1
            assert _claim(Catalog(other), "y").trace_id == 2  # tried again: the next id
        finally:
            other.close()


# ---------------------------------------------------------------- one transaction


def test_content_and_first_name_commit_together_or_not_at_all(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        cat = s.catalog
        with pytest.raises(RuntimeError, match="killed"), s.warehouse.transaction():
            rec = cat.claim(ContentRecord(content_hash="d1", kind="algorithm", ranks=8))
            cat.ready(rec)
            assert rec.trace_id is not None
            cat.add_name(NameRecord("x", rec.trace_id), rec, {})
            raise RuntimeError("killed")
        assert (cat.names(), cat.all_names(), cat.content(1), cat.stale()) == ([], set(), None, [])
        made = datetime(2025, 3, 4, 5, 6, 7, 89)  # stored as naive UTC
        rec = ContentRecord(content_hash="d1", kind="algorithm", ranks=8, ops=5, deps=4, messages=2)
        rec.created = made
        with s.warehouse.transaction():
            cat.claim(rec)
            cat.ready(rec)
            assert rec.trace_id is not None
            cat.add_name(
                NameRecord("x", rec.trace_id, "x.et", params='{"k": 1}', created=made), rec, {"k": 1}
            )
        got = cat.name("x")
        assert got is not None
        n, c = got
        assert c == ContentRecord("d1", "algorithm", 8, 5, 4, 0, 2, status="ready", created=made, trace_id=1)
        info = n.info(c)
        # the rolled-back claim never existed: its id is the first again
        assert (info.name, info.source, info.params, info.ops, info.trace_id) == ("x", "x.et", {"k": 1}, 5, 1)
        assert info.created == made.replace(tzinfo=timezone.utc)
        # the warehouse's ``traces`` row is the same name: SQL sees what the catalog says
        assert s.sql("SELECT name, kind, ops, content_hash, trace_id, params FROM traces").to_pylist() == [
            {
                "name": "x",
                "kind": "algorithm",
                "ops": 5,
                "content_hash": "d1",
                "trace_id": 1,
                "params": '{"k": 1}',
            }
        ]


def test_a_removal_commits_with_the_rows_or_not_at_all(tmp_path: Path) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "s") as s:
        tid = s.ingest(trace, name="a").trace.trace_id
        assert tid is not None
        s.ingest(trace, name="b")  # a second name of the same content
        cat, full = s.catalog, _rows_of(s, tid)
        assert full["trace_ops"] == trace.num_ops and full["trace_deps"] == trace.num_deps
        with pytest.raises(RuntimeError, match="killed"), s.warehouse.transaction():
            cat.drop_name("a")
            cat.drop_name("b")
            cat.delete_content(tid)
            raise RuntimeError("killed")
        assert [n.name for n in cat.names_of(tid)] == ["a", "b"] and _rows_of(s, tid) == full
        with s.warehouse.transaction():
            cat.drop_name("a")  # one name goes, the content stays
        assert [n.name for n in cat.names_of(tid)] == ["b"] and _rows_of(s, tid) == full
        assert cat.stale() == []
        with s.warehouse.transaction():
            cat.delete_content(tid)  # its last name goes with it
        assert cat.all_names() == set() and cat.content(tid) is None
        assert set(_rows_of(s, tid).values()) == {0}
        assert s.sql("SELECT count(*) FROM ops").scalar() == 0


# ---------------------------------------------------------------- names


def test_a_name_taken_meanwhile_is_a_store_error(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        other = s.warehouse.sibling()  # another writer's connection, its own transactions
        one, two = s.catalog, Catalog(other)
        try:
            mine, theirs = _claim(one, "h"), _claim(two, "g")
            assert mine.trace_id is not None
            taken = pytest.raises(StoreError, match="'a' was taken by another ingest meanwhile")
            with taken, s.warehouse.transaction():
                one.ready(mine)
                assert "a" not in one.all_names()  # free when this transaction began
                _commit(two, theirs, "a")  # the other commits it meanwhile
                one.add_name(NameRecord("a", mine.trace_id), mine, {})
            assert [(n.name, n.trace_id) for n, _ in one.names()] == [("a", theirs.trace_id)]
            assert one.stale() == [mine.trace_id]  # still loading: the next writable open sweeps it
        finally:
            other.close()
    with EmbeddedStore(tmp_path / "s") as s:
        assert [c.trace_id for c in s.catalog.contents()] == [2]
        assert s.catalog.content(1) is None


def test_reads_follow_names_and_contents(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        cat = s.catalog
        one = _claim(cat, "d1", "algorithm")
        _commit(cat, one, "x")
        two = _claim(cat, "d1", "workload")  # the same digest, another kind: another content
        assert one.trace_id is not None and two.trace_id is not None
        with s.warehouse.transaction():
            cat.add_name(NameRecord("y", one.trace_id, parent="x", parent_trace_id=one.trace_id), one, {})
        assert [r.name for r in cat.names_of(one.trace_id)] == ["x", "y"]
        assert cat.name_ids() == {"x": 1, "y": 1} and cat.all_names() == {"x", "y"}
        assert cat.lineage_users(1, 1) == 1 and cat.lineage_users(1, 2) == 0
        found = cat.by_identity("d1", "algorithm")
        assert found is not None and found.trace_id == 1
        assert cat.by_identity("d1", "workload") is None  # loading: not found, not listed
        assert [c.trace_id for c in cat.contents()] == [1] and cat.name("z") is None
        two_now = cat.content(2)
        assert two_now is not None and two_now.status == "loading"


def test_stale_finds_loading_and_nameless_contents(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        cat = s.catalog
        kept, loading, nameless = (_claim(cat, d) for d in ("k", "l", "n"))
        assert cat.stale() == [1, 2, 3]  # all loading
        _commit(cat, kept, "kept")
        _commit(cat, nameless, "gone")
        assert cat.stale() == [2]
        with s.warehouse.transaction():
            cat.drop_name("gone")  # ready, and no name points at it any more
        assert cat.stale() == [2, 3]
        assert loading.trace_id == 2 and nameless.trace_id == 3
    with EmbeddedStore(tmp_path / "s") as s:  # the next writable open sweeps both
        assert s.catalog.stale() == []
        assert s.sql("SELECT trace_id, status FROM contents").to_pylist() == [
            {"trace_id": 1, "status": "ready"}
        ]


def test_the_catalog_imports_no_orm() -> None:
    orm = ("sqlalchemy", "sqlmodel")
    code = f"import sys, etstore.store.catalog; print([m for m in {orm!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------- format 2: the SQLite catalog

# sqlite_master of a catalog of store format 2 (copied from such a store); its rows as that
# etstore wrote them: times as naive UTC text
_FORMAT2 = (
    "CREATE TABLE contents (\n\tseq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n\tcontent_hash VARCHAR "
    "NOT NULL, \n\tkind VARCHAR NOT NULL, \n\tranks INTEGER NOT NULL, \n\tops INTEGER NOT NULL, \n\tdeps "
    "INTEGER NOT NULL, \n\tmissing INTEGER NOT NULL, \n\tmessages INTEGER NOT NULL, \n\tgraph_name "
    "VARCHAR NOT NULL, \n\tstatus VARCHAR NOT NULL, \n\tcreated DATETIME NOT NULL\n)",
    "CREATE INDEX ix_contents_content_hash ON contents (content_hash)",
    "CREATE TABLE names (\n\tid INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n\tname VARCHAR NOT NULL, "
    "\n\ttrace_id INTEGER NOT NULL, \n\tsource VARCHAR NOT NULL, \n\tparent VARCHAR, \n\tparent_trace_id "
    "INTEGER, \n\tparams VARCHAR NOT NULL, \n\tcreated DATETIME NOT NULL\n)",
    "CREATE INDEX ix_names_trace_id ON names (trace_id)",
    "CREATE UNIQUE INDEX ix_names_name ON names (name)",
    "CREATE TABLE etstore_format (version INTEGER NOT NULL)",
    "INSERT INTO etstore_format VALUES (2)",
    "INSERT INTO contents VALUES (1, 'd1', 'algorithm', 8, 5, 4, 0, 2, 'x', 'ready', "
    "'2025-03-04 05:06:07.000089')",
    "INSERT INTO contents VALUES (2, 'd2', 'workload', 2, 3, 1, 0, 0, 'z', 'deleting', "
    "'2025-03-05 00:00:00.000000')",
    "INSERT INTO names VALUES (1, 'x', 1, 'x.xml', NULL, NULL, '{\"k\": 1}', '2025-03-04 05:06:07.000089')",
    "INSERT INTO names VALUES (2, 'y', 1, '', 'x', 1, '{}', '2025-03-06 01:02:03.000004')",
)


def test_a_format2_catalog_is_read_for_the_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    with closing(sqlite3.connect(path)) as con, con:
        for statement in _FORMAT2:
            con.execute(statement)
    old = legacy.Catalog(path, create=False)
    try:
        assert old.format_version() == 2
        made = datetime(2025, 3, 4, 5, 6, 7, 89, tzinfo=timezone.utc)
        assert old.content_rows() == [
            (1, "d1", "algorithm", 8, 5, 4, 0, 2, "ready", made),
            (2, "d2", "workload", 2, 3, 1, 0, 0, "deleting", datetime(2025, 3, 5, tzinfo=timezone.utc)),
        ]
        assert old.name_times() == {"x": made, "y": datetime(2025, 3, 6, 1, 2, 3, 4, tzinfo=timezone.utc)}
    finally:
        old.close()


def test_a_file_that_is_not_a_catalog_is_a_store_error(tmp_path: Path) -> None:
    store = tmp_path / "s"
    store.mkdir()
    (store / "catalog.sqlite").write_bytes(b"not a database, but sixteen bytes or more of text\n" * 40)
    with pytest.raises(
        StoreError, match=r"catalog.sqlite: SQLite refused the catalog: file is not a database"
    ):
        EmbeddedStore(store)
