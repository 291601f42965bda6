"""Runs and their metrics on the server ``etstore publish`` writes: records keyed by ``key``.

:mod:`etstore.app._publish_records` reads them from the store, one :class:`RecordSet` per
label; these functions write them through a :class:`~etstore.store._neo4j_publish.Server`:
a record and its child rows in one transaction, merged on its key (the label's uniqueness
constraint), so publishers racing with the same record make one node; its links to ``Trace``
nodes and other runs are merged too, whichever publisher makes them; a store's records it no
longer holds are removed with ``prune``. :mod:`etstore.store._neo4j_records` is the reader's
side of the same shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from etstore.progress import ProgressFn

if TYPE_CHECKING:
    from etstore.store._neo4j_publish import Server

__all__ = ["Children", "RecordSet", "prune_records", "record_keys", "relink", "write_records"]


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


def record_keys(server: Server, label: str, keys: list[str]) -> set[str]:
    """Which of ``keys`` the server holds as ``label`` nodes."""
    rows = server.run(f"UNWIND $keys AS k MATCH (n:{label} {{key: k}}) RETURN n.key AS k", {"keys": keys})
    return {r["k"] for r in rows}


def write_records(server: Server, records: RecordSet, store: str, progress: ProgressFn | None = None) -> int:
    """Create those of ``records`` the server lacks, with their child rows and links, in
    transactions of about ``batch_rows`` rows: a record and its children land together.

    Each record is merged on its key: the uniqueness constraint makes a publisher racing
    for the same record wait for the other's transaction and then find it, so a record
    another publisher wrote meanwhile is kept as it is. Returns how many were created.
    """
    label = records.label
    batch: list[dict[str, Any]] = []
    size = 0
    done = 0
    created = 0
    total = len(records.rows)

    def attempt(tx: Any) -> int:
        keys = [
            r["k"]
            for r in tx.run(
                f"UNWIND $rows AS r MERGE (n:{label} {{key: r.key}}) "
                "ON CREATE SET n = r, n.store = $s, n.fresh = true "
                "WITH n WHERE n.fresh REMOVE n.fresh RETURN n.key AS k",
                rows=batch,
                s=store,
            )
        ]
        for child in records.children:
            rows = [{"parent": k, "props": row} for k in keys for row in child.rows.get(k, [])]
            for start in range(0, len(rows), server.batch_rows):
                tx.run(
                    f"UNWIND $rows AS r MATCH (p:{label} {{key: r.parent}}) "
                    f"CREATE (p)-[:{child.rel}]->(c:{child.label}) SET c = r.props",
                    rows=rows[start : start + server.batch_rows],
                ).consume()
        for link in records.links:
            tx.run(link, keys=keys, store=store).consume()
        return len(keys)

    def flush() -> None:
        nonlocal batch, size, done, created
        if not batch:
            return
        created += server.write(f"publishing {label} records", attempt)
        done += len(batch)
        if progress is not None:
            progress(label, done, total)
        batch, size = [], 0

    for row in records.rows:
        batch.append(row)
        size += 1 + sum(len(c.rows.get(row["key"], ())) for c in records.children)
        if size >= server.batch_rows:
            flush()
    flush()
    return created


def relink(server: Server, records: RecordSet, store: str) -> None:
    """Run the links of every record of this store (what a trace published since now reaches)."""
    if not records.links:
        return
    keys = [
        r["k"] for r in server.run(f"MATCH (n:{records.label} {{store: $s}}) RETURN n.key AS k", {"s": store})
    ]
    for link in records.links:
        server.run(link, {"keys": keys, "store": store})


def prune_records(server: Server, records: RecordSet, store: str, keep: Iterable[str]) -> int:
    """Delete this store's ``label`` records (and their children) whose key is not in ``keep``."""
    rels = "|".join(c.rel for c in records.children)
    child = f"OPTIONAL MATCH (n)-[:{rels}]->(c) " if rels else ""
    rows = server.run(
        f"MATCH (n:{records.label} {{store: $s}}) WHERE NOT n.key IN $keep "
        f"{child}WITH n, collect(c) AS cs FOREACH (x IN cs | DETACH DELETE x) "
        "WITH n DETACH DELETE n RETURN count(*) AS removed"
        if rels
        else f"MATCH (n:{records.label} {{store: $s}}) WHERE NOT n.key IN $keep "
        "DETACH DELETE n RETURN count(*) AS removed",
        {"s": store, "keep": list(keep)},
    )
    return int(rows[0]["removed"]) if rows else 0
