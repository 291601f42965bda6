"""A local DuckDB copy of a server store's traces, so SQL runs where the user is.

The Neo4j backend keeps the graph, the catalog and each trace's lossless payload on
the server. SQL (and the simulator's metrics) stay in a DuckDB file on the client:
this module keeps that file's trace tables equal to the server's ready traces,
filling gaps from the payload and dropping what the server no longer has. A trace
is keyed by (name, seq, content hash) plus the server database's id, so a rebuilt
server or a reused name never leaves stale rows behind.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import pyarrow as pa

from etstore.errors import StoreError
from etstore.model import Trace
from etstore.store.base import TraceInfo
from etstore.store.embedded import _TRACE_TABLES, _WAREHOUSE_DDL, _attach_warehouse, insert_trace_rows
from etstore.store.graph import dep_edges, message_edges, uid_base

__all__ = ["Mirror"]

log = logging.getLogger(__name__)

_STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS _etstore_mirror "
    "(name VARCHAR PRIMARY KEY, seq BIGINT, content_hash VARCHAR, server VARCHAR)"
)

Key = tuple[str, int, str]  # (name, seq, content hash)


class Mirror:
    """The client-side DuckDB warehouse of one server database (see the module docstring)."""

    def __init__(self, directory: Path, server_id: str) -> None:
        self.path = directory / "warehouse.duckdb"
        self.server_id = server_id
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection (opened and schema'd on first use)."""
        if self._con is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                con = _attach_warehouse(self.path, read_only=False)
            except (OSError, duckdb.Error) as exc:
                raise StoreError(
                    f"{self.path}: cannot open the local SQL warehouse ({str(exc).splitlines()[0]}); "
                    "set ETSTORE_WAREHOUSE to another directory"
                ) from exc
            for ddl in [*_WAREHOUSE_DDL, _STATE_DDL]:
                con.execute(ddl)
            self._con = con
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def keys(self) -> dict[str, Key]:
        """What this file holds for the current server, by trace name."""
        rows = self.con.execute("SELECT name, seq, content_hash, server FROM _etstore_mirror").fetchall()
        # rows copied from another server (a rebuilt one) never match, so sync replaces them
        return {n: (n, s, h) if srv == self.server_id else (n, -1, "") for n, s, h, srv in rows}

    def sync(
        self,
        ready: Iterable[Key],
        fetch: Callable[[str], tuple[Trace, TraceInfo, pa.Table | None]],
    ) -> None:
        """Make the local tables hold exactly the traces in ``ready``."""
        want = {k[0]: k for k in ready}
        have = self.keys()
        for name, key in have.items():
            if want.get(name) != key:
                self.drop(name)
        for name, key in want.items():
            if have.get(name) != key:
                trace, info, links = fetch(name)
                self.add(trace, info, seq=key[1], lineage=links)

    def add(self, trace: Trace, info: TraceInfo, *, seq: int, lineage: pa.Table | None = None) -> None:
        """Insert one trace's rows (one DuckDB transaction); ``lineage`` holds the
        ``lineage`` table's columns but ``trace``."""
        con = self.con
        base = uid_base(seq)
        dep_uids = dep_edges(trace, base)
        msgs, _, _ = message_edges(trace, base)
        con.begin()
        try:
            self._delete(info.name)
            insert_trace_rows(con, trace, info.name, base, dep_uids, msgs, lineage)
            con.execute(
                "INSERT INTO traces VALUES ($name, $kind, $ranks, $ops, $deps, $missing, $messages, "
                "$parent, $source, $params, $hash)",
                {
                    "name": info.name,
                    "kind": info.kind,
                    "ranks": info.ranks,
                    "ops": info.ops,
                    "deps": info.deps,
                    "missing": info.missing,
                    "messages": info.messages,
                    "parent": info.parent,
                    "source": info.source,
                    "params": json.dumps(dict(info.params), sort_keys=True, default=str),
                    "hash": info.content_hash,
                },
            )
            con.execute(
                "INSERT INTO _etstore_mirror VALUES ($n, $s, $h, $server)",
                {"n": info.name, "s": seq, "h": info.content_hash, "server": self.server_id},
            )
            con.commit()
        except BaseException:
            con.rollback()
            raise

    def drop(self, name: str) -> None:
        """Remove one trace's rows (one DuckDB transaction)."""
        con = self.con
        con.begin()
        try:
            self._delete(name)
            con.commit()
        except BaseException:
            con.rollback()
            raise

    def _delete(self, name: str) -> None:
        con = self.con
        for table in (*_TRACE_TABLES, "traces", "_etstore_mirror"):
            col = "name" if table in ("traces", "_etstore_mirror") else "trace"
            con.execute(f"DELETE FROM {table} WHERE {col} = $t", {"t": name})
