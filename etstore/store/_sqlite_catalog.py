"""The SQLite catalog of stores of format 1 and 2, read to upgrade them (format 3 keeps it in DuckDB).

Format 2 held a *content* table (``contents``: trace id ``seq``, digest, kind, counts,
status, creation time) and a *name* table (``names``) in ``catalog.sqlite`` beside the
warehouse; format 1 held one ``traces`` table and no version record. This module reads
both as :mod:`etstore.store._format` needs them to upgrade a store: the version, the
format-1 rows and their upgrade to format 2 (one SQLite transaction), and the contents
and name times of format 2. Times are SQLite text ``YYYY-MM-DD HH:MM:SS.ffffff`` in UTC,
as those stores wrote them.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from etstore.errors import StoreError

__all__ = ["FORMAT_VERSION", "Catalog", "LegacyTrace"]

FORMAT_VERSION = 2
"""Version of the store layout this catalog holds once upgraded from format 1 (1: before
names; 2: names and contents)."""

# The schema of format 2, statement for statement as stores hold it (sqlite_master drops IF NOT EXISTS).
# AUTOINCREMENT: a trace id (column seq) is never reused, because graph uids derive from it.
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


@dataclass(frozen=True)
class LegacyTrace:
    """A row of a format-1 catalog's ``traces`` table (read by :meth:`Catalog.legacy_traces`)."""

    trace_id: int
    """Its column ``seq``: the content's trace id."""
    name: str
    kind: str
    content_hash: str
    status: str
    parent: str | None = None
    params: str = "{}"


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

        Every ``traces`` row becomes a content with the same trace id (column ``seq``, so graph
        uids and warehouse rows keep their trace ids) and, if it was ready, a name.
        ``digests`` maps each row's trace id to its content's identity in this
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
        trace_id_of = {r.name: r.trace_id for r in self.legacy_traces() if r.status == "ready"}
        with self._write() as db:
            for statement in _DDL:
                db.execute(statement)
            cur = db.execute("SELECT * FROM traces ORDER BY seq")
            cols = [d[0] for d in cur.description]
            for r in (dict(zip(cols, row, strict=True)) for row in cur.fetchall()):
                self._upgrade_row(db, r, trace_id_of, digests[r["seq"]])
            db.execute("DROP TABLE traces")
            db.execute(_FORMAT_DDL)
            db.execute("INSERT INTO etstore_format VALUES (?)", (FORMAT_VERSION,))

    @staticmethod
    def _upgrade_row(
        db: sqlite3.Connection, r: dict[str, Any], trace_id_of: dict[str, int], digest: str
    ) -> None:
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
                    trace_id_of.get(r["parent"]) if r["parent"] else None,
                    r["params"],
                    r["created"],
                ),
            )

    # ------------------------------------------------------------ reads

    def content_rows(self) -> list[tuple[Any, ...]]:
        """Every content in any state: (trace id, content_hash, kind, ranks, ops, deps, missing,
        messages, status, created), for the upgrade to format 3."""
        got = self._rows(
            "SELECT seq, content_hash, kind, ranks, ops, deps, missing, messages, status, created "
            "FROM contents"
        )
        return [(*r[:9], _read_time(r[9])) for r in got]

    def name_times(self) -> dict[str, datetime]:
        """Every name and when it was made, for the upgrade to format 3."""
        return {str(n): _read_time(t) for n, t in self._rows("SELECT name, created FROM names")}
