"""The DuckDB warehouse: the one way to talk to it (the store's tables: :mod:`etstore.store.schema`;
the features': :mod:`etstore.store.tables`).

:class:`Warehouse` wraps one DuckDB connection behind a narrow API (``query``,
``execute``, ``append``, ``next_id``, ``transaction``, ``registered``, ``ensure``) and turns
DuckDB's errors into :class:`~etstore.errors.QueryError` (reads) and
:class:`~etstore.errors.StoreError` (writes) carrying the engine's message.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from etstore.errors import QueryError, StoreError
from etstore.sandbox import read_only_config
from etstore.store._identity import choose_name
from etstore.store.result import Result
from etstore.store.schema import CATALOG_DDL, TABLE_SETS_DDL, TRACE_DDL, TRACE_VIEWS
from etstore.store.tables import TableSet, declared, table_set
from etstore.units import BUDGET_ENV_VAR

if TYPE_CHECKING:
    import duckdb

__all__ = ["Warehouse", "read_only_config"]

# Appends of at least one row group go straight to the database file at commit
# instead of through the WAL and a checkpoint (a second full write). DuckDB's
# default group of 122,880 rows leaves a typical algorithm trace (10^4-10^5 ops)
# below that line; this size puts it above, at a third less DuckDB time per ingest.
# DuckDB does not persist the size, so every open attaches with it.
_ROW_GROUP_SIZE = 16384


def _duckdb() -> Any:
    """The duckdb module."""
    import duckdb  # imported on first use: commands that touch no warehouse start without it

    return duckdb


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class Warehouse:
    """One DuckDB connection behind a narrow API (see the module docstring).

    Parameters
    ----------
    con
        An open DuckDB connection; the warehouse owns it from now on (:meth:`close`).
        ``Warehouse(duckdb.connect())`` is a fresh in-memory warehouse (no tables
        until :meth:`create_schema`, or a feature's own until :meth:`ensure`).
    read_only
        Whether ``con`` was opened read-only (:meth:`open` says what that refuses).

    Notes
    -----
    Not thread-safe: one thread at a time may use a warehouse.
    """

    __slots__ = ("_con", "_depth", "_ensured", "_error", "_pending", "_spill", "_statements", "read_only")

    def __init__(
        self, con: duckdb.DuckDBPyConnection, *, read_only: bool = False, statements: list[int] | None = None
    ) -> None:
        self._con = con
        self._statements = statements if statements is not None else [0]
        self.read_only = read_only
        self._error: type[Exception] = _duckdb().Error
        self._depth = 0  # open transaction() blocks; only the outermost one talks to DuckDB
        self._spill: str | None = None  # a read-only warehouse's private spill directory (close removes it)
        self._ensured: set[str] = set()  # table sets applied through this connection (committed)
        self._pending: set[str] = set()  # ... in the transaction under way

    @classmethod
    def open(
        cls, path: str | Path, *, read_only: bool = False, legacy: pa.Table | Literal["discard"] | None = None
    ) -> Warehouse:
        """Open (or create) the warehouse file at ``path``; writable ones get the store's schema
        and every declared table set they lack (:meth:`create_schema`).

        Parameters
        ----------
        path
            The DuckDB database file.
        read_only
            Open without write access (several readers may share the file); the schema
            is not touched. The engine then refuses every statement that writes or reads
            a file other than this one (``COPY ... TO``, ``EXPORT DATABASE``, ``ATTACH``,
            ``read_csv``, ``INSTALL``/``LOAD``, ...): DuckDB's ``enable_external_access``
            is off and ``lock_configuration`` keeps a query from turning it back on.
        legacy
            What to do with trace tables of store format 1 (keyed by name): a table
            ``name``, ``trace_id``, ``parent_trace_id``, ``content_hash`` re-keys them
            (:meth:`create_schema`); ``"discard"`` drops them (a cache that refills).

        Returns
        -------
        Warehouse

        Raises
        ------
        StoreError
            DuckDB cannot open the file (locked by another process, not a DuckDB file,
            ...), or a table set it creates refuses the database (a newer etstore's).
        """
        duckdb = _duckdb()
        if read_only:  # spills go to a directory of this process's own, never beside the store
            spill: str | None = None
            with contextlib.suppress(OSError):  # no writable temporary directory: nothing spills
                spill = tempfile.mkdtemp(prefix="etstore-sql-")
            try:
                con = duckdb.connect(str(path), read_only=True, config=read_only_config(spill))
            except duckdb.Error as exc:
                if spill is not None:
                    shutil.rmtree(spill, ignore_errors=True)
                raise StoreError(f"{path}: cannot open the DuckDB warehouse: {_first_line(exc)}") from exc
            warehouse = cls(con, read_only=True)
            warehouse._spill = spill
            return warehouse
        try:
            con = duckdb.connect()
        except duckdb.Error as exc:  # pragma: no cover - an in-memory database always opens
            raise StoreError(f"cannot start DuckDB: {_first_line(exc)}") from exc
        try:
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS warehouse (ROW_GROUP_SIZE {_ROW_GROUP_SIZE})")
            con.execute("USE warehouse")
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"{path}: cannot open the DuckDB warehouse: {_first_line(exc)}") from exc
        except BaseException:
            con.close()
            raise
        warehouse = cls(con)
        try:
            warehouse.create_schema(legacy=legacy, refresh=False)
        except BaseException:
            warehouse.close()
            raise
        return warehouse

    @classmethod
    def empty_read_only(cls) -> Warehouse:
        """A read-only warehouse with every table and no rows: what a store that has no
        warehouse file yet (nothing was ever stored) shows its readers. The schema is built
        in a scratch file opened read-only like a real one, so queries see empty tables,
        writes are refused, and nothing lands in the store."""
        duckdb = _duckdb()
        with tempfile.TemporaryDirectory(prefix="etstore-empty-") as scratch:
            path = Path(scratch) / "warehouse.duckdb"
            cls.open(path).close()
            try:  # the open file outlives its directory entry
                con = duckdb.connect(str(path), read_only=True, config=read_only_config())
            except duckdb.Error as exc:  # pragma: no cover - a file just written opens
                raise StoreError(f"cannot open an empty DuckDB warehouse: {_first_line(exc)}") from exc
        return cls(con, read_only=True)

    def sibling(self) -> Warehouse:
        """Another connection to this open database (its own transactions): what a second open
        of a store in the same process uses, since DuckDB lets one process attach a file once."""
        con = self._con.cursor()
        if not self.read_only:
            con.execute("USE warehouse")
        return Warehouse(con, read_only=self.read_only, statements=self._statements)

    @property
    def statements(self) -> int:
        """How many statements this database has run through this process's connections: while
        it has not moved, nothing was written here (what a cache of derived data checks)."""
        return self._statements[0]

    def close(self) -> None:
        """Close the connection (idempotent), and remove what it spilled."""
        self._con.close()
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)
            self._spill = None

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the API

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run one SQL statement and return its rows.

        Parameters
        ----------
        sql
            One statement; ``$name`` placeholders take values from ``params``.
        params
            Values of the placeholders.

        Returns
        -------
        Result
            The rows (no columns for a statement that returns none).

        Raises
        ------
        QueryError
            DuckDB refuses the statement (the message is DuckDB's first line).
        """
        self._statements[0] += 1
        try:
            rel = self._con.sql(sql, params=dict(params) if params else None)
            table = rel.to_arrow_table() if rel is not None else pa.table({})
        except self._error as exc:
            why = _first_line(exc)
            if self.read_only and why.startswith("Out of Memory"):
                why += f" ({BUDGET_ENV_VAR} sets read-only SQL's memory limit)"
            raise QueryError(f"SQL error: {why} (query: {sql!r})") from exc
        return Result(table, sql)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run one SQL statement for its effect (DDL, INSERT, DELETE, SET, ...).

        Raises
        ------
        StoreError
            DuckDB refuses the statement (the message is DuckDB's first line).
        """
        self._statements[0] += 1
        try:
            self._con.execute(sql, dict(params) if params else None)
        except self._error as exc:
            raise StoreError(f"SQL error: {_first_line(exc)} (statement: {_short(sql)!r})") from exc

    def append(self, table: str, rows: pa.Table) -> None:
        """Insert Arrow rows into ``table``, matching columns by name.

        ``rows`` may carry a subset of the table's columns (the others get their
        defaults); an empty ``rows`` writes nothing.

        Raises
        ------
        StoreError
            DuckDB refuses the rows (unknown column, type, constraint).

        Notes
        -----
        O(rows), one vectorised INSERT ... SELECT from the Arrow table.
        """
        if rows.num_rows == 0:
            return
        cols = ", ".join(_ident(c) for c in rows.column_names)
        with self.registered(_etstore_incoming=rows):
            self.execute(f"INSERT INTO {_ident(table)} ({cols}) SELECT {cols} FROM _etstore_incoming")

    def next_id(self, table: str, column: str) -> int:
        """One more than the largest ``column`` in ``table`` (1 for an empty table).

        Raises
        ------
        QueryError
            The table or column does not exist.
        """
        return int(self.query(f"SELECT coalesce(max({_ident(column)}), 0) + 1 FROM {_ident(table)}").scalar())

    def unused_name(self, table: str, wanted: str, *, explicit: bool, clash: str) -> str:
        """A name for a new row of ``table`` (a ``name`` column): ``wanted`` when no row holds
        it, else, for a default name, the first free ``wanted-2``, ``wanted-3``, ... as for
        traces (:func:`etstore.store._identity.choose_name`).

        Raises
        ------
        StoreError
            ``clash``, when ``explicit`` and a row already holds ``wanted``.
        """
        taken = self.query(
            f"SELECT name FROM {_ident(table)} WHERE name = $n OR name LIKE $p",
            {"n": wanted, "p": f"{wanted}-%"},
        ).to_arrow()["name"]
        held = {str(n): 0 for n in taken.to_pylist()}
        try:
            return choose_name(held, wanted, explicit=explicit, trace_id=None)[0]
        except StoreError as exc:
            raise StoreError(clash) from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block in one DuckDB transaction: COMMIT at the end, ROLLBACK on any exception.

        A block nested in another ``transaction()`` joins the outer transaction
        (it commits or rolls back with it).

        Raises
        ------
        StoreError
            DuckDB cannot begin or commit (the changes are rolled back).
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.execute("BEGIN TRANSACTION")
        self._depth = 1
        try:
            yield
            self.execute("COMMIT")
            self._ensured |= self._pending
        except BaseException:
            with suppress(self._error):  # a failed COMMIT has already ended it
                self._con.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0
            self._pending.clear()

    @contextmanager
    def registered(self, **tables: pa.Table) -> Iterator[None]:
        """Make Arrow tables queryable as views named by the keywords, for the block only.

        Notes
        -----
        Zero-copy: DuckDB scans the Arrow buffers in place.
        """
        done: list[str] = []
        try:
            for name, table in tables.items():
                self._con.register(name, table)
                done.append(name)
            yield
        finally:
            for name in done:
                # a statement that failed in a transaction aborts it, and DuckDB then refuses the
                # unregistering too; the rollback drops the view anyway, and the first error is the one to say
                with suppress(self._error):
                    self._con.unregister(name)

    # ------------------------------------------------------------ schema

    def create_schema(
        self, *, legacy: pa.Table | Literal["discard"] | None = None, refresh: bool = True
    ) -> None:
        """Create the store's tables (if absent) and views, and every declared table set, in one
        transaction.

        Idempotent; views are replaced so a database written by an older etstore gains
        the views (and their newer columns). Trace tables of store format 1 (``ops`` ... keyed
        by trace name) are re-keyed by content in the same transaction, as ``legacy`` says
        (see :meth:`open`).

        Parameters
        ----------
        legacy
            What to do with trace tables of store format 1 (:meth:`open`).
        refresh
            Apply every declared set (:mod:`etstore.store.tables`), each module imported; with
            False, only the sets the database does not record yet: what a writable open does,
            so that it imports no feature once the store holds them all (each feature applies
            its own set again when it writes, :meth:`ensure`).

        Raises
        ------
        StoreError
            Trace tables of format 1 and no ``legacy`` instruction, a table set refuses the
            database (one a newer etstore wrote), or DuckDB refuses the DDL.
        """
        with self.transaction():
            if self._has_format1_tables():
                if legacy is None:
                    raise StoreError(
                        "the warehouse holds trace tables of store format 1; open the store "
                        "writable to upgrade it"
                    )
                self._upgrade_format1(legacy)
            for ddl in (*TRACE_DDL, *CATALOG_DDL, TABLE_SETS_DDL):
                self.execute(ddl)
            # names stored before format 3 have no creation time here (the catalog held it)
            self.execute("ALTER TABLE traces ADD COLUMN IF NOT EXISTS created TIMESTAMP")
            own = self._base_tables()  # a database that is not a store may have its own ops table
            for view, ddl in TRACE_VIEWS.items():
                if view not in own:
                    self.execute(ddl)
            held = self._held_sets()
            done: set[str] = set()
            for name in declared():
                if refresh or name not in held:
                    self._apply(table_set(name), held, done)

    def ensure(self, tables: TableSet) -> None:
        """Apply ``tables`` (and create the sets it requires, where absent) unless this
        connection already did: what a feature calls before it writes its tables.

        The first call per connection runs the set's statements (idempotent: tables created
        where absent, its ``upgrade``, views re-created) and records the set; later calls cost
        nothing. Inside a :meth:`transaction` it joins it (rolled back with it). A read-only
        warehouse is left as it is (the feature's write is refused as any other).

        Raises
        ------
        StoreError
            The set's ``upgrade`` refuses the database (a newer etstore's), or DuckDB refuses
            the DDL; nothing of it stays.
        """
        if self.read_only or tables.name in self._ensured or tables.name in self._pending:
            return
        with self.transaction():
            self.execute(TABLE_SETS_DDL)
            self._apply(tables, self._held_sets(), set())

    def _held_sets(self) -> set[str]:
        """The table sets this database records (``etstore_table_sets``)."""
        return {str(r[0]) for r in self.query("SELECT name FROM etstore_table_sets")}

    def _apply(self, tables: TableSet, held: set[str], done: set[str]) -> None:
        """Run one set's statements and record it (inside the caller's transaction), after
        creating the sets it requires that ``held`` lacks; ``done``: sets applied in this call."""
        if tables.name in done:
            return
        done.add(tables.name)
        for name in tables.requires:
            if name not in held:
                self._apply(table_set(name), held, done)
        for ddl in tables.tables.values():
            self.execute(ddl)
        if tables.upgrade is not None:
            tables.upgrade(self)
        for ddl in tables.views.values():
            self.execute(ddl)
        self.execute("INSERT OR IGNORE INTO etstore_table_sets VALUES ($n)", {"n": tables.name})
        held.add(tables.name)
        self._pending.add(tables.name)

    # ------------------------------------------------------------ store format 1

    def _base_tables(self) -> set[str]:
        rows = self.query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE'"
        ).to_arrow()
        return set(rows.column(0).to_pylist())

    def _has_format1_tables(self) -> bool:
        """Trace tables keyed by name: ``ops`` and a ``traces`` table without ``trace_id``."""
        if not {"ops", "traces"} <= self._base_tables():
            return False
        cols = self.query(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'traces' AND column_name = 'trace_id'"
        ).scalar()
        return not cols

    def _upgrade_format1(self, legacy: pa.Table | Literal["discard"]) -> None:
        """Re-key format-1 trace tables by content (inside the caller's transaction).

        Rows of names absent from ``legacy`` are dropped (they were not committed).
        O(rows): one copy of each table.
        """
        old = ("ops", "deps", "missing_deps", "meta", "messages", "lineage")
        if isinstance(legacy, str):
            for table in (*old, "traces"):
                self.execute(f"DROP TABLE IF EXISTS {table}")
            return
        with self.registered(_etstore_legacy=legacy):
            for table in old[:-1]:
                self.execute(
                    f"CREATE TABLE trace_{table} AS SELECT m.trace_id, x.* EXCLUDE (trace) "
                    f"FROM {table} x JOIN _etstore_legacy m ON m.name = x.trace"
                )
            self.execute(
                "CREATE TABLE trace_lineage AS SELECT m.trace_id, p.trace_id AS parent_trace_id, l.rank, "
                "l.id, l.parent_id, l.parent_uid, l.uid FROM lineage l "
                "JOIN _etstore_legacy m ON m.name = l.trace JOIN _etstore_legacy p ON p.name = l.parent_trace"
            )
            self.execute(TRACE_DDL[-1].replace("EXISTS traces (", "EXISTS traces_format2 ("))
            self.execute(
                "INSERT INTO traces_format2 SELECT t.name, t.kind, t.ranks, t.ops, t.deps, t.missing, "
                "t.messages, t.parent, t.source, t.params, m.content_hash, m.trace_id, m.parent_trace_id, "
                "NULL "
                "FROM traces t JOIN _etstore_legacy m ON m.name = t.name"
            )
        for table in (*old, "traces"):
            self.execute(f"DROP TABLE {table}")
        self.execute("ALTER TABLE traces_format2 RENAME TO traces")


def _short(sql: str, limit: int = 200) -> str:
    """``sql`` on one line, cut to ``limit`` characters (error messages)."""
    text = " ".join(sql.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
