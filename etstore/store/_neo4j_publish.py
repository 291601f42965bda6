"""The server side of ``etstore publish``: a Neo4j server as a target an embedded store publishes to.

:mod:`etstore.app.publish` reads the store and decides what to send; this module writes it,
in the graph schema of the embedded store's index (:mod:`etstore.store.graph`) plus a few
bookkeeping and run nodes (``docs/neo4j.md``, "Publishing to Neo4j"):

- ``(:Content {content_hash, kind, trace_id, ranks, ops, deps, missing, messages, status,
  lineage_from, heartbeat, payload})``: one published content. ``trace_id`` is the server's id
  for it, given out by one counter (``EtstoreCounter 'trace_seq'``, the former backend's too),
  so uids (``trace_id << 40 | row``) are unique across every store that publishes here.
  ``lineage_from`` lists the parent contents whose ``BECOMES`` edges reach it; ``payload``
  says its ``Payload`` nodes are all there.
- ``(:Payload {trace_id, table, part, data})``: the content's lossless form in chunks
  (:func:`~etstore.store._neo4j_load.payload_chunks`), what a reader's ``load`` returns.
- ``(:Trace {name, trace_id, kind, ranks, ops, parent, source, store, params, created,
  parent_trace_id})``: one per published name, owned by the store (``store``) that published it.
- ``(:Store {store_id, location})``: a store that publishes here.
- run nodes keyed by ``key`` (a hash of the local row), each with child rows
  (:meth:`Server.write_records`; their shapes: :mod:`etstore.store._neo4j_records`).

A content is written while its ``Content`` node says ``loading`` (its ops carry its
``trace_id`` but no ``Trace`` node names it, so queries that join through ``Trace`` do not
see it) and flips to ``ready`` in the transaction that creates its ``Trace`` nodes. A failed
load is removed at once; one whose client died is swept by the next publish once its
heartbeat is ``stale_after_s`` old. A content no ``Trace`` node names any more is removed.
This is the only writer of a server; :mod:`etstore.store.neo4j` reads what it wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from etstore.errors import StoreError
from etstore.progress import ProgressFn
from etstore.store import _neo4j_migrate
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_dialect import driver, message, plain
from etstore.store._neo4j_load import Batch
from etstore.store._neo4j_target import parse_url
from etstore.store.graph import UID_SHIFT, uid_base

__all__ = ["Children", "Loading", "RecordSet", "Server", "ServerContent"]

log = logging.getLogger(__name__)

_SCHEMA = [
    "CREATE CONSTRAINT etstore_op_uid IF NOT EXISTS FOR (o:Op) REQUIRE o.uid IS UNIQUE",
    "CREATE INDEX etstore_op_trace_id IF NOT EXISTS FOR (o:Op) ON (o.trace_id)",
    "CREATE CONSTRAINT etstore_trace_node_name IF NOT EXISTS FOR (t:Trace) REQUIRE t.name IS UNIQUE",
    "CREATE INDEX etstore_trace_node_id IF NOT EXISTS FOR (t:Trace) ON (t.trace_id)",
    "CREATE CONSTRAINT etstore_counter IF NOT EXISTS FOR (c:EtstoreCounter) REQUIRE c.name IS UNIQUE",
    "CREATE INDEX etstore_pub_payload IF NOT EXISTS FOR (p:Payload) ON (p.trace_id)",
    "CREATE CONSTRAINT etstore_pub_content IF NOT EXISTS "
    "FOR (c:Content) REQUIRE (c.content_hash, c.kind) IS UNIQUE",
    "CREATE CONSTRAINT etstore_pub_content_id IF NOT EXISTS FOR (c:Content) REQUIRE c.trace_id IS UNIQUE",
    "CREATE INDEX etstore_pub_trace_store IF NOT EXISTS FOR (t:Trace) ON (t.store)",
    "CREATE CONSTRAINT etstore_pub_store IF NOT EXISTS FOR (s:Store) REQUIRE s.store_id IS UNIQUE",
]

# a name's Trace node, only where the content is ready and the name is free or this store's;
# the content is written first (SET), so a concurrent removal of it waits for this transaction
_UPSERT_NAMES = (
    "UNWIND $rows AS r MATCH (c:Content {trace_id: r.trace_id}) SET c.heartbeat = timestamp() "
    "WITH c, r WHERE c.status = 'ready' "
    "MERGE (t:Trace {name: r.name}) ON CREATE SET t.store = $store "
    "WITH t, r WHERE t.store = $store SET t += r "
    "RETURN count(t) AS n"
)


_UNNAMED = "NOT EXISTS { MATCH (t:Trace) WHERE t.trace_id = c.trace_id }"
"""A content ``c`` that no name points at."""


@dataclass(frozen=True)
class ServerContent:
    """A content the server holds (or is loading)."""

    trace_id: int
    status: str
    lineage_from: tuple[int, ...]
    idle_ms: int  # since its last heartbeat
    payload: bool  # its Payload nodes are all there (not so for a content an older etstore published)


@dataclass
class Loading:
    """What :meth:`Server.load` writes for one content: its stages of batched statements."""

    trace_id: int
    store: str  # the publishing store's id
    stages: list[tuple[str, Iterable[Batch]]]
    rows: int  # nodes + edges, for the one-transaction choice
    names: list[dict[str, Any]]  # Trace node properties of its names
    lineage_from: list[int]  # parents whose BECOMES edges the stages write
    children: list[int]  # contents whose BECOMES edges from this one the stages write


@dataclass(frozen=True)
class Children:
    """Child rows of records: ``(parent)-[:rel]->(:label)``, each row's ``parent`` the record's key."""

    label: str
    rel: str
    rows: Mapping[str, list[dict[str, Any]]]  # parent key -> rows


@dataclass(frozen=True)
class RecordSet:
    """Records of one kind (a ``label``), keyed by ``key``, with their child rows and the Cypher
    that links them (run with ``$keys``, the new records' keys, and ``$store``)."""

    label: str
    rows: list[dict[str, Any]]
    children: tuple[Children, ...] = ()
    links: tuple[str, ...] = ()


class Server:
    """A writable connection to the server being published to.

    Raises
    ------
    StoreError
        A bad URL, an unreachable server, refused credentials (one line, never the password).
    """

    def __init__(
        self,
        url: str,
        *,
        batch_rows: int = 20_000,
        single_tx_rows: int = 200_000,
        stale_after_s: float = 120.0,
    ) -> None:
        self.target = parse_url(url)
        self.location = self.target.location
        self.batch_rows = batch_rows
        self.single_tx_rows = single_tx_rows
        self.stale_after_s = stale_after_s
        self.bolt = Bolt(self.target, read_only=False)

    def close(self) -> None:
        self.bolt.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, query: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        return self.bolt.run(query, params, write=True)

    @contextmanager
    def _tx(self, what: str) -> Iterator[Any]:
        """One write transaction (committed when the block ends); engine errors as one line."""
        neo4j = driver()
        try:
            with self.bolt.session(write=True) as s, s.begin_transaction() as tx:
                yield tx
                tx.commit()
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {what} failed: {message(exc)}") from exc

    # ------------------------------------------------------------ set-up

    def prepare(self, store_id: str, location: str, labels: Sequence[str]) -> None:
        """Constraints and indexes (idempotent), a key constraint per record label, the store's node."""
        for ddl in _SCHEMA:
            self.run(ddl)
        for label in labels:
            self.run(
                f"CREATE CONSTRAINT etstore_pub_{label.lower()} IF NOT EXISTS "
                f"FOR (n:{label}) REQUIRE n.key IS UNIQUE"
            )
            self.run(
                f"CREATE INDEX etstore_pub_{label.lower()}_store IF NOT EXISTS FOR (n:{label}) ON (n.store)"
            )
        self.run(
            "MERGE (s:Store {store_id: $id}) ON CREATE SET s.location = $loc "
            "WITH s WHERE s.location <> $loc SET s.location = $loc",
            {"id": store_id, "loc": location},
        )

    # ------------------------------------------------------------ contents

    def contents(self, hashes: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ServerContent]:
        """The server's contents among ``(content_hash, kind)`` pairs."""
        keys = [{"h": h, "k": k} for h, k in hashes]
        rows = self.run(
            "UNWIND $keys AS x MATCH (c:Content {content_hash: x.h, kind: x.k}) "
            "RETURN c.content_hash AS h, c.kind AS k, c.trace_id AS t, c.status AS s, "
            "coalesce(c.lineage_from, []) AS l, timestamp() - coalesce(c.heartbeat, 0) AS idle, "
            "coalesce(c.payload, false) AS p",
            {"keys": keys},
        )
        return {
            (r["h"], r["k"]): ServerContent(
                int(r["t"]), r["s"], tuple(int(x) for x in r["l"]), int(r["idle"]), bool(r["p"])
            )
            for r in rows
        }

    def traces(self) -> dict[str, dict[str, Any]]:
        """Every ``Trace`` node's properties by name, as plain values (another store's too)."""
        return {r["t"]["name"]: plain(dict(r["t"])) for r in self.run("MATCH (t:Trace) RETURN t")}

    def upgrade_legacy(self) -> int:
        """Upgrade what etstore's former Neo4j backend wrote here to this form
        (:func:`etstore.store._neo4j_migrate.upgrade`); returns the contents upgraded."""
        return _neo4j_migrate.upgrade(self.bolt)

    def claim(self, content_hash: str, kind: str, counts: Mapping[str, int]) -> int:
        """A new ``loading`` content and its server trace id, in one transaction.

        Raises
        ------
        StoreError
            Another client is publishing or removing the same content right now.
        """
        neo4j = driver()
        try:
            rec = self.run(
                "MERGE (k:EtstoreCounter {name: 'trace_seq'}) ON CREATE SET k.value = 0 "
                "SET k.value = k.value + 1 "
                "CREATE (c:Content {content_hash: $h, kind: $k, trace_id: k.value, status: 'loading', "
                "lineage_from: [], heartbeat: timestamp()}) SET c += $counts RETURN c.trace_id AS t",
                {"h": content_hash, "k": kind, "counts": dict(counts)},
            )
        except StoreError as exc:
            if isinstance(exc.__cause__, neo4j.exceptions.ConstraintError):
                raise StoreError(
                    f"{self.location}: content {content_hash[:12]} is being published or removed by "
                    "another client; retry when that finishes"
                ) from exc
            raise
        trace_id = int(rec[0]["t"])
        uid_base(trace_id)  # refuses an id past the uid range
        return trace_id

    def load(self, job: Loading, progress: ProgressFn | None = None) -> None:
        """Write a claimed content's stages and flip it to ``ready`` with its ``Trace`` nodes.

        A content of at most ``single_tx_rows`` rows is written in one transaction with its
        flip; a larger one in one transaction per statement (its heartbeat beating between
        them), then flipped. On any failure or interrupt the content is removed again.
        """
        single = job.rows <= self.single_tx_rows
        neo4j = driver()
        try:
            with self.bolt.session(write=True) as s:
                if single:
                    with s.begin_transaction() as tx:
                        self._stages(job, lambda q, p: tx.run(q, dict(p)).consume(), progress)
                        self._flip(tx, job)
                        tx.commit()
                else:

                    def run(q: str, p: Mapping[str, Any]) -> None:
                        s.execute_write(lambda tx: tx.run(q, dict(p)).consume())
                        s.run(
                            "MATCH (c:Content {trace_id: $t}) SET c.heartbeat = timestamp()", t=job.trace_id
                        ).consume()

                    self._stages(job, run, progress)
                    s.execute_write(lambda tx: self._flip(tx, job))
        except BaseException as exc:
            self.purge(job.trace_id)
            if isinstance(exc, (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError)):
                raise StoreError(
                    f"{self.location}: publishing trace id {job.trace_id} failed: {message(exc)}"
                ) from exc
            raise

    def _stages(self, job: Loading, run: Any, progress: ProgressFn | None) -> None:
        total = max(job.rows, 1)
        done = 0
        for stage, batches in job.stages:
            for query, params, rows in batches:
                run(query, params)
                done += rows
                if progress is not None:
                    progress(stage, min(done, total), total)

    def _flip(self, tx: Any, job: Loading) -> None:
        """The commit point of a content: ``ready``, its lineage recorded, its names' ``Trace`` nodes."""
        tx.run(
            "MATCH (c:Content {trace_id: $t, status: 'loading'}) SET c.status = 'ready', "
            "c.lineage_from = $l, c.heartbeat = timestamp(), c.payload = true "
            "WITH c UNWIND $children AS k MATCH (x:Content {trace_id: k}) "
            "SET x.lineage_from = x.lineage_from + [$t]",
            {"t": job.trace_id, "l": job.lineage_from, "children": job.children},
        ).consume()
        if not tx.run("MATCH (c:Content {trace_id: $t, status: 'ready'}) RETURN c", t=job.trace_id).single():
            raise StoreError(
                f"{self.location}: trace id {job.trace_id} was removed by another client as abandoned; retry"
            )
        self._names(tx, job.names, job.store)

    def _names(self, tx: Any, rows: list[dict[str, Any]], store: str) -> None:
        if not rows:
            return
        got = tx.run(_UPSERT_NAMES, rows=rows, store=store).single()
        if int(got["n"]) != len(rows):
            raise StoreError(
                f"{self.location}: a name being published was taken by another store, or its content "
                "removed, meanwhile; nothing of this step was kept: retry"
            )

    def add_lineage(
        self, child: int, parent: int, batches: Iterable[Batch], rows: int, progress: ProgressFn | None
    ) -> None:
        """``BECOMES`` edges from ready content ``parent`` to ready content ``child``: any left by an
        interrupted attempt are removed first, the edges written, then ``parent`` recorded in the
        child's ``lineage_from`` (in one transaction when small)."""
        drop = (
            "MATCH (a:Op {trace_id: $p})-[r:BECOMES]->(b:Op) WHERE b.trace_id = $c "
            "CALL { WITH r DELETE r } IN TRANSACTIONS OF 10000 ROWS"
        )
        self.run(drop, {"p": parent, "c": child})
        mark = (
            "MATCH (c:Content {trace_id: $c}) WHERE NOT $p IN c.lineage_from "
            "SET c.lineage_from = c.lineage_from + [$p]"
        )
        done = 0
        if rows <= self.single_tx_rows:
            with self._tx("adding lineage") as tx:
                for q, params, _n in batches:
                    tx.run(q, params).consume()
                tx.run(mark, c=child, p=parent).consume()
            return
        for q, params, n in batches:
            self.bolt.write_tx(q, params)
            done += n
            if progress is not None:
                progress("lineage", min(done, rows), rows)
        self.bolt.write_tx(mark, {"c": child, "p": parent})

    def drop_lineage(self, child: int, parent: int) -> None:
        """Remove the ``BECOMES`` edges from content ``parent`` to content ``child`` (in bounded
        transactions), then ``parent`` from the child's ``lineage_from``."""
        self.run(
            "MATCH (a:Op {trace_id: $p})-[r:BECOMES]->(b:Op) WHERE b.trace_id = $c "
            "CALL { WITH r DELETE r } IN TRANSACTIONS OF 10000 ROWS",
            {"p": parent, "c": child},
        )
        self.run(
            "MATCH (c:Content {trace_id: $c}) SET c.lineage_from = [x IN c.lineage_from WHERE x <> $p]",
            {"c": child, "p": parent},
        )

    def add_payload(self, trace_id: int, batches: Iterable[Batch], missing: int) -> None:
        """The ``Payload`` nodes of ready content ``trace_id``, published by an etstore that sent
        none: any left by an interrupted attempt are removed first, the chunks written one
        transaction each, then ``payload`` (and the ``missing`` count) set on the content, after
        which readers use them."""
        self.run(
            "MATCH (p:Payload {trace_id: $t}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
            {"t": trace_id},
        )
        for q, params, _n in batches:
            self.bolt.write_tx(q, params)
        self.run(
            "MATCH (c:Content {trace_id: $t}) SET c.payload = true, c.missing = $m",
            {"t": trace_id, "m": missing},
        )

    # ------------------------------------------------------------ names and removal

    def sync_names(self, store: str, upserts: list[dict[str, Any]], removals: list[str]) -> None:
        """Create or update this store's ``Trace`` nodes and delete the ``removals``, in one transaction."""
        if not upserts and not removals:
            return
        with self._tx("updating names") as tx:
            self._names(tx, upserts, store)
            if removals:
                tx.run(
                    "MATCH (t:Trace {store: $s}) WHERE t.name IN $names DETACH DELETE t",
                    s=store,
                    names=removals,
                ).consume()

    def purge(self, trace_id: int) -> None:
        """Remove content ``trace_id``: its ops with their edges (in bounded transactions) and its
        payload, then its node (last, so an interrupted purge is found again by :meth:`sweep`)."""
        lo = uid_base(trace_id)
        self.run(
            "MATCH (c:Content {trace_id: $t}) SET c.status = 'deleting', c.heartbeat = timestamp()",
            {"t": trace_id},
        )
        self.run(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
            "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
            {"lo": lo, "hi": lo + (1 << UID_SHIFT)},
        )
        self.run(
            "MATCH (p:Payload {trace_id: $t}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
            {"t": trace_id},
        )
        self.run(
            "MATCH (x:Content) WHERE $t IN x.lineage_from "
            "SET x.lineage_from = [p IN x.lineage_from WHERE p <> $t]",
            {"t": trace_id},
        )
        self.run("MATCH (c:Content {trace_id: $t}) DELETE c", {"t": trace_id})

    def sweep(self) -> int:
        """Remove contents whose load or removal was abandoned (no heartbeat for
        ``stale_after_s``); returns how many."""
        rows = self.run(
            "MATCH (c:Content) WHERE c.status <> 'ready' AND c.heartbeat < timestamp() - $age "
            "RETURN c.trace_id AS t",
            {"age": int(self.stale_after_s * 1000)},
        )
        for r in rows:
            log.warning("%s: removing trace id %s left by an interrupted publish", self.location, r["t"])
            self.purge(int(r["t"]))
        return len(rows)

    def collect_garbage(self) -> int:
        """Remove ready contents no ``Trace`` node names; returns how many.

        Each is marked ``deleting`` only after its node is locked (SET first) and the check
        repeated, so a name another client is adding to it meanwhile either lands first and
        keeps it, or waits and then finds it gone (and says so).
        """
        rows = self.run(
            f"MATCH (c:Content {{status: 'ready'}}) WHERE {_UNNAMED} SET c.heartbeat = timestamp() "
            f"WITH c WHERE {_UNNAMED} "
            "SET c.status = 'deleting' RETURN c.trace_id AS t"
        )
        for r in rows:
            self.purge(int(r["t"]))
        return len(rows)

    # ------------------------------------------------------------ runs and their metrics

    def record_keys(self, label: str, keys: list[str]) -> set[str]:
        """Which of ``keys`` the server holds as ``label`` nodes."""
        rows = self.run(f"UNWIND $keys AS k MATCH (n:{label} {{key: k}}) RETURN n.key AS k", {"keys": keys})
        return {r["k"] for r in rows}

    def write_records(self, records: RecordSet, store: str, progress: ProgressFn | None = None) -> None:
        """Create ``records`` (none of them on the server yet) with their child rows and links, in
        transactions of about ``batch_rows`` rows: a record and its children land together."""
        label = records.label
        batch: list[dict[str, Any]] = []
        size = 0
        done = 0
        total = len(records.rows)

        def flush() -> None:
            nonlocal batch, size, done
            if not batch:
                return
            keys = [r["key"] for r in batch]
            with self._tx(f"publishing {label} records") as tx:
                tx.run(
                    f"UNWIND $rows AS r CREATE (n:{label}) SET n = r, n.store = $s", rows=batch, s=store
                ).consume()
                for child in records.children:
                    rows = [{"parent": k, "props": row} for k in keys for row in child.rows.get(k, [])]
                    for start in range(0, len(rows), self.batch_rows):
                        tx.run(
                            f"UNWIND $rows AS r MATCH (p:{label} {{key: r.parent}}) "
                            f"CREATE (p)-[:{child.rel}]->(c:{child.label}) SET c = r.props",
                            rows=rows[start : start + self.batch_rows],
                        ).consume()
                for link in records.links:
                    tx.run(link, keys=keys, store=store).consume()
            done += len(batch)
            if progress is not None:
                progress(label, done, total)
            batch, size = [], 0

        for row in records.rows:
            batch.append(row)
            size += 1 + sum(len(c.rows.get(row["key"], ())) for c in records.children)
            if size >= self.batch_rows:
                flush()
        flush()

    def relink(self, records: RecordSet, store: str) -> None:
        """Run the links of every record of this store (what a trace published since now reaches)."""
        if not records.links:
            return
        keys = [
            r["k"]
            for r in self.run(f"MATCH (n:{records.label} {{store: $s}}) RETURN n.key AS k", {"s": store})
        ]
        for link in records.links:
            self.run(link, {"keys": keys, "store": store})

    def prune_records(self, records: RecordSet, store: str, keep: Iterable[str]) -> int:
        """Delete this store's ``label`` records (and their children) whose key is not in ``keep``."""
        rels = "|".join(c.rel for c in records.children)
        child = f"OPTIONAL MATCH (n)-[:{rels}]->(c) " if rels else ""
        rows = self.run(
            f"MATCH (n:{records.label} {{store: $s}}) WHERE NOT n.key IN $keep "
            f"{child}WITH n, collect(c) AS cs FOREACH (x IN cs | DETACH DELETE x) "
            "WITH n DETACH DELETE n RETURN count(*) AS removed"
            if rels
            else f"MATCH (n:{records.label} {{store: $s}}) WHERE NOT n.key IN $keep "
            "DETACH DELETE n RETURN count(*) AS removed",
            {"s": store, "keep": list(keep)},
        )
        return int(rows[0]["removed"]) if rows else 0
