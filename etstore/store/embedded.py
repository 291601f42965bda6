"""The embedded default store: one directory holding Ladybug, DuckDB and the catalog.

Layout of the directory::

    catalog.sqlite     contents, the names pointing at them, the format version
                       (SQLite, :mod:`etstore.store.catalog`); the commit point of
                       every ingest and removal
    warehouse.duckdb   trace_ops, trace_deps, ... (each content once, by trace id),
                       traces (one row per name), the views ops, deps, ... by name
                       (+ sim metrics)
    graph/             Ladybug database: (:Op)-[:DEP]->(:Op), (:Op)-[:MSG]->(:Op),
                       (:Op)-[:BECOMES]->(:Op) from a parent trace's op to its replacements

Content is stored once; a name is a handle on it (``docs/store.md``). DuckDB is the
lossless source (export reads it); Ladybug holds the graph projection for Cypher,
each content once, its ops carrying one of its names in ``trace`` (other names are
resolved to it in queries, :mod:`etstore.store._cypher`). An ingest of new content
writes catalog(loading) → DuckDB (one transaction) beside Ladybug (bulk COPY) →
catalog(ready + name), its identity computed beside the load when no stored content has
its kind and counts (``docs/store.md``, "Ingest speed"); any failure or interrupt undoes
what landed, and content left ``loading`` or without a name is swept at the next
writable open. Known content under a new name writes only the name (and lineage from a
new parent, if any).

A store written before names existed (format 1) is upgraded in place by the first
writable open; a read-only open of one says how to upgrade it.
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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.dag import cycle_members
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace, TraceKind
from etstore.store import _streamed as streamed
from etstore.store import _trace_rows as rows
from etstore.store._copy import copy_arrow
from etstore.store._cypher import check_parameters, resolve_names
from etstore.store._format import check_format, upgrade_format1
from etstore.store._graph_purge import Step, discard_rebuild, remove_range, warehouse_rows
from etstore.store._graph_reader import SandboxedGraph
from etstore.store._identity import choose_name, identity, may_be_stored
from etstore.store._journal import JournalEntry
from etstore.store._ladybug import LadybugGraph, buffer_pool_bytes, first_line
from etstore.store._lock import WaitFn
from etstore.store._session import Session
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.catalog import Catalog, ContentRecord, NameRecord
from etstore.store.graph import (
    GRAPH_OP_COLUMNS,
    UID_SHIFT,
    dep_edges,
    graph_ddl,
    lineage_edges,
    message_edges,
    op_nodes,
    uid_base,
)
from etstore.store.listing import catalog_traces
from etstore.store.result import Result
from etstore.store.schema import DEPS_COLUMNS, OPS_COLUMNS
from etstore.store.warehouse import Warehouse

__all__ = ["EmbeddedStore"]

log = logging.getLogger(__name__)


_PURGE_STEPS = 7  # stages a removal reports: warehouse, then the graph's (see _graph_purge)


class EmbeddedStore:
    """Ladybug + DuckDB + catalog in one directory (see the module docstring).

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
        The path is not a store directory, the store was written by a newer etstore,
        it is of format 1 and opened read-only (the message says how to upgrade), or
        another process held it for longer than ``wait_s``.

    Notes
    -----
    A writer holds the store alone; readers share it (``docs/reliability.md``). Whatever
    an interrupted writer left (its journal, :mod:`etstore.store._journal`) is rolled
    back or finished by the next open, a read-only one included, before it reads.
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
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path}: exists and is not a store directory")
        creating = read_only and not (self.path / "catalog.sqlite").exists()
        if creating:
            read_only = False  # a fresh store: create it as its writer, then read it as a reader
        self.path.mkdir(parents=True, exist_ok=True)
        self._read_only_engines = self.read_only and read_only
        self._warehouse: Warehouse | None = None
        self._graph = LadybugGraph(
            self.path / "graph", read_only=self.read_only, engines_read_only=self._read_only_engines
        )
        self._aliases: tuple[tuple[int, ...], dict[str, str]] | None = None
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
            self.catalog = Catalog(self.path / "catalog.sqlite", create=not self._read_only_engines)
            if check_format(self.catalog, self.location, read_only=self._read_only_engines):
                self._warehouse = upgrade_format1(self.catalog, self.path / "warehouse.duckdb", self.location)
            if not self.read_only:
                self._sweep()
            if creating:  # nothing more to write: share the store with other readers from now on
                self.session.become_reader()
                self._read_only_engines = self._graph.engines_read_only = True
        except BaseException:
            self.close()
            raise
        _open_stores.add(self)

    # ------------------------------------------------------------ engines

    @property
    def warehouse(self) -> Warehouse:
        """The DuckDB warehouse (opened on first use; a writable store creates its schema)."""
        if self._warehouse is None:
            path = self.path / "warehouse.duckdb"
            if self._read_only_engines and not path.exists():
                self._warehouse = Warehouse.empty_read_only()  # nothing stored yet
            else:
                self._warehouse = Warehouse.open(path, read_only=self._read_only_engines)
        return self._warehouse

    @property
    def graph(self) -> Any:
        """The Ladybug connection (opened on first use)."""
        return self._graph.open()

    def close(self) -> None:
        """Close the engines, then (the writer) remove the journal and unlock (idempotent).

        A store never closed is closed when it is garbage-collected or, still open, when the
        interpreter exits: a writer's lock and journal never outlive its handle.
        """
        self._close_engines()
        session: Session | None = getattr(self, "session", None)  # absent if the open failed early
        if session is not None:
            session.close()
        _open_stores.discard(self)

    def __del__(self) -> None:
        """A handle dropped without :meth:`close`: close it (engines, journal, lock)."""
        with contextlib.suppress(Exception):
            self.close()

    def _close_engines(self) -> None:
        warehouse: Warehouse | None = getattr(self, "_warehouse", None)  # absent if the open failed early
        if warehouse is not None:
            warehouse.close()
            self._warehouse = None
        graph: LadybugGraph | None = getattr(self, "_graph", None)
        if graph is not None:
            graph.release()
        catalog: Catalog | None = getattr(self, "catalog", None)  # absent if the open failed early
        if catalog is not None:
            catalog.close()

    # ------------------------------------------------------------ journal and recovery

    def _roll_back(self, entry: JournalEntry) -> None:
        """Open the engines writable and make them agree with the catalog: an unfinished
        ingest goes, an unfinished removal completes (the journal is a removal's commit
        point), and Ladybug and DuckDB replay their logs so read-only opens need nothing."""
        flags = (self.read_only, self._read_only_engines)
        self.read_only = self._read_only_engines = False  # writable for the time it takes
        self._graph.read_only = self._graph.engines_read_only = False
        discard_rebuild(self.path / "graph.rebuild")  # a removal's copy cut short; the graph is intact
        try:
            self.catalog = Catalog(self.path / "catalog.sqlite", create=True)
            if check_format(self.catalog, self.location, read_only=False):
                self._warehouse = upgrade_format1(self.catalog, self.path / "warehouse.duckdb", self.location)
            if entry.op == "remove" and self.catalog.name(entry.name) is not None:
                self.catalog.drop_name(entry.name)
            if entry.op == "remove":  # (also recorded by the removal itself, unless killed first)
                self.session.journal.note_removed(entry.name)
            self._sweep()
            if (self.path / "graph").exists():
                self.graph.execute("CHECKPOINT")  # replays and folds in the log of a killed writer
            if (self.path / "warehouse.duckdb").exists():
                self.warehouse.execute("CHECKPOINT")
        finally:
            self._close_engines()
            self.__dict__.pop("catalog", None)  # the open makes its own, read-only or not
            self.read_only, self._read_only_engines = flags
            self._graph.read_only, self._graph.engines_read_only = flags

    def __enter__(self) -> EmbeddedStore:
        """The store itself; leaving the block closes it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # ------------------------------------------------------------ catalog

    def traces(self) -> list[TraceInfo]:
        return catalog_traces(self.catalog)  # what ``etstore ls`` reads without the engines

    def _lookup(self, name: str) -> tuple[NameRecord, ContentRecord]:
        got = self.catalog.name(name)
        if got is None:
            known = [n.name for n, _ in self.catalog.names()]
            hint = f"; stored traces: {', '.join(sorted(known)[:10])}" if known else "; the store is empty"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return got

    def info(self, name: str) -> TraceInfo:
        return NameRecord.info(*self._lookup(name))

    # ------------------------------------------------------------ ingest

    def _choose_name(self, wanted: str, explicit: bool, seq: int | None) -> tuple[str, bool]:
        """The name to store under, and whether it already points at content ``seq``."""
        return choose_name(self.catalog.name_ids(), wanted, explicit=explicit, seq=seq)

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
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")
        kind = checked_kind(trace)
        if lineage is not None and parent is None:
            raise StoreError(f"trace {name or trace.name!r}: lineage given without a parent trace")
        parent_id = self._lookup(parent)[1].seq if parent is not None else None
        started = time.perf_counter()
        # Content with other counts cannot be the same content (identity covers every row):
        # then the identity is computed beside the graph load instead of before it.
        digest = identity(trace) if may_be_stored(trace, (c for _, c in self.catalog.names())) else ""
        existing = self.catalog.by_identity(digest, kind.value) if digest else None
        final, same = self._choose_name(
            name or trace.name, name is not None, existing.seq if existing else None
        )
        name_rec = NameRecord.new(final, trace.source, trace.params, parent, parent_id)
        if existing is not None:
            return self._name_known(existing, name_rec, same, trace, lineage, started)
        self.session.doing("ingest", final)
        rec = self.catalog.add_content(
            ContentRecord(content_hash=digest, kind=kind.value, ranks=trace.num_ranks, graph_name=final)
        )
        seq = rec.seq
        assert seq is not None  # the catalog assigned it
        name_rec.trace_id = seq
        self.session.doing("ingest", final, seq)
        try:
            rec, cycles, unmatched_sends, unmatched_recvs = self._write(
                trace, rec, name_rec, lineage, progress
            )
        except BaseException:
            self._purge(seq)
            raise
        finally:
            self._graph.release()
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
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")
        started = time.perf_counter()
        first, whole, parts = streamed.first_part(parts, f"trace {name!r}" if name else "a streamed trace")
        if whole is not None:  # one part is a whole trace
            return self.ingest(whole, name=name, progress=progress)
        kind = checked_kind(first)
        # a name already taken may name this very content: known only once every part is hashed
        taken = name is not None and self.catalog.name(name) is not None
        final = name if taken and name else self._choose_name(name or first.name, name is not None, None)[0]
        name_rec = NameRecord.new(final, first.source, first.params, None, None)
        self.session.doing("ingest", final)
        rec = self.catalog.add_content(
            ContentRecord(content_hash="", kind=kind.value, ranks=0, graph_name=final)
        )
        seq = rec.seq
        assert seq is not None
        name_rec.trace_id = seq
        self.session.doing("ingest", final, seq)
        spool, known = streamed.spool_dir(self.path, seq), None
        try:
            # each part's rows commit on their own (one transaction would hold them all in
            # memory); the content stays ``loading`` in the catalog, its rows out of every view
            # until its name row lands, and any failure purges them
            self._graph.open()  # the graph's own op columns
            with streamed.memory_limit(self.warehouse, "512MB"):  # else DuckDB caches up to 80% of RAM
                staged = streamed.stage_parts(
                    self.warehouse,
                    first,
                    parts,
                    seq=seq,
                    base=uid_base(seq),
                    name=final,
                    graph_columns=self._graph.columns,
                    spool=spool,
                    ops=ops,
                    progress=progress,
                )
            known = self.catalog.by_identity(staged.digest, kind.value)
            if known is None and taken:
                self._choose_name(final, True, None)  # raises: other content holds the name
            if known is None:
                for k, v in {**staged.counts(), "content_hash": staged.digest}.items():
                    setattr(rec, k, v)
                if progress:
                    progress("graph", 0, 1)
                with streamed.memory_limit(self.warehouse, "64MB"):  # DuckDB's cache makes room
                    streamed.load_spool(self._graph, spool)  # reopens it with a pool for these rows
                if progress:
                    progress("graph", 1, 1)
                with self.warehouse.transaction():
                    rows.insert_name(
                        self.warehouse, final, seq, None, self._warehouse_row(rec, name_rec, first.params)
                    )
                ready = self.catalog.commit_content(
                    seq, name_rec, content_hash=staged.digest, **staged.counts()
                )
        except BaseException:
            self._purge(seq)
            raise
        finally:
            streamed.discard_spool(spool)
            self._graph.release()
        if known is not None:  # the same content is stored: drop these rows, point the name at it
            self._purge(seq)
            self.session.done()
            final, same = self._choose_name(name or first.name, name is not None, known.seq)
            name_rec.name = final
            return self._name_known(known, name_rec, same, first, None, started)
        self._aliases = None
        self.session.done()
        return IngestReport(
            name_rec.info(ready),
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
        """Point ``name_rec`` at stored content (a no-op when it already does: ``same``)."""
        assert existing.seq is not None
        if same:
            n, c = self._lookup(name_rec.name)
            return IngestReport(n.info(c), created=False, seconds=time.perf_counter() - started)
        name_rec.trace_id = existing.seq
        others = self.catalog.names_of(existing.seq)
        self.session.doing("name", name_rec.name, existing.seq)
        info = self._add_name(name_rec, existing, trace, lineage)
        self.session.done()
        first = others[0].name if others else None
        return IngestReport(info, created=True, same_as=first, seconds=time.perf_counter() - started)

    def _warehouse_row(self, rec: ContentRecord, name: NameRecord, params: Any) -> dict[str, Any]:
        """The ``traces`` row of ``name`` (see :func:`etstore.store._trace_rows.insert_name`)."""
        return {
            **{k: getattr(rec, k) for k in ("kind", "ranks", "ops", "deps", "missing", "messages")},
            "parent": name.parent,
            "source": name.source,
            "params": params,
            "content_hash": rec.content_hash,
        }

    def _write(
        self,
        trace: Trace,
        rec: ContentRecord,
        name: NameRecord,
        lineage: pa.Table | None,
        progress: ProgressFn | None,
    ) -> tuple[ContentRecord, int, int, int]:
        """Write a claimed content to both engines and commit it with its first name; the
        caller purges on failure.

        Returns the ready content, the dependency cycles and the unmatched sends and receives.
        A content claimed without its identity (``rec.content_hash`` empty) gets it here.
        """
        seq = rec.seq
        assert seq is not None
        base = uid_base(seq)
        # Two lanes, one per core: this thread feeds Ladybug (nodes, edges, one checkpoint),
        # the longer of the two; one helper thread, fed in order, computes the edge rows and
        # the identity while Ladybug loads the nodes, then writes DuckDB while Ladybug loads
        # the edges (hashlib and both engines release the GIL in their bulk paths).
        with ThreadPoolExecutor(max_workers=1) as pool:
            g = self._graph.open(incoming=trace.ops.nbytes + trace.deps.nbytes)
            edge_rows = pool.submit(lambda: (dep_edges(trace, base), message_edges(trace, base)))
            hashed = pool.submit(identity, trace) if not rec.content_hash else None
            if progress:
                progress("graph nodes", 0, trace.num_ops)
            nodes = op_nodes(trace, name.name, base, self._graph.columns)  # the graph's own columns
            copy_arrow(g, "Op", nodes)
            if progress:
                progress("graph nodes", trace.num_ops, trace.num_ops)
            deps, (msgs, unmatched_sends, unmatched_recvs) = edge_rows.result()
            counts = {
                "ops": trace.num_ops,
                "deps": trace.num_deps,
                "missing": trace.num_missing,
                "messages": msgs.num_rows,
                "ranks": trace.num_ranks,
            }
            for k, v in counts.items():
                setattr(rec, k, v)
            links = lineage_rows = None
            if lineage is not None and lineage.num_rows and name.parent_trace_id is not None:
                links, lineage_rows = self._lineage_rows(lineage, nodes, name.name, name.parent_trace_id)
            row = self._warehouse_row(rec, name, trace.params)
            warehouse = pool.submit(
                self._write_warehouse, trace, seq, base, deps, msgs, name, row, lineage_rows, hashed
            )
            edges = deps.num_rows + msgs.num_rows
            try:
                if progress:
                    progress("graph edges", 0, edges)
                self._write_edges(deps, msgs, links)
                if progress:  # the warehouse has been written alongside: its ops are what is left
                    progress("graph edges", edges, edges)
                    progress("warehouse", 0, trace.num_ops)
            finally:
                warehouse.result()  # wait even when the graph failed, then raise either error
        if progress:
            progress("warehouse", trace.num_ops, trace.num_ops)
        # the edges as op rows, from the uids already computed
        op_pairs = (deps["from"].to_numpy() - base, deps["to"].to_numpy() - base)
        cycles = len(cycle_members(trace, op_pairs))
        digest = hashed.result() if hashed is not None else rec.content_hash
        ready = self.catalog.commit_content(seq, name, content_hash=digest, **counts)
        self._aliases = None
        return ready, cycles, unmatched_sends, unmatched_recvs

    def _write_warehouse(
        self,
        trace: Trace,
        seq: int,
        base: int,
        dep_uids: pa.Table,
        msgs: pa.Table,
        name: NameRecord,
        row: Mapping[str, Any],
        lineage: pa.Table | None,
        hashed: Future[str] | None,
    ) -> None:
        """Insert the content's rows and its first name in one DuckDB transaction (the
        helper thread of :meth:`_write`; ``hashed`` is the identity computed before on it)."""
        if hashed is not None:
            row = {**row, "content_hash": hashed.result()}
        wh = self.warehouse
        # one core for the warehouse while the graph's bulk load (the longer of the two) runs beside it
        wh.execute("SET threads TO 1")
        try:
            with wh.transaction():
                rows.insert_content(wh, trace, seq, base, dep_uids, msgs)
                rows.insert_name(wh, name.name, seq, name.parent_trace_id, row)
                if lineage is not None and name.parent_trace_id is not None:
                    rows.insert_lineage(wh, seq, name.parent_trace_id, lineage)
        finally:
            wh.execute("RESET threads")

    def _lineage_rows(
        self, lineage: pa.Table, nodes: pa.Table, name: str, parent_id: int
    ) -> tuple[pa.Table, pa.Table]:
        """``BECOMES`` edges and ``trace_lineage`` rows for a name derived from content ``parent_id``."""
        parent_ops = self.warehouse.query(
            "SELECT rank, id, uid FROM trace_ops WHERE trace_id = $p", {"p": parent_id}
        ).to_arrow()
        links = lineage_edges(lineage, nodes, parent_ops, what=f"trace {name!r}")
        table = pa.table(
            {
                "rank": lineage["rank"].cast(pa.int32()),
                "id": lineage["id"].cast(pa.uint64()),
                "parent_id": lineage["parent_id"].cast(pa.uint64()),
                "parent_uid": links["from"],
                "uid": links["to"],
            }
        )
        return links, table

    def _write_edges(self, deps: pa.Table, msgs: pa.Table, links: pa.Table | None) -> None:
        """Load the edges (the nodes are in) and checkpoint the graph once for the whole ingest."""
        g = self.graph
        if deps.num_rows:
            copy_arrow(g, "DEP", deps)
        if msgs.num_rows:
            copy_arrow(g, "MSG", msgs)
        if links is not None and links.num_rows:
            copy_arrow(g, "BECOMES", links.select(["from", "to"]))
        g.execute("CHECKPOINT")

    def _add_name(
        self, name: NameRecord, content: ContentRecord, trace: Trace, lineage: pa.Table | None
    ) -> TraceInfo:
        """Point a new name at stored content: its ``traces`` row, lineage from a parent
        content the content has none from yet, then the catalog row (the commit point)."""
        seq, pid = content.seq, name.parent_trace_id
        assert seq is not None
        links = lineage_rows = None
        if (
            lineage is not None
            and lineage.num_rows
            and pid is not None
            and not self.catalog.lineage_users(seq, pid)
        ):
            child = self.warehouse.query(
                "SELECT rank, id, uid FROM trace_ops WHERE trace_id = $t", {"t": seq}
            ).to_arrow()
            links, lineage_rows = self._lineage_rows(lineage, child, name.name, pid)
        wh = self.warehouse
        try:
            with wh.transaction():
                rows.insert_name(wh, name.name, seq, pid, self._warehouse_row(content, name, trace.params))
                if lineage_rows is not None and pid is not None:
                    rows.insert_lineage(wh, seq, pid, lineage_rows)
            if links is not None:
                self._write_edges(links.slice(0, 0), links.slice(0, 0), links)
            self.catalog.add_name(name)
        except BaseException:
            self._undo_name(name.name, seq, pid if links is not None else None)
            raise
        self._aliases = None
        return name.info(content)

    def _undo_name(self, name: str, seq: int, lineage_from: int | None) -> None:
        """Remove what :meth:`_add_name` wrote for ``name`` (the catalog row is the caller's)."""
        wh = self.warehouse
        with wh.transaction():
            rows.delete_name(wh, name)
            if lineage_from is not None:
                rows.delete_lineage(wh, seq, lineage_from)
        if lineage_from is not None:
            self._delete_becomes(lineage_from, seq)

    def _delete_becomes(self, parent_id: int, seq: int) -> None:
        """Delete the ``BECOMES`` edges from content ``parent_id`` to content ``seq``."""
        lo, plo = uid_base(seq), uid_base(parent_id)
        self.graph.execute(
            "MATCH (a:Op)-[r:BECOMES]->(b:Op) WHERE a.uid >= $plo AND a.uid < $phi "
            "AND b.uid >= $lo AND b.uid < $hi DELETE r",
            {"plo": plo, "phi": plo + (1 << UID_SHIFT), "lo": lo, "hi": lo + (1 << UID_SHIFT)},
        )
        self.graph.execute("CHECKPOINT")

    # ------------------------------------------------------------ removal

    def _purge(self, seq: int, progress: ProgressFn | None = None) -> None:
        """Remove content ``seq`` from both engines, then from the catalog (with any name left)."""
        self.catalog.mark_deleting(seq)
        lo = uid_base(seq)
        done = [0]

        def step(stage: str) -> None:
            done[0] += 1
            if progress is not None:
                progress(stage, min(done[0], _PURGE_STEPS), _PURGE_STEPS)

        step("warehouse")
        wh = self.warehouse
        with wh.transaction():
            rows.delete_content(wh, seq)
        try:
            self._purge_graph(lo, lo + (1 << UID_SHIFT), last=self.catalog.content_count() == 1, step=step)
        except RuntimeError as exc:  # pragma: no cover - engine failure while cleaning up
            log.error("could not remove graph data of trace id %d: %s", seq, exc)
            raise StoreError(f"could not remove trace id {seq} from the graph: {first_line(exc)}") from exc
        streamed.discard_spool(streamed.spool_dir(self.path, seq))  # what a streamed ingest cut short left
        self.catalog.delete_content(seq)
        self._aliases = None
        if progress is not None:
            progress("done", _PURGE_STEPS, _PURGE_STEPS)

    def _purge_graph(self, lo: int, hi: int, *, last: bool, step: Step) -> None:
        """Delete the graph's ops with uids in ``[lo, hi)`` and every edge touching them.

        When no other content is stored, dropping and recreating the tables is instant
        (and safe to redo after a crash: the tables are recreated on the next open in any
        case); otherwise the faster of deleting in place and rebuilding without the range
        (:mod:`etstore.store._graph_purge`).
        """
        g = self.graph
        if last:
            step("graph")
            for table in ("BECOMES", "MSG", "DEP", "Op"):
                g.execute(f"DROP TABLE IF EXISTS {table}")
            for ddl in graph_ddl():
                g.execute(ddl)
            g.execute("CHECKPOINT")
            self._graph.columns = GRAPH_OP_COLUMNS
            return
        graph, seq = self.path / "graph", lo >> UID_SHIFT
        keep = {n.trace_id: c.graph_name for n, c in self.catalog.names() if n.trace_id != seq}
        source = warehouse_rows(self.warehouse, keep)  # DuckDB reads the kept rows faster than Ladybug
        pool = buffer_pool_bytes(graph, 0)
        remove_range(g, graph, lo, hi, step, pool=pool, release=self._graph.release, source=source)

    def _rename_graph(self, seq: int, name: str) -> None:
        """Make content ``seq``'s graph nodes carry ``name`` (its old one was removed)."""
        lo = uid_base(seq)
        self.graph.execute(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi SET o.trace = $n",
            {"lo": lo, "hi": lo + (1 << UID_SHIFT), "n": name},
        )
        self.graph.execute("CHECKPOINT")
        self.catalog.set_graph_name(seq, name)
        self._aliases = None

    def _sweep(self) -> None:
        """Finish what an interrupted ingest or removal left: contents not ready or without a
        name, ``traces`` rows of names the catalog does not have, graphs under a removed name."""
        stale = self.catalog.stale()
        for rec in stale:
            assert rec.seq is not None
            log.info("removing incomplete trace id %d left by an interrupted ingest or removal", rec.seq)
            self._purge(rec.seq)
        for rec in self.catalog.misnamed_graphs():
            assert rec.seq is not None
            self._rename_graph(rec.seq, self.catalog.names_of(rec.seq)[0].name)
        # a removal cut short after its commit point leaves the name's traces row behind
        if (self.path / "warehouse.duckdb").exists():
            names = pa.table({"name": pa.array(sorted(self.catalog.all_names()), pa.string())})
            wh = self.warehouse
            gone = "FROM traces WHERE name NOT IN (SELECT name FROM _etstore_names)"
            with wh.registered(_etstore_names=names):
                if wh.query(f"SELECT count(*) {gone}").scalar():
                    with wh.transaction():
                        wh.execute(f"DELETE {gone}")

    def remove(self, name: str, *, progress: ProgressFn | None = None) -> None:
        """Remove the name ``name``, and its content when no other name points at it.

        ``progress(stage, done, total)`` is called as the content's rows go. The journal
        entry is the commit point: an interrupted removal is finished by the next open.
        Raises UnknownTraceError (no such name) or StoreError (read-only); costs in
        :mod:`etstore.store._graph_purge`.
        """
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")
        self._lookup(name)
        self.session.doing("remove", name)
        self.session.removing(name)
        try:
            self._remove(name, progress)
        finally:
            self.session.done()

    def removed_names(self) -> list[str]:
        """Names removed lately and not stored again (the last 100), whether their removal
        finished in its own process or, interrupted, in a later open."""
        names = self.catalog.all_names()
        return [n for n in self.session.journal.removed() if n not in names]

    def _remove(self, name: str, progress: ProgressFn | None) -> None:
        dropped = self.catalog.drop_name(name)
        if dropped is None:  # pragma: no cover - the store is locked: nobody else removes it
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}")
        rec, rest = dropped
        self._aliases = None
        if not rest:
            self._purge(rec.trace_id, progress)
            return
        wh = self.warehouse
        pid = rec.parent_trace_id
        lineage_gone = pid is not None and all(n.parent_trace_id != pid for n in rest)
        with wh.transaction():
            rows.delete_name(wh, name)
            if lineage_gone and pid is not None:
                rows.delete_lineage(wh, rec.trace_id, pid)
        if lineage_gone and pid is not None:
            self._delete_becomes(pid, rec.trace_id)
        content = self.catalog.content(rec.trace_id)
        if content is not None and content.graph_name == name:
            self._rename_graph(rec.trace_id, rest[0].name)

    # ------------------------------------------------------------ read back

    def load(self, name: str) -> Trace:
        n, c = self._lookup(name)
        wh = self.warehouse
        p = {"t": c.seq}
        ops = wh.query(f"SELECT {OPS_COLUMNS} FROM trace_ops WHERE trace_id = $t ORDER BY uid", p).to_arrow()
        deps = wh.query(
            f"SELECT {DEPS_COLUMNS} FROM trace_deps WHERE trace_id = $t ORDER BY edge", p
        ).to_arrow()
        missing = wh.query(
            f"SELECT {DEPS_COLUMNS} FROM trace_missing_deps WHERE trace_id = $t ORDER BY edge", p
        ).to_arrow()
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

    def _second_names(self) -> dict[str, str]:
        """Names whose content's graph nodes carry another name → that name (cached while
        the catalog files are unchanged)."""
        stamp = tuple(int(v) for f in ("catalog.sqlite", "catalog.sqlite-wal") for v in _stat(self.path / f))
        if self._aliases is None or self._aliases[0] != stamp:
            pairs = {n.name: c.graph_name for n, c in self.catalog.names() if n.name != c.graph_name}
            self._aliases = (stamp, pairs)
        return self._aliases[1]

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the Ladybug graph (``Op`` nodes, ``DEP``, ``MSG`` and ``BECOMES`` edges).

        A ``$parameter`` without a value is refused; a trace name whose content the graph
        holds under another of its names is resolved to it (:mod:`etstore.store._cypher`).
        On a read-only store the query cannot write or read files (``COPY ... TO``,
        ``EXPORT DATABASE``, ``LOAD FROM``): it runs in a process the kernel sandboxes.
        """
        check_parameters(query, params)
        text, values = resolve_names(query, params, self._second_names())
        graph = self.graph
        try:
            if isinstance(graph, SandboxedGraph):  # a read-only store (see LadybugGraph.open)
                got = graph.query(text, values)
                return Result(pa.table({}) if got is None else got, query)
            res = graph.execute(text, values)
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


def _stat(path: Path) -> tuple[int, int]:
    """(mtime in ns, size) of ``path``, zeros when it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


_satisfies_store: type[Store] = EmbeddedStore  # mypy checks the backend against the interface
