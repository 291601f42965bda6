"""Chakra ``.et`` files ⇄ columnar :class:`~etstore.model.Trace`.

Decoding and encoding use the native codec (``etstore.formats._etcodec`` through
``_native``) when it is built and fall back to the protobuf runtime otherwise; both
produce identical columns and files that re-read to the identical trace. This module
reads; writing lives in :mod:`etstore.formats._et_encode` (:func:`write_et`,
:func:`encode_rank` are re-exported here). Files in the form ``export`` writes for an
algorithm are read back as an algorithm (:mod:`etstore.formats._et_kind`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from etstore.errors import TraceFormatError
from etstore.formats._et_encode import _encode_py, encode_rank, write_et
from etstore.formats._et_kind import algorithm_params
from etstore.formats._frames import frame_limit_message, max_nodes, read_bytes, varint
from etstore.formats.files import RankFile, comm_groups_path, read_comm_groups, resolve_rank_files
from etstore.model import (
    ATTR_COLUMNS,
    DEPS_SCHEMA,
    META_SCHEMA,
    OPS_SCHEMA,
    Trace,
    member_number,
    node_type_name,
    promotable,
)
from etstore.proto import COLLECTIVE_COMM_TYPES, GlobalMetadata, Node

__all__ = ["decode_rank", "encode_rank", "read_et", "read_rank_file", "split_missing", "write_et"]
_REEXPORTED = (_encode_py,)  # the reference encoder, which tests compare the native one with

log = logging.getLogger(__name__)

try:  # the native codec is an optional C build; the pure-Python path is the reference
    from etstore.formats import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]
_etcodec = None if _native is None else _native._etcodec

Progress = Callable[[int], None]


class _Decoded(NamedTuple):
    """One rank file decoded (:func:`read_rank_file`): its ops, its dependencies on nodes of the
    file and on absent ones, its GlobalMetadata frame (None without one), bytes read."""

    ops: pa.Table
    deps: pa.Table
    missing: pa.Table
    meta: bytes | None
    nbytes: int


# ---------------------------------------------------------------- decoding


def _looks_like_node(frame: bytes) -> bool:
    """Whether a file's first frame is a Node rather than a GlobalMetadata.

    Chakra files written before GlobalMetadata existed (the 2023 ASTRA-sim examples)
    start with a node. A GlobalMetadata has only length-delimited fields 1 and 2; a Node
    shows itself by its varint id (field 1) or any of fields 3..10. The scan stops at
    the first malformed field; the native codec's ``looks_like_node`` is the same rule.
    """
    pos, n = 0, len(frame)
    while pos < n:
        tag = 0
        for i in range(5):
            if pos >= n:
                return False
            b = frame[pos]
            pos += 1
            tag |= (b & 0x7F) << (7 * i)
            if b < 0x80:
                break
        else:
            return False
        field, wire = tag >> 3, tag & 7
        if (field == 1 and wire == 0) or 3 <= field <= 10:
            return True
        if wire in (0, 2):
            value, pos = _bounded_varint(frame, pos)
            if pos < 0:
                return False
            if wire == 2:
                if value > n - pos:
                    return False
                pos += value
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if n - pos < width:
                return False
            pos += width
        else:
            return False
    return False


def _bounded_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A varint of at most 10 bytes (bits past 64 dropped); position -1 when malformed."""
    value = 0
    for i in range(10):
        if pos >= len(buf):
            return 0, -1
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
    return 0, -1


def _decode_py(data: bytes, rank: int, path: Path) -> tuple[pa.Table, pa.Table, bytes | None]:
    """Reference decoder: one protobuf parse per frame.

    A file whose first frame is a node (no GlobalMetadata, the 2023 form) decodes from
    byte 0 and has no metadata (None).
    """
    meta_len, pos = varint(data, 0, path)
    if meta_len > len(data) - pos:
        raise TraceFormatError(
            f"{path}: byte 0: GlobalMetadata frame claims {meta_len} bytes but only "
            f"{len(data) - pos} remain (truncated, or not a Chakra ET file)"
        )
    meta_bytes: bytes | None = data[pos : pos + meta_len]
    if meta_len and _looks_like_node(data[pos : pos + meta_len]):
        meta_bytes, pos = None, 0
    else:
        try:
            meta = GlobalMetadata.FromString(meta_bytes)
        except DecodeError as exc:
            raise TraceFormatError(f"{path}: byte 0: first frame is not a Chakra GlobalMetadata") from exc
        if meta_bytes and not meta.ListFields():
            raise TraceFormatError(f"{path}: byte 0: first frame is not a Chakra GlobalMetadata")
        pos += meta_len

    cols: dict[str, list[Any]] = {f.name: [] for f in OPS_SCHEMA}
    seen: dict[bytes, tuple[str, Any, str] | None] = {}
    d_src: list[int] = []
    d_dst: list[int] = []
    d_kind: list[str] = []
    d_pos: list[int] = []
    n = len(data)
    frame = 1
    limit = max_nodes()
    while pos < n:
        start = pos
        if frame > limit:
            raise TraceFormatError(f"{path}: byte {start}: at least {frame_limit_message(frame)}")
        length, pos = varint(data, pos, path)
        if length > n - pos:
            raise TraceFormatError(
                f"{path}: byte {start}: node frame {frame} claims {length} bytes but only "
                f"{n - pos} remain (truncated file?)"
            )
        raw = data[pos : pos + length]
        try:
            node = Node.FromString(raw)
        except DecodeError as exc:
            raise TraceFormatError(f"{path}: byte {start}: frame {frame} is not a Chakra Node") from exc
        pos += length
        frame += 1
        _node_to_columns(node, raw, cols, seen)
        nid = node.id
        for i, d in enumerate(node.data_deps):
            d_src.append(d)
            d_dst.append(nid)
            d_kind.append("data")
            d_pos.append(i)
        for i, d in enumerate(node.ctrl_deps):
            d_src.append(d)
            d_dst.append(nid)
            d_kind.append("ctrl")
            d_pos.append(i)
    num = len(cols["id"])
    cols["rank"] = [rank] * num
    ops = pa.Table.from_pydict(cols, schema=OPS_SCHEMA)
    deps = pa.Table.from_pydict(
        {"rank": [rank] * len(d_src), "src": d_src, "dst": d_dst, "kind": d_kind, "pos": d_pos},
        schema=DEPS_SCHEMA,
    )
    return ops, deps, meta_bytes


def _node_to_columns(
    node: Any, raw: bytes, cols: dict[str, list[Any]], seen: dict[bytes, tuple[str, Any, str] | None]
) -> None:
    """Append one parsed node; ``raw`` is its frame, whose extra records are kept verbatim.

    ``attrs`` gets the node's inputs (8), outputs (9) and unpromoted attr (10) records
    byte-for-byte, in that field order (stable), which is the order export writes.
    ``seen`` caches, per attribute record, what promoting it gives (records repeat a lot).
    """
    cols["id"].append(node.id)
    cols["name"].append(node.name)
    cols["type"].append(node_type_name(node.type))
    cols["duration_micros"].append(node.duration_micros)
    cols["start_time_micros"].append(node.start_time_micros)
    promoted: dict[str, Any] = {}
    tokens: list[str] = []
    kept: list[tuple[int, bytes]] = []
    if node.attr or node.HasField("inputs") or node.HasField("outputs"):
        attrs = iter(node.attr)
        for field, begin, end in _extra_records(raw):
            record = raw[begin:end]
            if field != 10:
                kept.append((field, record))
                continue
            a = next(attrs)
            if record in seen:
                hit = seen[record]
            elif a.name in ATTR_COLUMNS:
                hit = seen[record] = _promotion(a)
            else:
                hit = None
            if hit is not None and hit[0] not in promoted:
                promoted[hit[0]] = hit[1]
                tokens.append(hit[2])
            else:
                kept.append((field, record))
                tokens.append("*")
    for column in ATTR_COLUMNS:
        cols[column].append(promoted.get(column))
    kept.sort(key=lambda record: record[0])  # stable: inputs, outputs, attrs, as export writes them
    blob = b"".join(record for _, record in kept)
    cols["attrs"].append(blob if blob else None)
    cols["attr_order"].append(",".join(tokens))


def _promotion(a: Any) -> tuple[str, Any, str] | None:
    """``(column, value, attr_order token)`` if attribute ``a`` becomes a column, else None.

    It must be named after a column, set a oneof member that fits the column
    (:func:`etstore.model.promotable`), have no doc string, and be rebuilt exactly
    by export.
    """
    member = a.WhichOneof("value")
    if member is None or a.doc_string:
        return None
    value = getattr(a, member)
    if not promotable(a.name, member, value) or not _rebuilds_exactly(a, member):
        return None
    if a.name == "comm_type":
        value = COLLECTIVE_COMM_TYPES[value]
    return a.name, value, f"{a.name}:{member_number(member)}"


def _rebuilds_exactly(a: Any, member: str) -> bool:
    """Whether export's fresh ``AttributeProto(name, member=value)`` equals ``a``.

    Once name, member and value match, only unknown fields (or known ones in a
    foreign wire type) can differ, and they show in ``ByteSize``; such an attribute
    stays in ``attrs`` so nothing is lost. The canonical size is computed, not built.
    """
    name = a.name.encode()
    value = getattr(a, member)
    kind = member[:-4]
    if kind == "bool":
        body = 1
    elif kind == "string":
        text = value.encode()
        body = _varint_size(len(text)) + len(text)
    elif kind in ("fixed32", "sfixed32"):
        body = 4
    elif kind in ("fixed64", "sfixed64"):
        body = 8
    elif kind == "sint32":
        body = _varint_size(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)
    elif kind == "sint64":
        body = _varint_size(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)
    else:  # int32 / int64 / uint32 / uint64: negatives take ten bytes
        body = _varint_size(value & 0xFFFFFFFFFFFFFFFF)
    size = (1 + _varint_size(len(name)) + len(name) if name else 0) + (1 if member_number(member) < 16 else 2)
    return a.ByteSize() == size + body


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _extra_records(raw: bytes) -> list[tuple[int, int, int]]:
    """``(field, start, end)`` of a Node frame's top-level inputs/outputs/attr records.

    Runs on frames protobuf has already parsed, so the wire format is known to be
    well-formed. Keeping these records byte-for-byte (instead of re-serializing the
    parsed messages) is lossless by construction and what the native codec does.
    """
    out = []
    pos, n = 0, len(raw)
    while pos < n:
        start = pos
        tag = raw[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _uvarint(raw, pos)
        wire = tag & 7
        if wire == 2:
            size = raw[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = _uvarint(raw, pos)
            pos += size
            if 8 <= tag >> 3 <= 10:
                out.append((tag >> 3, start, pos))
        elif wire == 0:
            while raw[pos] >= 0x80:
                pos += 1
            pos += 1
        else:
            pos = _skip_value(raw, pos, wire)
    return out


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _skip_value(buf: bytes, pos: int, wire: int) -> int:
    """Position after a field value of wire type ``wire`` (groups included)."""
    if wire == 0:
        return _uvarint(buf, pos)[1]
    if wire == 1:
        return pos + 8
    if wire == 5:
        return pos + 4
    if wire == 2:
        size, pos = _uvarint(buf, pos)
        return pos + size
    # wire == 3: a group, already checked to be balanced by the protobuf parse
    while True:
        tag, pos = _uvarint(buf, pos)
        if tag & 7 == 4:
            return pos
        pos = _skip_value(buf, pos, tag & 7)


def decode_rank(data: bytes, rank: int, path: Path) -> tuple[pa.Table, pa.Table, bytes | None]:
    """Decode one rank's (already gunzipped) ``.et`` bytes into ``(ops, deps, metadata)``.

    Raises :class:`TraceFormatError` naming the file and byte offset of a bad frame, or
    before decoding when the file has more node frames than the memory budget allows
    (:func:`etstore.formats._frames.max_nodes`).
    """
    if _native is not None:
        decoded = _native.decode_rank(data, rank, path, max_nodes=max_nodes())
        if decoded is not None:
            return decoded
    return _decode_py(data, rank, path)


def split_missing(ops: pa.Table, deps: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split ``deps`` into (present, missing): missing = ``src`` absent from its rank."""
    if deps.num_rows == 0:
        return deps, deps.schema.empty_table()
    key_ops = _rank_id_key(ops["rank"], ops["id"])
    key_src = _rank_id_key(deps["rank"], deps["src"])
    if key_ops is not None and key_src is not None and len(key_ops) == 0:
        mask = pa.array(np.zeros(len(key_src), dtype=bool))
    elif key_ops is not None and key_src is not None:
        # sort + searchsorted: ~8x faster than np.isin here; files are usually in order already
        sorted_ops = key_ops if _ascending(key_ops) else np.sort(key_ops)
        at = np.minimum(np.searchsorted(sorted_ops, key_src), len(sorted_ops) - 1)
        present = sorted_ops[at] == key_src
        mask = pa.array(present)
    else:
        ref = pa.table({"rank": ops["rank"], "src": ops["id"], "_hit": pa.repeat(True, ops.num_rows)})
        joined = (
            deps.append_column("_row", pa.array(np.arange(deps.num_rows)))
            .join(ref, ["rank", "src"], join_type="left outer")
            .sort_by("_row")
        )
        mask = pc.fill_null(joined["_hit"], False)
    return deps.filter(mask), deps.filter(pc.invert(mask))


def _rank_id_key(rank: pa.ChunkedArray, ids: pa.ChunkedArray) -> np.ndarray | None:
    """(rank, id) packed in one uint64 when ids fit 40 bits; None otherwise."""
    r = rank.to_numpy().astype(np.uint64)
    i = ids.to_numpy()
    if len(i) and (int(i.max()) >= 1 << 40 or int(r.max()) >= 1 << 23):
        return None
    return (r << np.uint64(40)) | i


def _ascending(a: np.ndarray, *, strict: bool = False) -> bool:
    """Whether ``a`` is sorted (strictly: without repeats); O(n), no copy of ``a``."""
    if len(a) < 2:
        return True
    return bool(np.all(a[1:] > a[:-1]) if strict else np.all(a[1:] >= a[:-1]))


def duplicate_ids(ops: pa.Table) -> tuple[int, int] | None:
    """First (rank, id) that occurs twice, or None."""
    key = _rank_id_key(ops["rank"], ops["id"])
    if key is None:
        counts = ops.group_by(["rank", "id"]).aggregate([("id", "count")])
        dup = counts.filter(pc.greater(counts["id_count"], 1))
        return None if dup.num_rows == 0 else (dup["rank"][0].as_py(), dup["id"][0].as_py())
    if _ascending(key, strict=True):  # the common case: ids written in order
        return None
    s = np.sort(key)
    hit = np.flatnonzero(s[1:] == s[:-1])
    if len(hit) == 0:
        return None
    k = int(s[hit[0]])
    return k >> 40, k & ((1 << 40) - 1)


def _decode_file(path: Path, rank: int) -> tuple[pa.Table, pa.Table, bytes | None, bytes]:
    """Read and decode one rank's file.

    A first frame of 123 bytes starts the file with ``{``, which the foreign-format check
    takes for JSON; such a file is decoded anyway, and the check's message stands only
    when the bytes are no Chakra file either.
    """
    try:
        data = read_bytes(path, max_frames=max_nodes())
    except TraceFormatError as foreign:
        data = read_bytes(path, sniff=False, max_frames=max_nodes())
        if data[:1] != b"{":
            raise
        try:
            return (*decode_rank(data, rank, path), data)
        except TraceFormatError:
            raise foreign from None
    return (*decode_rank(data, rank, path), data)


def read_rank_file(item: RankFile) -> _Decoded:
    """``(ops, deps, missing, metadata, bytes read)`` of one ``(rank, path)`` file: decoded, its
    dependencies split as :func:`split_missing` splits them (a rank's dependencies name nodes of
    that rank only, so each file splits on its own, on the decoding thread), and refused when
    two of its nodes share an id (:class:`TraceFormatError` naming the file)."""
    rank, path = item
    ops, deps, meta, data = _decode_file(path, rank)
    ids = ops["id"].to_numpy()
    in_order = _ascending(ids, strict=True)  # ids written in order have no repeat to look for
    dup = None if in_order else duplicate_ids(ops)
    if dup is not None:
        raise TraceFormatError(f"{path}: node id {dup[1]} appears twice on rank {dup[0]}")
    present, missing = _split_rank(ids, in_order, deps)
    return _Decoded(ops, present, missing, meta, len(data))


def _split_rank(ids: np.ndarray, in_order: bool, deps: pa.Table) -> tuple[pa.Table, pa.Table]:
    """One rank's dependencies split into (present, missing): missing = ``src`` not in ``ids``
    (that rank's node ids, each once; ``in_order``: ascending).

    Notes
    -----
    O(E) when the ids are ``0 .. n-1`` in order (what Chakra's converters and our writer
    emit), else O((V + E) log V). Per rank, so that it runs on the decoding threads instead
    of after them over the whole trace.
    """
    if deps.num_rows == 0:
        return deps, deps
    src, n = deps["src"].to_numpy(), len(ids)
    if n == 0:
        present = np.zeros(len(src), dtype=bool)
    elif in_order and int(ids[0]) == 0 and int(ids[-1]) == n - 1:
        present = src < np.uint64(n)
    else:
        ordered = ids if in_order else np.sort(ids)
        present = ordered[np.minimum(np.searchsorted(ordered, src), n - 1)] == src
    if present.all():
        return deps, deps.slice(0, 0)
    mask = pa.array(present)
    return deps.filter(mask), deps.filter(pc.invert(mask))


# below this many bytes in all, ranks decode in this thread: starting workers and handing
# results between them cost more than the native decoder saves (≈ 0.1 ms per small file)
PARALLEL_DECODE_BYTES = 8 << 20


def _in_order(one: Callable[[RankFile], _Decoded], files: Sequence[RankFile]) -> Iterator[_Decoded]:
    """``one(f)`` for each file, in order; the first error is raised as a loop would raise it.

    Large inputs decode on all cores (the native decoder releases the GIL); small ones,
    such as an exported workload's hundreds of 4 KiB files, in this thread.
    """
    workers = max(1, min(len(files), os.cpu_count() or 1))
    if workers == 1 or _total_bytes(files) < PARALLEL_DECODE_BYTES:
        yield from map(one, files)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(one, files)


def _total_bytes(files: Sequence[RankFile]) -> int:
    """The files' sizes on disk; a file that cannot be read counts 0 (decoding says why)."""
    total = 0
    for _, path in files:
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """``tables`` as one table of one chunk per column (``schema``'s empty table for none)."""
    return pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()


def read_et(
    spec: str | Path | Sequence[RankFile],
    *,
    name: str | None = None,
    progress: Progress | None = None,
) -> Trace:
    """Read a Chakra ``.et`` trace: one file, a directory, a glob or ``<dir>/<prefix>``.

    Parameters
    ----------
    spec
        Where the ``<prefix>.<rank>.et`` files are (plain or gzip), or explicit
        ``[(rank, path)]`` pairs.
    name
        Trace name; defaults to the file prefix.
    progress
        Called with the number of bytes decoded after each file.

    Returns
    -------
    Trace
        ``ops``/``deps`` as in :mod:`etstore.model`, with dependencies on absent
        nodes moved to ``missing``.

    Raises
    ------
    TraceFormatError
        A file is truncated, foreign, empty, or two nodes of one rank share an id.

    Notes
    -----
    O(total bytes) decode plus O(E) for the missing dependencies (O(E log V) where ids are not
    ``0 .. n-1``). Inputs of :data:`PARALLEL_DECODE_BYTES` (8 MiB) or more decode (and split
    missing dependencies) on all cores, smaller ones in the calling thread.
    """
    if isinstance(spec, (str, Path)):
        prefix, files = resolve_rank_files(spec)
        source = str(spec)
    else:
        files = list(spec)
        prefix = files[0][1].name.split(".")[0] if files else "trace"
        source = ",".join(str(p) for _, p in files)

    ops_parts, deps_parts, missing_parts, meta_ranks, meta_blobs = [], [], [], [], []
    for (rank, _), got in zip(files, _in_order(read_rank_file, files), strict=True):
        ops_parts.append(got.ops)
        deps_parts.append(got.deps)
        missing_parts.append(got.missing)
        meta_ranks.append(rank)
        meta_blobs.append(got.meta)
        if progress is not None:
            progress(got.nbytes)
    ops = _concat(ops_parts, OPS_SCHEMA)
    present, missing = _concat(deps_parts, DEPS_SCHEMA), _concat(missing_parts, DEPS_SCHEMA)
    meta = pa.Table.from_pydict({"rank": meta_ranks, "metadata": meta_blobs}, schema=META_SCHEMA)
    params: dict[str, object] = {}
    algorithm = algorithm_params(ops, meta_blobs)  # what export writes for an algorithm
    if algorithm is not None:
        params.update(algorithm)
    sidecar = comm_groups_path(files[0][1].parent / prefix) if files else None
    if sidecar is not None and sidecar.is_file():  # ASTRA-sim's groups, as export writes them
        params["comm_groups"] = read_comm_groups(sidecar)
    return Trace(
        ops=ops,
        deps=present,
        missing=missing,
        meta=meta,
        name=name or prefix,
        kind="workload" if algorithm is None else "algorithm",
        source=source,
        params=params,
    )
