"""Removing one content's ops and edges from the Ladybug graph, the faster of two ways.

Ladybug deletes at about 10 µs per node or edge (its primary-key index and both
directions of every edge list are updated one entry at a time): ~24 s for a 1M-op trace
with its 1.5M edges. Writing what stays into a new graph file costs ~2.2 s per 1M ops
kept (with their edges), reading the kept rows from the DuckDB warehouse, which holds
every column the graph has (:func:`warehouse_rows`), and bulk-loading them with
``COPY``. So a removal that leaves less than :data:`REBUILD_RATIO` times what it removes
rebuilds the graph without it and swaps the file in (:func:`rebuild_without`): 0.24 s
for a 1M-op trace beside a small one, 2.2 s beside another 1M-op trace. Otherwise it
deletes in place (:func:`delete_range`). The last trace of a store costs nothing: the
caller drops the tables and makes them again.

Both are safe to cut short: a deletion is redone (the journal names the removal), a
rebuild writes a separate file (``graph.rebuild``) and replaces the graph with one
``rename``; a leftover rebuild file is discarded (:func:`discard_rebuild`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.store._copy import copy_arrow
from etstore.store.warehouse import Warehouse

__all__ = [
    "REBUILD_RATIO",
    "RowSource",
    "Step",
    "count_range",
    "delete_range",
    "discard_rebuild",
    "rebuild_without",
    "remove_range",
    "swap_in",
    "warehouse_rows",
]

REBUILD_RATIO = 8.0
"""Rebuild when the ops that stay number fewer than this many times the ops removed
(measured on 1M-op traces: deleting costs ~24 µs per op removed, rebuilding ~2.2 µs per
op kept; the margin covers traces with more edges per op)."""

_KNOWN_RELS = ("DEP", "MSG", "BECOMES")

Step = Callable[[str], None]
"""``step(what)``: one more stage of a removal is starting."""

RowSource = Callable[[str, list[tuple[str, str]]], "pa.Table | None"]
"""``source(table, [(column, Ladybug type), ...])``: the rows a rebuild keeps for ``table``
(edges: ``from``, ``to``, then the properties), or None to read them from the graph."""


def remove_range(
    conn: Any,
    graph: Path,
    lo: int,
    hi: int,
    step: Step,
    *,
    pool: int,
    release: Callable[[], None],
    source: RowSource | None = None,
) -> None:
    """Remove the ops with uids in ``[lo, hi)`` and their edges from the graph file ``graph``,
    rebuilding it without them or deleting in place, whichever is faster.

    Parameters
    ----------
    conn
        A writable connection to ``graph``.
    graph
        The graph file.
    lo, hi
        The uid range.
    step
        Told as each stage starts.
    pool
        The rebuilt database's buffer pool, in bytes.
    release
        Closes ``conn`` and its database (before a rebuilt file replaces theirs).
    source
        Where a rebuild reads the rows it keeps (:func:`warehouse_rows`); default the graph.

    Notes
    -----
    O(min(kept, :data:`REBUILD_RATIO` x removed)) nodes and edges, roughly.
    """
    inside, total = count_range(conn, lo, hi)
    if inside == 0:
        return
    if total - inside < REBUILD_RATIO * inside:
        import ladybug  # imported lazily: only a removal that rebuilds needs it here

        conn.execute("CHECKPOINT")  # the copy reads everything; nothing may stay in the log
        target = graph.with_name(graph.name + ".rebuild")
        if rebuild_without(conn, target, lo, hi, step, ladybug=ladybug, pool=pool, source=source):
            release()
            swap_in(target, graph)
            return
    delete_range(conn, lo, hi, step)


def count_range(conn: Any, lo: int, hi: int) -> tuple[int, int]:
    """(ops with uids in ``[lo, hi)``, all ops) in the graph.

    Notes
    -----
    One scan of the ``uid`` column (~10 ms per 1M ops).
    """
    inside = conn.execute(
        "MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi RETURN count(o)", {"lo": lo, "hi": hi}
    ).get_as_arrow(0)
    total = conn.execute("MATCH (o:Op) RETURN count(o)").get_as_arrow(0)
    return int(inside.column(0)[0].as_py()), int(total.column(0)[0].as_py())


def delete_range(conn: Any, lo: int, hi: int, step: Step) -> None:
    """Delete the ops with uids in ``[lo, hi)`` and every edge touching them, in place.

    Notes
    -----
    O(removed nodes + edges) at Ladybug's per-entry delete cost; edges first, one table
    at a time (faster than ``DETACH DELETE``), then the nodes, then one checkpoint.
    """
    p = {"lo": lo, "hi": hi}
    for rel, end in (("DEP", "a"), ("MSG", "a"), ("BECOMES", "a"), ("BECOMES", "b")):
        step(f"{rel} edges")
        conn.execute(f"MATCH (a:Op)-[r:{rel}]->(b:Op) WHERE {end}.uid >= $lo AND {end}.uid < $hi DELETE r", p)
    step("ops")
    conn.execute("MATCH (o:Op) WHERE o.uid >= $lo AND o.uid < $hi DETACH DELETE o", p)
    step("checkpoint")
    conn.execute("CHECKPOINT")


def _schema(conn: Any) -> tuple[list[str], list[str], dict[str, list[tuple[str, str]]]] | None:
    """The DDL recreating ``conn``'s tables, the node and rel tables, and each table's
    (column, Ladybug type) pairs; None if a rel table is not one this store makes."""
    tables = conn.execute("CALL show_tables() RETURN name, type").get_as_arrow(0).to_pylist()
    nodes = sorted(t["name"] for t in tables if t["type"] == "NODE")
    rels = sorted(t["name"] for t in tables if t["type"] == "REL")
    if any(r not in _KNOWN_RELS for r in rels):
        return None
    ddl: list[str] = []
    columns: dict[str, list[tuple[str, str]]] = {}
    for t in nodes:
        info = conn.execute(f"CALL table_info('{t}') RETURN *").get_as_arrow(0).to_pylist()
        columns[t] = [(c["name"], c["type"]) for c in info]
        key = next(c["name"] for c in info if c["primary key"])
        cols = ", ".join(f"`{c['name']}` {c['type']}" for c in info)
        ddl.append(f"CREATE NODE TABLE `{t}`({cols}, PRIMARY KEY(`{key}`))")
    for r in rels:
        info = conn.execute(f"CALL table_info('{r}') RETURN *").get_as_arrow(0).to_pylist()
        ends = conn.execute(f"CALL show_connection('{r}') RETURN *").get_as_arrow(0).to_pylist()
        if (
            len(ends) != 1
            or ends[0]["source table name"] != "Op"
            or ends[0]["destination table name"] != "Op"
        ):
            return None
        columns[r] = [(c["name"], c["type"]) for c in info]
        props = "".join(f", `{c['name']}` {c['type']}" for c in info)
        ddl.append(f"CREATE REL TABLE `{r}`(FROM Op TO Op{props})")
    return ddl, nodes + rels, columns


def rebuild_without(
    conn: Any,
    target: Path,
    lo: int,
    hi: int,
    step: Step,
    *,
    ladybug: Any,
    pool: int,
    source: RowSource | None = None,
) -> bool:
    """Write a copy of the graph ``conn`` reads, without the ops in ``[lo, hi)`` and their
    edges, to ``target`` (closed and checkpointed when this returns True).

    Parameters
    ----------
    conn
        A connection to the current graph (checkpointed: nothing pending in its log).
    target
        The new graph file (removed first if it exists).
    lo, hi
        The uid range to leave out.
    step
        Told as each table starts.
    ladybug
        The ``ladybug`` module (imported lazily by the caller).
    pool
        The new database's buffer pool, in bytes (0: Ladybug's default).
    source
        Where the kept rows of a table come from when not from the graph itself
        (:func:`warehouse_rows`: DuckDB reads them ~30x faster than Ladybug).

    Returns
    -------
    bool
        False when the graph holds tables this store does not make (nothing written):
        delete in place instead.

    Notes
    -----
    O(kept nodes + edges) bulk reads and ``COPY``; holds one table's kept rows in memory.
    """
    schema = _schema(conn)
    if schema is None:
        return False
    ddl, tables, columns = schema
    discard_rebuild(target)
    db = ladybug.Database(str(target), buffer_pool_size=pool, auto_checkpoint=False)
    try:
        new = ladybug.Connection(db)
        for statement in ddl:
            new.execute(statement)
        for t in tables:
            step(f"copy {t}")
            rows = source(t, columns[t]) if source is not None else None
            if rows is None:
                rows = _graph_rows(conn, t, [c for c, _ in columns[t]], lo, hi)
            if rows.num_rows:
                copy_arrow(new, t, rows)
            del rows
        step("checkpoint")
        new.execute("CHECKPOINT")
        new.close()
    finally:
        db.close()
    return True


def _graph_rows(conn: Any, table: str, columns: list[str], lo: int, hi: int) -> pa.Table:
    """The rows of ``table`` the rebuild keeps, read back from the graph (edges as ``from``,
    ``to`` and their properties)."""
    p = {"lo": lo, "hi": hi}
    if table in _KNOWN_RELS:
        keep = "NOT (a.uid >= $lo AND a.uid < $hi) AND NOT (b.uid >= $lo AND b.uid < $hi)"
        props = "".join(f", r.`{c}` AS `{c}`" for c in columns)
        q = f"MATCH (a:Op)-[r:`{table}`]->(b:Op) WHERE {keep} RETURN a.uid AS `from`, b.uid AS `to`" + props
        return conn.execute(q, p).get_as_arrow(0)
    where = " WHERE n.uid < $lo OR n.uid >= $hi" if table == "Op" else ""
    q = f"MATCH (n:`{table}`){where} RETURN " + ", ".join(f"n.`{c}` AS `{c}`" for c in columns)
    return conn.execute(q, p if where else None).get_as_arrow(0)


_ARROW_TYPES = {
    "INT8": pa.int8(),
    "INT16": pa.int16(),
    "INT32": pa.int32(),
    "INT64": pa.int64(),
    "UINT8": pa.uint8(),
    "UINT16": pa.uint16(),
    "UINT32": pa.uint32(),
    "UINT64": pa.uint64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "BOOL": pa.bool_(),
    "BOOLEAN": pa.bool_(),
    "STRING": pa.string(),
}

# what the graph's Op, DEP, MSG and BECOMES rows are made of in the warehouse (etstore.store.graph
# builds them from the same columns at ingest): (table, the edge's ends, its properties)
_EDGE_SOURCES = {
    "DEP": ("trace_deps", "src_uid", "dst_uid", ("kind",)),
    "MSG": ("trace_messages", "send_uid", "recv_uid", ("tag", "comm_size")),
}


def warehouse_rows(wh: Warehouse, keep: Mapping[int, str]) -> RowSource:
    """A :data:`RowSource` reading the kept rows of ``Op``, ``DEP``, ``MSG`` and ``BECOMES``
    from the warehouse, which holds every column the graph has (other tables, or a graph
    whose columns the warehouse lacks, are read from the graph).

    Parameters
    ----------
    wh
        The store's warehouse.
    keep
        The contents to keep: trace id -> the name their ``Op`` nodes carry in ``trace``.

    Notes
    -----
    O(kept rows), columnar DuckDB scans joined to the few kept trace ids.
    """
    ids = pa.table(
        {
            "trace_id": pa.array(list(keep), pa.int64()),
            "graph_name": pa.array(list(keep.values()), pa.string()),
        }
    )
    ops_columns = set(wh.query("SELECT * FROM trace_ops LIMIT 0").to_arrow().column_names)

    def rows(table: str, columns: list[tuple[str, str]]) -> pa.Table | None:
        names = [c for c, _ in columns]
        if any(t not in _ARROW_TYPES for _, t in columns):
            return None
        if table == "Op":
            if any(c not in ops_columns for c in names if c != "trace"):
                return None
            cols = ", ".join("k.graph_name AS trace" if c == "trace" else f'o."{c}"' for c in names)
            sql = f"SELECT {cols} FROM trace_ops o JOIN _etstore_keep k USING (trace_id) ORDER BY o.uid"
        elif table in _EDGE_SOURCES:
            src, a, b, props = _EDGE_SOURCES[table]
            if tuple(names) != props:
                return None
            extra = "".join(f', e."{c}"' for c in props)
            sql = f'SELECT e.{a} AS "from", e.{b} AS "to"{extra} FROM {src} e '
            sql += "JOIN _etstore_keep k USING (trace_id)"
        elif table == "BECOMES" and not names:
            sql = (
                'SELECT l.parent_uid AS "from", l.uid AS "to" FROM trace_lineage l '
                "WHERE l.trace_id IN (SELECT trace_id FROM _etstore_keep) "
                "AND l.parent_trace_id IN (SELECT trace_id FROM _etstore_keep)"
            )
        else:
            return None
        with wh.registered(_etstore_keep=ids):
            got = wh.query(sql).to_arrow()
        ends = [pa.field("from", pa.int64()), pa.field("to", pa.int64())] if table != "Op" else []
        schema = pa.schema(ends + [pa.field(c, _ARROW_TYPES[t]) for c, t in columns])
        return got.rename_columns(schema.names).cast(schema)

    return rows


def swap_in(target: Path, graph: Path) -> None:
    """Replace ``graph`` by the rebuilt ``target`` in one rename (the old graph is closed and
    checkpointed, so its log holds nothing; its files go first, else the log would replay onto
    the new file and a checkpoint file would name another database)."""
    for leftover in _sidecars(graph):
        leftover.unlink(missing_ok=True)
    os.replace(target, graph)


def discard_rebuild(target: Path) -> None:
    """Remove a rebuild file and every file Ladybug keeps beside it (idempotent): a checkpoint
    file left by a rebuild cut short names that database, and Ladybug refuses to open the next
    one beside it."""
    for f in (target, *_sidecars(target)):
        f.unlink(missing_ok=True)


# the parts of the names Ladybug gives the files beside a database file: <db>.wal,
# <db>.wal.checkpoint, <db>.checkpoint.apply.lock, <db>.checkpoint.intent.lock, <db>.lock, ...
_SIDECAR_PARTS = frozenset({"wal", "checkpoint", "apply", "intent", "lock", "shadow", "tmp"})


def _sidecars(db: Path) -> list[Path]:
    """The files Ladybug keeps beside the database file ``db`` (not another database such as
    ``<db>.rebuild``)."""
    if not db.parent.is_dir():
        return []
    prefix = db.name + "."
    return [
        f
        for f in db.parent.iterdir()
        if f.name.startswith(prefix) and set(f.name[len(prefix) :].split(".")) <= _SIDECAR_PARTS
    ]
