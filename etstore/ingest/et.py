"""Chakra ``.et`` files ⇄ columnar :class:`~etstore.model.Trace`.

Decoding uses the native codec (``etstore.ingest._etcodec``) when it is built and
falls back to the protobuf runtime otherwise; both produce identical columns.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from etstore.errors import TraceFormatError
from etstore.ingest._frames import read_bytes, varint, write_varint
from etstore.ingest.files import RankFile, resolve_rank_files
from etstore.model import (
    ATTR_COLUMNS,
    DEPS_SCHEMA,
    META_SCHEMA,
    OPS_SCHEMA,
    Trace,
    member_number,
    node_type_code,
    node_type_name,
    promotable,
)
from etstore.proto import COLLECTIVE_COMM_TYPES, ONEOF_FIELDS, GlobalMetadata, Node

__all__ = ["decode_rank", "encode_rank", "read_et", "split_missing", "write_et"]

log = logging.getLogger(__name__)

try:  # the native codec is optional; the pure-Python path is the reference
    from etstore.ingest import _etcodec  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _etcodec = None

Progress = Callable[[int], None]


# ---------------------------------------------------------------- decoding


def _decode_py(data: bytes, rank: int, path: Path) -> tuple[pa.Table, pa.Table, bytes | None]:
    """Reference decoder: one protobuf parse per frame."""
    meta_len, pos = varint(data, 0, path)
    if meta_len > len(data) - pos:
        raise TraceFormatError(
            f"{path}: byte 0: GlobalMetadata frame claims {meta_len} bytes but only "
            f"{len(data) - pos} remain (truncated, or not a Chakra ET file)"
        )
    meta_bytes = data[pos : pos + meta_len]
    try:
        meta = GlobalMetadata.FromString(meta_bytes)
    except DecodeError as exc:
        raise TraceFormatError(f"{path}: byte 0: first frame is not a Chakra GlobalMetadata") from exc
    if meta_bytes and not meta.ListFields():
        raise TraceFormatError(f"{path}: byte 0: first frame is not a Chakra GlobalMetadata")
    pos += meta_len

    cols: dict[str, list[Any]] = {f.name: [] for f in OPS_SCHEMA}
    d_src: list[int] = []
    d_dst: list[int] = []
    d_kind: list[str] = []
    d_pos: list[int] = []
    n = len(data)
    frame = 1
    while pos < n:
        start = pos
        length, pos = varint(data, pos, path)
        if length > n - pos:
            raise TraceFormatError(
                f"{path}: byte {start}: node frame {frame} claims {length} bytes but only "
                f"{n - pos} remain (truncated file?)"
            )
        try:
            node = Node.FromString(data[pos : pos + length])
        except DecodeError as exc:
            raise TraceFormatError(f"{path}: byte {start}: frame {frame} is not a Chakra Node") from exc
        pos += length
        frame += 1
        _node_to_columns(node, cols)
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


def _node_to_columns(node: Any, cols: dict[str, list[Any]]) -> None:
    cols["id"].append(node.id)
    cols["name"].append(node.name)
    cols["type"].append(node_type_name(node.type))
    cols["duration_micros"].append(node.duration_micros)
    cols["start_time_micros"].append(node.start_time_micros)
    promoted: dict[str, Any] = {}
    tokens: list[str] = []
    extra = Node()
    if node.HasField("inputs"):
        extra.inputs.CopyFrom(node.inputs)
    if node.HasField("outputs"):
        extra.outputs.CopyFrom(node.outputs)
    for a in node.attr:
        member = a.WhichOneof("value")
        name = a.name
        if (
            name in ATTR_COLUMNS
            and name not in promoted
            and member is not None
            and not a.doc_string
            and promotable(name, member, getattr(a, member))
        ):
            value = getattr(a, member)
            promoted[name] = COLLECTIVE_COMM_TYPES[value] if name == "comm_type" else value
            tokens.append(f"{name}:{member_number(member)}")
        else:
            extra.attr.append(a)
            tokens.append("*")
    for column in ATTR_COLUMNS:
        cols[column].append(promoted.get(column))
    blob = extra.SerializeToString()
    cols["attrs"].append(blob if blob else None)
    cols["attr_order"].append(",".join(tokens))


def decode_rank(data: bytes, rank: int, path: Path) -> tuple[pa.Table, pa.Table, bytes | None]:
    """Decode one rank's (already gunzipped) ``.et`` bytes into ``(ops, deps, metadata)``.

    Raises :class:`TraceFormatError` naming the file and byte offset of a bad frame.
    """
    if _etcodec is not None:
        return _etcodec.decode(data, rank, str(path))
    return _decode_py(data, rank, path)


def split_missing(ops: pa.Table, deps: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split ``deps`` into (present, missing): missing = ``src`` absent from its rank."""
    if deps.num_rows == 0:
        return deps, deps.schema.empty_table()
    key_ops = _rank_id_key(ops["rank"], ops["id"])
    key_src = _rank_id_key(deps["rank"], deps["src"])
    if key_ops is not None and key_src is not None:
        present = np.isin(key_src, key_ops)
        mask = pa.array(present)
    else:
        ref = pa.table({"rank": ops["rank"], "src": ops["id"], "_hit": pa.repeat(True, ops.num_rows)})
        joined = deps.append_column("_row", pa.array(np.arange(deps.num_rows))).join(
            ref, ["rank", "src"], join_type="left outer"
        ).sort_by("_row")
        mask = pc.fill_null(joined["_hit"], False)
    return deps.filter(mask), deps.filter(pc.invert(mask))


def _rank_id_key(rank: pa.ChunkedArray, ids: pa.ChunkedArray) -> np.ndarray | None:
    """(rank, id) packed in one uint64 when ids fit 40 bits; None otherwise."""
    r = rank.to_numpy().astype(np.uint64)
    i = ids.to_numpy()
    if len(i) and (int(i.max()) >= 1 << 40 or int(r.max()) >= 1 << 23):
        return None
    return (r << np.uint64(40)) | i


def duplicate_ids(ops: pa.Table) -> tuple[int, int] | None:
    """First (rank, id) that occurs twice, or None."""
    key = _rank_id_key(ops["rank"], ops["id"])
    if key is None:
        counts = ops.group_by(["rank", "id"]).aggregate([("id", "count")])
        dup = counts.filter(pc.greater(counts["id_count"], 1))
        return None if dup.num_rows == 0 else (dup["rank"][0].as_py(), dup["id"][0].as_py())
    s = np.sort(key)
    hit = np.flatnonzero(s[1:] == s[:-1])
    if len(hit) == 0:
        return None
    k = int(s[hit[0]])
    return k >> 40, k & ((1 << 40) - 1)


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
    O(total bytes) decode plus O(E log V) to find missing dependencies.
    """
    if isinstance(spec, (str, Path)):
        prefix, files = resolve_rank_files(spec)
        source = str(spec)
    else:
        files = list(spec)
        prefix = files[0][1].name.split(".")[0] if files else "trace"
        source = ",".join(str(p) for _, p in files)
    ops_parts, deps_parts, meta_ranks, meta_blobs = [], [], [], []
    for rank, path in files:
        data = read_bytes(path)
        ops, deps, meta = decode_rank(data, rank, path)
        dup = duplicate_ids(ops)
        if dup is not None:
            raise TraceFormatError(f"{path}: node id {dup[1]} appears twice on rank {dup[0]}")
        ops_parts.append(ops)
        deps_parts.append(deps)
        meta_ranks.append(rank)
        meta_blobs.append(meta)
        if progress is not None:
            progress(len(data))
    ops = pa.concat_tables(ops_parts) if ops_parts else OPS_SCHEMA.empty_table()
    deps = pa.concat_tables(deps_parts) if deps_parts else DEPS_SCHEMA.empty_table()
    present, missing = split_missing(ops, deps)
    meta = pa.Table.from_pydict({"rank": meta_ranks, "metadata": meta_blobs}, schema=META_SCHEMA)
    return Trace(
        ops=ops.combine_chunks(),
        deps=present.combine_chunks(),
        missing=missing.combine_chunks(),
        meta=meta,
        name=name or prefix,
        kind="workload",
        source=source,
    )


# ---------------------------------------------------------------- encoding


def _member_for(column: str, token_member: str | None) -> str:
    return token_member or ATTR_COLUMNS[column][1]


def _attr_value(column: str, value: Any) -> Any:
    if column == "comm_type":
        return COLLECTIVE_COMM_TYPES.index(value)
    return value


def _set_attr(node: Any, column: str, member: str, value: Any) -> None:
    a = node.attr.add(name=column)
    setattr(a, member, _attr_value(column, value))


def _build_node(row: dict[str, Any], data_deps: list[int], ctrl_deps: list[int]) -> Any:
    node = Node()
    node.id = row["id"]
    node.name = row["name"] or ""
    node.type = node_type_code(row["type"])
    node.ctrl_deps.extend(ctrl_deps)
    node.data_deps.extend(data_deps)
    node.start_time_micros = row["start_time_micros"] or 0
    node.duration_micros = row["duration_micros"] or 0
    extras = Node.FromString(row["attrs"]) if row["attrs"] else Node()
    if extras.HasField("inputs"):
        node.inputs.CopyFrom(extras.inputs)
    if extras.HasField("outputs"):
        node.outputs.CopyFrom(extras.outputs)
    extra_iter = iter(extras.attr)
    written: set[str] = set()
    order = row["attr_order"]
    if order:
        for token in order.split(","):
            if token == "*":
                extra = next(extra_iter, None)
                if extra is not None:
                    node.attr.append(extra)
                continue
            column, number = token.split(":")
            if row.get(column) is None or column in written:
                continue
            _set_attr(node, column, ONEOF_FIELDS[int(number)], row[column])
            written.add(column)
    for column in ATTR_COLUMNS:
        if column not in written and row.get(column) is not None:
            _set_attr(node, column, _member_for(column, None), row[column])
    for extra in extra_iter:
        node.attr.append(extra)
    return node


def _deps_by_node(deps: pa.Table) -> dict[tuple[int, str], list[int]]:
    if deps.num_rows == 0:
        return {}
    ordered = deps.sort_by([("dst", "ascending"), ("kind", "ascending"), ("pos", "ascending")])
    out: dict[tuple[int, str], list[int]] = {}
    for src, dst, kind in zip(
        ordered["src"].to_pylist(), ordered["dst"].to_pylist(), ordered["kind"].to_pylist(), strict=True
    ):
        out.setdefault((dst, kind), []).append(src)
    return out


def encode_rank(ops: pa.Table, deps: pa.Table, metadata: bytes | None) -> bytes:
    """One rank's ``.et`` bytes (uncompressed) from its ops and all its deps (incl. missing)."""
    if _etcodec is not None and hasattr(_etcodec, "encode"):
        return _etcodec.encode(ops, deps, metadata or b"")
    out = bytearray()
    meta = metadata or b""
    out += write_varint(len(meta)) + meta
    by_node = _deps_by_node(deps)
    for row in ops.to_pylist():
        node = _build_node(row, by_node.get((row["id"], "data"), []), by_node.get((row["id"], "ctrl"), []))
        blob = node.SerializeToString()
        out += write_varint(len(blob)) + blob
    return bytes(out)


def write_et(trace: Trace, prefix: str | Path, *, gzip_output: bool = False) -> list[Path]:
    """Write ``<prefix>.<rank>.et`` (or ``.et.gz``) per rank; returns the paths written.

    Missing dependencies are written back where they were, so a re-read yields the
    same trace.
    """
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    all_deps = pa.concat_tables([trace.deps, trace.missing]) if trace.missing.num_rows else trace.deps
    meta = dict(zip(trace.meta["rank"].to_pylist(), trace.meta["metadata"].to_pylist(), strict=True))
    paths = []
    for rank, (start, end) in trace.rank_slices().items():
        ops = trace.ops.slice(start, end - start)
        deps = all_deps.filter(pc.equal(all_deps["rank"], rank))
        blob = encode_rank(ops, deps, meta.get(rank))
        path = prefix.parent / f"{prefix.name}.{rank}.et{'.gz' if gzip_output else ''}"
        path.write_bytes(gzip.compress(blob, mtime=0) if gzip_output else blob)
        paths.append(path)
    return paths
