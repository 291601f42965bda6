"""The server store: Neo4j 5 over Bolt, selected by a ``neo4j://`` or ``bolt://`` URL.

What lives where:

- On the server: the graph (``(:Op)-[:DEP]->(:Op)``, ``(:Op)-[:MSG]->(:Op)``, as in
  the embedded store), the catalog as ``(:EtstoreContent)`` nodes (each content once)
  and ``(:EtstoreTrace)`` nodes (the names pointing at them; see
  :mod:`etstore.store._neo4j_catalog`), and each content's lossless payload as
  ``(:EtstorePayload)`` nodes, so every client sees, loads and exports every trace.
- On the client: a DuckDB warehouse (``$ETSTORE_WAREHOUSE`` or a per-server
  directory under the user cache) that mirrors the server's ready traces for SQL,
  and holds the simulator's metrics.

An ingest of new content claims a content node and a name node in state ``loading``
(reserving the content hash and the name), writes nodes, edges and payload, then
flips both to ``ready`` in one transaction — the commit point. Known content under a
new name gets only the name node (and lineage from a new parent, if any). A trace of
up to ``single_tx_rows`` rows is written in one transaction, so a failure cannot
leave any of it behind even for a moment; a larger one is written in batches whose
leftovers are removed on failure or interrupt, and by the next writable open if the
client died (after ``stale_after_s`` without a heartbeat).

Credentials come from the URL (``neo4j://user:pass@host:7687``) or from
``NEO4J_USERNAME``/``NEO4J_USER`` and ``NEO4J_PASSWORD``; :attr:`location`, ``repr``,
log lines and error messages never contain them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.dag import cycle_members
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import Trace, TraceKind
from etstore.store._cypher import check_parameters, resolve_names
from etstore.store._identity import choose_name, identity
from etstore.store._mirror import Mirror, NameRow
from etstore.store._neo4j_catalog import SCHEMA, check_format, upgrade_format1
from etstore.store._neo4j_dialect import column, driver, message, plain, translate_cypher
from etstore.store._neo4j_load import decode_payload, edge_batches, encode_payload, node_batches
from etstore.store._neo4j_target import Neo4jTarget, default_warehouse, parse_url
from etstore.store._streamed import gather
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.catalog import FORMAT_VERSION
from etstore.store.graph import (
    UID_SHIFT,
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

_CONTENT_FIELDS = ("kind", "content_hash", "ranks", "ops", "deps", "missing", "messages")


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
        The URL is malformed, the server is unreachable or refuses the credentials,
        the store is of a newer format, or of format 1 and opened read-only.
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
        neo4j = driver()
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
            if getattr(exc, "code", None) == "Neo.ClientError.Security.AuthenticationRateLimit":
                raise StoreError(
                    f"{self.location}: Neo4j has locked the account after too many wrong passwords; wait "
                    "for the lock to expire (dbms.security.auth_lock_time, 5 s by default) and retry "
                    "with the right credentials"
                ) from exc
            raise StoreError(f"{self.location}: cannot reach Neo4j: {message(exc)}") from exc
        try:
            version = check_format(self._run, self.location, read_only=read_only)
            if not read_only:
                for ddl in SCHEMA:
                    self._run(ddl)
                if version == 1:
                    upgrade_format1(self._run, self._write_tx)
                    log.warning("upgraded %s to the current store format", self.location)
                elif version is None:
                    self._run(
                        "MERGE (f:EtstoreFormat) ON CREATE SET f.version = $v",
                        {"v": FORMAT_VERSION},
                        write=True,
                    )
                self._sweep()
            server_id = self._run("CALL db.info() YIELD id RETURN id")[0]["id"]
        except BaseException:
            self.driver.close()
            raise
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
        neo4j = driver()
        mode = neo4j.WRITE_ACCESS if write else self._access
        return self.driver.session(database=self.target.database, default_access_mode=mode)

    def _run(self, query: str, params: Mapping[str, Any] | None = None, *, write: bool = False) -> list[Any]:
        """One auto-commit statement; engine failures become StoreError."""
        neo4j = driver()
        try:
            with self._session(write=write) as s:
                return list(s.run(query, dict(params or {})))
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc

    def _write_tx(self, query: str, params: Mapping[str, Any]) -> None:
        """One statement in one managed write transaction; engine failures become StoreError."""
        neo4j = driver()
        try:
            with self._session(write=True) as s:
                s.execute_write(lambda tx: tx.run(query, dict(params)).consume())
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {message(exc)}") from exc

    def _require_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"{self.location} is open read-only")

    # ------------------------------------------------------------ catalog

    @staticmethod
    def _info(name: Mapping[str, Any], content: Mapping[str, Any]) -> TraceInfo:
        created: Any = name.get("created")
        return TraceInfo(
            name=name["name"],
            source=name.get("source") or "",
            **{k: content[k] for k in _CONTENT_FIELDS},
            parent=name.get("parent"),
            params=json.loads(name.get("params") or "{}"),
            created=created.to_native() if hasattr(created, "to_native") else created,
            trace_id=int(content["seq"]),
        )

    _READY = (
        "MATCH (t:EtstoreTrace {status: 'ready'}) MATCH (c:EtstoreContent {seq: t.seq, status: 'ready'}) "
    )

    def traces(self) -> list[TraceInfo]:
        rows = self._run(self._READY + "RETURN t, c ORDER BY t.created, t.name")
        return [self._info(r["t"], r["c"]) for r in rows]

    def _ready(self, name: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """A ready name and its content."""
        rows = self._run(
            self._READY.replace("{status: 'ready'}", "{name: $n, status: 'ready'}", 1) + "RETURN t, c",
            {"n": name},
        )
        if not rows:
            known = sorted(t.name for t in self.traces())
            hint = f"; stored traces: {', '.join(known[:10])}" if known else "; the store is empty"
            raise UnknownTraceError(f"no trace named {name!r} in {self.location}{hint}")
        return rows[0]["t"], rows[0]["c"]

    def info(self, name: str) -> TraceInfo:
        return self._info(*self._ready(name))

    # ------------------------------------------------------------ ingest

    def _choose_name(self, wanted: str, explicit: bool, seq: int | None) -> tuple[str, bool]:
        """The name to store under, and whether it already points at content ``seq``."""
        taken = {
            r["n"]: int(r["s"]) for r in self._run("MATCH (t:EtstoreTrace) RETURN t.name AS n, t.seq AS s")
        }
        return choose_name(taken, wanted, explicit=explicit, seq=seq)

    def _name_props(
        self, trace: Trace, name: str, parent: str | None, parent_seq: int | None
    ) -> dict[str, Any]:
        return {
            "name": name,
            "source": trace.source,
            "parent": parent,
            "parent_seq": parent_seq,
            "params": json.dumps(dict(trace.params), sort_keys=True, default=str),
            "created": datetime.now(timezone.utc),
        }

    def _claim(
        self,
        trace: Trace,
        kind: TraceKind,
        wanted: str,
        explicit: bool,
        parent: str | None,
        digest: str,
        *,
        parent_seq: int | None = None,
    ) -> tuple[int, str]:
        """Create the ``loading`` content node and its first name node; returns (seq, name)."""
        neo4j = driver()
        for _ in range(100):
            name, _same = self._choose_name(wanted, explicit, None)
            content: dict[str, Any] = {
                "kind": kind.value,
                "content_hash": digest,
                "ranks": trace.num_ranks,
                "graph_name": name,
                "lineage_from": [],
                "created": datetime.now(timezone.utc),
            }
            props = self._name_props(trace, name, parent, parent_seq)
            try:
                with self._session(write=True) as s:
                    rec = s.execute_write(
                        lambda tx, c=content, p=props: tx.run(
                            "MERGE (k:EtstoreCounter {name: 'trace_seq'}) ON CREATE SET k.value = 0 "
                            "SET k.value = k.value + 1 "
                            "CREATE (c:EtstoreContent) SET c = $c, c.seq = k.value, c.status = 'loading', "
                            "c.ops = 0, c.deps = 0, c.missing = 0, c.messages = 0, c.heartbeat = timestamp() "
                            "CREATE (t:EtstoreTrace) SET t = $p, t.seq = k.value, t.status = 'loading' "
                            "RETURN c.seq AS seq",
                            c=c,
                            p=p,
                        ).single()
                    )
                return int(rec["seq"]), name
            except neo4j.exceptions.ConstraintError as exc:
                other = self._run(
                    "MATCH (c:EtstoreContent {content_hash: $h, kind: $k}) "
                    "RETURN c.graph_name AS n, c.status AS s",
                    {"h": digest, "k": kind.value},
                )
                if other:
                    raise StoreError(
                        f"the same trace is being ingested into {self.location} as {other[0]['n']!r} "
                        f"(state {other[0]['s']}); retry when that finishes"
                    ) from exc
                if explicit:
                    raise StoreError(
                        f"a different trace is already named {wanted!r}; pick another name or remove it"
                    ) from exc
                # another client took the name meanwhile: choose again
            except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
                raise StoreError(f"{self.location}: cannot register the trace: {message(exc)}") from exc
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
                s.run("MATCH (c:EtstoreContent {seq: $s}) SET c.heartbeat = timestamp()", s=seq).consume()

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
        self._require_writable()
        kind = checked_kind(trace)
        if lineage is not None and parent is None:
            raise StoreError(f"trace {name or trace.name!r}: lineage given without a parent trace")
        parent_content = self._ready(parent)[1] if parent is not None else None
        started = time.perf_counter()
        digest = identity(trace)
        existing = self._run(
            "MATCH (c:EtstoreContent {content_hash: $h, kind: $k, status: 'ready'}) RETURN c",
            {"h": digest, "k": kind.value},
        )
        if existing:
            content = existing[0]["c"]
            final, same = self._choose_name(name or trace.name, name is not None, int(content["seq"]))
            if same:
                info = self._info(*self._ready(final))
                return IngestReport(info, created=False, seconds=time.perf_counter() - started)
            info = self._add_name(trace, final, content, parent, parent_content, lineage)
            first = self._run(
                "MATCH (t:EtstoreTrace {seq: $s, status: 'ready'}) WHERE t.name <> $n "
                "RETURN t.name AS n ORDER BY t.created LIMIT 1",
                {"s": int(content["seq"]), "n": final},
            )
            return IngestReport(
                info,
                created=True,
                same_as=first[0]["n"] if first else None,
                seconds=time.perf_counter() - started,
            )
        parent_seq = int(parent_content["seq"]) if parent_content is not None else None
        seq, final = self._claim(
            trace, kind, name or trace.name, name is not None, parent, digest, parent_seq=parent_seq
        )
        try:
            info, cycles, unmatched = self._write(trace, seq, final, parent_content, lineage, progress)
        except BaseException as exc:
            self._purge(seq)
            neo4j = driver()
            if isinstance(exc, (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError)):
                raise StoreError(f"{self.location}: ingest of {final!r} failed: {message(exc)}") from exc
            raise
        return IngestReport(
            info,
            created=True,
            cycles=cycles,
            unmatched_sends=unmatched[0],
            unmatched_recvs=unmatched[1],
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
        """See :meth:`Store.ingest_parts <etstore.store.base.Store.ingest_parts>`: the parts
        are gathered into one trace, which is ingested as a whole (``ops`` is not needed)."""
        self._require_writable()
        trace = gather(parts, f"trace {name!r}" if name else "a streamed trace")
        return self.ingest(trace, name=name, progress=progress)

    def _write(
        self,
        trace: Trace,
        seq: int,
        final: str,
        parent_content: Mapping[str, Any] | None,
        lineage: pa.Table | None,
        progress: ProgressFn | None,
    ) -> tuple[TraceInfo, int, tuple[int, int]]:
        """Write a claimed content (graph, payload) and commit it with its name."""
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
        lineage_from: list[int] = []
        if lineage is not None and lineage.num_rows and parent_content is not None:
            links = self._lineage(lineage, nodes, parent_content, final)
            lineage_from = [int(parent_content["seq"])]
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
        extra = {f"lineage@{lineage_from[0]}": lineage_rows} if lineage_rows is not None else {}
        with self._writer(single, seq) as run:
            for i, (stage, batches) in enumerate(stages):
                for query, params, _rows in batches:
                    run(query, params)
                if progress:
                    progress(stage, i + 1, len(stages) + 1)
            for table, part, data in encode_payload(trace, extra):
                run(
                    "CREATE (:EtstorePayload {seq: $s, table: $t, part: $p, data: $d})",
                    {"s": seq, "t": table, "p": part, "d": data},
                )
            run(
                "MATCH (c:EtstoreContent {seq: $s, status: 'loading'}) "
                "SET c += $c, c.lineage_from = $l, c.status = 'ready' "
                "WITH c MATCH (t:EtstoreTrace {seq: $s, name: $n}) SET t.status = 'ready'",
                {"s": seq, "c": counts, "l": lineage_from, "n": final},
            )
        if progress:
            progress("catalog", len(stages) + 1, len(stages) + 1)
        # the edges as op rows, from the uids already computed
        op_pairs = (deps["from"].to_numpy() - base, deps["to"].to_numpy() - base)
        cycles = len(cycle_members(trace, op_pairs))
        got = self._run(
            self._READY.replace("{status: 'ready'}", "{name: $n, status: 'ready'}", 1) + "RETURN t, c",
            {"n": final},
        )
        if not got or int(got[0]["c"]["seq"]) != seq:
            raise StoreError(
                f"{self.location}: the ingest of {final!r} was removed by another client as abandoned; retry"
            )
        info = self._info(got[0]["t"], got[0]["c"])
        try:
            self._mirror.add(trace, seq, info.content_hash, extra)
            self._mirror.set_names(self._name_rows())
        except Exception as exc:  # the mirror is a cache: the next SQL query fills it
            log.warning("local SQL warehouse not updated for %s: %s", final, message(exc))
        return info, cycles, (unmatched_sends, unmatched_recvs)

    def _add_name(
        self,
        trace: Trace,
        final: str,
        content: Mapping[str, Any],
        parent: str | None,
        parent_content: Mapping[str, Any] | None,
        lineage: pa.Table | None,
    ) -> TraceInfo:
        """Point a new name at stored content, with lineage from a parent content it has none from yet."""
        neo4j = driver()
        seq = int(content["seq"])
        pseq = int(parent_content["seq"]) if parent_content is not None else None
        props = self._name_props(trace, final, parent, pseq)
        new_lineage = (
            lineage is not None
            and lineage.num_rows > 0
            and pseq is not None
            and pseq not in (content.get("lineage_from") or [])
        )
        try:
            with self._writer(True, seq) as run:
                if new_lineage and parent_content is not None and lineage is not None:
                    payload = self._payload(seq)["ops"]
                    child = pa.table(
                        {
                            "rank": payload["rank"],
                            "id": payload["id"],
                            "uid": pa.array(
                                range(uid_base(seq), uid_base(seq) + payload.num_rows), pa.int64()
                            ),
                        }
                    )
                    links = self._lineage(lineage, child, parent_content, final)
                    for query, params, _rows in edge_batches(
                        links.select(["from", "to"]), "BECOMES", self.batch_rows
                    ):
                        run(query, params)
                    table = f"lineage@{pseq}"
                    for t, part, data in encode_payload(None, {table: links.drop_columns(["from", "to"])}):
                        run(
                            "CREATE (:EtstorePayload {seq: $s, table: $t, part: $p, data: $d})",
                            {"s": seq, "t": t, "p": part, "d": data},
                        )
                    run(
                        "MATCH (c:EtstoreContent {seq: $s}) SET c.lineage_from = c.lineage_from + [$p]",
                        {"s": seq, "p": pseq},
                    )
                run(
                    "CREATE (t:EtstoreTrace) SET t = $p, t.seq = $s, t.status = 'ready'",
                    {"p": props, "s": seq},
                )
        except neo4j.exceptions.ConstraintError as exc:
            raise StoreError(f"{final!r} was taken by another client meanwhile; nothing was stored") from exc
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: cannot add the name {final!r}: {message(exc)}") from exc
        self._refresh_mirror_names()
        return self._info(*self._ready(final))

    def _lineage(self, lineage: pa.Table, nodes: pa.Table, parent: Mapping[str, Any], final: str) -> pa.Table:
        """Lineage rows with uids: ``from``/``to`` for the graph plus the SQL table's columns."""
        pseq = int(parent["seq"])
        pops = self._payload(pseq)["ops"]
        base = uid_base(pseq)
        parent_ops = pa.table(
            {
                "rank": pops["rank"],
                "id": pops["id"],
                "uid": pa.array(range(base, base + pops.num_rows), pa.int64()),
            }
        )
        links = lineage_edges(lineage, nodes, parent_ops, what=f"trace {final!r}")
        return pa.table(
            {
                "from": links["from"],
                "to": links["to"],
                "rank": lineage["rank"].cast(pa.int32()),
                "id": lineage["id"].cast(pa.uint64()),
                "parent_id": lineage["parent_id"].cast(pa.uint64()),
                "parent_uid": links["from"],
                "uid": links["to"],
            }
        )

    # ------------------------------------------------------------ removal

    def _purge(self, seq: int) -> None:
        """Remove content ``seq`` (ops with their edges, payload), its names, then its node."""
        lo = uid_base(seq)
        self._run(
            "MATCH (c:EtstoreContent {seq: $s}) SET c.status = 'deleting', c.heartbeat = timestamp()",
            {"s": seq},
            write=True,
        )
        self._run(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
            "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
            {"lo": lo, "hi": lo + (1 << UID_SHIFT)},
            write=True,
        )
        self._run(
            "MATCH (p:EtstorePayload {seq: $s}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
            {"s": seq},
            write=True,
        )
        self._run("MATCH (t:EtstoreTrace {seq: $s}) DELETE t", {"s": seq}, write=True)
        self._run("MATCH (c:EtstoreContent {seq: $s}) DELETE c", {"s": seq}, write=True)
        try:
            self._mirror.drop(seq)
            self._mirror.set_names(self._name_rows())
        except Exception as exc:  # the mirror is a cache: the next SQL query drops it
            log.warning("local SQL warehouse still holds trace id %d: %s", seq, message(exc))

    def _sweep(self) -> None:
        """Remove contents whose ingest or removal was abandoned (no heartbeat for
        ``stale_after_s``) or that no name points at, and rename graphs whose name went."""
        rows = self._run(
            "MATCH (c:EtstoreContent) WHERE (c.status <> 'ready' AND c.heartbeat < timestamp() - $age) "
            "OR (c.status = 'ready' AND NOT EXISTS { MATCH (t:EtstoreTrace {seq: c.seq}) }) "
            "RETURN c.seq AS seq, c.graph_name AS name",
            {"age": int(self.stale_after_s * 1000)},
        )
        for r in rows:
            log.warning("removing incomplete trace %s left by an interrupted ingest or removal", r["name"])
            self._purge(int(r["seq"]))
        orphans = self._run(
            "MATCH (c:EtstoreContent {status: 'ready'}) "
            "WHERE NOT EXISTS { MATCH (t:EtstoreTrace {seq: c.seq, name: c.graph_name}) } "
            "MATCH (t:EtstoreTrace {seq: c.seq, status: 'ready'}) "
            "WITH c, t ORDER BY t.created RETURN c.seq AS seq, collect(t.name)[0] AS name"
        )
        for r in orphans:
            self._rename_graph(int(r["seq"]), r["name"])

    def _rename_graph(self, seq: int, name: str) -> None:
        """Make content ``seq``'s ``Op`` nodes carry ``name`` (the one they carried was removed)."""
        lo = uid_base(seq)
        self._run(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
            "CALL { WITH o SET o.trace = $n } IN TRANSACTIONS OF 10000 ROWS",
            {"lo": lo, "hi": lo + (1 << UID_SHIFT), "n": name},
            write=True,
        )
        self._run(
            "MATCH (c:EtstoreContent {seq: $s}) SET c.graph_name = $n", {"s": seq, "n": name}, write=True
        )

    def remove(self, name: str) -> None:
        self._require_writable()
        content = self._ready(name)[1]
        seq = int(content["seq"])
        rest = self._run(
            "MATCH (t:EtstoreTrace {name: $n}) WITH t, t.parent_seq AS pseq DELETE t "
            "WITH pseq OPTIONAL MATCH (o:EtstoreTrace {seq: $s}) WITH pseq, o ORDER BY o.created "
            "WITH pseq, collect(o) AS rest "
            "MATCH (c:EtstoreContent {seq: $s}) "
            "SET c.status = CASE size(rest) WHEN 0 THEN 'deleting' ELSE c.status END, "
            "c.heartbeat = timestamp() "
            "RETURN pseq, [x IN rest | x.name] AS names, [x IN rest | x.parent_seq] AS parents",
            {"n": name, "s": seq},
            write=True,
        )
        if not rest or not rest[0]["names"]:
            self._purge(seq)
            return
        pseq, names, parents = rest[0]["pseq"], rest[0]["names"], rest[0]["parents"]
        if pseq is not None and pseq not in parents:  # the last name derived from that parent
            lo, plo = uid_base(seq), uid_base(int(pseq))
            self._run(
                "MATCH (a:Op)-[r:BECOMES]->(b:Op) WHERE a.uid >= $plo AND a.uid < $phi "
                "AND b.uid >= $lo AND b.uid < $hi DELETE r",
                {"plo": plo, "phi": plo + (1 << UID_SHIFT), "lo": lo, "hi": lo + (1 << UID_SHIFT)},
                write=True,
            )
            self._run(
                "MATCH (p:EtstorePayload {seq: $s, table: $t}) DELETE p "
                "WITH count(*) AS n MATCH (c:EtstoreContent {seq: $s}) "
                "SET c.lineage_from = [x IN c.lineage_from WHERE x <> $p]",
                {"s": seq, "t": f"lineage@{pseq}", "p": pseq},
                write=True,
            )
        if content.get("graph_name") == name:
            self._rename_graph(seq, names[0])
        self._refresh_mirror_names()

    # ------------------------------------------------------------ read back

    def _payload(self, seq: int) -> dict[str, pa.Table]:
        rows = self._run(
            "MATCH (p:EtstorePayload {seq: $s}) RETURN p.table AS t, p.part AS p, p.data AS d", {"s": seq}
        )
        return decode_payload([(r["t"], r["p"], r["d"]) for r in rows], f"{self.location} trace id {seq}")

    def _fetch(self, seq: int) -> tuple[Trace, dict[str, pa.Table]]:
        """A content's trace and its lineage tables (``lineage@<parent seq>``), for the mirror."""
        tables = self._payload(seq)
        links = {k: tables.pop(k) for k in list(tables) if k.startswith("lineage")}
        return Trace(**tables, name=f"#{seq}"), links

    def load(self, name: str) -> Trace:
        """The full columnar trace back, byte-exact, from the server's payload."""
        node, content = self._ready(name)
        tables = self._payload(int(content["seq"]))
        return Trace(
            **{k: v for k, v in tables.items() if not k.startswith("lineage")},
            name=node["name"],
            kind=content["kind"],
            source=node.get("source") or "",
            params=json.loads(node.get("params") or "{}"),
        )

    # ------------------------------------------------------------ queries

    def _second_names(self) -> dict[str, str]:
        rows = self._run(
            self._READY + "WITH t, c WHERE t.name <> c.graph_name RETURN t.name AS n, c.graph_name AS g"
        )
        return {r["n"]: r["g"] for r in rows}

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the server (read access mode when the store is read-only).

        A ``$parameter`` without a value is refused; a trace name whose content the graph
        holds under another of its names is resolved to it (:mod:`etstore.store._cypher`);
        Ladybug spellings etstore documents are translated (:func:`translate_cypher`).
        Nodes come back as dicts of their properties plus ``_ID`` and ``_LABEL``.
        """
        neo4j = driver()
        check_parameters(query, params)
        resolved, values = resolve_names(query, params, self._second_names())
        text = translate_cypher(resolved)
        try:
            with self._session() as s:
                res = s.run(text, values)
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

    def _name_rows(self) -> list[NameRow]:
        return [
            NameRow(info=self._info(r["t"], r["c"]), parent_seq=r["t"].get("parent_seq"))
            for r in self._run(self._READY + "RETURN t, c")
        ]

    def _refresh_mirror_names(self) -> None:
        try:
            self._mirror.set_names(self._name_rows())
        except Exception as exc:  # the mirror is a cache: the next SQL query fills it
            log.warning("local SQL warehouse names not updated: %s", message(exc))

    def _sync(self) -> None:
        contents = self._run(
            "MATCH (c:EtstoreContent {status: 'ready'}) RETURN c.seq AS s, c.content_hash AS h, "
            "c.lineage_from AS l"
        )
        self._mirror.sync(
            {int(r["s"]): (r["h"], sorted(int(x) for x in (r["l"] or []))) for r in contents},
            self._name_rows(),
            self._fetch,
        )

    @property
    def warehouse(self) -> Warehouse:
        """The client-side DuckDB warehouse, brought in step with the server's traces."""
        self._sync()
        return self._mirror.warehouse

    def sql(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run SQL on the client-side DuckDB warehouse (views ``ops``, ``deps``, ``missing_deps``,
        ``messages``, ``meta``, ``lineage`` by trace name, ``traces`` and the simulator's metrics).

        On a read-only store the query runs on that file opened read-only with no access to
        other files (:meth:`Warehouse.open <etstore.store.warehouse.Warehouse.open>`), once
        it is in step with the server.
        """
        if not self.read_only:
            return self.warehouse.query(query, params)
        self._sync()
        self._mirror.close()  # DuckDB holds a file either writable or read-only in one process
        with Warehouse.open(self._mirror.path, read_only=True) as warehouse:
            return warehouse.query(query, params)


_satisfies_store: type[Store] = Neo4jStore  # mypy checks the backend against the interface
