"""The Neo4j backend's catalog: names, contents and the format version, as server nodes.

- ``(:EtstoreContent {seq, content_hash, kind, ranks, ops, deps, missing, messages,
  graph_name, lineage_from, status, heartbeat, created})``: one stored content; its
  ``Op`` nodes have uids from ``seq << 40`` and carry ``graph_name`` in ``trace``;
  ``lineage_from`` lists the parent contents it has ``BECOMES`` edges from.
- ``(:EtstoreTrace {name, seq, parent, parent_seq, source, params, created, status})``:
  a name pointing at content ``seq`` (``loading`` while its content is written).
- ``(:EtstoreFormat {version})``: the store format (:data:`~etstore.store.catalog.FORMAT_VERSION`).

Format 1 (before names) kept everything on ``EtstoreTrace`` nodes; :func:`upgrade_format1`
splits them in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from etstore.errors import StoreError
from etstore.store._identity import upgraded_identity
from etstore.store.catalog import FORMAT_VERSION

__all__ = ["SCHEMA", "Run", "format_version", "upgrade_format1"]

Run = Callable[..., list[Any]]
"""``run(query, params, write=False)``: one auto-commit statement, its records."""

SCHEMA = [
    "DROP CONSTRAINT etstore_trace_seq IF EXISTS",  # format 1: one name per seq
    "DROP CONSTRAINT etstore_trace_content IF EXISTS",  # format 1: content keyed on the name node
    "CREATE CONSTRAINT etstore_op_uid IF NOT EXISTS FOR (o:Op) REQUIRE o.uid IS UNIQUE",
    "CREATE INDEX etstore_op_trace IF NOT EXISTS FOR (o:Op) ON (o.trace)",
    "CREATE CONSTRAINT etstore_trace_name IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.name IS UNIQUE",
    "CREATE INDEX etstore_trace_seq_index IF NOT EXISTS FOR (t:EtstoreTrace) ON (t.seq)",
    "CREATE CONSTRAINT etstore_content_seq IF NOT EXISTS FOR (c:EtstoreContent) REQUIRE c.seq IS UNIQUE",
    "CREATE CONSTRAINT etstore_content_hash IF NOT EXISTS "
    "FOR (c:EtstoreContent) REQUIRE (c.content_hash, c.kind) IS UNIQUE",
    "CREATE CONSTRAINT etstore_counter IF NOT EXISTS FOR (c:EtstoreCounter) REQUIRE c.name IS UNIQUE",
    "CREATE INDEX etstore_payload_seq IF NOT EXISTS FOR (p:EtstorePayload) ON (p.seq)",
]
"""Constraints and indexes of a format-2 store (idempotent; drops format 1's that no longer hold)."""


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
        A newer format, or format 1 opened read-only (the message says what to run).
    """
    version = format_version(run)
    if version is not None and version > FORMAT_VERSION:
        raise StoreError(
            f"{location} is store format {version}, written by a newer etstore; this etstore "
            f"reads format {FORMAT_VERSION}: upgrade etstore"
        )
    if version == 1 and read_only:
        raise StoreError(
            f"{location} is store format 1 (written by an older etstore) and is open read-only; "
            f"upgrade it in place first: python -m etstore.store.upgrade {location}"
        )
    return version


_SPLIT = """
UNWIND $rows AS r
MATCH (t:EtstoreTrace {seq: r.seq})
CREATE (c:EtstoreContent {seq: t.seq, content_hash: r.hash, kind: t.kind, ranks: t.ranks, ops: t.ops,
    deps: t.deps, missing: t.missing, messages: t.messages, graph_name: t.name,
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


def upgrade_format1(run: Run, write_tx: Callable[[str, Mapping[str, Any]], None]) -> None:
    """Split format-1 ``EtstoreTrace`` nodes into names and contents, in one transaction
    (``write_tx(query, params)`` runs it), and record the format.

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
    write_tx(
        _SPLIT + "WITH count(*) AS done MERGE (f:EtstoreFormat) SET f.version = $v",
        {"rows": rows, "v": FORMAT_VERSION},
    )
