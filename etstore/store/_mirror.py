"""A local DuckDB copy of what was published to a Neo4j server, so SQL runs where the user is.

The server holds the graph, each content's lossless payload and the published runs
(:mod:`etstore.store._neo4j_publish`); SQL needs them as warehouse tables. This module keeps
a DuckDB file's tables equal to the server's ready contents and names, filling gaps from the
payload and dropping what the server no longer has, and its run tables equal to the published
records (:mod:`etstore.store._neo4j_records`). A content is keyed by (trace id, content hash,
the parent contents it has lineage from) plus the server database's id, so a rebuilt server
never leaves stale rows behind; the ``traces`` rows (one per name) are rewritten whole when
they differ, and the run tables whenever the set of published records changed.

The file is written only to bring it in step; queries read it through a read-only connection
(:meth:`Mirror.reader`), which refuses every write and every other file. A file etstore's
former Neo4j backend left at the same place is reused, unless it holds runs that backend
recorded there: those stay, in a file moved aside (:data:`FORMER_COPY`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from etstore.errors import StoreError
from etstore.model import Trace
from etstore.store import _trace_rows as rows
from etstore.store._neo4j_records import TABLES as RECORD_TABLES
from etstore.store.base import TraceInfo
from etstore.store.graph import dep_edges, message_edges, uid_base
from etstore.store.schema import MIRROR_STATE_DDL
from etstore.store.warehouse import Warehouse

__all__ = ["FORMER_COPY", "Mirror", "NameRow"]

log = logging.getLogger(__name__)

FORMER_COPY = "former-backend-warehouse.duckdb"
"""Where, beside the copy, the file of etstore's former Neo4j backend is kept when it held runs
recorded through that backend (which never reached the server)."""

Key = tuple[str, list[int]]  # (content hash, parent contents with lineage)
_LINEAGE_COLUMNS = ["rank", "id", "parent_id", "parent_uid", "uid"]


class NameRow(NamedTuple):
    """One server name as the copy's ``traces`` table needs it."""

    info: TraceInfo
    """The name's catalog entry (``trace_id`` is its content)."""
    parent_trace_id: int | None
    """The parent's content when the name was published."""


class Mirror:
    """The client-side DuckDB copy of one server database (see the module docstring)."""

    def __init__(self, directory: Path, server_id: str) -> None:
        self.path = directory / "warehouse.duckdb"
        self.server_id = server_id
        self._warehouse: Warehouse | None = None
        self._prepared = False

    def _open(self, *, read_only: bool) -> Warehouse:
        """The file through a connection of that mode (DuckDB holds a file in one mode per process)."""
        if self._warehouse is not None and self._warehouse.read_only == read_only:
            return self._warehouse
        self.close()
        try:
            if read_only:
                wh = Warehouse.open(self.path, read_only=True)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # a copy made by an etstore before names is a cache: drop it and refill
                wh = Warehouse.open(self.path, legacy="discard")
        except (OSError, StoreError) as exc:
            raise StoreError(
                f"{self.path}: cannot open the local SQL copy of the server ({str(exc).splitlines()[0]}); "
                "set ETSTORE_WAREHOUSE to another directory"
            ) from exc
        if not read_only and not self._prepared:
            try:
                if self._holds_former_runs(wh):
                    wh.close()
                    wh = self._set_aside()
                wh.execute("DROP TABLE IF EXISTS _etstore_mirror")  # per-name bookkeeping before names
                for ddl in MIRROR_STATE_DDL:
                    wh.execute(ddl)
                # no feature writes here to bring its tables up to date (a column added since the
                # copy was made): the published records are copied into them as they are now
                wh.create_schema()
            except BaseException:
                wh.close()
                raise
            self._prepared = True
        self._warehouse = wh
        return wh

    @staticmethod
    def _holds_former_runs(wh: Warehouse) -> bool:
        """Whether this file is the copy etstore's former Neo4j backend kept, holding runs it
        recorded there (and nowhere else): it has no record of published runs, yet rows in a
        run table."""
        tables = {r[0] for r in wh.query("SELECT table_name FROM information_schema.tables")}
        if "_etstore_mirror_records" in tables:
            return False
        return any(wh.query(f"SELECT count(*) FROM {t}").scalar() for t in RECORD_TABLES if t in tables)

    def _set_aside(self) -> Warehouse:
        """Move the former backend's copy aside, where its runs stay (said in a warning), and
        open a new file in its place."""
        kept = self.path.with_name(FORMER_COPY)
        for suffix in ("", ".wal"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                source.replace(Path(f"{kept}{suffix}"))
        log.warning(
            "%s held runs recorded through etstore's former Neo4j backend; it is kept as %s "
            "(a DuckDB file: its runs, op_timings, ... tables), and a new copy of the server starts here",
            self.path,
            kept,
        )
        return Warehouse.open(self.path)

    def _current(self) -> Warehouse:
        """The open connection, whichever its mode; the first in a process is writable (it
        creates the schema and bookkeeping an older copy may lack)."""
        if self._warehouse is not None and self._prepared:
            return self._warehouse
        return self._open(read_only=self._prepared)

    def reader(self) -> Warehouse:
        """The copy opened read-only: what queries run on."""
        self._current()
        return self._open(read_only=True)

    def close(self) -> None:
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None

    def keys(self) -> dict[int, Key]:
        """What this file holds for the current server, by trace id."""
        got = (
            self._current()
            .query("SELECT trace_id, content_hash, lineage, server FROM _etstore_mirror_contents")
            .to_pylist()
        )
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
        fetch: Callable[[int], tuple[Trace, dict[int, pa.Table]]],
        records: tuple[str, Callable[[], dict[str, list[dict[str, Any]]]]],
    ) -> None:
        """Make the local tables hold exactly ``contents`` (each fetched when missing: its trace
        and its lineage rows by parent content), ``names``, and the published records
        (``records``: their fingerprint, and how to read them when it is not the one held)."""
        have = self.keys()
        for trace_id, key in have.items():
            if contents.get(trace_id) != key:
                self._drop(trace_id)
        for trace_id, key in contents.items():
            if have.get(trace_id) != key:
                trace, links = fetch(trace_id)
                self._add(trace, trace_id, key[0], links)
        self._set_names(names)
        fingerprint, read = records
        held = self._current().query("SELECT fingerprint, server FROM _etstore_mirror_records").to_pylist()
        if held != [{"fingerprint": fingerprint, "server": self.server_id}]:
            self._set_records(fingerprint, read())

    def _add(self, trace: Trace, trace_id: int, content_hash: str, lineage: Mapping[int, pa.Table]) -> None:
        """Insert one content's rows (one DuckDB transaction); ``lineage`` maps a parent content
        to the lineage rows from it."""
        wh = self._open(read_only=False)
        base = uid_base(trace_id)
        dep_uids = dep_edges(trace, base)
        msgs, _, _ = message_edges(trace, base)
        with wh.transaction():
            self._delete(wh, trace_id)
            rows.insert_content(wh, trace, trace_id, base, dep_uids, msgs)
            for parent_trace_id, table in lineage.items():
                rows.insert_lineage(wh, trace_id, parent_trace_id, table.select(_LINEAGE_COLUMNS))
            wh.execute(
                "INSERT INTO _etstore_mirror_contents VALUES ($t, $h, $l, $server)",
                {
                    "t": trace_id,
                    "h": content_hash,
                    "l": ",".join(map(str, sorted(lineage))),
                    "server": self.server_id,
                },
            )

    def _set_names(self, names: Sequence[NameRow]) -> None:
        """Replace the ``traces`` rows with ``names`` (one DuckDB transaction), unless they
        already say the same (the common case)."""
        have = (
            self._current()
            .query("SELECT name, trace_id, parent_trace_id, parent, source, params FROM traces ORDER BY name")
            .to_pylist()
        )
        want = sorted(
            (
                {
                    "name": n.info.name,
                    "trace_id": n.info.trace_id,
                    "parent_trace_id": n.parent_trace_id,
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
        wh = self._open(read_only=False)
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
                    "created": i.created,
                }
                assert i.trace_id is not None  # server names always point at a content
                rows.insert_name(wh, i.name, i.trace_id, n.parent_trace_id, row)

    def _set_records(self, fingerprint: str, tables: Mapping[str, list[dict[str, Any]]]) -> None:
        """Replace the run tables' rows with the published records' (one DuckDB transaction)."""
        wh = self._open(read_only=False)
        with wh.transaction():
            for table in RECORD_TABLES:
                schema = wh.query(f"SELECT * FROM {table} LIMIT 0").to_arrow().schema
                wh.execute(f"DELETE FROM {table}")
                got = tables.get(table, [])
                try:
                    arrow = pa.Table.from_pylist(
                        [{c: r.get(c) for c in schema.names} for r in got], schema=schema
                    )
                except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                    raise StoreError(f"the published {table} rows do not fit the table: {exc}") from exc
                wh.append(table, arrow)
            wh.execute("DELETE FROM _etstore_mirror_records")
            wh.execute(
                "INSERT INTO _etstore_mirror_records VALUES ($f, $s)", {"f": fingerprint, "s": self.server_id}
            )

    def _drop(self, trace_id: int) -> None:
        """Remove one content's rows (one DuckDB transaction)."""
        wh = self._open(read_only=False)
        with wh.transaction():
            self._delete(wh, trace_id)

    @staticmethod
    def _delete(wh: Warehouse, trace_id: int) -> None:
        rows.delete_content(wh, trace_id)
        wh.execute("DELETE FROM _etstore_mirror_contents WHERE trace_id = $t", {"t": trace_id})


def _parents(text: str | None) -> list[int]:
    return [int(x) for x in text.split(",") if x] if text else []
