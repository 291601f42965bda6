"""A local DuckDB copy of a server store's traces, so SQL runs where the user is.

The Neo4j backend keeps the graph, the catalog and each content's lossless payload on
the server. SQL (and the simulator's metrics) stay in a DuckDB file on the client:
this module keeps that file's trace tables equal to the server's ready contents and
names, filling gaps from the payload and dropping what the server no longer has. A
content is keyed by (trace id, content hash, the parent contents it has lineage from)
plus the server database's id, so a rebuilt server never leaves stale rows behind;
the ``traces`` rows (one per name) are rewritten whole at every sync (they are few).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from etstore.errors import StoreError
from etstore.model import Trace
from etstore.store import _trace_rows as rows
from etstore.store.base import TraceInfo
from etstore.store.graph import dep_edges, message_edges, uid_base
from etstore.store.schema import MIRROR_STATE_DDL
from etstore.store.warehouse import Warehouse

__all__ = ["Mirror", "NameRow"]

log = logging.getLogger(__name__)

Key = tuple[str, list[int]]  # (content hash, parent contents with lineage)
_LINEAGE_COLUMNS = ["rank", "id", "parent_id", "parent_uid", "uid"]


class NameRow(NamedTuple):
    """One server name as the mirror's ``traces`` table needs it."""

    info: TraceInfo
    """The name's catalog entry (``trace_id`` is its content)."""
    parent_seq: int | None
    """The parent's content when the name was made."""


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
                # a copy made by an etstore before names is a cache: drop it and refill
                wh = Warehouse.open(self.path, legacy="discard")
            except (OSError, StoreError) as exc:
                raise StoreError(
                    f"{self.path}: cannot open the local SQL warehouse ({str(exc).splitlines()[0]}); "
                    "set ETSTORE_WAREHOUSE to another directory"
                ) from exc
            try:
                wh.execute("DROP TABLE IF EXISTS _etstore_mirror")  # per-name bookkeeping before names
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

    def keys(self) -> dict[int, Key]:
        """What this file holds for the current server, by trace id."""
        got = self.warehouse.query(
            "SELECT trace_id, content_hash, lineage, server FROM _etstore_mirror_contents"
        ).to_pylist()
        # rows copied from another server (a rebuilt one) never match, so sync replaces them
        return {
            int(r["trace_id"]): (r["content_hash"], _parents(r["lineage"]))
            if r["server"] == self.server_id
            else ("", [-1])
            for r in got
        }

    def sync(
        self,
        contents: Mapping[int, Key],
        names: Sequence[NameRow],
        fetch: Callable[[int], tuple[Trace, dict[str, pa.Table]]],
    ) -> None:
        """Make the local tables hold exactly ``contents`` and ``names``."""
        have = self.keys()
        for seq, key in have.items():
            if contents.get(seq) != key:
                self.drop(seq)
        for seq, key in contents.items():
            if have.get(seq) != key:
                trace, links = fetch(seq)
                self.add(trace, seq, key[0], links)
        self.set_names(names)

    def add(self, trace: Trace, seq: int, content_hash: str, lineage: Mapping[str, pa.Table]) -> None:
        """Insert one content's rows (one DuckDB transaction); ``lineage`` maps
        ``lineage@<parent seq>`` to that parent's lineage rows."""
        wh = self.warehouse
        base = uid_base(seq)
        dep_uids = dep_edges(trace, base)
        msgs, _, _ = message_edges(trace, base)
        parents = sorted(int(k.split("@", 1)[1]) for k in lineage if "@" in k)
        with wh.transaction():
            self._delete(seq)
            rows.insert_content(wh, trace, seq, base, dep_uids, msgs)
            for table_name, table in lineage.items():
                if "@" in table_name:
                    pseq = int(table_name.split("@", 1)[1])
                    rows.insert_lineage(wh, seq, pseq, table.select(_LINEAGE_COLUMNS))
            wh.execute(
                "INSERT INTO _etstore_mirror_contents VALUES ($t, $h, $l, $server)",
                {"t": seq, "h": content_hash, "l": ",".join(map(str, parents)), "server": self.server_id},
            )

    def set_names(self, names: Sequence[NameRow]) -> None:
        """Replace the ``traces`` rows with ``names`` (one DuckDB transaction), unless they
        already say the same (the common case: every SQL query syncs)."""
        wh = self.warehouse
        have = wh.query(
            "SELECT name, trace_id, parent_trace_id, parent, source, params FROM traces ORDER BY name"
        ).to_pylist()
        want = sorted(
            (
                {
                    "name": n.info.name,
                    "trace_id": n.info.trace_id,
                    "parent_trace_id": n.parent_seq,
                    "parent": n.info.parent,
                    "source": n.info.source,
                    "params": json.dumps(dict(n.info.params), sort_keys=True, default=str),
                }
                for n in names
            ),
            key=lambda r: str(r["name"]),
        )
        if have == want:
            return
        with wh.transaction():
            wh.execute("DELETE FROM traces")
            for n in names:
                i = n.info
                row = {
                    "kind": i.kind,
                    "ranks": i.ranks,
                    "ops": i.ops,
                    "deps": i.deps,
                    "missing": i.missing,
                    "messages": i.messages,
                    "parent": i.parent,
                    "source": i.source,
                    "params": i.params,
                    "content_hash": i.content_hash,
                }
                assert i.trace_id is not None  # server names always point at a content
                rows.insert_name(wh, i.name, i.trace_id, n.parent_seq, row)

    def drop(self, seq: int) -> None:
        """Remove one content's rows (one DuckDB transaction)."""
        with self.warehouse.transaction():
            self._delete(seq)

    def _delete(self, seq: int) -> None:
        rows.delete_content(self.warehouse, seq)
        self.warehouse.execute("DELETE FROM _etstore_mirror_contents WHERE trace_id = $t", {"t": seq})


def _parents(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x] if text else []
