"""Writing and deleting trace rows in a warehouse: contents once, names as rows of ``traces``.

The layout is declared in :mod:`etstore.store.schema` (:data:`~etstore.store.schema.TRACE_DDL`):
a content's rows live in ``trace_ops``, ``trace_deps``, ... under its ``trace_id``; a name
is a ``traces`` row pointing at one; the ``ops``, ``deps``, ... views join the two. Every
function here runs inside the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.model import Trace
from etstore.store.schema import CONTENT_TABLES
from etstore.store.warehouse import Warehouse

__all__ = [
    "delete_content",
    "delete_lineage",
    "delete_name",
    "in_key_order",
    "insert_content",
    "insert_edges",
    "insert_lineage",
    "insert_messages",
    "insert_name",
    "insert_ops",
    "insert_part",
]


def _append(wh: Warehouse, table: str, rows: pa.Table, key: Mapping[str, int]) -> None:
    """INSERT ``rows`` into ``table`` with the constant ``key`` columns in front."""
    if rows.num_rows == 0:
        return
    cols = ", ".join(rows.column_names)
    keys = ", ".join(key)
    values = ", ".join(f"${k}" for k in key)
    with wh.registered(_etstore_incoming=rows):
        wh.execute(
            f"INSERT INTO {table} ({keys}, {cols}) SELECT {values}, {cols} FROM _etstore_incoming", dict(key)
        )


def insert_content(
    wh: Warehouse, trace: Trace, trace_id: int, base: int, dep_uids: pa.Table, msgs: pa.Table
) -> None:
    """Insert one content's rows under ``trace_id``.

    Parameters
    ----------
    wh
        The warehouse (inside a transaction).
    trace
        The trace; its ops get uids ``base``, ``base + 1``, ...
    trace_id
        The content's trace id.
    base
        The first op uid.
    dep_uids
        :func:`~etstore.store.graph.dep_edges` for uids from ``base`` (``from``, ``to``).
    msgs
        :func:`~etstore.store.graph.message_edges` rows (send uid, receive uid, tag, size).

    Raises
    ------
    StoreError
        DuckDB refuses the rows.

    Notes
    -----
    O(ops + deps + messages), columnar inserts.
    """
    insert_part(wh, trace, trace_id, base, dep_uids)
    insert_messages(wh, trace_id, msgs)


def insert_part(
    wh: Warehouse,
    part: Trace,
    trace_id: int,
    base: int,
    dep_uids: pa.Table,
    first_dep: int = 0,
    first_missing: int = 0,
) -> None:
    """Insert the ops, deps, missing deps and metadata of one part of a content (a whole trace,
    or one rank range of one streamed in): its ops get uids from ``base``, its deps and missing
    deps edge numbers from ``first_dep`` and ``first_missing``."""
    insert_ops(wh, part, trace_id, base)
    insert_edges(wh, part, trace_id, dep_uids, first_dep, first_missing)


def insert_ops(wh: Warehouse, part: Trace, trace_id: int, base: int) -> None:
    """Insert the ops of one part of a content, with uids from ``base``."""
    ops = part.ops.add_column(0, "uid", pa.array(np.arange(base, base + part.num_ops, dtype=np.int64)))
    _append(wh, CONTENT_TABLES[0], ops, {"trace_id": trace_id})


def insert_edges(
    wh: Warehouse, part: Trace, trace_id: int, dep_uids: pa.Table, first_dep: int = 0, first_missing: int = 0
) -> None:
    """Insert the deps (with their ops' uids, ``dep_uids``), missing deps and metadata of one
    part of a content, numbering the edges from ``first_dep`` and ``first_missing``."""
    deps = part.deps.append_column("src_uid", dep_uids["from"]).append_column("dst_uid", dep_uids["to"])
    edge = np.arange(first_dep, first_dep + deps.num_rows, dtype=np.int64)
    deps = deps.add_column(0, "edge", pa.array(edge))
    edge = np.arange(first_missing, first_missing + part.num_missing, dtype=np.int64)
    missing = part.missing.add_column(0, "edge", pa.array(edge))
    key = {"trace_id": trace_id}
    for table, rows in zip(CONTENT_TABLES[1:4], (deps, missing, part.meta), strict=True):
        _append(wh, table, rows, key)


def insert_messages(wh: Warehouse, trace_id: int, msgs: pa.Table) -> None:
    """Insert message rows (:func:`~etstore.store.graph.message_edges`: send uid, receive uid,
    tag, size) of content ``trace_id``."""
    _append(
        wh,
        CONTENT_TABLES[4],
        msgs.rename_columns(["send_uid", "recv_uid", "tag", "comm_size"]),
        {"trace_id": trace_id},
    )


def insert_lineage(wh: Warehouse, trace_id: int, parent_trace_id: int, rows: pa.Table) -> None:
    """Insert lineage rows (``rank``, ``id``, ``parent_id``, ``parent_uid``, ``uid``) of content
    ``trace_id`` derived from content ``parent_trace_id``."""
    _append(wh, "trace_lineage", rows, {"trace_id": trace_id, "parent_trace_id": parent_trace_id})


def delete_lineage(wh: Warehouse, trace_id: int, parent_trace_id: int) -> None:
    """Delete the lineage rows of ``trace_id`` from ``parent_trace_id``."""
    wh.execute(
        "DELETE FROM trace_lineage WHERE trace_id = $t AND parent_trace_id = $p",
        {"t": trace_id, "p": parent_trace_id},
    )


def insert_name(
    wh: Warehouse, name: str, trace_id: int, parent_trace_id: int | None, row: Mapping[str, Any]
) -> None:
    """Insert the ``traces`` row of a name.

    ``row`` holds ``kind``, ``ranks``, ``ops``, ``deps``, ``missing``, ``messages``,
    ``parent``, ``source``, ``params`` (a mapping), ``content_hash`` and optionally ``created``.
    """
    values = {
        **{k: row[k] for k in ("kind", "ranks", "ops", "deps", "missing", "messages", "source")},
        "name": name,
        "parent": row.get("parent"),
        "params": json.dumps(dict(row.get("params") or {}), sort_keys=True, default=str),
        "content_hash": row["content_hash"],
        "trace_id": trace_id,
        "parent_trace_id": parent_trace_id,
        "created": row.get("created") or datetime.now(timezone.utc).replace(tzinfo=None),
    }
    wh.execute(
        f"INSERT INTO traces ({', '.join(values)}) VALUES ({', '.join('$' + k for k in values)})", values
    )


def delete_name(wh: Warehouse, name: str) -> None:
    """Delete the ``traces`` row of a name (its content stays)."""
    wh.execute("DELETE FROM traces WHERE name = $t", {"t": name})


def delete_content(wh: Warehouse, trace_id: int) -> None:
    """Delete one content's rows, its lineage and every name row still pointing at it."""
    for table in (*CONTENT_TABLES, "trace_lineage"):
        wh.execute(f"DELETE FROM {table} WHERE trace_id = $t", {"t": trace_id})
    wh.execute("DELETE FROM traces WHERE trace_id = $t", {"t": trace_id})


_LOAD_ROWS = 1 << 20
"""Rows a load reads per query: DuckDB sorts and converts each range on its own, so a load
peaks near the trace's Arrow size plus one range, not the two to three times of one query
over the whole content (10M ops: 2.9 GB against 4.3 GB, and faster)."""


def in_key_order(wh: Warehouse, select: str, key: str, params: dict[str, Any]) -> pa.Table:
    """``select`` (filtered on one content) in ``key`` order, read ``key`` range by range: a
    content's uids and edge numbers are dense (from its base, from 0), so each range holds
    about :data:`_LOAD_ROWS` rows; a content numbered otherwise is read in one query."""
    lo, hi, n = (
        wh.query(f"SELECT min({key}), max({key}), count(*) FROM ({select})", params)
        .to_arrow()
        .to_pylist()[0]
        .values()
    )
    if not n or hi - lo + 1 > 4 * n:
        return wh.query(f"{select} ORDER BY {key}", params).to_arrow()
    parts = [
        wh.query(
            f"{select} AND {key} >= $lo AND {key} < $hi ORDER BY {key}",
            {**params, "lo": start, "hi": start + _LOAD_ROWS},
        ).to_arrow()
        for start in range(lo, hi + 1, _LOAD_ROWS)
    ]
    return pa.concat_tables(parts)
