"""The SQLite catalog of stores of format 1 and 2, read to upgrade them (format 3 keeps it in DuckDB).

Content is stored once; names are handles. A *content* row (``contents``) is one
trace's data as the engines hold it, keyed by its sequence number (the *trace id*:
graph uids and warehouse rows derive from it) and identified by its digest
(:func:`~etstore.store._identity.identity`). A *name* row (``names``) maps a name
the user chose to a content, with what belongs to the name: its parent, source,
parameters and creation time. Two names may share one content; removing one name
leaves the other, and the content goes when its last name does.

A content row is written with ``status='loading'`` before any data lands; the one
SQLite transaction that flips it to ``'ready'`` and inserts its first name is the
commit point of an ingest. Content rows that are not ready, or that no name points
at, are swept (with their data) on the next writable open.

``etstore_format`` holds the store format version (:data:`FORMAT_VERSION`). A store
written before names existed (format 1: one ``traces`` table, no version record) is
upgraded in place by :meth:`Catalog.upgrade`, in one transaction.

The catalog is read by every command, so it is plain :mod:`sqlite3` (no ORM to import):
the tables are two small ones. The DDL below is the schema stores have always had
(earlier versions wrote it through SQLModel), and times are stored as SQLite text
``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC, as before, so existing stores open unchanged.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from etstore.errors import StoreError
from etstore.store.info import TraceInfo

__all__ = ["FORMAT_VERSION", "Catalog", "ContentRecord", "LegacyTrace", "NameRecord"]

FORMAT_VERSION = 2
"""Version of the store layout this catalog holds once upgraded from format 1 (1: before
names; 2: names and contents)."""

# The schema of format 2, statement for statement as stores hold it (sqlite_master drops IF NOT EXISTS).
# AUTOINCREMENT: a seq is never reused, because graph uids derive from it.
_DDL = (
    "CREATE TABLE IF NOT EXISTS contents (\n"
    "\tseq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n"
    "\tcontent_hash VARCHAR NOT NULL, \n"
    "\tkind VARCHAR NOT NULL, \n"
    "\tranks INTEGER NOT NULL, \n"
    "\tops INTEGER NOT NULL, \n"
    "\tdeps INTEGER NOT NULL, \n"
    "\tmissing INTEGER NOT NULL, \n"
    "\tmessages INTEGER NOT NULL, \n"
    "\tgraph_name VARCHAR NOT NULL, \n"
    "\tstatus VARCHAR NOT NULL, \n"
    "\tcreated DATETIME NOT NULL\n"
    ")",
    "CREATE INDEX IF NOT EXISTS ix_contents_content_hash ON contents (content_hash)",
    "CREATE TABLE IF NOT EXISTS names (\n"
    "\tid INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, \n"
    "\tname VARCHAR NOT NULL, \n"
    "\ttrace_id INTEGER NOT NULL, \n"
    "\tsource VARCHAR NOT NULL, \n"
    "\tparent VARCHAR, \n"
    "\tparent_trace_id INTEGER, \n"
    "\tparams VARCHAR NOT NULL, \n"
    "\tcreated DATETIME NOT NULL\n"
    ")",
    "CREATE INDEX IF NOT EXISTS ix_names_trace_id ON names (trace_id)",
    "CREATE UNIQUE INDEX IF NOT EXISTS ix_names_name ON names (name)",
)
_FORMAT_DDL = "CREATE TABLE IF NOT EXISTS etstore_format (version INTEGER NOT NULL)"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _stored_time(t: datetime) -> str:
    """A time as the catalog stores it: UTC wall clock, microseconds, no offset."""
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")


def _read_time(text: str) -> datetime:
    """A stored time, as an aware UTC datetime."""
    t = datetime.fromisoformat(text)
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


@dataclass
class ContentRecord:
    """One stored content: what the engines hold under trace id ``seq``."""

    content_hash: str
    kind: str
    ranks: int = 0
    ops: int = 0
    deps: int = 0
    missing: int = 0
    messages: int = 0
    graph_name: str = ""  # the name the graph's Op nodes carry in ``trace`` (one of its names)
    status: str = "loading"
    created: datetime = field(default_factory=_now)
    seq: int | None = None


@dataclass
class NameRecord:
    """One name: a handle on a content, with its own parent, source and parameters."""

    name: str
    trace_id: int  # ContentRecord.seq
    source: str = ""
    parent: str | None = None
    parent_trace_id: int | None = None  # the parent's content when this name was made
    params: str = "{}"
    created: datetime = field(default_factory=_now)
    id: int | None = None  # creation order

    @classmethod
    def new(
        cls,
        name: str,
        source: str,
        params: Mapping[str, Any],
        parent: str | None,
        parent_trace_id: int | None,
    ) -> NameRecord:
        """A name about to be stored (its content's id is set once the content is claimed)."""
        text = json.dumps(dict(params), sort_keys=True, default=str)
        return cls(name, 0, source, parent, parent_trace_id, text)

    def info(self, content: ContentRecord) -> TraceInfo:
        """The name as the store interface shows it."""
        return TraceInfo(
            name=self.name,
            kind=content.kind,
            source=self.source,
            content_hash=content.content_hash,
            ranks=content.ranks,
            ops=content.ops,
            deps=content.deps,
            missing=content.missing,
            messages=content.messages,
            parent=self.parent,
            params=json.loads(self.params),
            created=self.created,
            trace_id=self.trace_id,
        )


@dataclass(frozen=True)
class LegacyTrace:
    """A row of a format-1 catalog's ``traces`` table (read by :meth:`Catalog.legacy_traces`)."""

    seq: int
    name: str
    kind: str
    content_hash: str
    status: str
    parent: str | None = None
    params: str = "{}"


_CONTENT_COLS = tuple(f.name for f in fields(ContentRecord))
_NAME_COLS = tuple(f.name for f in fields(NameRecord))
_C = ", ".join(f"c.{c}" for c in _CONTENT_COLS)
_N = ", ".join(f"n.{c}" for c in _NAME_COLS)


def _content(row: tuple[Any, ...]) -> ContentRecord:
    rec = ContentRecord(*row)
    rec.created = _read_time(row[_CONTENT_COLS.index("created")])
    return rec


def _name(row: tuple[Any, ...]) -> NameRecord:
    rec = NameRecord(*row)
    rec.created = _read_time(row[_NAME_COLS.index("created")])
    return rec


def _pair(row: tuple[Any, ...]) -> tuple[NameRecord, ContentRecord]:
    k = len(_NAME_COLS)
    return _name(row[:k]), _content(row[k:])


class Catalog:
    """SQLite-backed catalog of one store directory (see the module docstring).

    Parameters
    ----------
    path
        The ``catalog.sqlite`` file.
    create
        Create the tables and the version record of a new catalog. Without it (a
        read-only open) nothing is written.

    Notes
    -----
    One connection, opened on first use and shared by the threads of a store under a lock;
    every write is one ``BEGIN IMMEDIATE`` transaction, so two processes never interleave a
    read-modify-write. :meth:`close` releases it; the catalog stays usable.
    """

    def __init__(self, path: Path, *, create: bool = True) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._con: sqlite3.Connection | None = None
        if create and "traces" not in self._tables():  # a format-1 catalog stays as it is until upgrade()
            self._create()

    def close(self) -> None:
        """Close the connection (idempotent; a later call opens a new one)."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened on first use (autocommit: transactions are explicit)."""
        if self._con is None:
            con = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                con.execute("PRAGMA journal_mode=WAL")
                con.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                con.close()
                raise
            self._con = con
        return self._con

    def _refused(self, exc: sqlite3.Error) -> StoreError:
        """SQLite's refusal (not a database, locked past the timeout, disk full) as one line."""
        return StoreError(f"{self.path}: SQLite refused the catalog: {exc}")

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise self._refused(exc) from exc

    @contextmanager
    def _write(self, name: str | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction; a unique-name clash on ``name`` becomes a StoreError."""
        with self._lock:
            try:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._refused(exc) from exc
            try:
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if name is not None and isinstance(exc, sqlite3.IntegrityError):
                    raise StoreError(
                        f"{name!r} was taken by another ingest meanwhile; nothing was stored"
                    ) from exc
                if isinstance(exc, sqlite3.Error):
                    raise self._refused(exc) from exc
                raise

    def _tables(self) -> set[str]:
        return {r[0] for r in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _create(self) -> None:
        with self._write() as db:
            for statement in (*_DDL, _FORMAT_DDL):
                db.execute(statement)
            if db.execute("SELECT count(*) FROM etstore_format").fetchone()[0] == 0:
                db.execute("INSERT INTO etstore_format VALUES (?)", (FORMAT_VERSION,))

    # ------------------------------------------------------------ format

    def format_version(self) -> int | None:
        """The format this catalog is in: its version record, 1 for a catalog from before
        version records, None for an empty (new) catalog."""
        tables = self._tables()
        if "etstore_format" in tables:
            v = self._rows("SELECT max(version) FROM etstore_format")[0][0]
            return int(v) if v is not None else None
        return 1 if "traces" in tables else None

    def legacy_traces(self) -> list[LegacyTrace]:
        """Every row of a format-1 ``traces`` table, in sequence order."""
        rows = self._rows(
            "SELECT seq, name, kind, content_hash, status, parent, params FROM traces ORDER BY seq"
        )
        return [LegacyTrace(*r) for r in rows]

    def upgrade(self, digests: Mapping[int, str]) -> None:
        """Turn a format-1 catalog into this format, in one SQLite transaction.

        Every ``traces`` row becomes a content with the same sequence number (so graph
        uids and warehouse rows keep their trace ids) and, if it was ready, a name.
        ``digests`` maps each row's sequence number to its content's identity in this
        format (an algorithm's digest gains its parameters:
        :func:`~etstore.store._identity.upgraded_identity`). Rows that were not ready
        stay as contents without names, which the next sweep removes.

        Raises
        ------
        StoreError
            The catalog is not in format 1.
        """
        if self.format_version() != 1:
            raise StoreError(f"{self.path}: not a format-1 catalog; nothing to upgrade")
        seq_of = {r.name: r.seq for r in self.legacy_traces() if r.status == "ready"}
        with self._write() as db:
            for statement in _DDL:
                db.execute(statement)
            cur = db.execute("SELECT * FROM traces ORDER BY seq")
            cols = [d[0] for d in cur.description]
            for r in (dict(zip(cols, row, strict=True)) for row in cur.fetchall()):
                self._upgrade_row(db, r, seq_of, digests[r["seq"]])
            db.execute("DROP TABLE traces")
            db.execute(_FORMAT_DDL)
            db.execute("INSERT INTO etstore_format VALUES (?)", (FORMAT_VERSION,))

    @staticmethod
    def _upgrade_row(db: sqlite3.Connection, r: dict[str, Any], seq_of: dict[str, int], digest: str) -> None:
        """One format-1 ``traces`` row as a content with identity ``digest`` (and a name, if it was ready)."""
        ready = r["status"] == "ready"
        db.execute(
            "INSERT INTO contents (seq, content_hash, kind, ranks, ops, deps, missing, messages, "
            "graph_name, status, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r["seq"],
                digest,
                *(r[k] for k in ("kind", "ranks", "ops", "deps", "missing", "messages", "name")),
                "ready" if ready else "deleting",
                r["created"],
            ),
        )
        if ready:
            db.execute(
                "INSERT INTO names (id, name, trace_id, source, parent, parent_trace_id, params, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r["seq"],
                    r["name"],
                    r["seq"],
                    r["source"],
                    r["parent"],
                    seq_of.get(r["parent"]) if r["parent"] else None,
                    r["params"],
                    r["created"],
                ),
            )

    # ------------------------------------------------------------ reads

    def content_rows(self) -> list[tuple[Any, ...]]:
        """Every content in any state: (seq, content_hash, kind, ranks, ops, deps, missing,
        messages, status, created), for the upgrade to format 3."""
        got = self._rows(
            "SELECT seq, content_hash, kind, ranks, ops, deps, missing, messages, status, created "
            "FROM contents"
        )
        return [(*r[:9], _read_time(r[9])) for r in got]

    def name_times(self) -> dict[str, datetime]:
        """Every name and when it was made, for the upgrade to format 3."""
        return {str(n): _read_time(t) for n, t in self._rows("SELECT name, created FROM names")}

    def name(self, name: str) -> tuple[NameRecord, ContentRecord] | None:
        """A name and its (ready) content, or None."""
        rows = self._rows(
            f"SELECT {_N}, {_C} FROM names n JOIN contents c ON c.seq = n.trace_id "
            "WHERE n.name = ? AND c.status = 'ready'",
            (name,),
        )
        return _pair(rows[0]) if rows else None

    def names(self) -> list[tuple[NameRecord, ContentRecord]]:
        """Every name of a ready content, oldest first."""
        rows = self._rows(
            f"SELECT {_N}, {_C} FROM names n JOIN contents c ON c.seq = n.trace_id "
            "WHERE c.status = 'ready' ORDER BY n.id"
        )
        return [_pair(r) for r in rows]

    def all_names(self) -> set[str]:
        """Every name, whatever state its content is in."""
        return set(self.name_ids())

    def name_ids(self) -> dict[str, int]:
        """Every name → its content's trace id, whatever state the content is in."""
        return {n: t for n, t in self._rows("SELECT name, trace_id FROM names")}

    def content_count(self) -> int:
        """How many contents the catalog holds, in any state."""
        return int(self._rows("SELECT count(*) FROM contents")[0][0])

    def names_of(self, trace_id: int) -> list[NameRecord]:
        """The names of one content, oldest first."""
        rows = self._rows(f"SELECT {_N} FROM names n WHERE n.trace_id = ? ORDER BY n.id", (trace_id,))
        return [_name(r) for r in rows]

    def content(self, trace_id: int) -> ContentRecord | None:
        """Content ``trace_id`` in any state, or None."""
        rows = self._rows(f"SELECT {_C} FROM contents c WHERE c.seq = ?", (trace_id,))
        return _content(rows[0]) if rows else None

    def by_identity(self, digest: str, kind: str) -> ContentRecord | None:
        """The ready content with this digest and kind, if stored."""
        rows = self._rows(
            f"SELECT {_C} FROM contents c WHERE c.content_hash = ? AND c.kind = ? AND c.status = 'ready' "
            "ORDER BY c.seq LIMIT 1",
            (digest, kind),
        )
        return _content(rows[0]) if rows else None

    def stale(self) -> list[ContentRecord]:
        """Contents to sweep: not ready, or ready with no name pointing at them."""
        rows = self._rows(
            f"SELECT {_C} FROM contents c WHERE c.status != 'ready' "
            "OR c.seq NOT IN (SELECT trace_id FROM names) ORDER BY c.seq"
        )
        return [_content(r) for r in rows]

    def misnamed_graphs(self) -> list[ContentRecord]:
        """Ready contents whose graph nodes carry a name that no longer points at them."""
        rows = self._rows(
            f"SELECT {_C} FROM contents c WHERE c.status = 'ready' "
            "AND c.graph_name NOT IN (SELECT n.name FROM names n WHERE n.trace_id = c.seq) ORDER BY c.seq"
        )
        return [_content(r) for r in rows]

    def lineage_users(self, trace_id: int, parent_trace_id: int) -> int:
        """How many names of content ``trace_id`` derive from content ``parent_trace_id``."""
        rows = self._rows(
            "SELECT count(*) FROM names WHERE trace_id = ? AND parent_trace_id = ?",
            (trace_id, parent_trace_id),
        )
        return int(rows[0][0])

    # ------------------------------------------------------------ writes

    def add_content(self, record: ContentRecord) -> ContentRecord:
        """Claim a new content (``loading``); returns it with its sequence number."""
        with self._write() as db:
            record.seq = _insert(db, "contents", _content_row(record))
        return record

    def commit_content(self, seq: int, first: NameRecord, **counts: Any) -> ContentRecord:
        """The commit point of an ingest: the content is ready and has its first name, at once.

        Raises
        ------
        StoreError
            The name was taken meanwhile (another process), or the content row vanished.
        """
        unknown = set(counts) - set(_CONTENT_COLS)
        if unknown:
            raise StoreError(f"catalog contents have no column {sorted(unknown)[0]!r}")
        with self._write(first.name) as db:
            sets = "".join(f", {k} = ?" for k in counts)
            cur = db.execute(
                f"UPDATE contents SET status = 'ready'{sets} WHERE seq = ?", (*counts.values(), seq)
            )
            if cur.rowcount == 0:
                raise StoreError(f"trace id {seq} vanished from the catalog while it was written")
            first.id = _insert(db, "names", _name_row(first))
            row = db.execute(f"SELECT {_C} FROM contents c WHERE c.seq = ?", (seq,)).fetchone()
        return _content(row)

    def add_name(self, record: NameRecord) -> NameRecord:
        """Point one more name at a stored content (one transaction).

        Raises
        ------
        StoreError
            The name was taken meanwhile (another process).
        """
        with self._write(record.name) as db:
            record.id = _insert(db, "names", _name_row(record))
        return record

    def drop_name(self, name: str) -> tuple[NameRecord, list[NameRecord]] | None:
        """Remove a name; returns it and the names its content still has (the commit point of
        a removal). A content left without names is marked ``deleting`` in the same transaction."""
        with self._write() as db:
            row = db.execute(f"SELECT {_N} FROM names n WHERE n.name = ?", (name,)).fetchone()
            if row is None:
                return None
            rec = _name(row)
            db.execute("DELETE FROM names WHERE id = ?", (rec.id,))
            rest = [
                _name(r)
                for r in db.execute(
                    f"SELECT {_N} FROM names n WHERE n.trace_id = ? ORDER BY n.id", (rec.trace_id,)
                ).fetchall()
            ]
            if not rest:
                db.execute("UPDATE contents SET status = 'deleting' WHERE seq = ?", (rec.trace_id,))
        return rec, rest

    def set_graph_name(self, seq: int, name: str) -> None:
        """Record the name content ``seq``'s graph nodes now carry."""
        with self._write() as db:
            db.execute("UPDATE contents SET graph_name = ? WHERE seq = ?", (name, seq))

    def mark_deleting(self, seq: int) -> None:
        """Mark content ``seq`` as being removed (the sweep finishes what a crash leaves)."""
        with self._write() as db:
            db.execute("UPDATE contents SET status = 'deleting' WHERE seq = ?", (seq,))

    def delete_content(self, seq: int) -> None:
        """Forget a content and any name still pointing at it."""
        with self._write() as db:
            db.execute("DELETE FROM names WHERE trace_id = ?", (seq,))
            db.execute("DELETE FROM contents WHERE seq = ?", (seq,))


def _content_row(rec: ContentRecord) -> dict[str, Any]:
    row = {c: getattr(rec, c) for c in _CONTENT_COLS if c != "seq" or rec.seq is not None}
    row["created"] = _stored_time(rec.created)
    return row


def _name_row(rec: NameRecord) -> dict[str, Any]:
    row = {c: getattr(rec, c) for c in _NAME_COLS if c != "id" or rec.id is not None}
    row["created"] = _stored_time(rec.created)
    return row


def _insert(db: sqlite3.Connection, table: str, row: dict[str, Any]) -> int:
    """Insert one row; returns its (auto-assigned) key."""
    cols = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    cur = db.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values()))
    assert cur.lastrowid is not None  # an INSERT into a rowid table always sets it
    return int(cur.lastrowid)
