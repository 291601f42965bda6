"""PyTorch execution-trace nodes as columns, and which node stands for each communication call.

Schemas 1.0.1 (flat ``parent``/``inputs``/``input_types`` keys) through
1.1.1-chakra.0.0.4 (``ctrl_deps``, ``inputs: {values, shapes, types}``, an ``attrs``
list) are read into one layout. A communication call shows up as several nested or
adjacent nodes (``c10d::allreduce_``, its ``record_param_comms`` record, the backend's
``nccl:all_reduce`` / ``gloo:all_reduce`` annotation); :func:`classify` picks one per
call and fills its Chakra fields from the richest record available.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from etstore.errors import TraceFormatError
from etstore.formats._torch_comm import (
    RECV_NODE,
    SEND_NODE,
    CommKind,
    comm_args,
    comm_kind,
    comm_prefixed,
    dtype_size,
)
from etstore.formats._torch_link import dumps

__all__ = [
    "PG_INIT",
    "ROOT",
    "Comm",
    "EtNodes",
    "Groups",
    "classify",
    "declared_groups",
    "parse_nodes",
    "tensor_bytes",
    "tensors",
]

ROOT = re.compile(r"^\[pytorch\|profiler\|execution_(?:graph|trace)\|(?:process|thread)\]$")
PG_INIT = "## process_group:init ##"
_RPC = "record_param_comms"
# ET attribute names of record_param_comms → the Kineto argument names comm_args reads
_ET_COMM_KEYS = {
    "collective_name": "Collective name",
    "dtype": "dtype",
    "in_msg_nelems": "In msg nelems",
    "out_msg_nelems": "Out msg nelems",
    "in_split_size": "In split size",
    "out_split_size": "Out split size",
    "global_rank_start": "Global rank start",
    "global_rank_stride": "Global rank stride",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_size": "Group size",
}


# ---------------------------------------------------------------- one rank's nodes


@dataclass
class EtNodes:
    """One ET file's nodes as columns, ascending id (entry order)."""

    ids: np.ndarray
    names: list[str]
    parent_row: np.ndarray
    tids: np.ndarray
    rf_ids: np.ndarray
    inputs: list[tuple[list[Any], list[Any]]]  # (values, types)
    outputs: list[tuple[list[Any], list[Any]]]
    attrs: list[dict[str, Any]]
    raw: list[bytes]
    header: dict[str, Any] = field(default_factory=dict)


def node_io(node: dict[str, Any], key: str) -> tuple[list[Any], list[Any]]:
    """A node's ``inputs`` or ``outputs`` as (values, types), whichever schema wrote it."""
    io = node.get(key)
    if isinstance(io, dict):  # ≥ 1.0.2-chakra: {"values", "shapes", "types"}
        values, types = io.get("values", []), io.get("types", [])
    else:  # 1.0.1: "inputs" + "input_types"
        values, types = io or [], node.get(key[:-1] + "_types", [])
    return (values if isinstance(values, list) else []), (types if isinstance(types, list) else [])


def parse_nodes(doc: Any, path: Path) -> EtNodes:
    """Validate and columnise an ET document."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise TraceFormatError(f"{path}: not a PyTorch execution trace (expected a 'nodes' list)")
    if not nodes:
        raise TraceFormatError(f"{path}: the PyTorch execution trace has no nodes")
    ids, parents, tids, rf_ids = [], [], [], []
    rows = []
    for i, node in enumerate(nodes):
        if (
            not isinstance(node, dict)
            or isinstance(node.get("id"), bool)
            or not isinstance(node.get("id"), int)
        ):
            raise TraceFormatError(f"{path}: node {i}: expected an object with an integer 'id'")
        attrs = {a.get("name"): a.get("value") for a in node.get("attrs", []) if isinstance(a, dict)}
        parent = node.get("ctrl_deps", node.get("parent", 0))
        if isinstance(parent, list):  # a list in some writers; the caller is the first
            parent = parent[0] if parent else 0
        tid = attrs.get("tid", node.get("tid", 0))
        rf = attrs.get("rf_id", node.get("rf_id", -1))
        ids.append(node["id"])
        parents.append(parent if isinstance(parent, int) else 0)
        tids.append(tid if isinstance(tid, int) else 0)
        rf_ids.append(rf if isinstance(rf, int) else -1)
        rows.append((node, attrs))
    id_arr = np.asarray(ids, dtype=np.int64)
    order = np.argsort(id_arr, kind="stable")
    id_arr = id_arr[order]
    dup = np.flatnonzero(id_arr[1:] == id_arr[:-1])
    if len(dup):
        raise TraceFormatError(f"{path}: node id {int(id_arr[dup[0]])} appears twice")
    par = np.asarray(parents, dtype=np.int64)[order]
    pos = np.searchsorted(id_arr, par)
    pos_c = np.minimum(pos, len(id_arr) - 1)
    parent_row = np.where((id_arr[pos_c] == par) & (par != id_arr), pos_c, -1)
    ordered = [rows[i] for i in order.tolist()]
    return EtNodes(
        ids=id_arr,
        names=[str(n.get("name", "")) for n, _ in ordered],
        parent_row=parent_row,
        tids=np.asarray(tids, dtype=np.int64)[order],
        rf_ids=np.asarray(rf_ids, dtype=np.int64)[order],
        inputs=[node_io(n, "inputs") for n, _ in ordered],
        outputs=[node_io(n, "outputs") for n, _ in ordered],
        attrs=[a for _, a in ordered],
        raw=[dumps(n) for n, _ in ordered],
        header={k: v for k, v in doc.items() if k != "nodes"},
    )


def tensors(values: list[Any], types: list[Any]) -> list[list[Any]]:
    """Tensor records ``[id, storage_id, offset, numel, itemsize, device]`` among arguments."""
    out: list[list[Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            if len(v) >= 5 and all(type(x) is int for x in v[:5]):
                out.append(v)
            else:
                for x in v:
                    walk(x)

    for v, t in zip(values, types, strict=False):
        if isinstance(t, str) and "Tensor" in t:
            walk(v)
    return out


def tensor_bytes(tensors: list[list[Any]]) -> tuple[int, int | None]:
    """Total elements and the element size (bytes) of tensor records (size None if mixed/unknown)."""
    nelems = sum(t[3] for t in tensors)
    sizes = {t[4] for t in tensors}
    return nelems, (sizes.pop() if len(sizes) == 1 else None)


# ---------------------------------------------------------------- process groups


@dataclass
class Groups:
    """Process groups a rank's ET declares: ranks per pg_name, and backend ids → pg_name."""

    ranks: dict[str, list[int]] = field(default_factory=dict)
    by_backend_id: dict[int, str] = field(default_factory=dict)


def declared_groups(nodes: EtNodes) -> Groups:
    out = Groups()
    for row, name in enumerate(nodes.names):
        if name != PG_INIT:
            continue
        values, _ = nodes.inputs[row]
        try:
            config = _json_text(values[0]) if values and isinstance(values[0], str) else []
        except ValueError:
            continue
        except RecursionError:
            raise TraceFormatError(
                f"node {int(nodes.ids[row])} ({PG_INIT}): its process-group list nests too deeply"
            ) from None
        for pg in config if isinstance(config, list) else []:
            if not isinstance(pg, dict) or pg.get("pg_name") is None:
                continue
            pg_name = str(pg["pg_name"])
            ranks = [int(r) for r in pg.get("ranks") or [] if isinstance(r, int)]
            size = pg.get("group_size", pg.get("pg_size"))
            if not ranks and isinstance(size, int) and size > 0:
                ranks = list(range(size))  # [] is the default group: every rank
            out.ranks[pg_name] = ranks
            if isinstance(pg.get("backend_id"), int):
                out.by_backend_id[pg["backend_id"]] = pg_name
    return out


def _json_text(text: str) -> Any:
    """Decode a JSON string embedded in a node (the process-group list)."""
    return json.loads(text)


# ---------------------------------------------------------------- communication


@dataclass
class Comm:
    """Communication columns of one rank (None where an op is not a communication)."""

    kind: list[CommKind | None]
    size: list[int | None]
    pg: list[str | None]
    peer: list[int | None]
    tag: list[int | None]
    rank: int | None = None  # the rank the file's collectives name, if any
    group_ranks: dict[str, list[int]] = field(default_factory=dict)  # from the records' rank fields
    issued_by: dict[int, int] = field(default_factory=dict)  # a backend's execution record → its call
    unrun: list[int] = field(default_factory=list)  # calls without the worker record the others have


def _rpc_args(nodes: EtNodes, row: int, groups: Groups) -> tuple[Mapping[str, Any], int | None]:
    """Kineto-style arguments of a ``record_param_comms`` node and the rank slot's value."""
    attrs = nodes.attrs[row]
    args: dict[str, Any] = {_ET_COMM_KEYS[k]: v for k, v in attrs.items() if k in _ET_COMM_KEYS}
    values, types = nodes.inputs[row]
    at = next((i for i, t in enumerate(types) if t == "String"), None)
    rank_slot = None
    if at is not None:
        args.setdefault("Collective name", values[at])
        rank_slot = values[at - 1] if at >= 1 and isinstance(values[at - 1], int) else None
        pg = values[at - 2] if at >= 2 else None
        if "Process Group Name" not in args:
            if isinstance(pg, list) and pg and isinstance(pg[0], str):  # (pg_name, pg_desc)
                args["Process Group Name"] = pg[0]
            elif isinstance(pg, int) and pg in groups.by_backend_id:  # ≤ 1.0.2: the backend's id
                args["Process Group Name"] = groups.by_backend_id[pg]
        if at + 1 < len(values):
            args.setdefault("In split size", values[at + 1])
        if at + 2 < len(values):
            args.setdefault("Out split size", values[at + 2])
    tin = tensors(values[:1], types[:1])
    if tin:  # ≤ 1.0.2 records carry no counts; newer ones may name a dtype we cannot size
        nelems, args["_elem_bytes"] = tensor_bytes(tin)
        if "In msg nelems" not in args:
            tout = tensors(*[x[:1] for x in nodes.outputs[row]])
            args["In msg nelems"] = nelems
            args["Out msg nelems"] = tensor_bytes(tout)[0] if tout else nelems
    return args, rank_slot


def _is_detail(name: str) -> bool:
    """Backend annotations and record_param_comms: the records that describe one call."""
    return name == _RPC or (
        comm_prefixed(name) and not name.startswith(("c10d::", "c10d_functional", "_c10d_functional"))
    )


def _execution_record(name: str) -> bool:
    """A backend's own record of running a call (``nccl:all_reduce``, ``gloo:all_reduce``)."""
    return name != _RPC and _is_detail(name)


# c10d calls whose tensor arguments are (output, input): the call's input is the second
_OUTPUT_FIRST = re.compile(r"(?:allgather|all_gather|reduce_scatter|alltoall|all_to_all)", re.IGNORECASE)


def _call_input_bytes(nodes: EtNodes, r: int) -> int | None:
    """Bytes of a c10d call's input buffer: its first tensor argument, or its second where the
    call takes (output, input) (all-gather, reduce-scatter, all-to-all)."""
    values, types = nodes.inputs[r]
    per_arg = [t for t in (tensors([v], [ty]) for v, ty in zip(values, types, strict=False)) if t]
    if not per_arg:
        return None
    buffer = per_arg[1] if len(per_arg) > 1 and _OUTPUT_FIRST.search(nodes.names[r]) else per_arg[0]
    nelems, elem = tensor_bytes(buffer)
    if elem is None and types:
        elem = dtype_size(str(types[0]))
    return nelems * elem if elem is not None else None


def classify(nodes: EtNodes, groups: Groups) -> Comm:
    """Pick one node per communication call and fill its Chakra communication fields.

    A call is the outermost ``c10d::`` (or functional) op; it is what the program asked
    for, so its collective and buffer are the call's. Its records are the
    ``record_param_comms`` nested in it (which describes the call) and the backend's
    execution record: nested in it (NCCL), or, where the backend runs the work
    asynchronously on a worker thread (gloo), the next execution record not nested in any
    call, calls taken in the order they were issued. gloo may run a call as another
    collective (a reduce-scatter as an all-reduce); the call's kind stands. The op that
    becomes the collective is an execution record that ran apart from its call, else the
    ``record_param_comms``, else a nested execution record, else the call; records without
    a call stand for themselves.
    """
    n = len(nodes.names)
    comm = Comm([None] * n, [None] * n, [None] * n, [None] * n, [None] * n)
    candidates = [r for r, name in enumerate(nodes.names) if name == _RPC or comm_prefixed(name)]
    is_cand = np.zeros(n, dtype=bool)
    is_cand[candidates] = True
    info: dict[int, tuple[CommKind | None, Mapping[str, Any], int | None]] = {}
    for r in candidates:
        if nodes.names[r] == _RPC:
            args, slot = _rpc_args(nodes, r, groups)
            name = args.get("Collective name")
            info[r] = (comm_kind(str(name)) if name else None, args, slot)
        else:
            info[r] = (comm_kind(nodes.names[r]), {}, None)

    def ancestors(r: int) -> list[int]:
        out, p = [], int(nodes.parent_row[r])
        while p >= 0 and is_cand[p]:
            out.append(p)
            p = int(nodes.parent_row[p])
        return out

    def is_call(r: int) -> bool:
        return not _is_detail(nodes.names[r]) and info[r][0] is not None

    rpc: dict[int, int] = {}  # call → its record_param_comms
    record: dict[int, int] = {}  # call → its execution record that ran apart from it
    nested: dict[int, int] = {}  # call → its execution record nested in it
    outer: list[int] = []  # every outermost call
    waiting: list[int] = []  # calls issued whose execution record has not been seen, in order
    alone: list[int] = []  # records of no call
    for r in candidates:
        if info[r][0] is None and nodes.names[r] != _RPC:
            continue
        up = ancestors(r)
        calls_up = [a for a in up if is_call(a)]
        if is_call(r):
            if not calls_up:  # an outermost call
                outer.append(r)
                waiting.append(r)
            continue
        if info[r][0] is None:  # a record_param_comms without a collective name
            continue
        nested_in_record = any(_is_detail(nodes.names[a]) and info[a][0] for a in up)
        if calls_up:
            call = calls_up[-1]
        elif not nested_in_record and _execution_record(nodes.names[r]) and waiting:
            call = waiting[0]
        else:
            call = -1
        if call >= 0 and _execution_record(nodes.names[r]):
            if call in waiting:
                waiting.remove(call)
            if not calls_up:  # it ran apart from the call (gloo's worker): it is the collective
                record.setdefault(call, r)
            elif not nested_in_record:
                nested.setdefault(call, r)
        elif call >= 0:
            rpc.setdefault(call, r)
        elif not nested_in_record:
            alone.append(r)
    single_pg = next(iter(groups.ranks)) if len(groups.ranks) == 1 else None
    comm.issued_by.update({r: call for found in (nested, record) for call, r in found.items()})
    if record:  # the backend records runs apart from their calls: a call without one is a gap
        comm.unrun = [c for c in waiting if c not in nested]
    for call in outer:
        at = record.get(call, rpc.get(call, nested.get(call, call)))
        described = info[rpc[call]] if call in rpc else info[call]
        _fill(nodes, at, described, comm, single_pg)
        if call not in rpc:
            comm.size[at] = _call_input_bytes(nodes, call)
        kind = described[0]
        if kind is not None and kind.node_type in (SEND_NODE, RECV_NODE):
            comm.peer[at], comm.tag[at] = _peer_and_tag(nodes, call, described[2])
    for r in alone:
        _fill(nodes, r, info[r], comm, single_pg)
    return comm


def _fill(
    nodes: EtNodes,
    r: int,
    info: tuple[CommKind | None, Mapping[str, Any], int | None],
    comm: Comm,
    single_pg: str | None,
) -> None:
    kind, args, slot = info
    assert kind is not None  # chosen nodes have a kind
    parsed = comm_args(args) if args else None
    if parsed is not None and parsed.in_nelems is not None:
        elem = parsed.elem_bytes or args.get("_elem_bytes")
        size = parsed.in_nelems * elem if elem else None
        pg = parsed.pg_name
        if pg and parsed.ranks:
            comm.group_ranks.setdefault(pg, list(parsed.ranks))
    else:  # an annotation or c10d op: its first tensor argument is the buffer
        values, types = nodes.inputs[r]
        per_arg = (tensors([v], [ty]) for v, ty in zip(values, types, strict=False))
        buffer = next((t for t in per_arg if t), [])
        nelems, elem = tensor_bytes(buffer) if buffer else (0, None)
        if elem is None and types:
            elem = dtype_size(str(types[0]))
        size = nelems * elem if elem is not None else None
        pg = None
    comm.kind[r] = kind
    comm.size[r] = size
    comm.pg[r] = pg if pg else single_pg
    if kind.node_type in (SEND_NODE, RECV_NODE):
        comm.peer[r], comm.tag[r] = _peer_and_tag(nodes, r, slot)
    elif slot is not None and comm.rank is None and comm.pg[r] in (None, "0"):
        comm.rank = slot


def _peer_and_tag(nodes: EtNodes, r: int, slot: int | None) -> tuple[int | None, int]:
    """Peer rank and tag of a send/recv: the c10d call's ``(..., peer, tag)`` ints, else the rank slot."""
    p = r
    while p >= 0:
        name = nodes.names[p]
        if name.startswith("c10d::") and comm_kind(name) is not None:
            values, types = nodes.inputs[p]
            ints = [v for v, t in zip(values, types, strict=False) if t == "Int"]
            if len(ints) >= 2:
                return int(ints[0]), int(ints[1])
        p = int(nodes.parent_row[p])
    return slot, 0
