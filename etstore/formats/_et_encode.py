"""Columnar :class:`~etstore.model.Trace` → Chakra ``.et`` bytes and files (the writing half of
:mod:`etstore.formats.et`, which re-exports :func:`encode_rank` and :func:`write_et`).

Encoding uses the native codec when it is built and the protobuf runtime otherwise; both
write identical bytes, which re-read to the identical trace.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.formats._frames import write_varint
from etstore.model import ATTR_COLUMNS, Trace, chakra_deps, node_type_code
from etstore.proto import COLLECTIVE_COMM_TYPES, ONEOF_FIELDS, Node

__all__ = ["encode_rank", "write_et"]

try:  # the native codec is an optional C build; the pure-Python path is the reference
    from etstore.formats import _native
except ImportError:  # pragma: no cover - depends on the build
    _native = None  # type: ignore[assignment]


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
    """One rank's ``.et`` bytes (uncompressed) from its ops and all its deps (incl. missing);
    a recorded trace's lane, launch and wait dependencies are written as ``ctrl_deps``."""
    deps = chakra_deps(deps)
    if _native is not None:
        return _native.encode_rank(ops, deps, metadata)
    return _encode_py(ops, deps, metadata)


def _encode_py(ops: pa.Table, deps: pa.Table, metadata: bytes | None) -> bytes:
    """Reference encoder: one protobuf message per node."""
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
