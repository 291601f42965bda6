"""A Neo4j 5 server as a read view of what ``etstore publish`` sent it, opened by a ``neo4j://`` URL.

A server is a target stores publish to (:mod:`etstore.app.publish`,
:mod:`etstore.store._neo4j_publish`), never a store written directly: there is one
protocol for getting data onto it. Opening its URL gives a :class:`Neo4jStore` that reads
the published data the way every command reads a store:

- ``traces()``, ``info()``: the published names (``Trace`` nodes) whose content is ready;
- ``load()``: the content's lossless payload (``Payload`` nodes), byte for byte what the
  publishing store would load, so ``sim``, ``export`` and the analyses work from any machine;
- ``cypher()``: the published graph, in READ access mode;
- ``sql()`` and ``warehouse``: a client-side DuckDB copy (:mod:`etstore.store._mirror`,
  ``$ETSTORE_WAREHOUSE`` or a per-server directory under the user cache) of the published
  traces, runs and metrics, brought in step before each use and read through a read-only
  connection.

``ingest``, ``ingest_parts`` and ``remove`` refuse, and so does opening for writing, in one
line saying what to do instead (:func:`writes_refused`). A server still holding what
etstore's former Neo4j backend wrote is refused until it is upgraded in place
(:mod:`etstore.store._neo4j_migrate`).

Credentials come from the URL (``neo4j://user:pass@host:7687``) or from
``NEO4J_USERNAME``/``NEO4J_USER`` and ``NEO4J_PASSWORD``; :attr:`location`, ``repr``,
log lines and error messages never contain them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import Trace
from etstore.store import _neo4j_records
from etstore.store._cypher import check_parameters
from etstore.store._mirror import Mirror, NameRow
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_dialect import column, driver, message, plain, translate_cypher
from etstore.store._neo4j_load import decode_payload
from etstore.store._neo4j_migrate import legacy_format, refusal
from etstore.store._neo4j_target import Neo4jTarget, default_warehouse, parse_url, writes_refused
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo
from etstore.store.result import Result
from etstore.store.warehouse import Warehouse

__all__ = ["Neo4jStore", "Neo4jTarget", "parse_url", "translate_cypher", "writes_refused"]

log = logging.getLogger(__name__)

_READY = "MATCH (t:Trace) MATCH (c:Content {trace_id: t.trace_id, status: 'ready'}) "
"""A published name ``t`` and its content ``c``, once the content is all there."""


class Neo4jStore:
    """What was published to a Neo4j 5 server, read as a store (see the module docstring).

    Parameters
    ----------
    url
        ``neo4j://`` or ``bolt://`` URL, optionally with ``user:password@`` and a
        ``/database`` path.
    read_only
        Must stay True: a server is written by ``etstore publish`` only.
    warehouse
        Directory of the client-side DuckDB copy (default: ``$ETSTORE_WAREHOUSE``, else one
        directory per server under the user cache).

    Raises
    ------
    StoreError
        ``read_only`` is False; the URL is malformed; the server is unreachable or refuses
        the credentials; it holds data of etstore's former Neo4j backend not upgraded yet
        (the message says what to run).
    """

    def __init__(
        self, url: str, *, read_only: bool = True, warehouse: str | os.PathLike[str] | None = None
    ) -> None:
        self.target = parse_url(url)
        self.location = self.target.location
        self.read_only = True
        if not read_only:
            raise StoreError(writes_refused(self.location))
        self._bolt = Bolt(self.target, read_only=True)
        self._run = self._bolt.run
        try:
            version = legacy_format(self._bolt)
            if version is not None:
                raise StoreError(refusal(self.location, version))
            server_id = self._run("CALL db.info() YIELD id RETURN id")[0]["id"]
        except BaseException:
            self._bolt.close()
            raise
        self._mirror = Mirror(Path(warehouse) if warehouse else default_warehouse(self.target), server_id)

    def __repr__(self) -> str:
        return f"Neo4jStore({self.location!r}, read_only=True)"

    def __enter__(self) -> Neo4jStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._mirror.close()
        self._bolt.close()

    # ------------------------------------------------------------ names

    @staticmethod
    def _info(name: Mapping[str, Any], content: Mapping[str, Any]) -> TraceInfo:
        created = plain(name.get("created"))
        if isinstance(created, datetime) and created.tzinfo is not None:  # as DuckDB's TIMESTAMP
            created = created.astimezone(timezone.utc).replace(tzinfo=None)
        return TraceInfo(
            name=name["name"],
            kind=content["kind"],
            source=name.get("source") or "",
            content_hash=content["content_hash"],
            ranks=int(content["ranks"]),
            ops=int(content["ops"]),
            deps=int(content["deps"]),
            missing=int(content.get("missing") or 0),
            messages=int(content["messages"]),
            parent=name.get("parent"),
            params=json.loads(name.get("params") or "{}"),
            created=created,
            trace_id=int(content["trace_id"]),
        )

    def _rows(self, name: str | None = None) -> list[Any]:
        if name is None:
            return self._run(_READY + "RETURN t, c ORDER BY t.created, t.name")
        return self._run(_READY.replace("(t:Trace)", "(t:Trace {name: $n})", 1) + "RETURN t, c", {"n": name})

    def traces(self) -> list[TraceInfo]:
        """Every published name whose content is ready, oldest first."""
        return [self._info(r["t"], r["c"]) for r in self._rows()]

    def _ready(self, name: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """A published name and its content."""
        rows = self._rows(name)
        if not rows:
            known = sorted(t.name for t in self.traces())
            hint = f"; published traces: {', '.join(known[:10])}" if known else "; nothing is published there"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return rows[0]["t"], rows[0]["c"]

    def info(self, name: str) -> TraceInfo:
        return self._info(*self._ready(name))

    # ------------------------------------------------------------ writes: refused

    def ingest(
        self,
        trace: Trace,
        *,
        name: str | None = None,
        parent: str | None = None,
        lineage: pa.Table | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """Refused: see :func:`writes_refused`."""
        raise StoreError(writes_refused(self.location))

    def ingest_parts(
        self,
        parts: Iterable[Trace],
        *,
        name: str | None = None,
        ops: int | None = None,
        progress: ProgressFn | None = None,
    ) -> IngestReport:
        """Refused: see :func:`writes_refused`."""
        raise StoreError(writes_refused(self.location))

    def remove(self, name: str) -> None:
        """Refused: see :func:`writes_refused`."""
        raise StoreError(writes_refused(self.location))

    def removed_names(self) -> list[str]:
        """None: nothing is removed through a reader."""
        return []

    def finished_removals(self) -> set[str]:
        """None: see :meth:`removed_names`."""
        return set()

    def index(self, progress: ProgressFn | None = None) -> bool:
        """Always False: the server's graph is what publish wrote, never derived here."""
        return False

    # ------------------------------------------------------------ read back

    def _payload(self, trace_id: int, content: Mapping[str, Any] | None = None) -> dict[str, pa.Table]:
        where = f"{self.location} trace id {trace_id}"
        if content is not None and not content.get("payload"):
            raise StoreError(
                f"{where} was published by an etstore that did not send its lossless form; "
                "publish it again from a store that holds it (etstore publish sends what is missing)"
            )
        rows = self._run(
            "MATCH (p:Payload {trace_id: $t}) RETURN p.table AS t, p.part AS p, p.data AS d", {"t": trace_id}
        )
        return decode_payload([(r["t"], r["p"], r["d"]) for r in rows], where)

    def load(self, name: str) -> Trace:
        """The published trace back, byte-exact, from the server's payload.

        Raises
        ------
        UnknownTraceError
            No published name ``name`` (or its content is not all there yet).
        StoreError
            Its content was published without a payload (by an older etstore): the message
            says to publish it again.
        """
        node, content = self._ready(name)
        tables = self._payload(int(content["trace_id"]), content)
        return Trace(
            **tables,
            name=node["name"],
            kind=content["kind"],
            source=node.get("source") or "",
            params=json.loads(node.get("params") or "{}"),
        )

    def _fetch(self, trace_id: int) -> tuple[Trace, dict[int, pa.Table]]:
        """A content's trace and its lineage rows by parent content (from the ``BECOMES``
        edges), for the client-side copy."""
        content = self._run("MATCH (c:Content {trace_id: $t}) RETURN c", {"t": trace_id})[0]["c"]
        tables = self._payload(trace_id, content)
        lineage = {}
        for parent in sorted(int(p) for p in content.get("lineage_from") or []):
            rows = self._run(
                "MATCH (a:Op {trace_id: $p})-[:BECOMES]->(b:Op {trace_id: $t}) "
                "RETURN b.rank AS rank, b.id AS id, a.id AS parent_id, a.uid AS parent_uid, b.uid AS uid "
                "ORDER BY uid, parent_uid",
                {"p": parent, "t": trace_id},
            )
            lineage[parent] = pa.table(
                {
                    "rank": pa.array([r["rank"] for r in rows], pa.int32()),
                    "id": pa.array([r["id"] for r in rows], pa.uint64()),
                    "parent_id": pa.array([r["parent_id"] for r in rows], pa.uint64()),
                    "parent_uid": pa.array([r["parent_uid"] for r in rows], pa.int64()),
                    "uid": pa.array([r["uid"] for r in rows], pa.int64()),
                }
            )
        return Trace(**tables, name=f"#{trace_id}"), lineage

    # ------------------------------------------------------------ queries

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the server in READ access mode.

        A ``$parameter`` without a value is refused (:mod:`etstore.store._cypher`); Ladybug
        spellings etstore documents are translated (:func:`translate_cypher`); names and
        other strings pass as written (a query selects a trace by joining its ``Trace`` node).
        Nodes come back as dicts of their properties plus ``_ID`` and ``_LABEL``.

        Raises
        ------
        QueryError
            The server refuses the query (a write among them), or it administers the server.
        """
        neo4j = driver()
        check_parameters(query, params)
        text = translate_cypher(query)
        try:
            with self._bolt.session() as s:
                res = s.run(text, dict(params or {}))
                keys = list(res.keys())
                rows = [tuple(rec.values()) for rec in res]
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise QueryError(f"Cypher error: {message(exc)} (query: {query!r})") from exc
        if not keys:
            return Result(pa.table({}), query)
        cols = list(zip(*rows, strict=True)) if rows else [() for _ in keys]
        return Result(
            pa.table({k: column([plain(v) for v in c]) for k, c in zip(keys, cols, strict=True)}), query
        )

    def _names(self) -> list[NameRow]:
        return [
            NameRow(info=self._info(r["t"], r["c"]), parent_trace_id=r["t"].get("parent_trace_id"))
            for r in self._rows()
        ]

    def _sync(self) -> None:
        contents = self._run(
            "MATCH (c:Content {status: 'ready'}) WHERE EXISTS { MATCH (:Trace {trace_id: c.trace_id}) } "
            "RETURN c.trace_id AS t, c.content_hash AS h, c.lineage_from AS l, "
            "coalesce(c.payload, false) AS p"
        )
        lacking = [int(r["t"]) for r in contents if not r["p"]]
        if lacking:  # named in `traces`, without rows: the rest of the copy still serves
            log.warning(
                "%s: trace ids %s were published without their lossless form and have no SQL rows here; "
                "publish them again",
                self.location,
                ", ".join(map(str, lacking)),
            )
        self._mirror.sync(
            {int(r["t"]): (r["h"], sorted(int(x) for x in (r["l"] or []))) for r in contents if r["p"]},
            self._names(),
            self._fetch,
            (_neo4j_records.fingerprint(self._run), lambda: _neo4j_records.read_records(self._run)),
        )

    @property
    def warehouse(self) -> Warehouse:
        """The client-side DuckDB copy, in step with the server, opened read-only."""
        self._sync()
        return self._mirror.reader()

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on the client-side copy (views ``ops``, ``deps``, ``missing_deps``,
        ``messages``, ``meta``, ``lineage`` by trace name, ``traces``, and the published runs:
        ``runs``, ``rank_breakdown``, ``comparisons``, ``opportunities``, ``measured_runs``,
        ``measurements``, ``tuner_runs``, ``tuner_steps``, ``calibrations``,
        ``calibration_points``, ``sweep_points``), read-only and with no access to other files
        (:meth:`Warehouse.open <etstore.store.warehouse.Warehouse.open>`).
        """
        return self.warehouse.query(query, params)


_satisfies_store: type[Store] = Neo4jStore  # mypy checks the reader against the interface
