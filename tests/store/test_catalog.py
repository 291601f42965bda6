"""The embedded catalog on its own: names are unique even between processes; the schema is the stores'."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path

import pytest

from etstore.errors import StoreError
from etstore.store.catalog import FORMAT_VERSION, Catalog, ContentRecord, NameRecord

# sqlite_master of a catalog written by etstore 0.1 through SQLModel/SQLAlchemy (copied from such a store):
# a new catalog must be the same, statement for statement, so stores written either way open unchanged
_SCHEMA_0_1 = [
    (
        "table",
        "contents",
        "CREATE TABLE contents (\n\tseq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n\tcontent_hash VARCHAR "
        "NOT NULL, \n\tkind VARCHAR NOT NULL, \n\tranks INTEGER NOT NULL, \n\tops INTEGER NOT NULL, \n\tdeps "
        "INTEGER NOT NULL, \n\tmissing INTEGER NOT NULL, \n\tmessages INTEGER NOT NULL, \n\tgraph_name "
        "VARCHAR NOT NULL, \n\tstatus VARCHAR NOT NULL, \n\tcreated DATETIME NOT NULL\n)",
    ),
    ("index", "ix_contents_content_hash", "CREATE INDEX ix_contents_content_hash ON contents (content_hash)"),
    (
        "table",
        "names",
        "CREATE TABLE names (\n\tid INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n\tname VARCHAR NOT NULL, "
        "\n\ttrace_id INTEGER NOT NULL, \n\tsource VARCHAR NOT NULL, \n\tparent VARCHAR, \n\tparent_trace_id "
        "INTEGER, \n\tparams VARCHAR NOT NULL, \n\tcreated DATETIME NOT NULL\n)",
    ),
    ("index", "ix_names_trace_id", "CREATE INDEX ix_names_trace_id ON names (trace_id)"),
    ("index", "ix_names_name", "CREATE UNIQUE INDEX ix_names_name ON names (name)"),
    ("table", "etstore_format", "CREATE TABLE etstore_format (version INTEGER NOT NULL)"),
]


def _master(path: Path) -> list[tuple[str, str, str]]:
    with closing(sqlite3.connect(path)) as con:
        rows = con.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name != 'sqlite_sequence' ORDER BY rowid"
        ).fetchall()
    return [(t, n, s) for t, n, s in rows]


def test_a_name_taken_meanwhile_is_a_store_error(tmp_path: Path) -> None:
    one = Catalog(tmp_path / "catalog.sqlite")
    other = Catalog(tmp_path / "catalog.sqlite")  # a second process's view of the same file
    seq = one.add_content(ContentRecord(content_hash="h", kind="workload")).seq
    assert seq is not None
    one.commit_content(seq, NameRecord(name="a", trace_id=seq), ops=3)
    with pytest.raises(StoreError, match="'a' was taken by another ingest meanwhile"):
        other.add_name(NameRecord(name="a", trace_id=seq))
    second = other.add_content(ContentRecord(content_hash="g", kind="workload")).seq
    assert second is not None
    with pytest.raises(StoreError, match="'a' was taken"):
        other.commit_content(second, NameRecord(name="a", trace_id=second))
    assert [n.name for n, _ in one.names()] == ["a"]
    assert [c.seq for c in one.stale()] == [second]  # left loading: the next open sweeps it
    one.close()
    other.close()


def test_a_new_catalog_has_the_schema_stores_always_had(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    Catalog(path).close()
    assert _master(path) == _SCHEMA_0_1
    with closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT version FROM etstore_format").fetchall() == [(FORMAT_VERSION,)]
        assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    Catalog(path).close()  # opening again adds nothing
    assert _master(path) == _SCHEMA_0_1


def test_rows_round_trip_in_the_stored_layout(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    cat = Catalog(path)
    made = datetime(2025, 3, 4, 5, 6, 7, 89, tzinfo=timezone.utc)
    seq = cat.add_content(ContentRecord(content_hash="d1", kind="algorithm", ranks=8, created=made)).seq
    assert seq == 1
    ready = cat.commit_content(
        seq, NameRecord(name="x", trace_id=seq, params='{"k": 1}', created=made), ops=5, deps=4, messages=2
    )
    assert (ready.status, ready.ops, ready.deps, ready.messages, ready.created) == ("ready", 5, 4, 2, made)
    cat.add_name(NameRecord(name="y", trace_id=seq, parent="x", parent_trace_id=seq))
    with closing(sqlite3.connect(path)) as con:  # what SQLAlchemy wrote for a DateTime: naive UTC text
        assert con.execute("SELECT created FROM names WHERE name = 'x'").fetchone() == (
            "2025-03-04 05:06:07.000089",
        )
    got = cat.name("x")
    assert got is not None
    n, c = got
    assert (n.id, n.created, c.seq, c.content_hash, c.ranks) == (1, made, 1, "d1", 8)
    assert n.info(c).params == {"k": 1}
    assert [r.name for r in cat.names_of(seq)] == ["x", "y"]
    assert cat.lineage_users(seq, seq) == 1 and cat.name_ids() == {"x": 1, "y": 1}
    assert cat.by_identity("d1", "algorithm") == c and cat.by_identity("d1", "workload") is None
    dropped = cat.drop_name("x")
    assert dropped is not None and [r.name for r in dropped[1]] == ["y"]
    assert cat.drop_name("x") is None
    cat.set_graph_name(seq, "gone")
    assert [r.seq for r in cat.misnamed_graphs()] == [seq]
    dropped = cat.drop_name("y")
    assert dropped is not None and dropped[1] == []
    stale = cat.stale()
    assert [(r.seq, r.status) for r in stale] == [(seq, "deleting")]
    cat.delete_content(seq)
    assert (cat.content_count(), cat.content(seq)) == (0, None)
    cat.close()


def test_committing_a_vanished_content_is_a_store_error(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    with pytest.raises(StoreError, match="trace id 7 vanished from the catalog"):
        cat.commit_content(7, NameRecord(name="a", trace_id=7))
    assert cat.all_names() == set()  # the name went with the rolled-back transaction
    with pytest.raises(StoreError, match="catalog contents have no column 'opz'"):
        cat.commit_content(7, NameRecord(name="a", trace_id=7), opz=1)
    cat.close()


def test_the_catalog_imports_no_orm() -> None:
    orm = ("sqlalchemy", "sqlmodel")
    code = f"import sys, etstore.store.catalog; print([m for m in {orm!r} if m in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_file_that_is_not_a_catalog_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    path.write_bytes(b"not a database, but sixteen bytes or more of text\n" * 40)
    with pytest.raises(
        StoreError, match=r"catalog.sqlite: SQLite refused the catalog: file is not a database"
    ):
        Catalog(path)
