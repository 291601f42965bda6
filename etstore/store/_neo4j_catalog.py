"""The Neo4j backend's catalog: names, contents and the format version, as server nodes.

- ``(:EtstoreContent {seq, content_hash, kind, ranks, ops, deps, missing, messages,
  lineage_from, status, heartbeat, created})``: one stored content; its ``Op`` nodes have
  uids from ``seq << 40`` and carry ``seq`` in ``trace_id``; ``lineage_from`` lists the
  parent contents it has ``BECOMES`` edges from.
- ``(:EtstoreTrace {name, seq, parent, parent_seq, source, params, created, status})``:
  a name pointing at content ``seq`` (``loading`` while its content is written).
- ``(:Trace {name, trace_id, kind, ranks, ops, parent, source})``: what Cypher sees of a
  ready name (:data:`~etstore.store.graph.TRACE_NODE_COLUMNS`), written in the transaction
  that makes the name ready (:data:`TRACE_NODE`) and deleted with it, so queries join a
  name to its ops (``o.trace_id = t.trace_id``) and never see a half-written trace by name.
- ``(:EtstoreFormat {version})``: the store format (:data:`FORMAT_VERSION`).

Older formats are upgraded in place by :func:`upgrade`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from etstore.errors import StoreError
from etstore.store._identity import upgraded_identity
from etstore.store.graph import TRACE_NODE_COLUMNS, UID_SHIFT

__all__ = ["FORMAT_VERSION", "SCHEMA", "TRACE_NODE", "Run", "check_format", "format_version", "upgrade"]

FORMAT_VERSION = 3
"""The server store's format, apart from the embedded store's (the two layouts move separately).

1: the catalog on ``EtstoreTrace`` nodes alone, before names; 2: names and contents, each
``Op`` carrying one name of its content in ``trace``; 3: ``Op.trace_id`` and one ``Trace``
node per name."""

Run = Callable[..., list[Any]]
"""``run(query, params, write=False)``: one auto-commit statement, its records."""
WriteTx = Callable[[str, Mapping[str, Any]], None]
"""``write_tx(query, params)``: one statement in one write transaction."""

SCHEMA = [
    "DROP CONSTRAINT etstore_trace_seq IF EXISTS",  # format 1: one name per seq
    "DROP CONSTRAINT etstore_trace_content IF EXISTS",  # format 1: content keyed on the name node
    "CREATE CONSTRAINT etstore_op_uid IF NOT EXISTS FOR (o:Op) REQUIRE o.uid IS UNIQUE",
    "CREATE INDEX etstore_op_trace_id IF NOT EXISTS FOR (o:Op) ON (o.trace_id)",
    "CREATE CONSTRAINT etstore_trace_node_name IF NOT EXISTS FOR (t:Trace) REQUIRE t.name IS UNIQUE",
    "CREATE INDEX etstore_trace_node_id IF NOT EXISTS FOR (t:Trace) ON (t.trace_id)",
    "CREATE CONSTRAINT etstore_trace_name IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.name IS UNIQUE",
    "CREATE INDEX etstore_trace_seq_index IF NOT EXISTS FOR (t:EtstoreTrace) ON (t.seq)",
    "CREATE CONSTRAINT etstore_content_seq IF NOT EXISTS FOR (c:EtstoreContent) REQUIRE c.seq IS UNIQUE",
    "CREATE CONSTRAINT etstore_content_hash IF NOT EXISTS "
    "FOR (c:EtstoreContent) REQUIRE (c.content_hash, c.kind) IS UNIQUE",
    "CREATE CONSTRAINT etstore_counter IF NOT EXISTS FOR (c:EtstoreCounter) REQUIRE c.name IS UNIQUE",
    "CREATE INDEX etstore_payload_seq IF NOT EXISTS FOR (p:EtstorePayload) ON (p.seq)",
]
"""Constraints and indexes of the current format (idempotent; drops format 1's that no longer hold)."""

# each Trace property from the name node ``t`` and its content node ``c``
_TRACE_FROM = {
    "name": "t.name",
    "trace_id": "c.seq",
    "kind": "c.kind",
    "ranks": "c.ranks",
    "ops": "c.ops",
    "parent": "t.parent",
    "source": "t.source",
}
assert tuple(_TRACE_FROM) == TRACE_NODE_COLUMNS, "a Trace property without its source"
TRACE_NODE = "CREATE (:Trace {" + ", ".join(f"{k}: {v}" for k, v in _TRACE_FROM.items()) + "})"
"""Cypher clause creating the ``Trace`` node of name node ``t`` and content node ``c``."""


def format_version(run: Run) -> int | None:
    """The server store's format: its version node, 1 for catalog nodes of format 1, None if empty."""
    rows = run("MATCH (f:EtstoreFormat) RETURN max(f.version) AS v")
    if rows and rows[0]["v"] is not None:
        return int(rows[0]["v"])
    old = run("MATCH (t:EtstoreTrace) WHERE t.content_hash IS NOT NULL RETURN count(t) AS n")
    return 1 if old and old[0]["n"] else None


def check_format(run: Run, location: str, *, read_only: bool) -> int | None:
    """The format after checking this etstore may use it as opened.

    Raises
    ------
    StoreError
        A newer format, or an older one opened read-only (the message says what to run).
    """
    version = format_version(run)
    if version is not None and version > FORMAT_VERSION:
        raise StoreError(
            f"{location} is store format {version}, written by a newer etstore; this etstore "
            f"reads format {FORMAT_VERSION}: upgrade etstore"
        )
    if version is not None and version < FORMAT_VERSION and read_only:
        raise StoreError(
            f"{location} is store format {version} (written by an older etstore) and is open read-only; "
            f"upgrade it in place first: python -m etstore.store.upgrade {location}"
        )
    return version


def upgrade(run: Run, write_tx: WriteTx, version: int) -> None:
    """Bring a store of an older ``version`` to :data:`FORMAT_VERSION`, one format at a time."""
    if version == 1:
        _upgrade_format1(write_tx, run)
    _upgrade_format2(run, write_tx)


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
WITH t, r
OPTIONAL MATCH (p:EtstorePayload {seq: r.seq, table: 'lineage'})
FOREACH (x IN CASE WHEN r.parent_seq IS NULL THEN [p] ELSE [] END | DELETE x)
FOREACH (x IN CASE WHEN r.parent_seq IS NULL THEN [] ELSE [p] END |
    SET x.table = 'lineage@' + toString(r.parent_seq))
WITH t WHERE t.status <> 'ready'
DELETE t
"""


def _upgrade_format1(write_tx: WriteTx, run: Run) -> None:
    """Split format-1 ``EtstoreTrace`` nodes into names and contents, in one transaction,
    and record format 2.

    Trace ids (``seq``) stay, so ``Op`` uids and payloads keep their keys; an old
    ``lineage`` payload becomes ``lineage@<parent seq>``. Algorithm digests gain their
    parameters (:func:`~etstore.store._identity.upgraded_identity`).
    """
    old = run("MATCH (t:EtstoreTrace) WHERE t.content_hash IS NOT NULL RETURN t")
    nodes = [r["t"] for r in old]
    seq_of = {t["name"]: int(t["seq"]) for t in nodes if t.get("status") == "ready"}
    rows = [
        {
            "seq": int(t["seq"]),
            "hash": upgraded_identity(t["content_hash"], t["kind"], json.loads(t.get("params") or "{}")),
            "parent_seq": seq_of.get(t.get("parent") or ""),
        }
        for t in nodes
    ]
    write_tx(_SPLIT + "WITH count(*) AS done MERGE (f:EtstoreFormat) SET f.version = 2", {"rows": rows})


_TRACE_NODES = (
    "OPTIONAL MATCH (x:Trace) WHERE NOT EXISTS { MATCH (:EtstoreTrace {name: x.name, status: 'ready'}) } "
    "DELETE x WITH count(*) AS done "
    "MATCH (t:EtstoreTrace {status: 'ready'}) MATCH (c:EtstoreContent {seq: t.seq, status: 'ready'}) "
    "MERGE (x:Trace {name: t.name}) SET "
    + ", ".join(f"x.{k} = {v}" for k, v in _TRACE_FROM.items() if k != "name")
    + " WITH count(*) AS done MATCH (c:EtstoreContent) REMOVE c.graph_name"
    " WITH count(*) AS done MERGE (f:EtstoreFormat) SET f.version = $v"
)


def _upgrade_format2(run: Run, write_tx: WriteTx) -> None:
    """Move format-2 ops from a name (``o.trace``) to their content (``o.trace_id``) and give
    each ready name its ``Trace`` node (and no other name one), then record format 3.

    The ops move in transactions of 10,000 (a store of millions of ops would exhaust the
    server's heap in one); the ``Trace`` nodes and the version follow in one transaction.
    Every step is idempotent, so an interrupted upgrade (the store still says format 2)
    is finished by the next writable open. The content is known from the uid
    (``trace_id = uid >> 40``), so no catalog lookup is needed per op.
    """
    run(
        "MATCH (o:Op) WHERE o.trace IS NOT NULL "
        "CALL { WITH o SET o.trace_id = o.uid / $unit REMOVE o.trace } IN TRANSACTIONS OF 10000 ROWS",
        {"unit": 1 << UID_SHIFT},
        write=True,
    )
    write_tx(_TRACE_NODES, {"v": FORMAT_VERSION})
    run("DROP INDEX etstore_op_trace IF EXISTS", write=True)  # format 2's index on Op.trace
