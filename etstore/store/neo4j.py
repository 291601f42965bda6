"""The server store: Neo4j 5 over Bolt, selected by a ``neo4j://`` or ``bolt://`` URL.

What lives where:

- On the server: the graph (``(:Op)-[:DEP]->(:Op)``, ``(:Op)-[:MSG]->(:Op)``, as in
  the embedded store), the catalog as ``(:EtstoreTrace)`` nodes, and each trace's
  lossless payload as ``(:EtstorePayload)`` nodes, so every client sees, loads and
  exports every trace.
- On the client: a DuckDB warehouse (``$ETSTORE_WAREHOUSE`` or a per-server
  directory under the user cache) that mirrors the server's ready traces for SQL,
  and holds the simulator's metrics.

An ingest claims a catalog node in state ``loading`` (which also reserves the name
and the content hash), writes nodes, edges and payload, then flips the node to
``ready`` — the commit point. A trace of up to ``single_tx_rows`` rows is written
in one transaction, so a failure cannot leave any of it behind even for a moment;
a larger one is written in batches whose leftovers are removed on failure or
interrupt, and by the next writable open if the client died (after
``stale_after_s`` without a heartbeat).

Credentials come from the URL (``neo4j://user:pass@host:7687``) or from
``NEO4J_USERNAME``/``NEO4J_USER`` and ``NEO4J_PASSWORD``; :attr:`location`, ``repr``,
log lines and error messages never contain them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.dag import cycle_members
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import Trace, TraceKind, content_hash
from etstore.store._mirror import Mirror
from etstore.store._neo4j_load import decode_payload, edge_batches, encode_payload, node_batches
from etstore.store._neo4j_target import Neo4jTarget, default_warehouse, parse_url
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.graph import (
    GRAPH_OP_COLUMNS,
    dep_edges,
    lineage_edges,
    message_edges,
    op_nodes,
    uid_base,
)
from etstore.store.result import Result
from etstore.store.warehouse import Warehouse

__all__ = ["Neo4jStore", "Neo4jTarget", "parse_url", "translate_cypher"]

log = logging.getLogger(__name__)
# the driver logs connection failures itself; etstore reports them as one line instead
logging.getLogger("neo4j").setLevel(logging.CRITICAL)

_SCHEMA = [
    "CREATE CONSTRAINT etstore_op_uid IF NOT EXISTS FOR (o:Op) REQUIRE o.uid IS UNIQUE",
    "CREATE INDEX etstore_op_trace IF NOT EXISTS FOR (o:Op) ON (o.trace)",
    "CREATE CONSTRAINT etstore_trace_name IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.name IS UNIQUE",
    "CREATE CONSTRAINT etstore_trace_seq IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.seq IS UNIQUE",
    "CREATE CONSTRAINT etstore_trace_content IF NOT EXISTS "
    "FOR (t:EtstoreTrace) REQUIRE (t.content_hash, t.kind) IS UNIQUE",
    "CREATE CONSTRAINT etstore_counter IF NOT EXISTS FOR (c:EtstoreCounter) REQUIRE c.name IS UNIQUE",
    "CREATE INDEX etstore_payload_seq IF NOT EXISTS FOR (p:EtstorePayload) ON (p.seq)",
]
_TRACE_FIELDS = ("name", "kind", "source", "content_hash", "ranks", "ops", "deps", "missing", "messages")


# ---------------------------------------------------------------- dialect


_REL_VAR = re.compile(r"-\[\s*([A-Za-z_][A-Za-z0-9_]*)")
_LABEL_CALL = re.compile(r"\blabel\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", re.IGNORECASE)
_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")


def translate_cypher(query: str) -> str:
    """Rewrite the Ladybug spellings etstore documents into Neo4j's, outside string literals.

    ``label(r)`` of a relationship variable becomes ``type(r)``; ``label(n)`` of a
    node becomes ``head(labels(n))``. Everything else passes through unchanged.
    """
    pieces: list[str] = []
    last = 0
    rels = set(_REL_VAR.findall(_STRINGS.sub("''", query)))

    def fix(segment: str) -> str:
        return _LABEL_CALL.sub(
            lambda m: f"type({m[1]})" if m[1] in rels else f"head(labels({m[1]}))", segment
        )

    for m in _STRINGS.finditer(query):
        pieces.append(fix(query[last : m.start()]))
        pieces.append(m[0])
        last = m.end()
    pieces.append(fix(query[last:]))
    return "".join(pieces)


def _driver() -> Any:
    """The ``neo4j`` driver package."""
    import neo4j  # about a second to import: only server stores pay for it, on first use

    return neo4j


def _plain(value: Any) -> Any:
    """A driver value as plain Python: nodes and relationships become dicts, temporals native."""
    graph = _driver().graph
    if isinstance(value, graph.Node):
        labels = sorted(value.labels)
        out: dict[str, Any] = {"_ID": value.element_id, "_LABEL": labels[0] if labels else None}
        if "Op" in value.labels:
            out.update({c: value.get(c) for c in GRAPH_OP_COLUMNS})
        out.update({k: _plain(v) for k, v in value.items() if k not in out})
        return out
    if isinstance(value, graph.Relationship):
        rel: dict[str, Any] = {
            "_SRC": value.start_node.element_id if value.start_node is not None else None,
            "_DST": value.end_node.element_id if value.end_node is not None else None,
            "_LABEL": value.type,
            "_ID": value.element_id,
        }
        rel.update({k: _plain(v) for k, v in value.items()})
        return rel
    if isinstance(value, graph.Path):
        return {"_NODES": [_plain(n) for n in value.nodes], "_RELS": [_plain(r) for r in value.relationships]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "to_native"):
        return value.to_native()
    return value


def _column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in one column: keep them readable
        return pa.array([None if v is None else json.dumps(v, default=str) for v in values], pa.string())


def _message(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- the store


class Neo4jStore:
    """A Neo4j 5 server as an etstore store (see the module docstring).

    Parameters
    ----------
    url
        ``neo4j://`` or ``bolt://`` URL, optionally with ``user:password@`` and a
        ``/database`` path.
    read_only
        Open every session in read access mode: ingest and remove refuse, and the
        server rejects any Cypher that writes.
    warehouse
        Directory of the client-side DuckDB warehouse (default: see module docstring).
    batch_rows
        Rows per Cypher statement in bulk loads.
    single_tx_rows
        Traces with at most this many nodes + edges are written in one transaction.
    stale_after_s
        A ``loading`` trace whose heartbeat is older than this is treated as abandoned.

    Raises
    ------
    StoreError
        The URL is malformed, the server is unreachable or refuses the credentials.
    """

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        warehouse: str | os.PathLike[str] | None = None,
        batch_rows: int = 20_000,
        single_tx_rows: int = 200_000,
        stale_after_s: float = 120.0,
    ) -> None:
        neo4j = _driver()
        self.target = parse_url(url)
        self.location = self.target.location
        self.read_only = read_only
        self.batch_rows = batch_rows
        self.single_tx_rows = single_tx_rows
        self.stale_after_s = stale_after_s
        self._access = neo4j.READ_ACCESS if read_only else neo4j.WRITE_ACCESS
        try:
            self.driver = neo4j.GraphDatabase.driver(
                self.target.uri, auth=self.target.auth, notifications_min_severity="OFF"
            )
            self.driver.verify_connectivity()
        except neo4j.exceptions.AuthError as exc:
            raise StoreError(
                f"{self.location}: Neo4j refused the credentials "
                "(from the URL or NEO4J_USERNAME/NEO4J_PASSWORD)"
            ) from exc
        except (neo4j.exceptions.DriverError, neo4j.exceptions.Neo4jError, OSError, ValueError) as exc:
            raise StoreError(f"{self.location}: cannot reach Neo4j: {_message(exc)}") from exc
        if not read_only:
            for ddl in _SCHEMA:
                self._run(ddl)
            self._sweep()
        server_id = self._run("CALL db.info() YIELD id RETURN id")[0]["id"]
        self._mirror = Mirror(Path(warehouse) if warehouse else default_warehouse(self.target), server_id)

    def __repr__(self) -> str:
        return f"Neo4jStore({self.location!r}, read_only={self.read_only})"

    def __enter__(self) -> Neo4jStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._mirror.close()
        self.driver.close()

    # ------------------------------------------------------------ sessions

    def _session(self, *, write: bool = False) -> Any:
        neo4j = _driver()
        mode = neo4j.WRITE_ACCESS if write else self._access
        return self.driver.session(database=self.target.database, default_access_mode=mode)

    def _run(self, query: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[Any]:
        """One auto-commit statement; engine failures become StoreError."""
        neo4j = _driver()
        try:
            with self._session(write=write) as s:
                return list(s.run(query, dict(params or {})))
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {_message(exc)}") from exc

    def _require_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")

    # ------------------------------------------------------------ catalog

    @staticmethod
    def _info(node: Mapping[str, Any]) -> TraceInfo:
        created: Any = node.get("created")
        return TraceInfo(
            **{k: node[k] for k in _TRACE_FIELDS},
            parent=node.get("parent"),
            params=json.loads(node.get("params") or "{}"),
            created=created.to_native() if hasattr(created, "to_native") else created,
        )

    def traces(self) -> list[TraceInfo]:
        rows = self._run("MATCH (t:EtstoreTrace {status: 'ready'}) RETURN t ORDER BY t.seq")
        return [self._info(r["t"]) for r in rows]

    def _ready(self, name: str) -> Mapping[str, Any]:
        rows = self._run("MATCH (t:EtstoreTrace {name: $n, status: 'ready'}) RETURN t", {"n": name})
        if not rows:
            known = sorted(t.name for t in self.traces())
            hint = f"; stored traces: {', '.join(known[:10])}" if known else "; the store is empty"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return rows[0]["t"]

    def info(self, name: str) -> TraceInfo:
        return self._info(self._ready(name))

    # ------------------------------------------------------------ ingest

    def _claim(
        self, trace: Trace, kind: TraceKind, wanted: str, explicit: bool, parent: str | None, digest: str
    ) -> tuple[int, str]:
        """Create the ``loading`` catalog node; returns (seq, final name)."""
        neo4j = _driver()
        taken = {r["n"] for r in self._run("MATCH (t:EtstoreTrace) RETURN t.name AS n")}
        for _ in range(100):
            name = wanted
            if name in taken:
                if explicit:
                    raise StoreError(
                        f"a different trace is already named {wanted!r}; pick another name or remove it"
                    )
                i = 2
                while f"{wanted}-{i}" in taken:
                    i += 1
                name = f"{wanted}-{i}"
            props = {
                "name": name,
                "kind": kind.value,
                "source": trace.source,
                "content_hash": digest,
                "ranks": trace.num_ranks,
                "parent": parent,
                "params": json.dumps(dict(trace.params), sort_keys=True, default=str),
                "created": datetime.now(timezone.utc),
            }
            try:
                with self._session(write=True) as s:
                    rec = s.execute_write(
                        lambda tx, p=props: tx.run(
                            "MERGE (c:EtstoreCounter {name: 'trace_seq'}) ON CREATE SET c.value = 0 "
                            "SET c.value = c.value + 1 "
                            "CREATE (t:EtstoreTrace) SET t = $p, t.seq = c.value, t.status = 'loading', "
                            "t.ops = 0, t.deps = 0, t.missing = 0, t.messages = 0, t.heartbeat = timestamp() "
                            "RETURN t.seq AS seq",
                            p=p,
                        ).single()
                    )
                return int(rec["seq"]), name
            except neo4j.exceptions.ConstraintError as exc:
                other = self._run(
                    "MATCH (t:EtstoreTrace {content_hash: $h, kind: $k}) RETURN t.name AS n, t.status AS s",
                    {"h": digest, "k": kind.value},
                )
                if other:
                    raise StoreError(
                        f"the same trace is being ingested into {self.location} as {other[0]['n']!r} "
                        f"(state {other[0]['s']}); retry when that finishes"
                    ) from exc
                taken.add(name)  # another client took the name meanwhile
            except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
                raise StoreError(f"{self.location}: cannot register the trace: {_message(exc)}") from exc
        raise StoreError(f"{self.location}: could not find a free name for {wanted!r}")

    @contextmanager
    def _writer(self, single: bool, seq: int) -> Iterator[Callable[[str, Mapping[str, Any]], None]]:
        """Run statements in one transaction (``single``) or one per statement with heartbeats."""
        with self._session(write=True) as s:
            if single:
                with s.begin_transaction() as tx:
                    yield lambda q, p: tx.run(q, dict(p)).consume()
                    tx.commit()
                return

            def run(q: str, p: Mapping[str, Any]) -> None:
                s.execute_write(lambda tx: tx.run(q, dict(p)).consume())
                s.run("MATCH (t:EtstoreTrace {seq: $s}) SET t.heartbeat = timestamp()", s=seq).consume()

            yield run

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
        neo4j = _driver()
        self._require_writable()
        kind = checked_kind(trace)
        if lineage is not None and parent is None:
            raise StoreError(f"trace {name or trace.name!r}: lineage given without a parent trace")
        parent_node = self._ready(parent) if parent is not None else None
        started = time.perf_counter()
        digest = content_hash(trace)
        existing = self._run(
            "MATCH (t:EtstoreTrace {content_hash: $h, kind: $k, status: 'ready'}) RETURN t",
            {"h": digest, "k": kind.value},
        )
        if existing:
            return IngestReport(
                self._info(existing[0]["t"]), created=False, seconds=time.perf_counter() - started
            )
        seq, final = self._claim(trace, kind, name or trace.name, name is not None, parent, digest)
        try:
            base = uid_base(seq)
            nodes = op_nodes(trace, final, base)
            deps = dep_edges(trace, base)
            msgs, unmatched_sends, unmatched_recvs = message_edges(trace, base)
            counts = {
                "ops": trace.num_ops,
                "deps": trace.num_deps,
                "missing": trace.num_missing,
                "messages": msgs.num_rows,
            }
            links = None
            if lineage is not None and lineage.num_rows and parent_node is not None:
                links = self._lineage(lineage, nodes, parent_node, final)
            becomes = (
                links.select(["from", "to"]) if links is not None else msgs.slice(0, 0).select(["from", "to"])
            )
            rows = nodes.num_rows + deps.num_rows + msgs.num_rows + becomes.num_rows
            single = rows <= self.single_tx_rows
            stages = [
                ("nodes", node_batches(nodes, final, self.batch_rows)),
                ("deps", edge_batches(deps, "DEP", self.batch_rows)),
                ("messages", edge_batches(msgs, "MSG", self.batch_rows)),
                ("lineage", edge_batches(becomes, "BECOMES", self.batch_rows)),
            ]
            lineage_rows = links.drop_columns(["from", "to"]) if links is not None else None
            with self._writer(single, seq) as run:
                for i, (stage, batches) in enumerate(stages):
                    for query, params, _rows in batches:
                        run(query, params)
                    if progress:
                        progress(stage, i + 1, len(stages) + 1)
                for table, part, data in encode_payload(trace, lineage_rows):
                    run(
                        "CREATE (:EtstorePayload {seq: $s, table: $t, part: $p, data: $d})",
                        {"s": seq, "t": table, "p": part, "d": data},
                    )
                run(
                    "MATCH (t:EtstoreTrace {seq: $s, status: 'loading'}) SET t += $c, t.status = 'ready'",
                    {"s": seq, "c": counts},
                )
            if progress:
                progress("catalog", len(stages) + 1, len(stages) + 1)
            # the edges as op rows, from the uids already computed
            rows = (deps["from"].to_numpy() - base, deps["to"].to_numpy() - base)
            cycles = len(cycle_members(trace, rows))
            node = self._run("MATCH (t:EtstoreTrace {seq: $s, status: 'ready'}) RETURN t", {"s": seq})
            if not node:
                raise StoreError(
                    f"{self.location}: the ingest of {final!r} was removed by another client "
                    "as abandoned; retry"
                )
            info = self._info(node[0]["t"])
        except BaseException as exc:
            self._purge(seq, final)
            if isinstance(exc, (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError)):
                raise StoreError(f"{self.location}: ingest of {final!r} failed: {_message(exc)}") from exc
            raise
        try:
            self._mirror.add(trace, info, seq=seq, lineage=lineage_rows)
        except Exception as exc:  # the mirror is a cache: the next SQL query fills it
            log.warning("local SQL warehouse not updated for %s: %s", final, _message(exc))
        return IngestReport(
            info,
            created=True,
            cycles=cycles,
            unmatched_sends=unmatched_sends,
            unmatched_recvs=unmatched_recvs,
            seconds=time.perf_counter() - started,
        )

    def _lineage(self, lineage: pa.Table, nodes: pa.Table, parent: Mapping[str, Any], final: str) -> pa.Table:
        """Lineage rows with uids: ``from``/``to`` for the graph plus the SQL table's columns."""
        pops = self._payload(parent)["ops"]
        base = uid_base(int(parent["seq"]))
        parent_ops = pa.table(
            {
                "rank": pops["rank"],
                "id": pops["id"],
                "uid": pa.array(range(base, base + pops.num_rows), pa.int64()),
            }
        )
        links = lineage_edges(lineage, nodes, parent_ops, what=f"trace {final!r}")
        n = links.num_rows
        return pa.table(
            {
                "from": links["from"],
                "to": links["to"],
                "rank": lineage["rank"].cast(pa.int32()),
                "id": lineage["id"].cast(pa.uint64()),
                "parent_trace": pa.array([parent["name"]] * n, pa.string()),
                "parent_id": lineage["parent_id"].cast(pa.uint64()),
                "parent_uid": links["from"],
                "uid": links["to"],
            }
        )

    # ------------------------------------------------------------ removal

    def _purge(self, seq: int, name: str) -> None:
        """Remove every node of ``seq`` (ops with their edges, payload), then the catalog node."""
        lo = uid_base(seq)
        self._run(
            "MATCH (t:EtstoreTrace {seq: $s}) SET t.status = 'deleting', t.heartbeat = timestamp()",
            {"s": seq},
            write=True,
        )
        self._run(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
            "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
            {"lo": lo, "hi": lo + (1 << 40)},
            write=True,
        )
        self._run(
            "MATCH (p:EtstorePayload {seq: $s}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
            {"s": seq},
            write=True,
        )
        self._run("MATCH (t:EtstoreTrace {seq: $s}) DELETE t", {"s": seq}, write=True)
        try:
            self._mirror.drop(name)
        except Exception as exc:  # the mirror is a cache: the next SQL query drops it
            log.warning("local SQL warehouse still holds %s: %s", name, _message(exc))

    def _sweep(self) -> None:
        """Remove traces whose ingest or removal was abandoned (no heartbeat for ``stale_after_s``)."""
        rows = self._run(
            "MATCH (t:EtstoreTrace) WHERE t.status <> 'ready' AND t.heartbeat < timestamp() - $age "
            "RETURN t.seq AS seq, t.name AS name",
            {"age": int(self.stale_after_s * 1000)},
        )
        for r in rows:
            log.warning("removing incomplete trace %s left by an interrupted ingest", r["name"])
            self._purge(int(r["seq"]), r["name"])

    def remove(self, name: str) -> None:
        self._require_writable()
        node = self._ready(name)
        self._purge(int(node["seq"]), node["name"])

    # ------------------------------------------------------------ read back

    def _payload(self, node: Mapping[str, Any]) -> dict[str, pa.Table]:
        rows = self._run(
            "MATCH (p:EtstorePayload {seq: $s}) RETURN p.table AS t, p.part AS p, p.data AS d",
            {"s": node["seq"]},
        )
        return decode_payload(
            [(r["t"], r["p"], r["d"]) for r in rows], f"{self.location} trace {node['name']!r}"
        )

    def _load(self, node: Mapping[str, Any]) -> tuple[Trace, pa.Table | None]:
        tables = self._payload(node)
        links = tables.pop("lineage", None)
        trace = Trace(
            **tables,
            name=node["name"],
            kind=node["kind"],
            source=node["source"],
            params=json.loads(node.get("params") or "{}"),
        )
        return trace, links

    def _fetch(self, node: Mapping[str, Any]) -> tuple[Trace, TraceInfo, pa.Table | None]:
        trace, links = self._load(node)
        return trace, self._info(node), links

    def load(self, name: str) -> Trace:
        """The full columnar trace back, byte-exact, from the server's payload."""
        return self._load(self._ready(name))[0]

    # ------------------------------------------------------------ queries

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the server (read access mode when the store is read-only).

        Ladybug spellings etstore documents are translated first (:func:`translate_cypher`).
        Nodes come back as dicts of their properties plus ``_ID`` and ``_LABEL``.
        """
        neo4j = _driver()
        text = translate_cypher(query)
        try:
            with self._session() as s:
                res = s.run(text, dict(params or {}))
                keys = list(res.keys())
                rows = [tuple(rec.values()) for rec in res]
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise QueryError(f"Cypher error: {_message(exc)} (query: {query!r})") from exc
        if not keys:
            return Result(pa.table({}), query)
        cols = list(zip(*rows, strict=True)) if rows else [() for _ in keys]
        return Result(
            pa.table({k: _column([_plain(v) for v in c]) for k, c in zip(keys, cols, strict=True)}), query
        )

    def _sync(self) -> None:
        ready = self._run("MATCH (t:EtstoreTrace {status: 'ready'}) RETURN t")
        by_name = {r["t"]["name"]: r["t"] for r in ready}
        self._mirror.sync(
            [(n, int(t["seq"]), t["content_hash"]) for n, t in by_name.items()],
            lambda n: self._fetch(by_name[n]),
        )

    @property
    def warehouse(self) -> Warehouse:
        """The client-side DuckDB warehouse, brought in step with the server's traces."""
        self._sync()
        return self._mirror.warehouse

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on the client-side DuckDB warehouse (``ops``, ``deps``, ``missing_deps``,
        ``messages``, ``meta``, ``traces`` and the simulator's metrics)."""
        return self.warehouse.query(query, params)


_satisfies_store: type[Store] = Neo4jStore  # mypy checks the backend against the interface
