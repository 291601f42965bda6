"""Chakra's JSON trace form (``{"workload_graph": [...]}``) ⇄ :class:`Trace`.

Chakra writes nodes with keys ``Id``, ``Name``, ``NodeType``, ``ctrlDeps``,
``data_deps``, ``runtime`` (µs) and ``is_cpu_op``. We read those, the promoted
attribute names (``comm_type``, ``comm_size``, ...) and ``start_time_micros``. Our
writer adds ``attrs`` (every other attribute as ``{"name", <oneof member>: value}``)
and ``inputs``/``outputs``, so a JSON export re-reads to the same trace.
"""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.errors import TraceFormatError
from etstore.formats._frames import read_bytes
from etstore.formats.et import duplicate_ids, split_missing
from etstore.formats.files import resolve_rank_files
from etstore.model import (
    ATTR_COLUMNS,
    DEPS_SCHEMA,
    META_SCHEMA,
    OPS_SCHEMA,
    Trace,
    chakra_deps,
    member_number,
    node_type_name,
)
from etstore.proto import COLLECTIVE_COMM_TYPES, NODE_TYPES, Node
from etstore.units import memory_budget

__all__ = ["read_chakra_json", "write_chakra_json"]

_PEAK_BYTES_PER_JSON_BYTE = 10  # reading peaks at ~8.5x the file (measured on Chakra's 4.9 MB trace)

_META_KEY = "global_metadata_raw"  # base64 of the GlobalMetadata message (not a Chakra key: ours)


def _node_type(value: Any, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31:
        return node_type_name(value)
    if isinstance(value, str):
        name = value if value.endswith("_NODE") or value.startswith("NODE_TYPE_") else f"{value}_NODE"
        if name in NODE_TYPES or re.fullmatch(r"NODE_TYPE_[0-9]{1,9}", name):
            return name
    raise TraceFormatError(
        f"{where}: NodeType must be a Chakra node type (a number or a name such as COMP_NODE), "
        f"got {_shown(value)}"
    )


def _shown(value: Any) -> str:
    """``value`` for a one-line message: repr, newlines escaped, at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(value: Any, where: str, key: str, *, bits: int = 64) -> int:
    """``value`` as a non-negative integer below ``2**bits`` (integral floats allowed)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << bits:
        return value
    raise TraceFormatError(f"{where}: {key!r} must be a whole number in 0..2^{bits}-1, got {_shown(value)}")


def _dep_list(node: dict[str, Any], key: str, where: str) -> list[int]:
    """The node ids listed under ``key`` (absent or null: none)."""
    value = node.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TraceFormatError(f"{where}: {key!r} must be a list of node ids, got {_shown(value)}")
    return [_integer(v, where, key) for v in value]


def _reject_constant(name: str) -> float:
    """``json.loads`` hook: NaN and Infinity are not JSON and no Chakra field can hold them."""
    raise ValueError(f"{name} is not a valid JSON value")


def _parse(path: Path) -> Any:
    """The parsed JSON document of ``path`` (gunzipped if needed), or a one-line refusal."""
    try:
        data = read_bytes(path, sniff=False, limit=memory_budget() // _PEAK_BYTES_PER_JSON_BYTE)
        return json.loads(data, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not valid JSON: {str(exc).splitlines()[0]}") from exc
    except ValueError as exc:  # from _reject_constant
        raise TraceFormatError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: not a Chakra JSON trace: values nested too deeply to read") from exc


def _extras(node: dict[str, Any], where: str) -> tuple[bytes | None, str]:
    """Raw protobuf bytes for inputs/outputs/extra attrs, and the attr_order tokens."""
    msg = Node()
    for key in ("inputs", "outputs"):
        if key in node:
            if not isinstance(node[key], dict):
                raise TraceFormatError(f"{where}: {key!r} must be an object, got {_shown(node[key])}")
            io = getattr(msg, key)
            for field in ("values", "shapes", "types"):
                setattr(io, field, str(node[key].get(field, "")))
    tokens = [f"{c}:{_member_number(c)}" for c in ATTR_COLUMNS if node.get(c) is not None]
    attrs = node.get("attrs") or []
    if not isinstance(attrs, list):
        raise TraceFormatError(f"{where}: 'attrs' must be a list of attributes, got {_shown(attrs)}")
    for attr in attrs:
        try:
            a = msg.attr.add(name=attr["name"])
            members = [k for k in attr if k not in ("name", "doc_string")]
            if attr.get("doc_string"):
                a.doc_string = attr["doc_string"]
            for member in members:
                value = attr[member]
                if member.startswith("bytes"):
                    value = (
                        [base64.b64decode(v) for v in value]
                        if member.endswith("_list")
                        else base64.b64decode(value)
                    )
                if member.endswith("_list"):
                    getattr(a, member).values.extend(value)
                else:
                    setattr(a, member, value)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TraceFormatError(f"{where}: malformed attribute {_shown(attr)}: {first}") from exc
        tokens.append("*")
    blob = msg.SerializeToString()
    return (blob or None), ",".join(tokens)


def _member_number(column: str) -> int:
    return member_number(ATTR_COLUMNS[column][1])


def _metadata(doc: dict[str, Any], path: Path) -> bytes | None:
    """The GlobalMetadata frame that :func:`write_chakra_json` kept (``global_metadata_raw``), if any."""
    raw = doc.get(_META_KEY)
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True) if isinstance(raw, str) else _bad_meta(path)
    except ValueError:
        return _bad_meta(path)


def _bad_meta(path: Path) -> bytes:
    raise TraceFormatError(f"{path}: {_META_KEY!r} must be the base64 text of a GlobalMetadata message")


def _read_one(path: Path, rank: int) -> tuple[pa.Table, pa.Table, bytes | None]:
    doc = _parse(path)
    nodes = doc.get("workload_graph") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise TraceFormatError(f"{path}: not a Chakra JSON trace (expected a 'workload_graph' list)")
    meta = _metadata(doc, path)
    cols: dict[str, list[Any]] = {f.name: [] for f in OPS_SCHEMA}
    deps: dict[str, list[Any]] = {f.name: [] for f in DEPS_SCHEMA}
    for i, node in enumerate(nodes):
        where = f"{path}: node {i}"
        if not isinstance(node, dict):
            raise TraceFormatError(f"{where}: expected an object with 'Id', got {_shown(node)}")
        if "Id" not in node:
            raise TraceFormatError(f"{where}: missing 'Id'")
        nid = _integer(node["Id"], where, "Id")
        where = f"{path}: node {i} (Id {nid})"
        cols["rank"].append(rank)
        cols["id"].append(nid)
        cols["name"].append(str(node.get("Name", "")))
        cols["type"].append(_node_type(node.get("NodeType", 0), where))
        runtime_key = "runtime" if "runtime" in node else "duration_micros"
        cols["duration_micros"].append(_integer(node.get(runtime_key) or 0, where, runtime_key))
        cols["start_time_micros"].append(
            _integer(node.get("start_time_micros") or 0, where, "start_time_micros")
        )
        for c in ATTR_COLUMNS:
            v = node.get(c)
            if c == "comm_type" and isinstance(v, int) and not isinstance(v, bool):
                if not 0 <= v < len(COLLECTIVE_COMM_TYPES):
                    raise TraceFormatError(
                        f"{where}: comm_type {v} is not a Chakra collective "
                        f"(0..{len(COLLECTIVE_COMM_TYPES) - 1})"
                    )
                v = COLLECTIVE_COMM_TYPES[v]
            cols[c].append(v)
        blob, order = _extras(node, where)
        cols["attrs"].append(blob)
        cols["attr_order"].append(node.get("attr_order", order))
        for kind, key in (("data", "data_deps"), ("ctrl", "ctrlDeps")):
            for pos, src in enumerate(_dep_list(node, key, where)):
                deps["rank"].append(rank)
                deps["src"].append(src)
                deps["dst"].append(nid)
                deps["kind"].append(kind)
                deps["pos"].append(pos)
    try:
        return (
            pa.Table.from_pydict(cols, schema=OPS_SCHEMA),
            pa.Table.from_pydict(deps, schema=DEPS_SCHEMA),
            meta,
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(f"{path}: a node field has the wrong type: {first}") from exc


def read_chakra_json(spec: str | Path, *, name: str | None = None) -> Trace:
    """Read Chakra JSON trace file(s): one file, a directory or ``<prefix>.<rank>.json`` set.

    Raises
    ------
    TraceFormatError
        Not JSON (``NaN`` and ``Infinity`` included), larger than a tenth of the memory
        budget (:func:`etstore.units.memory_budget`; reading peaks at ~8.5x the file), nested
        too deeply, no ``workload_graph``, a node without ``Id``, a field of the wrong type
        or out of range (ids and times are unsigned 64-bit), or a duplicate id.

    Notes
    -----
    O(file bytes): the document is parsed whole, then one pass over the nodes.
    """
    prefix, files = resolve_rank_files(spec)
    ops_parts, deps_parts, metas = [], [], []
    for rank, path in files:
        ops, deps, meta_blob = _read_one(path, rank)
        metas.append(meta_blob)
        dup = duplicate_ids(ops)
        if dup is not None:
            raise TraceFormatError(f"{path}: node id {dup[1]} appears twice")
        ops_parts.append(ops)
        deps_parts.append(deps)
    ops = pa.concat_tables(ops_parts).combine_chunks()
    present, missing = split_missing(ops, pa.concat_tables(deps_parts).combine_chunks())
    meta = pa.Table.from_pydict({"rank": [r for r, _ in files], "metadata": metas}, schema=META_SCHEMA)
    return Trace(ops=ops, deps=present, missing=missing, meta=meta, name=name or prefix, source=str(spec))


def _attr_json(a: Any) -> dict[str, Any]:
    member = a.WhichOneof("value")
    out: dict[str, Any] = {"name": a.name}
    if a.doc_string:
        out["doc_string"] = a.doc_string
    if member is None:
        return out
    value = getattr(a, member)
    if member.endswith("_list"):
        value = list(value.values)
        if member.startswith("bytes"):
            value = [base64.b64encode(v).decode() for v in value]
    elif member.startswith("bytes"):
        value = base64.b64encode(value).decode()
    out[member] = value
    return out


def write_chakra_json(trace: Trace, prefix: str | Path) -> list[Path]:
    """Write ``<prefix>.<rank>.json`` per rank in Chakra's JSON form (plus our lossless keys)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    all_deps = chakra_deps(pa.concat_tables([trace.deps, trace.missing]))
    by_node: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    for r, s, d, k, p in zip(
        *(all_deps[c].to_pylist() for c in ("rank", "src", "dst", "kind", "pos")), strict=True
    ):
        by_node.setdefault((r, d, k), []).append((p, s))
    meta = dict(zip(trace.meta["rank"].to_pylist(), trace.meta["metadata"].to_pylist(), strict=True))
    paths = []
    for rank, (start, end) in trace.rank_slices().items():
        nodes = []
        for row in trace.ops.slice(start, end - start).to_pylist():
            node: dict[str, Any] = {
                "Id": row["id"],
                "Name": row["name"],
                "NodeType": row["type"],
                "ctrlDeps": [s for _, s in sorted(by_node.get((rank, row["id"], "ctrl"), []))],
                "data_deps": [s for _, s in sorted(by_node.get((rank, row["id"], "data"), []))],
                "runtime": row["duration_micros"],
            }
            if row["start_time_micros"]:
                node["start_time_micros"] = row["start_time_micros"]
            if row["attr_order"] is not None:
                node["attr_order"] = row["attr_order"]
            for c in ATTR_COLUMNS:
                if row[c] is not None:
                    node[c] = row[c]
            if row["attrs"]:
                extra = Node.FromString(row["attrs"])
                for key in ("inputs", "outputs"):
                    if extra.HasField(key):
                        io = getattr(extra, key)
                        node[key] = {"values": io.values, "shapes": io.shapes, "types": io.types}
                if extra.attr:
                    node["attrs"] = [_attr_json(a) for a in extra.attr]
            nodes.append(node)
        path = prefix.parent / f"{prefix.name}.{rank}.json"
        doc: dict[str, Any] = {"workload_graph": nodes}
        if meta.get(rank) is not None:  # the .et file's metadata frame, so a re-read is the same trace
            doc[_META_KEY] = base64.b64encode(meta[rank]).decode()
        path.write_text(json.dumps(doc, indent=1))
        paths.append(path)
    return paths
