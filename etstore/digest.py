"""The content digest of a trace, computed whole or part by part.

Two traces with equal rows have equal digests however their rows arrive: in one table,
in Arrow chunks of any size, or as consecutive rank ranges (:class:`~etstore.model.TraceParts`)
too large to hold at once. That is what makes ingest idempotent on every path.

The digest is a SHA-1 over the kind and, table by table (``ops``, ``deps``, ``missing``,
``meta``), the schema and each column in canonical form (null slots filled with one value,
plus a ``<name>.valid`` column where the column has nulls). A column of at most
:data:`WHOLE_ROWS` rows counts as the Arrow IPC stream of that column (the definition
stores have always used); a longer one as the SHA-1 of its consecutive :data:`PIECE_ROWS`-row
pieces, each an IPC stream, so it can be hashed while it streams past in bounded memory.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.model import Trace

__all__ = ["PIECE_ROWS", "TABLES", "WHOLE_ROWS", "ContentDigest", "content_hash"]

WHOLE_ROWS = 1 << 20
"""Columns up to this many rows are hashed as one IPC stream (held until the digest is taken)."""
PIECE_ROWS = 1 << 16
"""Longer columns are hashed in pieces of this many rows."""
TABLES = ("ops", "deps", "missing", "meta")
"""The trace's tables, in digest order."""

_ZERO: dict[pa.DataType, Any] = {pa.string(): "", pa.binary(): b"", pa.bool_(): False}


def _ipc(name: str, values: pa.Array | pa.ChunkedArray) -> memoryview:
    """One column as an IPC stream of one record batch (no batch when empty): IPC honours
    slices, so how the buffers happen to be laid out cannot leak into the digest."""
    one = pa.table({name: values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, one.schema) as writer:
        if one.num_rows:
            writer.write_table(one)
    return memoryview(sink.getvalue())


def _filled(values: pa.Array | pa.ChunkedArray) -> Any:
    """Null slots hold arbitrary bytes (engines differ): give them one value."""
    return pc.fill_null(values, _ZERO.get(values.type, 0)) if values.null_count else values


class _Column:
    """One column's share of the digest: held whole while short, then hashed piece by piece."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.held: list[pa.Array] = []
        self.rows = 0
        self.nulls = 0
        self.values: Any = None  # SHA-1 of the filled pieces, once the column outgrows WHOLE_ROWS
        self.valid: Any = None  # SHA-1 of the validity pieces (counted only if a null turns up)
        self.pending: list[pa.Array] = []  # rows of the piece being filled
        self.pending_rows = 0

    def add(self, col: pa.ChunkedArray) -> None:
        self.rows += len(col)
        self.nulls += col.null_count
        chunks = [c for c in col.chunks if len(c)]
        if self.values is None:
            self.held += chunks
            if self.rows <= WHOLE_ROWS:
                return
            self.values = hashlib.sha1(usedforsecurity=False)
            self.valid = hashlib.sha1(usedforsecurity=False)
            chunks, self.held = self.held, []
        for chunk in chunks:
            self._feed(chunk)

    def _feed(self, chunk: pa.Array) -> None:
        while len(chunk):
            take = min(len(chunk), PIECE_ROWS - self.pending_rows)
            self.pending.append(chunk.slice(0, take))
            self.pending_rows += take
            chunk = chunk.slice(take)
            if self.pending_rows == PIECE_ROWS:
                self._piece()

    def _piece(self) -> None:
        if not self.pending_rows:
            return
        piece = pa.chunked_array(self.pending, type=self.pending[0].type).combine_chunks()
        self.values.update(_ipc(self.name, _filled(piece)))
        self.valid.update(_ipc(f"{self.name}.valid", pc.is_valid(piece)))
        self.pending, self.pending_rows = [], 0

    def digest_into(self, h: Any, typ: pa.DataType) -> None:
        if self.values is None:  # short: the column itself
            col = pa.chunked_array(self.held, type=typ)
            h.update(_ipc(self.name, _filled(col)))
            if self.nulls:
                h.update(_ipc(f"{self.name}.valid", pc.is_valid(col)))
            return
        self._piece()
        h.update(self.values.digest())
        if self.nulls:
            h.update(self.valid.digest())


class ContentDigest:
    """The content digest fed one trace part at a time (:func:`content_hash` of the whole).

    ``update`` the parts in order (consecutive rank ranges, as :class:`~etstore.model.TraceParts`
    delivers them), then :meth:`hexdigest`. Memory: at most :data:`WHOLE_ROWS` rows per column
    held, then one piece per column.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.schemas: dict[str, pa.Schema] = {}
        self.columns: dict[str, list[_Column]] = {}

    def update(self, part: Trace) -> None:
        for table_name in TABLES:
            table: pa.Table = getattr(part, table_name)
            known = self.schemas.setdefault(table_name, table.schema)
            if known != table.schema:
                raise ValueError(f"{table_name} of a later part has another schema: {table.schema}")
            cols = self.columns.setdefault(table_name, [_Column(n) for n in table.column_names])
            for col, values in zip(cols, table.columns, strict=True):
                col.add(values)

    def hexdigest(self) -> str:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(self.kind.encode())
        for table_name in TABLES:
            schema = self.schemas[table_name]
            h.update(str(schema).encode())
            for col, f in zip(self.columns[table_name], schema, strict=True):
                col.digest_into(h, f.type)
        return h.hexdigest()


def content_hash(trace: Trace) -> str:
    """A digest of the trace's content (kind, ops, deps, missing deps, metadata), not its name.

    Equal content gives an equal digest, which is what makes ingest idempotent: how the
    columns happen to be chunked and whether an empty table has an empty chunk do not
    count. O(bytes) over the Arrow buffers; copies only columns split into several chunks.
    """
    d = ContentDigest(str(trace.kind))
    d.update(trace)
    return d.hexdigest()
