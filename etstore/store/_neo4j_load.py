"""Bulk-load pieces of the Neo4j backend: batched Cypher for nodes and edges, and the payload.

Rows travel to the server column-wise (one list parameter per column, ``UNWIND
range(...)``): the driver packs a list of ints far faster than a list of maps,
and columns that are all null in a batch are left out of the statement.

The *payload* is the trace's lossless columnar form (ops with raw attributes,
deps, missing deps, meta) as zstd-compressed Arrow IPC streams, split into
``EtstorePayload`` nodes of at most :data:`CHUNK_BYTES`; ``load`` and the
client-side SQL warehouse read it back byte-exact, whichever client ingested.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import StoreError
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace
from etstore.store.graph import lineage_edges, uid_base

__all__ = [
    "CHUNK_BYTES",
    "PAYLOAD_TABLES",
    "Batch",
    "decode_payload",
    "edge_batches",
    "encode_payload",
    "lineage_links",
    "node_batches",
    "uid_table",
]

CHUNK_BYTES = 4 << 20
PAYLOAD_TABLES: dict[str, pa.Schema] = {
    "ops": OPS_SCHEMA,
    "deps": DEPS_SCHEMA,
    "missing": DEPS_SCHEMA,
    "meta": META_SCHEMA,
}
_INT64_MAX = (1 << 63) - 1

Batch = tuple[str, dict[str, Any], int]  # (Cypher, parameters, rows)


def _check_int64(table: pa.Table, what: str) -> None:
    """Neo4j integers are signed 64-bit: refuse larger unsigned values by name."""
    for f in table.schema:
        if f.type == pa.uint64() and table.num_rows:
            top = pc.max(table[f.name]).as_py()
            if top is not None and top > _INT64_MAX:
                raise StoreError(f"{what}: column {f.name} holds {top}, above Neo4j's integer limit 2^63-1")


def _columns(table: pa.Table, start: int, stop: int) -> dict[str, list[Any]]:
    part = table.slice(start, stop - start)
    return {
        name: part[name].to_pylist() for name in part.column_names if part[name].null_count < part.num_rows
    }


def node_batches(nodes: pa.Table, trace_name: str, batch_rows: int) -> Iterator[Batch]:
    """``CREATE (:Op {...})`` statements over ``nodes`` (:func:`etstore.store.graph.op_nodes`).

    ``trace_id`` is one value for the whole table, so it travels once per statement, not
    once per op; ``trace_name`` names the trace in errors.
    """
    _check_int64(nodes, f"trace {trace_name}")
    if nodes.num_rows == 0:
        return
    trace_id = nodes["trace_id"][0].as_py()
    body = nodes.drop_columns(["trace_id"])
    for start in range(0, body.num_rows, batch_rows):
        stop = min(start + batch_rows, body.num_rows)
        cols = _columns(body, start, stop)
        props = ", ".join(["trace_id: $trace_id", *(f"{c}: $c_{c}[i]" for c in cols)])
        query = f"UNWIND range(0, $n - 1) AS i CREATE (:Op {{{props}}})"
        params = {"n": stop - start, "trace_id": trace_id, **{f"c_{c}": v for c, v in cols.items()}}
        yield query, params, stop - start


def edge_batches(edges: pa.Table, rel: str, batch_rows: int) -> Iterator[Batch]:
    """``MATCH``-by-uid then ``CREATE`` statements for ``DEP``/``MSG`` rows (``from``, ``to``, props)."""
    props_cols = [c for c in edges.column_names if c not in ("from", "to")]
    for start in range(0, edges.num_rows, batch_rows):
        stop = min(start + batch_rows, edges.num_rows)
        cols = _columns(edges, start, stop)
        props = ", ".join(f"{c}: $c_{c}[i]" for c in props_cols if c in cols)
        query = (
            "UNWIND range(0, $n - 1) AS i "
            "MATCH (a:Op {uid: $src[i]}) MATCH (b:Op {uid: $dst[i]}) "
            f"CREATE (a)-[:{rel}{f' {{{props}}}' if props else ''}]->(b)"
        )
        params = {
            "n": stop - start,
            "src": cols.pop("from"),
            "dst": cols.pop("to"),
            **{f"c_{c}": v for c, v in cols.items()},
        }
        yield query, params, stop - start


def encode_payload(
    trace: Trace | None, extra: Mapping[str, pa.Table] | None = None
) -> list[tuple[str, int, bytes]]:
    """The trace's tables (none for ``None``) and the ``extra`` tables by name (lineage rows,
    ``lineage@<parent seq>``) as (table, part, bytes) chunks of compressed Arrow IPC."""
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    chunks: list[tuple[str, int, bytes]] = []
    tables: dict[str, pa.Table] = {name: getattr(trace, name) for name in PAYLOAD_TABLES} if trace else {}
    tables.update(extra or {})
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table, max_chunksize=1 << 16)
        data = sink.getvalue().to_pybytes()
        for part, off in enumerate(range(0, max(len(data), 1), CHUNK_BYTES)):
            chunks.append((name, part, data[off : off + CHUNK_BYTES]))
    return chunks


def decode_payload(chunks: Sequence[tuple[str, int, bytes]], where: str) -> dict[str, pa.Table]:
    """Invert :func:`encode_payload` (lineage tables are present only if they were stored);
    ``where`` names the trace in errors."""
    parts: dict[str, list[tuple[int, bytes]]] = {}
    for name, part, data in chunks:
        parts.setdefault(name, []).append((part, data))
    missing = [name for name in PAYLOAD_TABLES if name not in parts]
    if missing:
        raise StoreError(f"{where}: the stored payload lacks its {missing[0]} table; re-ingest the trace")
    tables: dict[str, pa.Table] = {}
    for name, pieces in parts.items():
        data = b"".join(d for _, d in sorted(pieces))
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except pa.ArrowInvalid as exc:
            raise StoreError(f"{where}: the stored {name} payload is damaged: {exc}") from exc
        tables[name] = table.cast(PAYLOAD_TABLES[name]) if name in PAYLOAD_TABLES else table
    return tables


def uid_table(ops: pa.Table, seq: int) -> pa.Table:
    """``rank``, ``id``, ``uid`` of content ``seq``'s ops (its payload's ``ops``, in uid order)."""
    base = uid_base(seq)
    return pa.table(
        {"rank": ops["rank"], "id": ops["id"], "uid": pa.array(range(base, base + ops.num_rows), pa.int64())}
    )


def lineage_links(lineage: pa.Table, child: pa.Table, parent: pa.Table, what: str) -> pa.Table:
    """Lineage rows with uids (``child`` and ``parent`` from :func:`uid_table`): ``from``/``to``
    for the ``BECOMES`` edges plus the columns of the SQL ``lineage`` table, which the payload
    keeps so every client's warehouse gets them."""
    links = lineage_edges(lineage, child, parent, what=what)
    return pa.table(
        {
            "from": links["from"],
            "to": links["to"],
            "rank": lineage["rank"].cast(pa.int32()),
            "id": lineage["id"].cast(pa.uint64()),
            "parent_id": lineage["parent_id"].cast(pa.uint64()),
            "parent_uid": links["from"],
            "uid": links["to"],
        }
    )
