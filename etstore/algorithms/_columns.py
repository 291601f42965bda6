"""Columnar gathers for expansion: ragged segments, run copies of string columns, validity.

Expanded ops copy whole blocks of an algorithm's rows into a workload, so the
gathers here work on segments and runs rather than element by element.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["gather_bytes", "numeric", "ragged"]


def ragged(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments ``[starts[i], starts[i] + counts[i])``: each element's segment and index (O(total))."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    offs = np.cumsum(counts) - counts
    idx = np.asarray(starts, dtype=np.int64)[owner] + (np.arange(total, dtype=np.int64) - offs[owner])
    return owner, idx


def numeric(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls zeroed, validity) of a numeric or boolean column."""
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    zero = False if pa.types.is_boolean(col.type) else pa.scalar(0, col.type)
    return pc.fill_null(col, zero).to_numpy(zero_copy_only=False), valid


def gather_bytes(source: pa.Array, idx: np.ndarray) -> pa.Array:
    """``source.take(idx)`` for a string/binary array, copying runs of consecutive indices at once.

    Expanded ops copy whole blocks of the algorithm's rows, so ``idx`` is a few
    thousand runs; each run is one slice of the data buffer (a memcpy) instead of
    one copy per element. Falls back to Arrow's take when runs are short.
    """
    n = len(idx)
    if n == 0:
        return source.take(pa.array(idx))
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    if len(breaks) * 8 > n or source.offset:
        return source.take(pa.array(idx))
    _, offsets_buf, data_buf = source.buffers()[:3]
    src_off = np.frombuffer(offsets_buf, dtype=np.int32)[: len(source) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lens = src_off[idx + 1] - src_off[idx]
    out_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=out_off[1:])
    if out_off[-1] >= 1 << 31:
        return source.take(pa.array(idx))
    run_start = np.r_[0, breaks]
    run_end = np.r_[breaks, n]
    a = src_off[idx[run_start]].tolist()
    b = src_off[idx[run_end - 1] + 1].tolist()
    out_data = np.concatenate([data[x:y] for x, y in zip(a, b, strict=True)])
    bufs: list[pa.Buffer | None] = [None, pa.py_buffer(out_off.astype(np.int32)), pa.py_buffer(out_data)]
    if source.null_count:
        valid = pc.is_valid(source).to_numpy(zero_copy_only=False)[idx]
        if not valid.all():
            bufs[0] = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(source.type, n, bufs)
