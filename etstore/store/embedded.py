"""The embedded default store: one directory whose one truth is a DuckDB file.

Layout of the directory::

    warehouse.duckdb   the store: contents and names (:mod:`etstore.store.catalog`), each
                       content's rows once by trace id (trace_ops, trace_deps, ...), the
                       views by name (ops, deps, ...), the format version, every other
                       table (runs, metrics, opportunities, ...) and the graph index's
                       watermark
    graph              Ladybug database, a derived index for Cypher: (:Trace) per name,
                       (:Op)-[:DEP|MSG]->(:Op), (:Op)-[:BECOMES]->(:Op), (:TunerStep);
                       built from the warehouse when a query needs it
                       (:mod:`etstore.store._graph_index`)
    listing.json       what ``etstore ls`` reads without opening DuckDB (derived)
    lock, journal.json the lock of readers and the writer; what the writer is doing

An ingest, a naming and a removal each commit in one DuckDB transaction (a streamed ingest
commits its parts under a content no name points at yet, swept if it never gets one), so
a failure or an interrupt leaves the store as it was. Content is stored once; a name is a
handle on it (``docs/store.md``). A store of an older format is upgraded in place by the
first writable open (:mod:`etstore.store._format`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import time
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace, TraceKind
from etstore.store import _streamed as streamed
from etstore.store import _trace_rows as rows
from etstore.store import _writes as writes
from etstore.store._cypher import check_parameters
from etstore.store._format import check_format, start_format, upgrade
from etstore.store._graph_index import build, plan
from etstore.store._graph_reader import SandboxedGraph
from etstore.store._identity import choose_name, identity, may_be_stored
from etstore.store._journal import JournalEntry
from etstore.store._ladybug import LadybugGraph, first_line
from etstore.store._location import check_store_directory
from etstore.store._lock import WaitFn
from etstore.store._session import Session
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.catalog import Catalog, ContentRecord, NameRecord
from etstore.store.listing import LISTING, write_listing
from etstore.store.result import Result
from etstore.store.schema import DEPS_COLUMNS, OPS_COLUMNS
from etstore.store.warehouse import Warehouse

__all__ = ["EmbeddedStore"]

log = logging.getLogger(__name__)


class EmbeddedStore:
    """A store in one directory: DuckDB holds it, Ladybug indexes it (see the module docstring).

    Parameters
    ----------
    path
        The store directory (created if absent).
    read_only
        Open for reading: several readers share the store; writers wait for them.
    wait_s
        How long to wait for another process holding the store, in seconds (default
        ``$ETSTORE_WAIT``, else 300; :mod:`etstore.store._lock`).
    notify
        Called with one line when the open has to wait for another process, or recovers
        what an interrupted writer left (default: a log warning).
    purpose
        What this open is for (e.g. ``"ingest"``), shown to the processes that wait for it.

    Raises
    ------
    StoreError
        The path is not a store directory, the store was written by a newer etstore, it
        is of an older format and opened read-only (the message says how to upgrade), or
        another process held it for longer than ``wait_s``.

    Notes
    -----
    A writer holds the store alone; readers share it (``docs/reliability.md``). Whatever an
    interrupted writer left is swept by the next open, a read-only one included, before it
    reads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        wait_s: float | None = None,
        notify: WaitFn | None = None,
        purpose: str = "",
    ) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.read_only = read_only
        self.index_progress: ProgressFn | None = None
        """Told how a build of the graph index goes, when a Cypher query has to wait for one."""
        # the warehouse and its statement count when the graph index was last found fresh
        self._fresh_at: tuple[int, int] | None = None
        check_store_directory(self.path)  # a store is made only where there is none, or nothing
        creating = read_only and not any(
            (self.path / f).exists() for f in ("warehouse.duckdb", "catalog.sqlite")
        )
        if creating:
            read_only = False  # a fresh store: create it as its writer, then read it as a reader
        self.path.mkdir(parents=True, exist_ok=True)
        self._read_only_engines = self.read_only and read_only
        self._warehouse: Warehouse | None = None
        self._graph = LadybugGraph(
            self.path / "graph", read_only=self.read_only, engines_read_only=self._read_only_engines
        )
        self.session = Session(
            self.path,
            write=not self._read_only_engines,
            purpose=purpose,
            wait_s=wait_s,
            notify=notify if notify is not None else log.warning,
        )
        try:
            self.recovered = self.session.recover(self._roll_back)
            """What this open rolled back or finished for writers that were interrupted."""
            self.session.start_writing()
            self._open_format(read_only=self._read_only_engines)
            if not self._read_only_engines:
                self._sweep()
            if creating:  # nothing more to write: share the store with other readers from now on
                self._write_listing()
                self._close_engines()
                self.session.become_reader()
                self._read_only_engines = self._graph.engines_read_only = True
        except BaseException:
            self.close()
            raise
        _open_stores.add(self)

    # ------------------------------------------------------------ engines

    @property
    def warehouse(self) -> Warehouse:
        """The DuckDB warehouse: the store (opened on first use)."""
        if self._warehouse is None:
            path = self.path / "warehouse.duckdb"
            if (shared := self._shared_warehouse()) is not None:
                self._warehouse = shared
            elif self._read_only_engines and not path.exists():
                self._warehouse = Warehouse.empty_read_only()  # nothing stored yet
            else:
                self._warehouse = Warehouse.open(path, read_only=self._read_only_engines)
        return self._warehouse

    def _shared_warehouse(self) -> Warehouse | None:
        """The warehouse of this process's earlier open of this store, as a second connection
        (None when this open is the first: it holds the lock, :class:`Session`)."""
        if self.session.owner:
            return None
        for other in list(_open_stores):
            if other is not self and other.session.owner and other.path.resolve() == self.path.resolve():
                return other.warehouse.sibling()
        return None

    @property
    def catalog(self) -> Catalog:
        """The contents and names, in the warehouse."""
        return Catalog(self.warehouse)

    @property
    def graph(self) -> Any:
        """The Ladybug connection of the graph index, as it is (:meth:`index` brings it up to date)."""
        return self._graph.open()

    def _open_format(self, *, read_only: bool) -> None:
        """Check the format; upgrade an older one in place (writable opens only). A second open
        in this process shares the first's warehouse, which the first open checked."""
        if not self.session.owner:
            return
        wh = self.warehouse if read_only else None
        if check_format(self.path, wh, self.location, read_only=read_only):
            self._close_engines()
            self._warehouse = upgrade(self.path, self.location)
        if not read_only:
            start_format(self.path, self.warehouse)

    def close(self) -> None:
        """Close the engines, then (the writer) leave the listing, remove the journal and unlock
        (idempotent).

        A store never closed is closed when it is garbage-collected or, still open, when the
        interpreter exits: a writer's lock and journal never outlive its handle.
        """
        session: Session | None = getattr(self, "session", None)  # absent if the open failed early
        if session is not None and not session.closed and session.entry is not None:
            try:
                self._write_listing()
            except Exception:  # derived: without it ``ls`` opens the store; a stale one would lie
                with contextlib.suppress(OSError):
                    (self.path / LISTING).unlink(missing_ok=True)
        self._close_engines()
        if session is not None:
            session.close()
        _open_stores.discard(self)

    def _write_listing(self) -> None:
        if self._warehouse is not None and not self._warehouse.read_only:
            write_listing(self.path, self.traces())

    def __del__(self) -> None:
        """A handle dropped without :meth:`close`: close it (engines, journal, lock)."""
        with contextlib.suppress(Exception):
            self.close()

    def _close_engines(self) -> None:
        self._fresh_at = None
        warehouse: Warehouse | None = getattr(self, "_warehouse", None)  # absent if the open failed early
        if warehouse is not None:
            warehouse.close()
            self._warehouse = None
        graph: LadybugGraph | None = getattr(self, "_graph", None)
        if graph is not None:
            graph.release()

    def __enter__(self) -> EmbeddedStore:
        """The store itself; leaving the block closes it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # ------------------------------------------------------------ recovery

    def _roll_back(self, entry: JournalEntry) -> None:
        """Sweep what an interrupted writer left (DuckDB rolled back its open transaction) and
        checkpoint, so that read-only opens need nothing; a removal it journaled is noted."""
        flags = self._read_only_engines
        self._read_only_engines = False  # writable for the time it takes
        try:
            self._open_format(read_only=False)
            if entry.op == "remove":  # the journal is a removal's commit point
                self._drop(entry.name)
                self.session.journal.note_removed(entry.name)
            self._sweep()
            self.warehouse.execute("CHECKPOINT")
            self._write_listing()
        finally:
            self._close_engines()
            self._read_only_engines = flags

    def _sweep(self) -> None:
        """Remove the contents an interrupted writer left (loading, or without a name)."""
        stale = self.catalog.stale()
        for trace_id in stale:
            log.info("removing incomplete trace id %d left by an interrupted ingest or removal", trace_id)
            with self.warehouse.transaction():
                self.catalog.delete_content(trace_id)

    # ------------------------------------------------------------ catalog

    def traces(self) -> list[TraceInfo]:
        return [n.info(c) for n, c in self.catalog.names()]

    def _lookup(self, name: str) -> tuple[NameRecord, ContentRecord]:
        got = self.catalog.name(name)
        if got is None:
            known = sorted(self.catalog.all_names())
            hint = f"; stored traces: {', '.join(known[:10])}" if known else "; the store is empty"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return got

    def info(self, name: str) -> TraceInfo:
        return NameRecord.info(*self._lookup(name))

    def removed_names(self) -> list[str]:
        """Names removed lately and not stored again (the last 100), whether their removal
        finished in its own process or, interrupted, in a later open."""
        names = self.catalog.all_names()
        return [n for n in self.session.journal.removed() if n not in names]

    def finished_removals(self) -> set[str]:
        """Names whose interrupted removal this open finished (from the journal it found)."""
        return {e.name for e in self.recovered if e.op == "remove"}

    # ------------------------------------------------------------ ingest

    def _writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")

    def ingest(
        self,
        trace: Trace,
        *,
        name: str | None = None,
        parent: str | None = None,
        lineage: pa.Table | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """See :meth:`Store.ingest <etstore.store.base.Store.ingest>`."""
        self._writable()
        kind = checked_kind(trace)
        if lineage is not None and parent is None:
            raise StoreError(f"trace {name or trace.name!r}: lineage given without a parent trace")
        parent_id = self._lookup(parent)[1].trace_id if parent is not None else None
        started = time.perf_counter()
        catalog = self.catalog
        # Content with other counts cannot be the same content (identity covers every row):
        # then the identity is computed beside the write instead of before it.
        digest = identity(trace) if may_be_stored(trace, catalog.contents()) else ""
        existing = catalog.by_identity(digest, kind.value) if digest else None
        final, same = choose_name(
            catalog.name_ids(),
            name or trace.name,
            explicit=name is not None,
            trace_id=existing.trace_id if existing else None,
        )
        name_rec = NameRecord.new(final, trace.source, trace.params, parent, parent_id)
        if existing is not None:
            return self._name_known(existing, name_rec, same, trace, lineage, started)
        self.session.doing("ingest", final)
        rec = ContentRecord(content_hash=digest, kind=kind.value, ranks=trace.num_ranks)
        cycles, unmatched_sends, unmatched_recvs = writes.write_content(
            self.warehouse, trace, rec, name_rec, lineage, progress
        )
        if progress:
            progress("warehouse", trace.num_ops, trace.num_ops)
        self.session.done()
        return IngestReport(
            name_rec.info(rec),
            created=True,
            cycles=cycles,
            unmatched_sends=unmatched_sends,
            unmatched_recvs=unmatched_recvs,
            seconds=time.perf_counter() - started,
        )

    def ingest_parts(
        self,
        parts: Iterable[Trace],
        *,
        name: str | None = None,
        ops: int | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """See :meth:`Store.ingest_parts <etstore.store.base.Store.ingest_parts>`."""
        self._writable()
        started = time.perf_counter()
        first, whole, parts = streamed.first_part(parts, f"trace {name!r}" if name else "a streamed trace")
        if whole is not None:  # one part is a whole trace
            return self.ingest(whole, name=name, progress=progress)
        kind = checked_kind(first)
        catalog, wh = self.catalog, self.warehouse
        # a name already taken may name this very content: known only once every part is hashed
        taken = name is not None and catalog.name(name) is not None
        wanted = name or first.name
        final = (
            wanted
            if taken
            else choose_name(catalog.name_ids(), wanted, explicit=name is not None, trace_id=None)[0]
        )
        name_rec = NameRecord.new(final, first.source, first.params, None, None)
        self.session.doing("ingest", final)
        rec = ContentRecord(content_hash="", kind=kind.value)
        with wh.transaction():
            catalog.claim(rec)
        assert rec.trace_id is not None
        self.session.doing("ingest", final, rec.trace_id)
        staged, known = writes.write_parts(
            wh, first, parts, rec, name_rec, taken=taken, ops=ops, progress=progress
        )
        if known is not None:  # the same content is stored (these rows are gone): point the name at it
            self.session.done()
            final, same = choose_name(
                catalog.name_ids(), wanted, explicit=name is not None, trace_id=known.trace_id
            )
            name_rec.name = final
            return self._name_known(known, name_rec, same, first, None, started)
        self.session.done()
        return IngestReport(
            name_rec.info(rec),
            created=True,
            cycles=staged.cycles,
            unmatched_sends=staged.unmatched_sends,
            unmatched_recvs=staged.unmatched_recvs,
            seconds=time.perf_counter() - started,
        )

    def _name_known(
        self,
        existing: ContentRecord,
        name_rec: NameRecord,
        same: bool,
        trace: Trace,
        lineage: pa.Table | None,
        started: float,
    ) -> IngestReport:
        """Point ``name_rec`` at stored content (a no-op when it already does: ``same``); lineage
        from a parent content the content has none from yet comes with it, in one transaction."""
        assert existing.trace_id is not None
        if same:
            n, c = self._lookup(name_rec.name)
            return IngestReport(n.info(c), created=False, seconds=time.perf_counter() - started)
        wh = self.warehouse
        tid = existing.trace_id
        name_rec.trace_id = tid
        others = Catalog(wh).names_of(tid)
        self.session.doing("name", name_rec.name, tid)
        writes.add_name(wh, existing, name_rec, trace.params, lineage)
        self.session.done()
        first = others[0].name if others else None
        return IngestReport(
            name_rec.info(existing), created=True, same_as=first, seconds=time.perf_counter() - started
        )

    # ------------------------------------------------------------ removal

    def remove(self, name: str, *, progress: ProgressFn | None = None) -> None:
        """Remove the name ``name``, and its content when no other name points at it.

        The journal entry is the commit point (an interrupted removal is finished by the next
        open), then one DuckDB transaction; the graph index drops the content when it is next
        brought up to date. Raises UnknownTraceError (no such name) or StoreError (read-only).
        """
        self._writable()
        self._lookup(name)
        self.session.doing("remove", name)
        try:
            if progress is not None:
                progress("warehouse", 0, 1)
            self._drop(name)
            if progress is not None:
                progress("done", 1, 1)
        finally:
            self.session.done()

    def _drop(self, name: str) -> None:
        """Remove ``name`` (and its content with its last name) in one transaction; the
        journal names the removal first, so an interrupted one is finished by the next open."""
        if writes.drop_name(self.warehouse, name):
            self.session.removing(name)

    # ------------------------------------------------------------ read back

    def load(self, name: str) -> Trace:
        n, c = self._lookup(name)
        wh = self.warehouse
        p = {"t": c.trace_id}
        ops = rows.in_key_order(wh, f"SELECT uid, {OPS_COLUMNS} FROM trace_ops WHERE trace_id = $t", "uid", p)
        deps = rows.in_key_order(
            wh, f"SELECT edge, {DEPS_COLUMNS} FROM trace_deps WHERE trace_id = $t", "edge", p
        )
        missing = rows.in_key_order(
            wh, f"SELECT edge, {DEPS_COLUMNS} FROM trace_missing_deps WHERE trace_id = $t", "edge", p
        )
        ops, deps, missing = (
            ops.drop_columns(["uid"]),
            deps.drop_columns(["edge"]),
            missing.drop_columns(["edge"]),
        )
        meta = wh.query(
            "SELECT rank, metadata FROM trace_meta WHERE trace_id = $t ORDER BY rank", p
        ).to_arrow()
        return Trace(
            ops=ops.cast(OPS_SCHEMA),
            deps=deps.cast(DEPS_SCHEMA),
            missing=missing.cast(DEPS_SCHEMA),
            meta=meta.cast(META_SCHEMA),
            name=n.name,
            kind=TraceKind(c.kind).value,
            source=n.source,
            params=json.loads(n.params),
        )

    # ------------------------------------------------------------ queries

    def index(self, progress: ProgressFn | None = None) -> bool:
        """Bring the graph index up to date with the warehouse; True when it had to change.

        A read-only open becomes the store's writer for the time it takes (waiting for other
        readers, as a writer does), then a reader again.

        Raises
        ------
        StoreError
            The index is behind and cannot be built here (a read-only directory, a writer
            holding the store past the wait limit), or an engine refuses.
        """
        progress = progress or self.index_progress
        spool = self.path / "graph.spool"
        # Nothing but this process can write the store while it is open (the lock), so an
        # index found fresh stays fresh until this process runs another statement on it.
        if self._fresh_at is not None and self._fresh_at == (id(self.warehouse), self.warehouse.statements):
            return False
        if not self._read_only_engines:
            todo = plan(self.warehouse, self._graph.path)
            if todo:
                build(self.warehouse, self._graph, todo, spool, progress)
            self._fresh_at = (id(self.warehouse), self.warehouse.statements)
            return bool(todo)
        if not plan(self.warehouse, self._graph.path):
            self._fresh_at = (id(self.warehouse), self.warehouse.statements)
            return False
        self._close_engines()
        lock = self.session.lock
        try:
            lock.upgrade()
        except StoreError as exc:
            raise StoreError(
                f"the graph index of {self.location} is behind the store and cannot be built: {exc}"
            ) from exc
        try:
            try:
                wh = Warehouse.open(self.path / "warehouse.duckdb")
            except StoreError as exc:  # a full disk, say
                raise StoreError(
                    f"the graph index of {self.location} is behind the store and cannot be built "
                    f"(nothing was changed): {exc}"
                ) from exc
            graph = LadybugGraph(self._graph.path, read_only=False, engines_read_only=False)
            try:
                todo = plan(wh, graph.path)  # another reader may have built it meanwhile
                if todo:
                    build(wh, graph, todo, spool, progress)
            finally:
                graph.release()
                wh.close()
        finally:
            lock.downgrade()
        return True

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the graph index (``Trace``, ``Op``, ``TunerStep`` nodes; ``DEP``, ``MSG``,
        ``BECOMES`` edges), brought up to date with the warehouse first (:meth:`index`).

        A ``$parameter`` without a value is refused. On a read-only store the query cannot
        write or read files (``COPY ... TO``, ``EXPORT DATABASE``, ``LOAD FROM``): it runs in
        a process the kernel sandboxes.
        """
        check_parameters(query, params)
        self.index()
        graph = self.graph
        try:
            if isinstance(graph, SandboxedGraph):  # a read-only store (see LadybugGraph.open)
                got = graph.query(query, params)
                return Result(pa.table({}) if got is None else got, query)
            res = graph.execute(query, dict(params or {}))
            if not res.get_column_names():
                return Result(pa.table({}), query)
            # chunk size 0: one chunk of exactly the result's rows. The default sizes
            # its buffers for millions of rows, which costs ~1 ms on every small query.
            table = res.get_as_arrow(0)
        except (RuntimeError, QueryError) as exc:
            raise QueryError(f"Cypher error: {first_line(exc)} (query: {query!r})") from exc
        return Result(table, query)

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on DuckDB (views ``ops``, ``deps``, ``missing_deps``, ``messages``, ``meta``,
        ``lineage`` by trace name, table ``traces`` and the simulator's metrics).

        On a read-only store the query cannot write or read files: the warehouse is open
        read-only with DuckDB's external access off (:meth:`Warehouse.open`)."""
        warehouse = self.warehouse
        if self.read_only and not warehouse.read_only:  # created by this open: schema in, now lock it
            warehouse.close()
            self._warehouse = warehouse = Warehouse.open(self.path / "warehouse.duckdb", read_only=True)
        return warehouse.query(query, params)


_open_stores: weakref.WeakSet[EmbeddedStore] = weakref.WeakSet()
"""The stores of this process not closed yet (closed at exit: :func:`_close_at_exit`)."""


@atexit.register
def _close_at_exit() -> None:
    """Close the stores left open when the interpreter exits, so that the next command finds no
    journal to recover from. (``os._exit`` skips this on purpose: the CLI's Ctrl-C during a
    write leaves the journal for the next command to roll back.)"""
    for store in list(_open_stores):
        with contextlib.suppress(Exception):
            store.close()


_satisfies_store: type[Store] = EmbeddedStore  # mypy checks the backend against the interface
