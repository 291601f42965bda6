"""A local DuckDB copy of a server store's traces, so SQL runs where the user is.

The Neo4j backend keeps the graph, the catalog and each trace's lossless payload on
the server. SQL (and the simulator's metrics) stay in a DuckDB file on the client:
this module keeps that file's trace tables equal to the server's ready traces,
filling gaps from the payload and dropping what the server no longer has. A trace
is keyed by (name, seq, content hash) plus the server database's id, so a rebuilt
server or a reused name never leaves stale rows behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa

from etstore.errors import StoreError
from etstore.model import Trace
from etstore.store.base import TraceInfo
from etstore.store.graph import dep_edges, message_edges, uid_base
from etstore.store.warehouse import MIRROR_STATE_DDL, Warehouse

__all__ = ["Mirror"]

log = logging.getLogger(__name__)

Key = tuple[str, int, str]  # (name, seq, content hash)


class Mirror:
    """The client-side DuckDB warehouse of one server database (see the module docstring)."""

    def __init__(self, directory: Path, server_id: str) -> None:
        self.path = directory / "warehouse.duckdb"
        self.server_id = server_id
        self._warehouse: Warehouse | None = None

    @property
    def warehouse(self) -> Warehouse:
        """The local warehouse (opened, with the full schema, on first use)."""
        if self._warehouse is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                wh = Warehouse.open(self.path)
            except (OSError, StoreError) as exc:
                raise StoreError(
                    f"{self.path}: cannot open the local SQL warehouse ({str(exc).splitlines()[0]}); "
                    "set ETSTORE_WAREHOUSE to another directory"
                ) from exc
            try:
                wh.execute(MIRROR_STATE_DDL)
            except BaseException:
                wh.close()
                raise
            self._warehouse = wh
        return self._warehouse

    def close(self) -> None:
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None

    def keys(self) -> dict[str, Key]:
        """What this file holds for the current server, by trace name."""
        rows = self.warehouse.query("SELECT name, seq, content_hash, server FROM _etstore_mirror")
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
        wh = self.warehouse
        base = uid_base(seq)
        dep_uids = dep_edges(trace, base)
        msgs, _, _ = message_edges(trace, base)
        row = {
            "kind": info.kind,
            "ranks": info.ranks,
            "ops": info.ops,
            "deps": info.deps,
            "missing": info.missing,
            "messages": info.messages,
            "parent": info.parent,
            "source": info.source,
            "params": info.params,
            "content_hash": info.content_hash,
        }
        with wh.transaction():
            self._delete(info.name)
            wh.insert_trace(trace, info.name, base, dep_uids, msgs, row, lineage)
            wh.execute(
                "INSERT INTO _etstore_mirror VALUES ($n, $s, $h, $server)",
                {"n": info.name, "s": seq, "h": info.content_hash, "server": self.server_id},
            )

    def drop(self, name: str) -> None:
        """Remove one trace's rows (one DuckDB transaction)."""
        with self.warehouse.transaction():
            self._delete(name)

    def _delete(self, name: str) -> None:
        self.warehouse.delete_trace(name)
        self.warehouse.execute("DELETE FROM _etstore_mirror WHERE name = $t", {"t": name})
