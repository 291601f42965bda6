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
from pathlib import Path
from typing import Any

import pyarrow as pa

from etstore.errors import TraceFormatError
from etstore.ingest._frames import read_bytes
from etstore.ingest.et import duplicate_ids, split_missing
from etstore.ingest.files import resolve_rank_files
from etstore.model import (
    ATTR_COLUMNS,
    DEPS_SCHEMA,
    META_SCHEMA,
    OPS_SCHEMA,
    Trace,
    member_number,
    node_type_name,
)
from etstore.proto import COLLECTIVE_COMM_TYPES, Node

__all__ = ["read_chakra_json", "write_chakra_json"]


def _node_type(value: Any, where: str) -> str:
    if isinstance(value, int):
        return node_type_name(value)
    if isinstance(value, str):
        return value if value.endswith("_NODE") or value.startswith("NODE_TYPE_") else f"{value}_NODE"
    raise TraceFormatError(f"{where}: NodeType must be an integer or a name, got {value!r}")


def _extras(node: dict[str, Any], where: str) -> tuple[bytes | None, str]:
    """Raw protobuf bytes for inputs/outputs/extra attrs, and the attr_order tokens."""
    msg = Node()
    for key in ("inputs", "outputs"):
        if key in node:
            io = getattr(msg, key)
            for field in ("values", "shapes", "types"):
                setattr(io, field, str(node[key].get(field, "")))
    tokens = [f"{c}:{_member_number(c)}" for c in ATTR_COLUMNS if node.get(c) is not None]
    for attr in node.get("attrs", []):
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
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TraceFormatError(f"{where}: malformed attribute {attr!r}: {exc}") from exc
        tokens.append("*")
    blob = msg.SerializeToString()
    return (blob or None), ",".join(tokens)


def _member_number(column: str) -> int:
    return member_number(ATTR_COLUMNS[column][1])


def _read_one(path: Path, rank: int) -> tuple[pa.Table, pa.Table]:
    try:
        doc = json.loads(read_bytes(path, sniff=False))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not valid JSON: {exc}") from exc
    nodes = doc.get("workload_graph") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise TraceFormatError(f"{path}: not a Chakra JSON trace (expected a 'workload_graph' list)")
    cols: dict[str, list[Any]] = {f.name: [] for f in OPS_SCHEMA}
    deps: dict[str, list[Any]] = {f.name: [] for f in DEPS_SCHEMA}
    for i, node in enumerate(nodes):
        where = f"{path}: node {i}"
        try:
            nid = int(node["Id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"{where}: missing or bad 'Id'") from exc
        cols["rank"].append(rank)
        cols["id"].append(nid)
        cols["name"].append(str(node.get("Name", "")))
        cols["type"].append(_node_type(node.get("NodeType", 0), where))
        cols["duration_micros"].append(int(node.get("runtime", node.get("duration_micros", 0)) or 0))
        cols["start_time_micros"].append(int(node.get("start_time_micros", 0) or 0))
        for c in ATTR_COLUMNS:
            v = node.get(c)
            if c == "comm_type" and isinstance(v, int):
                v = COLLECTIVE_COMM_TYPES[v]
            cols[c].append(v)
        blob, order = _extras(node, where)
        cols["attrs"].append(blob)
        cols["attr_order"].append(node.get("attr_order", order))
        for kind, key in (("data", "data_deps"), ("ctrl", "ctrlDeps")):
            for pos, src in enumerate(node.get(key, []) or []):
                deps["rank"].append(rank)
                deps["src"].append(int(src))
                deps["dst"].append(nid)
                deps["kind"].append(kind)
                deps["pos"].append(pos)
    try:
        return pa.Table.from_pydict(cols, schema=OPS_SCHEMA), pa.Table.from_pydict(deps, schema=DEPS_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise TraceFormatError(f"{path}: a node field has the wrong type: {exc}") from exc


def read_chakra_json(spec: str | Path, *, name: str | None = None) -> Trace:
    """Read Chakra JSON trace file(s): one file, a directory or ``<prefix>.<rank>.json`` set.

    Raises
    ------
    TraceFormatError
        Not JSON, no ``workload_graph``, a node without ``Id``, or a duplicate id.
    """
    prefix, files = resolve_rank_files(spec)
    ops_parts, deps_parts = [], []
    for rank, path in files:
        ops, deps = _read_one(path, rank)
        dup = duplicate_ids(ops)
        if dup is not None:
            raise TraceFormatError(f"{path}: node id {dup[1]} appears twice")
        ops_parts.append(ops)
        deps_parts.append(deps)
    ops = pa.concat_tables(ops_parts).combine_chunks()
    present, missing = split_missing(ops, pa.concat_tables(deps_parts).combine_chunks())
    meta = pa.Table.from_pydict(
        {"rank": [r for r, _ in files], "metadata": [None] * len(files)}, schema=META_SCHEMA
    )
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
    all_deps = pa.concat_tables([trace.deps, trace.missing])
    by_node: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    for r, s, d, k, p in zip(
        *(all_deps[c].to_pylist() for c in ("rank", "src", "dst", "kind", "pos")), strict=True
    ):
        by_node.setdefault((r, d, k), []).append((p, s))
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
        path.write_text(json.dumps({"workload_graph": nodes}, indent=1))
        paths.append(path)
    return paths
