"""The server side of ``etstore publish``: a Neo4j server as a target an embedded store publishes to.

:mod:`etstore.app.publish` reads the store and decides what to send; this module writes it,
in the graph schema of the embedded store's index (:mod:`etstore.store.graph`) plus a few
bookkeeping and run nodes (``docs/neo4j.md``, "Publishing to Neo4j"):

- ``(:Content {content_hash, kind, trace_id, ranks, ops, deps, missing, messages, status,
  lineage_from, heartbeat, payload})``: one published content. ``trace_id`` is the server's id
  for it, given out by one counter (``EtstoreCounter 'trace_seq'``, the former backend's too),
  so uids (``trace_id << 40 | row``) are unique across every store that publishes here.
  ``lineage_from`` lists the parent contents whose ``BECOMES`` edges reach it; ``payload``
  says its ``Payload`` nodes are all there; ``busy`` lists what a publisher is completing on
  it (:meth:`Server._take`).
- ``(:Payload {trace_id, table, part, data})``: the content's lossless form in chunks
  (:func:`~etstore.store._neo4j_load.payload_chunks`), what a reader's ``load`` returns.
- ``(:Trace {name, trace_id, kind, ranks, ops, parent, source, store, params, created,
  parent_trace_id})``: one per published name, owned by the store (``store``) that published it.
- ``(:Store {store_id, location})``: a store that publishes here.
- run nodes keyed by ``key`` (a hash of the local row), each with child rows
  (:mod:`etstore.store._neo4j_runs`; their shapes: :mod:`etstore.store._neo4j_records`).

A content is written while its ``Content`` node says ``loading`` (its ops carry its
``trace_id`` but no ``Trace`` node names it, so queries that join through ``Trace`` do not
see it) and flips to ``ready`` in the transaction that creates its ``Trace`` nodes. A failed
load is removed at once; one whose client died is swept by the next publish once its
heartbeat is ``stale_after_s`` old. A content no ``Trace`` node names any more is removed.
This is the only writer of a server; :mod:`etstore.store.neo4j` reads what it wrote.

Several publishers may write one server at once. A content's claim passes its uniqueness
constraint for one of them; the others wait for that copy and use it (:meth:`Server.claim`).
Work that completes a ready content is done by one publisher under the content node's lock
(:meth:`Server._take`), and every statement the server rolls back as transient runs again
(:mod:`etstore.store._neo4j_retry`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from etstore.errors import StoreError
from etstore.progress import ProgressFn
from etstore.store import _neo4j_migrate
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_dialect import driver, message, plain
from etstore.store._neo4j_load import Batch
from etstore.store._neo4j_retry import Patience, retrying
from etstore.store._neo4j_target import parse_url
from etstore.store.graph import UID_SHIFT, uid_base

__all__ = ["Loading", "Server", "ServerContent", "Stages"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Stages = list[tuple[str, Iterable[Batch]]]

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

_EXISTS = frozenset(
    f"Neo.ClientError.Schema.{code}"
    for code in (
        "EquivalentSchemaRuleAlreadyExists",
        "ConstraintAlreadyExists",
        "IndexAlreadyExists",
        "ConstraintWithNameAlreadyExists",
        "IndexWithNameAlreadyExists",
    )
)
"""What the server answers a schema rule that another client created meanwhile."""

# a name's Trace node, only where the content is ready and the name is free or this store's;
# the content is written first (SET), so a concurrent removal of it waits for this transaction
_UPSERT_NAMES = (
    "UNWIND $rows AS r MATCH (c:Content {trace_id: r.trace_id}) SET c.heartbeat = timestamp() "
    "WITH c, r WHERE c.status = 'ready' "
    "MERGE (t:Trace {name: r.name}) ON CREATE SET t.store = $store "
    "WITH t, r WHERE t.store = $store SET t += r "
    "RETURN count(t) AS n"
)


_BECOMES = "MATCH (a:Op {trace_id: $p})-[r:BECOMES]->(b:Op) WHERE b.trace_id = $c "
"""The ``BECOMES`` edges from content ``$p``'s ops to content ``$c``'s."""

_RELEASE = (
    "WITH c, [x IN coalesce(c.busy, []) WHERE x <> $job] AS rest "
    "SET c.busy = CASE WHEN rest = [] THEN null ELSE rest END"
)
"""Take job ``$job`` off content ``c``'s ``busy`` list (:meth:`Server._take`)."""

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
    stages: Callable[[], Stages]  # read afresh for each attempt (a transaction the server rolled back)
    rows: int  # nodes + edges, for the one-transaction choice
    names: list[dict[str, Any]]  # Trace node properties of its names
    lineage_from: list[int]  # parents whose BECOMES edges the stages write
    children: list[int]  # contents whose BECOMES edges from this one the stages write


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
        wait_s: float = 600.0,
    ) -> None:
        self.target = parse_url(url)
        self.location = self.target.location
        self.batch_rows = batch_rows
        self.single_tx_rows = single_tx_rows
        self.stale_after_s = stale_after_s
        self.wait_s = wait_s
        self.bolt = Bolt(self.target, read_only=False)

    def close(self) -> None:
        self.bolt.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, query: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        """One statement in a managed write transaction (run again by the driver while transient)."""
        return self.bolt.write_tx(query, params)

    def run_batched(self, query: str, params: Mapping[str, Any]) -> None:
        """One ``CALL { ... } IN TRANSACTIONS`` statement (auto-commit), run again while transient."""
        retrying(lambda: self.bolt.run(query, params, write=True))

    def write(self, what: str, work: Callable[[Any], T]) -> T:
        """``work(tx)`` in one managed write transaction, run again by the driver while the server
        rolls it back as transient (so ``work`` reads its input afresh); engine errors as one line."""
        neo4j = driver()
        try:
            with self.bolt.session(write=True) as s:
                return s.execute_write(work)
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
            raise StoreError(f"{self.location}: {what} failed: {message(exc)}") from exc

    def beat(self, trace_id: int) -> None:
        """Content ``trace_id``'s heartbeat: its publisher is alive (``stale_after_s``)."""
        self.run("MATCH (c:Content {trace_id: $t}) SET c.heartbeat = timestamp()", {"t": trace_id})

    # ------------------------------------------------------------ set-up

    def prepare(self, store_id: str, location: str, labels: Sequence[str]) -> None:
        """The constraints and indexes the server lacks (a key constraint and a store index per
        record label among them), and the store's node.

        Publishers that start together on a new server may create the same rule at once; the
        server lets one through and tells the others an equivalent one exists, which is what
        they asked for.
        """
        ddls = [*_SCHEMA]
        for label in labels:
            ddls.append(
                f"CREATE CONSTRAINT etstore_pub_{label.lower()} IF NOT EXISTS "
                f"FOR (n:{label}) REQUIRE n.key IS UNIQUE"
            )
            ddls.append(
                f"CREATE INDEX etstore_pub_{label.lower()}_store IF NOT EXISTS FOR (n:{label}) ON (n.store)"
            )
        have = {r["n"] for r in self.run("SHOW CONSTRAINTS YIELD name RETURN name AS n")}
        have |= {r["n"] for r in self.run("SHOW INDEXES YIELD name RETURN name AS n")}
        for ddl in ddls:
            if ddl.split()[2] in have:
                continue
            try:
                self.run(ddl)
            except StoreError as exc:
                if getattr(exc.__cause__, "code", None) not in _EXISTS:
                    raise
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

    def claim(self, content_hash: str, kind: str, counts: Mapping[str, int]) -> int | ServerContent:
        """A new ``loading`` content and its server trace id, in one transaction; or, when another
        client holds the content, that content once it is ready.

        The uniqueness constraint on ``(content_hash, kind)`` lets one client's claim through.
        The others wait while the winner's heartbeat beats and then reuse its content; a claim
        left stale (its client died) is removed and the content claimed again, and so is one
        whose load failed and was removed.

        Raises
        ------
        StoreError
            Another client has held the content for ``wait_s`` without finishing it.
        """
        neo4j = driver()
        patience = Patience(self.location, self.wait_s)
        while True:
            try:
                rec = self.run(
                    "MERGE (k:EtstoreCounter {name: 'trace_seq'}) ON CREATE SET k.value = 0 "
                    "SET k.value = k.value + 1 "
                    "CREATE (c:Content {content_hash: $h, kind: $k, trace_id: k.value, status: 'loading', "
                    "lineage_from: [], heartbeat: timestamp()}) SET c += $counts RETURN c.trace_id AS t",
                    {"h": content_hash, "k": kind, "counts": dict(counts)},
                )
            except StoreError as exc:
                if not isinstance(exc.__cause__, neo4j.exceptions.ConstraintError):
                    raise
            else:
                trace_id = int(rec[0]["t"])
                uid_base(trace_id)  # refuses an id past the uid range
                return trace_id
            got = self.contents([(content_hash, kind)]).get((content_hash, kind))
            if got is None:  # removed since: claim it again
                continue
            if got.status == "ready":
                return got
            if got.idle_ms >= self.stale_after_s * 1000:
                if self.purge(got.trace_id, stale=True):
                    log.warning(
                        "%s: removed trace id %s left by an interrupted publish", self.location, got.trace_id
                    )
                continue
            patience.wait(f"content {content_hash[:12]}")

    def load(self, job: Loading, progress: ProgressFn | None = None) -> None:
        """Write a claimed content's stages and flip it to ``ready`` with its ``Trace`` nodes.

        A content of at most ``single_tx_rows`` rows is written in one transaction with its
        flip (run again, its stages read afresh, when the server rolls it back as transient); a
        larger one in one transaction per statement, then flipped. Either way the heartbeat
        beats, from another transaction, at least every ``stale_after_s / 8`` between
        statements, so other publishers wait for a live load instead of removing it. On any
        failure or interrupt the content is removed again.
        """
        single = job.rows <= self.single_tx_rows
        neo4j = driver()
        try:
            with self.bolt.session(write=True) as s:
                if single:

                    def attempt(tx: Any) -> None:
                        self._stages(job, lambda q, p: tx.run(q, dict(p)).consume(), progress)
                        self._flip(tx, job)

                    s.execute_write(attempt)
                else:
                    self._stages(
                        job, lambda q, p: s.execute_write(lambda tx: tx.run(q, dict(p)).consume()), progress
                    )
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
        every_s = self.stale_after_s / 8
        beaten = time.monotonic()
        for stage, batches in job.stages():
            for query, params, rows in batches:
                run(query, params)
                done += rows
                if progress is not None:
                    progress(stage, min(done, total), total)
                if time.monotonic() - beaten >= every_s:
                    self.beat(job.trace_id)
                    beaten = time.monotonic()

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
        self,
        child: int,
        parent: int,
        batches: Callable[[], Iterable[Batch]],
        rows: int,
        progress: ProgressFn | None,
    ) -> bool:
        """``BECOMES`` edges from ready content ``parent`` to ready content ``child``, unless another
        client added them meanwhile (False). The child is taken for the job (:meth:`_take`); any
        edges left by an interrupted attempt are removed, the edges written, then ``parent``
        recorded in the child's ``lineage_from`` (all in one transaction when small)."""
        job = f"lineage:{parent}"
        if not self._take(child, f"{parent} IN c.lineage_from", job):
            return False
        params = {"p": parent, "c": child, "job": job}
        mark = (
            "MATCH (c:Content {trace_id: $c}) SET c.lineage_from = "
            "CASE WHEN $p IN c.lineage_from THEN c.lineage_from ELSE c.lineage_from + [$p] END " + _RELEASE
        )
        try:
            if rows <= self.single_tx_rows:

                def attempt(tx: Any) -> None:
                    tx.run(_BECOMES + "DELETE r", params).consume()
                    for q, ps, _n in batches():
                        tx.run(q, ps).consume()
                    tx.run(mark, params).consume()

                self.write("adding lineage", attempt)
                return True
            self.run_batched(_BECOMES + "CALL { WITH r DELETE r } IN TRANSACTIONS OF 10000 ROWS", params)
            self._batches(child, batches(), rows, "lineage", progress)
            self.run(mark, params)
        except BaseException:
            self._release(child, job)
            raise
        return True

    def _take(self, trace_id: int, done: str, job: str) -> bool:
        """Take ready content ``trace_id`` for ``job`` (its name in the content's ``busy`` list):
        False when ``done`` (Cypher over ``c``) holds already. The content's node is locked first
        (a write), so two clients decide one after the other; while another client's job is
        there and its heartbeat beats, this one waits (``wait_s``), and a stale one is taken over.

        Raises
        ------
        StoreError
            The content was removed meanwhile, or another client's job outlasted ``wait_s``.
        """
        patience = Patience(self.location, self.wait_s)
        while True:
            rows = self.run(
                "MATCH (c:Content {trace_id: $t, status: 'ready'}) SET c.lock = true REMOVE c.lock "
                f"WITH c, {done} AS done, "
                "$job IN coalesce(c.busy, []) AND timestamp() - coalesce(c.heartbeat, 0) < $age AS busy "
                "FOREACH (_ IN CASE WHEN done OR busy THEN [] ELSE [1] END | "
                "SET c.busy = [x IN coalesce(c.busy, []) WHERE x <> $job] + [$job], "
                "c.heartbeat = timestamp()) "
                "RETURN CASE WHEN done THEN 'done' WHEN busy THEN 'busy' ELSE 'mine' END AS state",
                {"t": trace_id, "job": job, "age": int(self.stale_after_s * 1000)},
            )
            if not rows:
                raise StoreError(
                    f"{self.location}: trace id {trace_id} was removed by another client meanwhile; retry"
                )
            if rows[0]["state"] != "busy":
                return bool(rows[0]["state"] == "mine")
            patience.wait(f"trace id {trace_id}")

    def _release(self, trace_id: int, job: str) -> None:
        """``job`` off content ``trace_id``'s ``busy`` list (after a failure: the next client redoes it)."""
        self.run("MATCH (c:Content {trace_id: $c}) " + _RELEASE, {"c": trace_id, "job": job})

    def _batches(
        self, trace_id: int, batches: Iterable[Batch], rows: int, stage: str, progress: ProgressFn | None
    ) -> None:
        """Statements of a job on content ``trace_id``, one transaction each, its heartbeat beating."""
        done = 0
        beaten = time.monotonic()
        for q, params, n in batches:
            self.bolt.write_tx(q, params)
            done += n
            if progress is not None:
                progress(stage, min(done, rows), rows)
            if time.monotonic() - beaten >= self.stale_after_s / 8:
                self.beat(trace_id)
                beaten = time.monotonic()

    def drop_lineage(self, child: int, parent: int) -> None:
        """Remove the ``BECOMES`` edges from content ``parent`` to content ``child`` (in bounded
        transactions), then ``parent`` from the child's ``lineage_from``."""
        self.run_batched(
            _BECOMES + "CALL { WITH r DELETE r } IN TRANSACTIONS OF 10000 ROWS", {"p": parent, "c": child}
        )
        self.run(
            "MATCH (c:Content {trace_id: $c}) SET c.lineage_from = [x IN c.lineage_from WHERE x <> $p]",
            {"c": child, "p": parent},
        )

    def add_payload(self, trace_id: int, batches: Callable[[], Iterable[Batch]], missing: int) -> bool:
        """The ``Payload`` nodes of ready content ``trace_id``, published by an etstore that sent
        none, unless another client sent them meanwhile (False). The content is taken for the
        job (:meth:`_take`); any chunks left by an interrupted attempt are removed, the chunks
        written one transaction each, then ``payload`` (and the ``missing`` count) set on the
        content, after which readers use them."""
        job = "payload"
        if not self._take(trace_id, "coalesce(c.payload, false)", job):
            return False
        try:
            self.run_batched(
                "MATCH (p:Payload {trace_id: $t}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
                {"t": trace_id},
            )
            self._batches(trace_id, batches(), 0, "payload", None)
            self.run(
                "MATCH (c:Content {trace_id: $c}) SET c.payload = true, c.missing = $m " + _RELEASE,
                {"c": trace_id, "m": missing, "job": job},
            )
        except BaseException:
            self._release(trace_id, job)
            raise
        return True

    # ------------------------------------------------------------ names and removal

    def sync_names(self, store: str, upserts: list[dict[str, Any]], removals: list[str]) -> None:
        """Create or update this store's ``Trace`` nodes and delete the ``removals``, in one transaction."""
        if not upserts and not removals:
            return

        def attempt(tx: Any) -> None:
            self._names(tx, upserts, store)
            if removals:
                tx.run(
                    "MATCH (t:Trace {store: $s}) WHERE t.name IN $names DETACH DELETE t",
                    s=store,
                    names=removals,
                ).consume()

        self.write("updating names", attempt)

    def purge(self, trace_id: int, *, stale: bool = False) -> bool:
        """Remove content ``trace_id``, unless it is ready (or, ``stale``, its heartbeat beats
        again): its ops with their edges (in bounded transactions) and its payload, then its node
        (last, so an interrupted purge is found again by :meth:`sweep`). The node is locked
        before that is decided, so a load flipping it meanwhile keeps it. Ops and payload left
        in its range without a node (ids are never given twice) go too. Returns whether the
        content was there to remove."""
        lo = uid_base(trace_id)
        taken = self.run(
            "MATCH (c:Content {trace_id: $t}) SET c.lock = true REMOVE c.lock "
            "WITH c, c.status <> 'ready' AND (NOT $stale OR c.heartbeat < timestamp() - $age) AS mine "
            "FOREACH (_ IN CASE WHEN mine THEN [1] ELSE [] END | "
            "SET c.status = 'deleting', c.heartbeat = timestamp()) RETURN mine",
            {"t": trace_id, "stale": stale, "age": int(self.stale_after_s * 1000)},
        )
        if taken and not taken[0]["mine"]:
            return False
        self.run_batched(
            "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
            "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
            {"lo": lo, "hi": lo + (1 << UID_SHIFT)},
        )
        self.run_batched(
            "MATCH (p:Payload {trace_id: $t}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
            {"t": trace_id},
        )
        self.run(
            "MATCH (x:Content) WHERE $t IN x.lineage_from "
            "SET x.lineage_from = [p IN x.lineage_from WHERE p <> $t]",
            {"t": trace_id},
        )
        self.run("MATCH (c:Content {trace_id: $t}) DELETE c", {"t": trace_id})
        return bool(taken)

    def sweep(self) -> int:
        """Remove contents whose load or removal was abandoned (no heartbeat for
        ``stale_after_s``); returns how many."""
        rows = self.run(
            "MATCH (c:Content) WHERE c.status <> 'ready' AND c.heartbeat < timestamp() - $age "
            "RETURN c.trace_id AS t",
            {"age": int(self.stale_after_s * 1000)},
        )
        swept = 0
        for r in rows:
            if self.purge(int(r["t"]), stale=True):  # another publisher may have taken it meanwhile
                log.warning("%s: removed trace id %s left by an interrupted publish", self.location, r["t"])
                swept += 1
        return swept

    def collect_garbage(self) -> int:
        """Remove ready contents no ``Trace`` node names; returns how many.

        Each is marked ``deleting`` only after its node is locked (SET first) and the check
        repeated, so a name another client is adding to it meanwhile either lands first and
        keeps it, or waits and then finds it gone (and says so).
        """
        rows = self.run(
            f"MATCH (c:Content {{status: 'ready'}}) WHERE {_UNNAMED} SET c.heartbeat = timestamp() "
            f"WITH c WHERE c.status = 'ready' AND {_UNNAMED} "
            "SET c.status = 'deleting' RETURN c.trace_id AS t"
        )
        for r in rows:
            self.purge(int(r["t"]))
        return len(rows)
