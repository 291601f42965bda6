"""Arrow glue for the native ``.et`` codec (``_etcodec``): buffers in, tables out, no copies.

The C side knows the wire format and the promotion rules; this side knows Arrow.
Importing this module raises :class:`ImportError` when the extension is missing or
was built against other columns than :mod:`etstore.model` declares, so callers
fall back to the pure-Python codec instead of producing a wrong table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import TraceFormatError
from etstore.formats import _etcodec  # type: ignore[attr-defined]  # ImportError when not built
from etstore.formats._frames import frame_limit_message
from etstore.model import ATTR_COLUMNS, DEPS_SCHEMA, OPS_SCHEMA, member_number, node_type_code
from etstore.proto import COLLECTIVE_COMM_TYPES, NODE_TYPES

__all__ = ["decode_rank", "encode_rank"]

_KIND_TYPES = {
    "bool": pa.bool_(),
    "comm_type": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "string": pa.string(),
}


def _check_build() -> None:
    """Refuse a codec whose compiled-in tables disagree with the model (stale build)."""
    promoted = [(name, _KIND_TYPES[kind], member) for name, kind, member in _etcodec.PROMOTED]
    expected = [(name, typ, member_number(member)) for name, (typ, member) in ATTR_COLUMNS.items()]
    kinds_ok = all(kind != "comm_type" or name == "comm_type" for name, kind, _ in _etcodec.PROMOTED)
    if (
        promoted != expected
        or not kinds_ok
        or tuple(_etcodec.NODE_TYPES) != NODE_TYPES
        or tuple(_etcodec.COMM_TYPES) != COLLECTIVE_COMM_TYPES
    ):
        raise ImportError("etstore.formats._etcodec was built for other columns; rebuild: pip install -e .")


_check_build()
_PROMOTED_KIND = [kind for _, kind, _ in _etcodec.PROMOTED]
# (name, type) of each column, read once: walking a schema makes new Field objects each time, which
# on an exported workload's small files costs several times what the C decoder takes
_OPS_FIELDS = [(f.name, f.type) for f in OPS_SCHEMA]
_DEPS_FIELDS = [(f.name, f.type) for f in DEPS_SCHEMA]


def _array(typ: pa.DataType, length: int, parts: tuple[Any, ...]) -> pa.Array:
    *bufs, nulls = parts
    return pa.Array.from_buffers(
        typ, length, [None if b is None else pa.py_buffer(b) for b in bufs], null_count=nulls
    )


def decode_rank(
    data: bytes, rank: int, path: Path, *, max_nodes: int = 0
) -> tuple[pa.Table, pa.Table, bytes] | None:
    """``(ops, deps, metadata)`` for one rank's bytes, as the reference decoder gives them;
    None when a string column would pass 2 GiB (the reference decoder then chunks it).

    Raises :class:`TraceFormatError` before allocating any column when ``max_nodes > 0``
    and the file has more node frames (the codec counts them first).
    """
    result = _etcodec.decode(data, str(path), max_nodes)
    if result is None:
        return None
    if isinstance(result, int):
        raise TraceFormatError(f"{path}: {frame_limit_message(result)}")
    n, m, meta, ops_cols, deps_cols = result
    ops = pa.Table.from_arrays(
        [
            _rank_column(n, rank) if name == "rank" else _array(typ, n, ops_cols[name])
            for name, typ in _OPS_FIELDS
        ],
        schema=OPS_SCHEMA,
    )
    deps = pa.Table.from_arrays(
        [
            _rank_column(m, rank) if name == "rank" else _array(typ, m, deps_cols[name])
            for name, typ in _DEPS_FIELDS
        ],
        schema=DEPS_SCHEMA,
    )
    return ops, deps, meta


def _rank_column(n: int, rank: int) -> pa.Array:
    """``n`` copies of ``rank``, as the int32 column both tables start with."""
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, rank, dtype=np.int32))])


# ---------------------------------------------------------------- encoding


def _flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _valid(arr: pa.Array) -> np.ndarray | None:
    """uint8 validity per row, or None when nothing is null."""
    if arr.null_count == 0:
        return None
    return np.ascontiguousarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)


def _strings(col: Any) -> tuple[np.ndarray, Any, np.ndarray | None]:
    """(int32 offsets[n+1], data buffer, validity) of a string/binary column, slice-aware."""
    arr = _flat(col)
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.string() if pa.types.is_large_string(arr.type) else pa.binary())
    _, offsets, data = arr.buffers()
    offs = np.frombuffer(offsets, dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]
    return offs, (data if data is not None else b""), _valid(arr)


def _ints(col: Any, dtype: type) -> tuple[np.ndarray, np.ndarray | None]:
    """(values with nulls as 0, validity) of an integer or boolean column."""
    arr = valid_from = _flat(col)
    if arr.null_count:
        arr = pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0)
    values = arr.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values, dtype=dtype), _valid(valid_from)


def _type_codes(col: Any) -> np.ndarray:
    arr = _flat(col)
    if arr.null_count:
        raise ValueError("ops.type is null; every node needs a Chakra NodeType name")
    enc = arr.dictionary_encode()
    codes = np.array([node_type_code(name) for name in enc.dictionary.to_pylist()], dtype=np.int32)
    return np.ascontiguousarray(codes[enc.indices.to_numpy()]) if len(arr) else np.zeros(0, np.int32)


def _comm_type_codes(col: Any) -> tuple[np.ndarray, np.ndarray | None]:
    arr = _flat(col)
    codes = pc.index_in(arr, value_set=pa.array(COLLECTIVE_COMM_TYPES))
    if codes.null_count != arr.null_count:
        bad = pc.filter(arr, pc.and_(pc.is_valid(arr), pc.is_null(codes)))[0].as_py()
        raise ValueError(f"comm_type {bad!r} is not a CollectiveCommType name")
    return _ints(codes, np.int64)


def encode_rank(ops: pa.Table, deps: pa.Table, metadata: bytes | None) -> bytes:
    """Same contract as ``et.encode_rank``: one rank's ``.et`` bytes from its ops and deps."""
    promoted: list[tuple[Any, ...]] = []
    for (name, _), kind in zip(ATTR_COLUMNS.items(), _PROMOTED_KIND, strict=True):
        if kind == "bool":
            promoted.append(_ints(ops[name], np.uint8))
        elif kind == "comm_type":
            promoted.append(_comm_type_codes(ops[name]))
        elif kind == "string":
            promoted.append(_strings(ops[name]))
        else:
            promoted.append(_ints(ops[name], np.int64))
    if deps.num_rows:
        kinds = _flat(deps["kind"])
        known = pc.fill_null(pc.is_in(kinds, value_set=pa.array(["data", "ctrl"])), False)
        wanted = None if pc.all(known).as_py() else known.to_numpy(zero_copy_only=False)
        src = _flat(deps["src"]).to_numpy()
        dst = _flat(deps["dst"]).to_numpy()
        kind = pc.fill_null(pc.equal(kinds, "data"), False).to_numpy(zero_copy_only=False).astype(np.uint8)
        pos = pc.fill_null(_flat(deps["pos"]), np.iinfo(np.int32).max).to_numpy()
        order = np.lexsort((pos, kind, dst))  # stable, like Table.sort_by; nulls last
        if wanted is not None:  # kinds other than data/ctrl are not written, as in the reference
            order = order[wanted[order]]
        dep_parts = (
            np.ascontiguousarray(src[order], dtype=np.uint64),
            np.ascontiguousarray(dst[order], dtype=np.uint64),
            np.ascontiguousarray(kind[order]),
        )
    else:
        dep_parts = (np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint8))
    return _etcodec.encode(
        metadata or b"",
        _ints(ops["id"], np.uint64)[0],
        _type_codes(ops["type"]),
        _ints(ops["duration_micros"], np.uint64)[0],
        _ints(ops["start_time_micros"], np.uint64)[0],
        _strings(ops["name"]),
        _strings(ops["attrs"]),
        _strings(ops["attr_order"]),
        tuple(promoted),
        dep_parts,
    )
