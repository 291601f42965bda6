"""The server store: Neo4j 5 over Bolt, selected by a ``neo4j://`` or ``bolt://`` URL.

What lives where:

- On the server: the graph (``(:Op)-[:DEP]->(:Op)``, ``(:Op)-[:MSG]->(:Op)`` and one
  ``(:Trace)`` node per name, as in the embedded store), the catalog as
  ``(:EtstoreContent)`` nodes (each content once) and ``(:EtstoreTrace)`` nodes (the names
  pointing at them; see :mod:`etstore.store._neo4j_catalog`), and each content's lossless
  payload as ``(:EtstorePayload)`` nodes, so every client sees, loads and exports every trace.
- On the client: a DuckDB warehouse (``$ETSTORE_WAREHOUSE`` or a per-server
  directory under the user cache) that mirrors the server's ready traces for SQL,
  and holds the simulator's metrics.

An ingest of new content claims a content node and a name node in state ``loading``
(reserving the content hash and the name), writes nodes, edges and payload, then
flips both to ``ready`` and creates the name's ``Trace`` node in one transaction — the
commit point. Known content under a new name gets only the name's two nodes (and lineage
from a new parent, if any). A trace of up to ``single_tx_rows`` rows is written in one
transaction, so a failure cannot leave any of it behind even for a moment; a larger one
is written in batches whose leftovers are removed on failure or interrupt
(:mod:`etstore.store._neo4j_remove`), and by the next writable open if the client died
(after ``stale_after_s`` without a heartbeat).

Credentials come from the URL (``neo4j://user:pass@host:7687``) or from
``NEO4J_USERNAME``/``NEO4J_USER`` and ``NEO4J_PASSWORD``; :attr:`location`, ``repr``,
log lines and error messages never contain them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.dag import cycle_members
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.model import Trace, TraceKind
from etstore.store._cypher import check_parameters
from etstore.store._identity import choose_name, identity
from etstore.store._mirror import Mirror, NameRow
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_catalog import FORMAT_VERSION, SCHEMA, TRACE_NODE, check_format, upgrade
from etstore.store._neo4j_dialect import column, driver, message, plain, translate_cypher
from etstore.store._neo4j_load import (
    decode_payload,
    edge_batches,
    encode_payload,
    lineage_links,
    node_batches,
    uid_table,
)
from etstore.store._neo4j_remove import abandoned, drop_name, purge
from etstore.store._neo4j_target import Neo4jTarget, default_warehouse, parse_url
from etstore.store._streamed import gather
from etstore.store.base import IngestReport, ProgressFn, Store, TraceInfo, checked_kind
from etstore.store.graph import (
    dep_edges,
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
        the store is of a newer format, or of an older one and opened read-only.
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
        self.target = parse_url(url)
        self.location = self.target.location
        self.read_only = read_only
        self.batch_rows = batch_rows
        self.single_tx_rows = single_tx_rows
        self.stale_after_s = stale_after_s
        self._bolt = Bolt(self.target, read_only=read_only)
        self._run = self._bolt.run
        try:
            version = check_format(self._run, self.location, read_only=read_only)
            if not read_only:
                for ddl in SCHEMA:
                    self._run(ddl)
                if version is not None and version < FORMAT_VERSION:
                    upgrade(self._run, self._bolt.write_tx, version)
                    log.warning("upgraded %s to store format %d", self.location, FORMAT_VERSION)
                elif version is None:
                    self._run(
                        "MERGE (f:EtstoreFormat) ON CREATE SET f.version = $v",
                        {"v": FORMAT_VERSION},
                        write=True,
                    )
                self._sweep()
            server_id = self._run("CALL db.info() YIELD id RETURN id")[0]["id"]
        except BaseException:
            self._bolt.close()
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
        self._bolt.close()

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
                "lineage_from": [],
                "created": datetime.now(timezone.utc),
            }
            props = self._name_props(trace, name, parent, parent_seq)
            try:
                with self._bolt.session(write=True) as s:
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
                    "OPTIONAL MATCH (t:EtstoreTrace {seq: c.seq}) "
                    "RETURN collect(t.name)[0] AS n, c.status AS s",
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
        nodes = op_nodes(trace, seq, base)
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
        with self._bolt.writer(single, seq) as run:
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
                "WITH c MATCH (t:EtstoreTrace {seq: $s, name: $n}) SET t.status = 'ready' " + TRACE_NODE,
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
            with self._bolt.writer(True, seq) as run:
                if new_lineage and parent_content is not None and lineage is not None:
                    child = uid_table(self._payload(seq)["ops"], seq)
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
                    "CREATE (t:EtstoreTrace) SET t = $p, t.seq = $s, t.status = 'ready' "
                    "WITH t MATCH (c:EtstoreContent {seq: $s}) " + TRACE_NODE,
                    {"p": props, "s": seq},
                )
        except neo4j.exceptions.ConstraintError as exc:
            raise StoreError(f"{final!r} was taken by another client meanwhile; nothing was stored") from exc
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: cannot add the name {final!r}: {message(exc)}") from exc
        self._refresh_mirror_names()
        return self._info(*self._ready(final))

    def _lineage(self, lineage: pa.Table, nodes: pa.Table, parent: Mapping[str, Any], final: str) -> pa.Table:
        """Lineage rows with uids (:func:`lineage_links`) from op ``nodes`` to the ``parent`` content's."""
        pseq = int(parent["seq"])
        return lineage_links(lineage, nodes, uid_table(self._payload(pseq)["ops"], pseq), f"trace {final!r}")

    # ------------------------------------------------------------ removal

    def _purge(self, seq: int) -> None:
        """Remove content ``seq`` from the server (:func:`purge`), then from the local warehouse."""
        purge(self._run, seq)
        try:
            self._mirror.drop(seq)
            self._mirror.set_names(self._name_rows())
        except Exception as exc:  # the mirror is a cache: the next SQL query drops it
            log.warning("local SQL warehouse still holds trace id %d: %s", seq, message(exc))

    def _sweep(self) -> None:
        """Remove contents whose ingest or removal was abandoned, or that no name points at."""
        for seq, name in abandoned(self._run, self.stale_after_s):
            log.warning("removing incomplete trace %s left by an interrupted ingest or removal", name)
            self._purge(seq)

    def remove(self, name: str) -> None:
        self._require_writable()
        seq = int(self._ready(name)[1]["seq"])
        if drop_name(self._run, name, seq):
            self._purge(seq)
        else:
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

    def removed_names(self) -> list[str]:
        """None recorded: a server removal is one transaction, never left half done."""
        return []

    def finished_removals(self) -> set[str]:
        """None: see :meth:`removed_names`."""
        return set()

    def index(self, progress: ProgressFn | None = None) -> bool:
        """Always False: the server's graph is written by each ingest and removal, never derived later."""
        return False

    def cypher(self, query: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run Cypher on the server (read access mode when the store is read-only).

        A ``$parameter`` without a value is refused (:mod:`etstore.store._cypher`); Ladybug
        spellings etstore documents are translated (:func:`translate_cypher`); names and
        other strings pass as written (a query selects a trace by joining its ``Trace`` node).
        Nodes come back as dicts of their properties plus ``_ID`` and ``_LABEL``.
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
