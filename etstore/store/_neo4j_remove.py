"""How names and contents leave a Neo4j store: a name with its ``Trace`` node, a content with
its graph and payload (in bounded transactions), and the sweep of abandoned ingests.

A name is removed in one statement with its ``Trace`` node, so Cypher never finds a name the
catalog no longer lists. When it was the content's last name, the same statement marks the
content ``deleting``: :func:`purge` then removes it piece by piece, and a client that dies
half-way leaves a content that :func:`abandoned` reports to the next writable open.
"""

from __future__ import annotations

from etstore.store._neo4j_catalog import Run
from etstore.store.graph import UID_SHIFT, uid_base

__all__ = ["abandoned", "drop_name", "purge"]


def drop_name(run: Run, name: str, seq: int) -> bool:
    """Delete ``name`` (its catalog node and its ``Trace`` node) of content ``seq``; drop the
    lineage from a parent content that only this name derived from it.

    Returns True when it was the content's last name: the content is then marked
    ``deleting``, for :func:`purge`.
    """
    rows = run(
        "MATCH (t:EtstoreTrace {name: $n}) OPTIONAL MATCH (x:Trace {name: $n}) "
        "WITH t, x, t.parent_seq AS pseq DELETE t, x "
        "WITH pseq OPTIONAL MATCH (o:EtstoreTrace {seq: $s}) WITH pseq, collect(o) AS rest "
        "MATCH (c:EtstoreContent {seq: $s}) "
        "SET c.status = CASE size(rest) WHEN 0 THEN 'deleting' ELSE c.status END, "
        "c.heartbeat = timestamp() "
        "RETURN pseq, size(rest) AS names, [x IN rest | x.parent_seq] AS parents",
        {"n": name, "s": seq},
        write=True,
    )
    if not rows or not rows[0]["names"]:
        return True
    pseq, parents = rows[0]["pseq"], rows[0]["parents"]
    if pseq is not None and pseq not in parents:  # the last name derived from that parent
        run(
            "MATCH (a:Op {trace_id: $p})-[r:BECOMES]->(b:Op {trace_id: $s}) DELETE r",
            {"p": int(pseq), "s": seq},
            write=True,
        )
        run(
            "MATCH (p:EtstorePayload {seq: $s, table: $t}) DELETE p "
            "WITH count(*) AS n MATCH (c:EtstoreContent {seq: $s}) "
            "SET c.lineage_from = [x IN c.lineage_from WHERE x <> $p]",
            {"s": seq, "t": f"lineage@{pseq}", "p": pseq},
            write=True,
        )
    return False


def purge(run: Run, seq: int) -> None:
    """Remove content ``seq``: ops with their edges, payload, names with their ``Trace`` nodes,
    then the content node (last, so an interrupted purge is found again by :func:`abandoned`)."""
    lo = uid_base(seq)
    run(
        "MATCH (c:EtstoreContent {seq: $s}) SET c.status = 'deleting', c.heartbeat = timestamp()",
        {"s": seq},
        write=True,
    )
    # by uid range, not trace_id: an op of an interrupted batch is in the range whatever it carries
    run(
        "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi "
        "CALL { WITH o DETACH DELETE o } IN TRANSACTIONS OF 10000 ROWS",
        {"lo": lo, "hi": lo + (1 << UID_SHIFT)},
        write=True,
    )
    run(
        "MATCH (p:EtstorePayload {seq: $s}) CALL { WITH p DELETE p } IN TRANSACTIONS OF 10 ROWS",
        {"s": seq},
        write=True,
    )
    run("MATCH (t:Trace {trace_id: $s}) DELETE t", {"s": seq}, write=True)
    run("MATCH (t:EtstoreTrace {seq: $s}) DELETE t", {"s": seq}, write=True)
    run("MATCH (c:EtstoreContent {seq: $s}) DELETE c", {"s": seq}, write=True)


def abandoned(run: Run, stale_after_s: float) -> list[tuple[int, str]]:
    """(trace id, a name or ``#id``) of contents whose ingest or removal was abandoned (no
    heartbeat for ``stale_after_s``) or that no name points at."""
    rows = run(
        "MATCH (c:EtstoreContent) WHERE (c.status <> 'ready' AND c.heartbeat < timestamp() - $age) "
        "OR (c.status = 'ready' AND NOT EXISTS { MATCH (t:EtstoreTrace {seq: c.seq}) }) "
        "OPTIONAL MATCH (t:EtstoreTrace {seq: c.seq}) "
        "RETURN c.seq AS seq, collect(t.name)[0] AS name",
        {"age": int(stale_after_s * 1000)},
    )
    return [(int(r["seq"]), r["name"] or f"#{r['seq']}") for r in rows]
