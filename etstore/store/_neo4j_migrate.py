"""Servers written by etstore's former Neo4j backend, upgraded in place to what ``etstore publish`` writes.

That backend kept its own catalog on the server: ``(:EtstoreContent {seq, content_hash, kind,
ranks, ops, deps, missing, messages, lineage_from, status})`` per content, ``(:EtstoreTrace
{name, seq, parent, parent_seq, source, params, created, status})`` per name,
``(:EtstorePayload {seq, table, part, data})`` chunks and ``(:EtstoreFormat {version})``
(format 3: ``Op.trace_id`` and a ``Trace`` node per name; 2: ops named by ``Op.trace``; 1: the
catalog on ``EtstoreTrace`` nodes alone). The read view (:mod:`etstore.store.neo4j`) refuses
such a server in one line saying what to run; :func:`upgrade` (run by ``etstore publish`` and
by ``python -m etstore.store.upgrade URL``) rewrites it:

1. formats 1 and 2 are first brought to format 3, as that backend's own upgrades did;
2. contents left loading or deleting, or that no ready name points at, are removed;
3. each ready content becomes a ``Content`` node with the same trace id (so its ``Op`` uids,
   edges and lineage stay as they are), its payload ``Payload`` nodes (the lineage copies go:
   the read view reads lineage from the ``BECOMES`` edges), and its names ``Trace`` nodes owned
   by the store :data:`LEGACY_STORE`, with their ``params``, ``created`` and
   ``parent_trace_id``; one write transaction per content, which also deletes its catalog
   nodes. A content a store has published meanwhile (same hash and kind) keeps the published
   copy: the names are pointed at it and the old copy removed (with its lineage);
4. the catalog's constraints, indexes and format node go last.

The state is the server's own: the catalog nodes left are the contents not upgraded yet, so
an interrupted upgrade is finished by running it again, and until then the read view refuses.
``TunerStep`` nodes that backend wrote stay as they were (their runs lived in the client's
copy, not on the server).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from etstore.errors import StoreError
from etstore.store._identity import upgraded_identity
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_dialect import driver, message
from etstore.store._neo4j_target import parse_url
from etstore.store.graph import UID_SHIFT, uid_base

__all__ = ["LEGACY_STORE", "legacy_format", "refusal", "upgrade", "upgrade_server"]

log = logging.getLogger(__name__)

LEGACY_STORE = "etstore-neo4j-backend"
"""The store id (``Trace.store``, ``Store.store_id``) of names the former backend wrote."""

_OLDEST = 1
_NEWEST = 3

_LEGACY_SCHEMA = [
    "DROP CONSTRAINT etstore_trace_seq IF EXISTS",
    "DROP CONSTRAINT etstore_trace_content IF EXISTS",
    "DROP CONSTRAINT etstore_trace_name IF EXISTS",
    "DROP INDEX etstore_trace_seq_index IF EXISTS",
    "DROP CONSTRAINT etstore_content_seq IF EXISTS",
    "DROP CONSTRAINT etstore_content_hash IF EXISTS",
    "DROP INDEX etstore_payload_seq IF EXISTS",
    "DROP INDEX etstore_op_trace IF EXISTS",
]


def legacy_format(bolt: Bolt) -> int | None:
    """The former backend's format on this server; None when it holds nothing of that backend."""
    rows = bolt.run(
        "OPTIONAL MATCH (f:EtstoreFormat) WITH max(f.version) AS v "
        "RETURN v, EXISTS { MATCH (t:EtstoreTrace) WHERE t.content_hash IS NOT NULL } AS one, "
        "EXISTS { MATCH (n) WHERE n:EtstoreContent OR n:EtstoreTrace OR n:EtstorePayload } AS any"
    )
    row = rows[0]
    if row["v"] is not None:
        return int(row["v"])
    if row["one"]:
        return 1
    return _NEWEST if row["any"] else None


def refusal(location: str, version: int) -> str:
    """The one line a reader of such a server is refused with."""
    return (
        f"{location} holds traces written by etstore's former Neo4j backend (its format {version}); "
        f"upgrade them in place to what etstore publish writes: python -m etstore.store.upgrade {location}"
    )


def upgrade_server(url: str) -> int:
    """Connect to ``url`` and :func:`upgrade` it; returns the contents upgraded.

    Raises
    ------
    StoreError
        A bad URL, an unreachable server, refused credentials, or the upgrade fails (what it
        finished stays finished; running it again goes on from there).
    """
    bolt = Bolt(parse_url(url), read_only=False)
    try:
        return upgrade(bolt)
    finally:
        bolt.close()


def upgrade(bolt: Bolt) -> int:
    """Bring a server the former backend wrote to the published form (see the module docstring);
    returns how many contents were upgraded (0 when there was nothing of that backend).

    Raises
    ------
    StoreError
        The catalog is of a format this etstore does not know, another client is publishing
        one of its contents right now, or the server refuses a step.

    Notes
    -----
    O(ops of contents removed) in transactions of 10,000 ops; O(names + payload chunks) per
    content for the rest. Nothing is sent over Bolt but statements: the ops, edges and
    payload bytes stay where they are on the server.
    """
    version = legacy_format(bolt)
    if version is None:
        return 0
    if not _OLDEST <= version <= _NEWEST:
        raise StoreError(
            f"{bolt.location} holds a catalog of format {version} of etstore's former Neo4j backend, "
            "which this etstore does not know"
        )
    if version == 1:
        _format1_to_2(bolt)
    if version <= 2:
        _format2_to_3(bolt)
    bolt.run(
        "MERGE (s:Store {store_id: $id}) ON CREATE SET s.location = $loc",
        {"id": LEGACY_STORE, "loc": bolt.location},
        write=True,
    )
    for trace_id in _abandoned(bolt):
        log.warning(
            "%s: removing trace id %d, left incomplete by the former backend", bolt.location, trace_id
        )
        _purge(bolt, trace_id)
    done = 0
    for trace_id in [int(r["s"]) for r in bolt.run("MATCH (c:EtstoreContent) RETURN c.seq AS s ORDER BY s")]:
        _content(bolt, trace_id)
        done += 1
    bolt.run(
        "MATCH (p:EtstorePayload) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS", write=True
    )  # chunks of no content
    for ddl in _LEGACY_SCHEMA:
        bolt.run(ddl, write=True)
    bolt.run("MATCH (f:EtstoreFormat) DELETE f", write=True)
    if done:
        log.warning(
            "%s: upgraded %d contents of the former Neo4j backend to the published form", bolt.location, done
        )
    return done


def _abandoned(bolt: Bolt) -> list[int]:
    """Contents not ready, or that no ready name points at."""
    rows = bolt.run(
        "MATCH (c:EtstoreContent) WHERE c.status <> 'ready' "
        "OR NOT EXISTS { MATCH (t:EtstoreTrace {seq: c.seq, status: 'ready'}) } RETURN c.seq AS s"
    )
    bolt.run(  # names whose ingest never finished, with any Trace node they got
        "MATCH (t:EtstoreTrace) WHERE t.status <> 'ready' "
        "OPTIONAL MATCH (x:Trace {name: t.name}) WHERE x.store IS NULL DELETE t, x",
        write=True,
    )
    return [int(r["s"]) for r in rows]


def _purge(bolt: Bolt, trace_id: int) -> None:
    """Remove content ``trace_id`` of the former backend: ops and their edges (by uid range), payload,
    names, lineage records naming it, and last its catalog node."""
    lo = uid_base(trace_id)
    bolt.run(
        "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
        "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
        {"lo": lo, "hi": lo + (1 << UID_SHIFT)},
        write=True,
    )
    bolt.run(
        "MATCH (p:EtstorePayload {seq: $s}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
        {"s": trace_id},
        write=True,
    )
    bolt.run("MATCH (x:Trace {trace_id: $s}) WHERE x.store IS NULL DELETE x", {"s": trace_id}, write=True)
    bolt.run("MATCH (t:EtstoreTrace {seq: $s}) DELETE t", {"s": trace_id}, write=True)
    for label in ("EtstoreContent", "Content"):
        bolt.run(
            f"MATCH (x:{label}) WHERE $s IN x.lineage_from "
            "SET x.lineage_from = [p IN x.lineage_from WHERE p <> $s]",
            {"s": trace_id},
            write=True,
        )
    bolt.run("MATCH (c:EtstoreContent {seq: $s}) DELETE c", {"s": trace_id}, write=True)


# a name's Trace node as publish writes it, from its catalog node t and the content's id $to
_NAMES = """
MATCH (c:EtstoreContent {seq: $s}) MATCH (t:EtstoreTrace {seq: $s})
MERGE (x:Trace {name: t.name})
SET x.trace_id = $to, x.kind = c.kind, x.ranks = c.ranks, x.ops = c.ops, x.parent = t.parent,
    x.source = t.source, x.store = $store, x.params = coalesce(t.params, '{}'),
    x.created = CASE WHEN t.created IS NULL THEN NULL ELSE localdatetime({datetime: t.created}) END,
    x.parent_trace_id = t.parent_seq
DELETE t
"""

_CONTENT = """
MATCH (c:EtstoreContent {seq: $s})
CREATE (:Content {content_hash: c.content_hash, kind: c.kind, trace_id: c.seq, ranks: c.ranks, ops: c.ops,
    deps: c.deps, missing: c.missing, messages: c.messages, status: 'ready',
    lineage_from: coalesce(c.lineage_from, []), heartbeat: timestamp(), payload: true})
WITH c
OPTIONAL MATCH (p:EtstorePayload {seq: $s}) WHERE NOT p.table STARTS WITH 'lineage'
SET p:Payload, p.trace_id = p.seq
REMOVE p:EtstorePayload, p.seq
"""


def _content(bolt: Bolt, trace_id: int) -> None:
    """Upgrade one ready content (step 3 of the module docstring)."""
    neo4j = driver()
    row = bolt.run(
        "MATCH (c:EtstoreContent {seq: $s}) "
        "OPTIONAL MATCH (x:Content {content_hash: c.content_hash, kind: c.kind}) "
        "RETURN x.trace_id AS other, x.status AS status",
        {"s": trace_id},
    )[0]
    other, status = row["other"], row["status"]
    taken = bolt.run(
        "MATCH (t:EtstoreTrace {seq: $s}) MATCH (x:Trace {name: t.name}) "
        "WHERE x.store IS NOT NULL AND x.store <> $store RETURN t.name AS n",
        {"s": trace_id, "store": LEGACY_STORE},
    )
    if taken:
        raise StoreError(
            f"{bolt.location}: {taken[0]['n']!r} is both a name of the former backend and one a store "
            "published; remove one of them (MATCH (t:Trace {name: ...}) ...), then upgrade again"
        )
    if other is not None and status != "ready":
        raise StoreError(
            f"{bolt.location}: trace id {trace_id} is being published by another client as trace id {other}; "
            "retry when that finishes"
        )

    def work(tx: Any) -> None:
        params = {"s": trace_id, "to": trace_id if other is None else int(other), "store": LEGACY_STORE}
        if other is None:
            tx.run(_CONTENT, params).consume()
        tx.run(_NAMES, params).consume()
        if other is None:
            tx.run("MATCH (p:EtstorePayload {seq: $s}) DELETE p", params).consume()  # lineage copies
            tx.run("MATCH (c:EtstoreContent {seq: $s}) DELETE c", params).consume()
        else:
            tx.run("MATCH (c:EtstoreContent {seq: $s}) SET c.status = 'superseded'", params).consume()

    try:
        with bolt.session(write=True) as s:
            s.execute_write(work)
    except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError) as exc:
        raise StoreError(f"{bolt.location}: upgrading trace id {trace_id} failed: {message(exc)}") from exc
    if other is not None:
        log.warning(
            "%s: trace id %d was published as trace id %d: its names now point there",
            bolt.location,
            trace_id,
            other,
        )
        _purge(bolt, trace_id)


# ---------------------------------------------------------------- formats 1 and 2 (as the backend did)

_SPLIT = """
UNWIND $rows AS r
MATCH (t:EtstoreTrace {seq: r.seq})
CREATE (c:EtstoreContent {seq: t.seq, content_hash: r.hash, kind: t.kind, ranks: t.ranks, ops: t.ops,
    deps: t.deps, missing: t.missing, messages: t.messages,
    lineage_from: CASE WHEN r.parent_seq IS NULL THEN [] ELSE [r.parent_seq] END,
    status: CASE t.status WHEN 'ready' THEN 'ready' ELSE 'deleting' END,
    heartbeat: coalesce(t.heartbeat, timestamp()), created: t.created})
SET t.parent_seq = r.parent_seq
REMOVE t.content_hash, t.kind, t.ranks, t.ops, t.deps, t.missing, t.messages, t.heartbeat
WITH t
WHERE t.status <> 'ready'
DELETE t
WITH count(*) AS done MERGE (f:EtstoreFormat) SET f.version = 2
"""


def _format1_to_2(bolt: Bolt) -> None:
    """Split format-1 ``EtstoreTrace`` nodes into names and contents in one transaction (trace
    ids stay; algorithm digests gain their parameters, :func:`upgraded_identity`)."""
    nodes = [r["t"] for r in bolt.run("MATCH (t:EtstoreTrace) WHERE t.content_hash IS NOT NULL RETURN t")]
    trace_id_of = {t["name"]: int(t["seq"]) for t in nodes if t.get("status") == "ready"}
    rows = [
        {
            "seq": int(t["seq"]),
            "hash": upgraded_identity(t["content_hash"], t["kind"], json.loads(t.get("params") or "{}")),
            "parent_seq": trace_id_of.get(t.get("parent") or ""),
        }
        for t in nodes
    ]
    bolt.write_tx(_SPLIT, {"rows": rows})


def _format2_to_3(bolt: Bolt) -> None:
    """Move format-2 ops from a name (``o.trace``) to their content (``o.trace_id``, from the uid)
    in transactions of 10,000, then give each ready name its ``Trace`` node and record format 3."""
    bolt.run(
        "MATCH (o:Op) WHERE o.trace IS NOT NULL "
        "CALL { WITH o SET o.trace_id = o.uid / $unit REMOVE o.trace } IN TRANSACTIONS OF 10000 ROWS",
        {"unit": 1 << UID_SHIFT},
        write=True,
    )
    bolt.write_tx(
        "MATCH (t:EtstoreTrace {status: 'ready'}) MATCH (c:EtstoreContent {seq: t.seq, status: 'ready'}) "
        "MERGE (x:Trace {name: t.name}) SET x.trace_id = c.seq, x.kind = c.kind, x.ranks = c.ranks, "
        "x.ops = c.ops, x.parent = t.parent, x.source = t.source "
        "WITH count(*) AS done MATCH (c:EtstoreContent) REMOVE c.graph_name "
        "WITH count(*) AS done MERGE (f:EtstoreFormat) SET f.version = 3",
        {},
    )
