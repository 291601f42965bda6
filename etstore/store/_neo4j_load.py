"""What ``etstore publish`` sends of a content, in the form the server keeps it: batched Cypher
for nodes and edges, and the payload.

Rows travel to the server column-wise (one list parameter per column, ``UNWIND
range(...)``): the driver packs a list of ints far faster than a list of maps,
and columns that are all null in a batch are left out of the statement.

The *payload* is the content's lossless columnar form (ops with raw attributes, deps,
missing deps, meta) as zstd-compressed Arrow IPC streams, split into ``Payload`` nodes of
at most :data:`CHUNK_BYTES`; the read view (:mod:`etstore.store.neo4j`) gives it back from
``load`` byte-exact, and fills its client-side SQL tables from it, whichever store published.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import StoreError
from etstore.model import DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace

__all__ = [
    "CHUNK_BYTES",
    "PAYLOAD_TABLES",
    "Batch",
    "decode_payload",
    "edge_batches",
    "node_batches",
    "payload_batches",
    "payload_chunks",
    "trace_payload",
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


class _Sink:
    """A write-only file that keeps what was written until it is taken (:func:`payload_chunks`)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.closed = False

    def write(self, data: Any) -> int:
        self.buffer += bytes(data)
        return len(data)

    def flush(self) -> None:
        """Nothing to flush: the bytes stay in :attr:`buffer`."""

    def close(self) -> None:
        self.closed = True

    def take(self, size: int) -> bytes:
        """The first ``size`` bytes written and not yet taken."""
        out = bytes(self.buffer[:size])
        del self.buffer[:size]
        return out


def payload_chunks(table: str, pages: Iterable[pa.Table]) -> Iterator[tuple[str, int, bytes]]:
    """One payload table (``ops``, ``deps``, ``missing`` or ``meta``) as ``(table, part, bytes)``
    chunks of one zstd-compressed Arrow IPC stream, cut at :data:`CHUNK_BYTES` as it is written.

    ``pages`` are the table's rows in order, a page at a time, cast to the table's schema here;
    memory holds one page and one chunk, whatever the table's size. A table of no rows is one
    small chunk (the stream's schema), so every table is present. O(rows).
    """
    schema = PAYLOAD_TABLES[table]
    sink = _Sink()
    part = 0
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, schema, options=options) as writer:
        for page in pages:
            writer.write_table(page.select(schema.names).cast(schema), max_chunksize=1 << 16)
            while len(sink.buffer) >= CHUNK_BYTES:
                yield table, part, sink.take(CHUNK_BYTES)
                part += 1
    while sink.buffer or part == 0:
        yield table, part, sink.take(CHUNK_BYTES)
        part += 1


def trace_payload(trace: Trace) -> Iterator[tuple[str, int, bytes]]:
    """Every payload table of an in-memory ``trace`` (:func:`payload_chunks`)."""
    for name in PAYLOAD_TABLES:
        yield from payload_chunks(name, [getattr(trace, name)])


def payload_batches(trace_id: int, chunks: Iterable[tuple[str, int, bytes]]) -> Iterator[Batch]:
    """One ``CREATE (:Payload ...)`` statement per chunk of content ``trace_id`` (each counts as
    no row: progress and the one-transaction choice count nodes and edges)."""
    for table, part, data in chunks:
        yield (
            "CREATE (:Payload {trace_id: $t, table: $table, part: $part, data: $data})",
            {"t": trace_id, "table": table, "part": part, "data": data},
            0,
        )


def decode_payload(chunks: Sequence[tuple[str, int, bytes]], where: str) -> dict[str, pa.Table]:
    """Invert :func:`payload_chunks`: each payload table from its chunks; ``where`` names the
    trace in errors."""
    parts: dict[str, list[tuple[int, bytes]]] = {}
    for name, part, data in chunks:
        parts.setdefault(name, []).append((part, data))
    missing = [name for name in PAYLOAD_TABLES if name not in parts]
    if missing:
        raise StoreError(f"{where}: the stored payload lacks its {missing[0]} table; publish the trace again")
    tables: dict[str, pa.Table] = {}
    for name, schema in PAYLOAD_TABLES.items():
        data = b"".join(d for _, d in sorted(parts[name]))
        try:
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except pa.ArrowInvalid as exc:
            raise StoreError(f"{where}: the stored {name} payload is damaged: {exc}") from exc
        tables[name] = table.cast(schema)
    return tables
