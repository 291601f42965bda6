"""The embedded default store: one directory holding Ladybug, DuckDB and the catalog.

Layout of the directory::

    catalog.sqlite     traces (SQLModel); the commit point of every ingest
    warehouse.duckdb   ops, deps, missing_deps, messages, meta, traces (+ sim metrics)
    graph/             Ladybug database: (:Op)-[:DEP]->(:Op), (:Op)-[:MSG]->(:Op),
                       (:Op)-[:BECOMES]->(:Op) from a parent trace's op to its replacements

DuckDB is the lossless source (export reads it); Ladybug holds the graph
projection for Cypher. An ingest writes catalog(loading) → DuckDB (one
transaction) → Ladybug (bulk COPY) → catalog(ready); any failure or interrupt
undoes what landed, and a row stuck in ``loading`` is swept at the next open.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.dag import cycle_members
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace, content_hash
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.catalog import Catalog, TraceRecord
from etstore.store.graph import (
    GRAPH_OP_COLUMNS,
    dep_edges,
    lineage_edges,
    message_edges,
    op_nodes,
    uid_base,
)
from etstore.store.result import Result
from etstore.store.warehouse import DEPS_COLUMNS, OPS_COLUMNS, Warehouse

__all__ = ["EmbeddedStore"]

log = logging.getLogger(__name__)

_GRAPH_TYPES = {
    pa.int32(): "INT32",
    pa.int64(): "INT64",
    pa.uint64(): "UINT64",
    pa.string(): "STRING",
    pa.bool_(): "BOOLEAN",
}


def _graph_ddl() -> list[str]:
    op_schema = pa.schema(
        [("uid", pa.int64()), ("trace", pa.string())]
        + [(f.name, f.type) for f in OPS_SCHEMA if f.name in GRAPH_OP_COLUMNS]
    )
    columns = ", ".join(f"{f.name} {_GRAPH_TYPES[f.type]}" for f in op_schema)
    return [
        f"CREATE NODE TABLE IF NOT EXISTS Op({columns}, PRIMARY KEY(uid))",
        "CREATE REL TABLE IF NOT EXISTS DEP(FROM Op TO Op, kind STRING)",
        "CREATE REL TABLE IF NOT EXISTS MSG(FROM Op TO Op, tag INT32, comm_size INT64)",
        "CREATE REL TABLE IF NOT EXISTS BECOMES(FROM Op TO Op)",
    ]


def _buffer_pool_bytes(graph: Path, incoming: int) -> int:
    """Ladybug's buffer pool: 16x the graph file plus what is about to be loaded, at
    least 1 GiB, at most Ladybug's own default of 80% of RAM. Ladybug maps the whole
    pool when it opens (about 1.2 ms per GiB here: 25 ms at its default on 24 GiB,
    paid by every command that opens the graph)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0  # Ladybug's default
    held = graph.stat().st_size if graph.exists() else 0
    return int(min(0.8 * ram, max(1 << 30, 16 * (held + incoming))))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class EmbeddedStore:
    """Ladybug + DuckDB + catalog in one directory (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.read_only = read_only
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path}: exists and is not a store directory")
        if read_only and not (self.path / "catalog.sqlite").exists():
            read_only = False  # a fresh store: create it once, then nothing writes
        self.path.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(self.path / "catalog.sqlite")
        self._warehouse: Warehouse | None = None
        self._graph_conn: Any = None
        self._graph_db: Any = None
        self._graph_columns: tuple[str, ...] = GRAPH_OP_COLUMNS
        self._read_only_engines = self.read_only and read_only
        if not self.read_only:
            self._sweep()

    # ------------------------------------------------------------ engines

    @property
    def warehouse(self) -> Warehouse:
        """The DuckDB warehouse (opened on first use; a writable store creates its schema)."""
        if self._warehouse is None:
            path = self.path / "warehouse.duckdb"
            self._warehouse = Warehouse.open(path, read_only=self._read_only_engines)
        return self._warehouse

    @property
    def graph(self) -> Any:
        """The Ladybug connection (opened on first use)."""
        return self._open_graph()

    def _open_graph(self, incoming: int = 0) -> Any:
        """Open the graph once, with a buffer pool sized for what it holds plus
        ``incoming`` bytes of Arrow about to be loaded."""
        if self._graph_conn is None:
            import ladybug  # imported lazily: SQL-only commands never pay for it

            try:
                # checkpoints are ours: one per ingest or removal instead of one per COPY
                # statement (each commit of a bulk load would otherwise checkpoint by itself)
                self._graph_db = ladybug.Database(
                    str(self.path / "graph"),
                    read_only=self._read_only_engines,
                    auto_checkpoint=self._read_only_engines,
                    buffer_pool_size=_buffer_pool_bytes(self.path / "graph", incoming),
                )
                conn: Any = ladybug.Connection(self._graph_db)  # typed loosely, as _graph_conn
            except RuntimeError as exc:
                raise StoreError(f"{self.path}: cannot open the Ladybug graph: {_first_line(exc)}") from exc
            if not self._read_only_engines:
                for ddl in _graph_ddl():
                    conn.execute(ddl)
                # a store made by an older etstore may carry more op properties: load what it has
                info = conn.execute("CALL table_info('Op') RETURN name").get_as_arrow(0)
                self._graph_columns = tuple(info["name"].to_pylist())
            self._graph_conn = conn
        return self._graph_conn

    def close(self) -> None:
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None
        if self._graph_conn is not None:
            self._graph_conn.close()
            self._graph_conn = None
            self._graph_db.close()
            self._graph_db = None
        self.catalog.engine.dispose()

    def __enter__(self) -> EmbeddedStore:
        """The store itself; leaving the block closes it."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # ------------------------------------------------------------ catalog

    def traces(self) -> list[TraceInfo]:
        return [r.info() for r in self.catalog.ready()]

    def _record(self, name: str) -> TraceRecord:
        rec = self.catalog.by_name(name)
        if rec is None:
            known = sorted(r.name for r in self.catalog.ready())
            hint = f"; stored traces: {', '.join(known[:10])}" if known else "; the store is empty"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return rec

    def info(self, name: str) -> TraceInfo:
        return self._record(name).info()

    # ------------------------------------------------------------ ingest

    def _free_name(self, wanted: str, explicit: bool) -> str:
        taken = self.catalog.names()
        if wanted not in taken:
            return wanted
        if explicit:
            raise StoreError(f"a different trace is already named {wanted!r}; pick another name or remove it")
        i = 2
        while f"{wanted}-{i}" in taken:
            i += 1
        return f"{wanted}-{i}"

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
        if parent is not None:
            self._record(parent)
        started = time.perf_counter()
        digest = content_hash(trace)
        existing = self.catalog.by_hash(digest, kind)
        if existing is not None:
            return IngestReport(existing.info(), created=False, seconds=time.perf_counter() - started)
        rec = self.catalog.add(
            TraceRecord(
                name=self._free_name(name or trace.name, explicit=name is not None),
                kind=kind.value,
                source=trace.source,
                content_hash=digest,
                ranks=trace.num_ranks,
                parent=parent,
                params=json.dumps(dict(trace.params), sort_keys=True, default=str),
            )
        )
        seq, final = rec.seq, rec.name
        assert seq is not None  # the catalog assigned it
        try:
            rec, cycles, unmatched_sends, unmatched_recvs = self._write(trace, rec, lineage, progress)
        except BaseException:
            self._purge(seq, final)
            raise
        return IngestReport(
            rec.info(),
            created=True,
            cycles=cycles,
            unmatched_sends=unmatched_sends,
            unmatched_recvs=unmatched_recvs,
            seconds=time.perf_counter() - started,
        )

    def _write(
        self, trace: Trace, rec: TraceRecord, lineage: pa.Table | None, progress: ProgressFn | None
    ) -> tuple[TraceRecord, int, int, int]:
        """Write a claimed trace to both engines and mark it ready; the caller purges on failure.

        Returns the ready record, the dependency cycles and the unmatched sends and receives.
        """
        assert rec.seq is not None
        base = uid_base(rec.seq)
        # One helper thread, fed in order: it computes the edge rows while Ladybug loads
        # the nodes, then writes DuckDB while Ladybug loads the edges (both engines
        # release the GIL in their bulk paths).
        with ThreadPoolExecutor(max_workers=1) as pool:
            g = self._open_graph(incoming=trace.ops.nbytes + trace.deps.nbytes)
            edge_rows = pool.submit(lambda: (dep_edges(trace, base), message_edges(trace, base)))
            nodes = op_nodes(trace, rec.name, base, self._graph_columns)  # the graph's own columns
            g.execute("COPY Op FROM nodes")
            deps, (msgs, unmatched_sends, unmatched_recvs) = edge_rows.result()
            counts = {
                "ops": trace.num_ops,
                "deps": trace.num_deps,
                "missing": trace.num_missing,
                "messages": msgs.num_rows,
                "ranks": trace.num_ranks,
            }
            links = lineage_rows = None
            if lineage is not None and lineage.num_rows and rec.parent is not None:
                links, lineage_rows = self._lineage_rows(lineage, nodes, rec.name, rec.parent)
            row = {
                **counts,
                "kind": rec.kind,
                "parent": rec.parent,
                "source": rec.source,
                "params": trace.params,
                "content_hash": rec.content_hash,
            }
            rows_in = (trace, rec.name, base, deps, msgs, row, lineage_rows)
            warehouse = pool.submit(self._write_warehouse, *rows_in)
            try:
                self._write_edges(deps, msgs, links)
            finally:
                warehouse.result()  # wait even when the graph failed, then raise either error
        if progress:
            progress("warehouse", 1, 2)
            progress("graph", 2, 2)
        # the edges as op rows, from the uids already computed
        rows = (deps["from"].to_numpy() - base, deps["to"].to_numpy() - base)
        cycles = len(cycle_members(trace, rows))
        return self.catalog.mark_ready(rec.seq, **counts), cycles, unmatched_sends, unmatched_recvs

    def _write_warehouse(
        self,
        trace: Trace,
        name: str,
        base: int,
        dep_uids: pa.Table,
        msgs: pa.Table,
        row: Mapping[str, Any],
        lineage: pa.Table | None = None,
    ) -> None:
        wh = self.warehouse
        # one core for the warehouse while the graph's bulk load (the longer of the two) runs beside it
        wh.execute("SET threads TO 1")
        try:
            with wh.transaction():
                wh.insert_trace(trace, name, base, dep_uids, msgs, row, lineage)
        finally:
            wh.execute("RESET threads")

    def _lineage_rows(
        self, lineage: pa.Table, nodes: pa.Table, name: str, parent: str
    ) -> tuple[pa.Table, pa.Table]:
        """``BECOMES`` edges and ``lineage`` table rows for a derived trace."""
        parent_ops = self.warehouse.query(
            "SELECT rank, id, uid FROM ops WHERE trace = $t", {"t": parent}
        ).to_arrow()
        links = lineage_edges(lineage, nodes, parent_ops, what=f"trace {name!r}")
        # the trace column is the insert's own (insert_trace_rows)
        rows = links.append_column("parent_trace", pa.array([parent] * links.num_rows, pa.string()))
        for col in ("rank", "id", "parent_id"):
            rows = rows.append_column(col, lineage[col])
        return links, rows.rename_columns(["parent_uid", "uid", *rows.column_names[2:]])

    def _write_edges(self, deps: pa.Table, msgs: pa.Table, links: pa.Table | None) -> None:
        """Load the edges (the nodes are in) and checkpoint the graph once for the whole ingest."""
        g = self.graph
        if deps.num_rows:
            g.execute("COPY DEP FROM deps")
        if msgs.num_rows:
            g.execute("COPY MSG FROM msgs")
        if links is not None and links.num_rows:
            becomes = links.select(["from", "to"])  # noqa: F841 - read by COPY
            g.execute("COPY BECOMES FROM becomes")
        g.execute("CHECKPOINT")

    def _purge(self, seq: int, name: str) -> None:
        """Remove every trace of ``seq``/``name`` from both engines, then the catalog row."""
        self.catalog.mark_deleting(seq)
        lo = uid_base(seq)
        hi = lo + (1 << 40)
        try:
            self._purge_graph(lo, hi, last=self.catalog.names() == {name})
        except RuntimeError as exc:  # pragma: no cover - engine failure while cleaning up
            log.error("could not remove graph data of %s: %s", name, exc)
            raise StoreError(f"could not remove {name!r} from the graph: {_first_line(exc)}") from exc
        wh = self.warehouse
        with wh.transaction():
            wh.delete_trace(name)
        self.catalog.delete(seq)

    def _purge_graph(self, lo: int, hi: int, *, last: bool) -> None:
        """Delete the graph's ops with uids in ``[lo, hi)`` and every edge touching them.

        Ladybug deletes at ~10 µs per node or edge; when no other trace is stored,
        dropping and recreating the tables is instant (and safe to redo after a
        crash: the tables are recreated on the next open in any case).
        """
        g = self.graph
        if last:
            for table in ("BECOMES", "MSG", "DEP", "Op"):
                g.execute(f"DROP TABLE IF EXISTS {table}")
            for ddl in _graph_ddl():
                g.execute(ddl)
            g.execute("CHECKPOINT")
            self._graph_columns = GRAPH_OP_COLUMNS
            return
        p = {"lo": lo, "hi": hi}
        # edges first, one table at a time (faster than DETACH DELETE), then the nodes
        for rel, end in (("DEP", "a"), ("MSG", "a"), ("BECOMES", "a"), ("BECOMES", "b")):
            g.execute(
                f"MATCH (a:Op)-[r:{rel}]->(b:Op) WHERE {end}.uid >= $lo AND {end}.uid < $hi DELETE r", p
            )
        g.execute("MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi DETACH DELETE o", p)
        g.execute("CHECKPOINT")

    def _sweep(self) -> None:
        for rec in self.catalog.stale():
            assert rec.seq is not None
            log.warning("removing incomplete trace %s left by an interrupted ingest", rec.name)
            self._purge(rec.seq, rec.name)

    def remove(self, name: str) -> None:
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")
        rec = self._record(name)
        assert rec.seq is not None
        self._purge(rec.seq, rec.name)

    # ------------------------------------------------------------ read back

    def load(self, name: str) -> Trace:
        rec = self._record(name)
        wh = self.warehouse
        p = {"t": name}
        ops = wh.query(f"SELECT {OPS_COLUMNS} FROM ops WHERE trace = $t ORDER BY uid", p).to_arrow()
        deps = wh.query(f"SELECT {DEPS_COLUMNS} FROM deps WHERE trace = $t ORDER BY edge", p).to_arrow()
        missing = wh.query(
            f"SELECT {DEPS_COLUMNS} FROM missing_deps WHERE trace = $t ORDER BY edge", p
        ).to_arrow()
        meta = wh.query("SELECT rank, metadata FROM meta WHERE trace = $t ORDER BY rank", p).to_arrow()
        return Trace(
            ops=ops.cast(OPS_SCHEMA),
            deps=deps.cast(DEPS_SCHEMA),
            missing=missing.cast(DEPS_SCHEMA),
            meta=meta.cast(META_SCHEMA),
            name=rec.name,
            kind=rec.kind,
            source=rec.source,
            params=json.loads(rec.params),
        )

    # ------------------------------------------------------------ queries

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the Ladybug graph (``Op`` nodes, ``DEP`` and ``MSG`` edges)."""
        try:
            res = self.graph.execute(query, dict(params or {}))
            if not res.get_column_names():
                return Result(pa.table({}), query)
            # chunk size 0: one chunk of exactly the result's rows. The default sizes
            # its buffers for millions of rows, which costs ~1 ms on every small query.
            table = res.get_as_arrow(0)
        except RuntimeError as exc:
            raise QueryError(f"Cypher error: {_first_line(exc)} (query: {query!r})") from exc
        return Result(table, query)

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on DuckDB (tables ``ops``, ``deps``, ``missing_deps``, ``messages``, ``meta``,
        ``traces`` and the simulator's metrics)."""
        return self.warehouse.query(query, params)


_satisfies_store: type[Store] = EmbeddedStore  # mypy checks the backend against the interface
