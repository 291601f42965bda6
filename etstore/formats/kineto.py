"""Kineto / PyTorch-profiler traces (Chrome trace JSON, ``*.pt.trace.json[.gz]``) → :class:`Trace`.

This is what most users have (``torch.profiler`` with ``on_trace_ready``), and what HTA
reads: no execution trace is needed. Each complete event (``"ph": "X"``) becomes one op,
ids in file order:

* CPU events (``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``python_function``...)
  → ``COMP_NODE`` with ``is_cpu_op`` true; device events (``kernel``, ``gpu_memcpy``,
  ``gpu_memset``, ``gpu_user_annotation``) → ``COMP_NODE`` with ``is_cpu_op`` false;
* each communication call → one ``COMM_COLL_NODE`` (or ``COMM_SEND_NODE`` /
  ``COMM_RECV_NODE``): the NCCL/RCCL kernel it launched when there is one, else the
  call's ``record_param_comms`` event (gloo and other CPU backends), else its backend
  annotation (``gloo:all_reduce``). A call is a nest of CPU events on one thread whose
  names say communication (``c10d::allreduce_`` ⊃ ``record_param_comms`` ⊃
  ``nccl:all_reduce``); ``comm_type``, ``comm_size`` (elements × dtype bytes),
  ``pg_name``, group ranks, peer and tag come from the nest's and kernel's arguments.

Dependencies: ``ctrl`` order within each thread and each GPU stream (an event waits for
its previous sibling at its nesting depth; a nested event starts with its parent), and
``data`` edges from each launching runtime call (``cudaLaunchKernel``...) to its kernel,
joined by ``correlation`` (or the ``ac2g`` flow when the kernel lacks one).

Nothing is dropped: every op keeps its source event as compact JSON in the lossless
attribute ``kineto_event``; the document's other keys and non-op events (metadata,
instants, flows, the profiler span) stay in the rank's GlobalMetadata (``kineto_document``).
Times are µs, rounded to whole µs in the columns (exact in ``kineto_event``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.errors import TraceFormatError
from etstore.formats._frames import KINETO_COST, load_json, write_varint
from etstore.formats._guard import values_in_range
from etstore.formats._kineto_events import (
    KERNEL_CATS,
    RPC,
    Call,
    Events,
    calls,
    enclosing_call,
    events,
    is_kineto,
    launches,
    nesting,
)
from etstore.formats._torch_check import collective_mismatches, partial_ranks
from etstore.formats._torch_comm import (
    COLL_NODE,
    CommArgs,
    CommKind,
    comm_args,
    comm_prefixed,
    is_comm_kernel,
    process_groups,
)
from etstore.formats._torch_link import dumps
from etstore.formats.files import stated_rank
from etstore.gcpause import gc_paused
from etstore.model import ATTR_COLUMNS, DEPS_SCHEMA, META_SCHEMA, OPS_SCHEMA, Trace, member_number
from etstore.proto import AttributeProto, GlobalMetadata

__all__ = [
    "FORMAT",
    "KINETO_ATTR",
    "KinetoRank",
    "is_kineto",
    "kineto_rank",
    "merge_summaries",
    "read_kineto",
]

FORMAT = "kineto"
KINETO_ATTR = "kineto_event"
DOCUMENT_ATTR = "kineto_document"

_RAW_TAG = write_varint((member_number("string_val") << 3) | 2)


# ---------------------------------------------------------------- one rank


@dataclass
class KinetoRank:
    """One rank's tables and what was recognised in it."""

    ops: pa.Table
    deps: pa.Table
    metadata: bytes
    rank: int | None  # distributedInfo.rank, when the file says
    world_size: int | None
    summary: dict[str, Any]


def kineto_rank(doc: Any, path: Path, rank: int) -> KinetoRank:
    """Convert one parsed Kineto document into one rank's ``ops``/``deps``/metadata.

    Parameters
    ----------
    doc
        The parsed JSON document.
    path
        The file it came from (for messages).
    rank
        The rank to store the ops under.

    Returns
    -------
    KinetoRank

    Raises
    ------
    TraceFormatError
        The document is not a Kineto trace, or an event is not an object / has no ``ts``.

    Notes
    -----
    O(n log n) in events: one sort per lane for the nesting, dictionary joins elsewhere.
    """
    ev = events(doc, path)
    parent, prev = nesting(ev)
    launch = launches(ev, ev.other)
    comm = _comm_ops(ev, parent, launch)
    file_rank, world = stated_rank(doc)
    groups = process_groups(doc.get("distributedInfo"))
    info = doc.get("distributedInfo")
    stated = isinstance(info, Mapping) and bool(info.get("pg_config"))
    cols = _columns(ev, comm, file_rank if file_rank is not None else rank, groups, stated)
    cols["rank"] = np.full(len(ev.names), rank, dtype=np.int32)
    ops = pa.Table.from_pydict({f.name: cols[f.name] for f in OPS_SCHEMA}, schema=OPS_SCHEMA)
    deps = _deps(rank, prev, launch)
    meta = _metadata(doc, ev.other, file_rank, world)
    return KinetoRank(ops, deps, meta, file_rank, world, _summary(ev, comm, launch))


_Comm = dict[int, tuple[CommKind, Call | None, CommArgs | None]]


def _comm_ops(ev: Events, parent: np.ndarray, launch: np.ndarray) -> _Comm:
    """The events that become communication ops: ``{event: (kind, call, kernel's own args)}``.

    An NCCL/RCCL kernel (or any kernel naming its collective) is the op of the call that
    launched it; a call that launched none (gloo, or a kernel outside the window) is its
    ``record_param_comms`` event, else its innermost backend annotation.
    """
    by_root, root_of = calls(ev, parent)
    comm: _Comm = {}
    served: set[int] = set()
    for k in (i for i, c in enumerate(ev.cats) if c in KERNEL_CATS):
        has_own = ev.args[k].get("Collective name") is not None
        if not has_own and not is_comm_kernel(ev.names[k]):
            continue
        own = comm_args(ev.args[k], ev.names[k])
        root = enclosing_call(int(launch[k]), parent, root_of)
        call = by_root.get(root)
        kind = (own.kind if has_own else None) or (call.kind if call else None) or own.kind
        if kind is None:
            continue
        comm[k] = (kind, call, own if has_own else None)
        if call is not None:
            served.add(root)
    for root, call in by_root.items():
        if root in served or call.kind is None:
            continue
        rep = next((i for i in call.members if ev.names[i] == RPC), None)
        if rep is None:
            rep = max((i for i in call.members if comm_prefixed(ev.names[i])), key=lambda i: ev.ts[i])
        comm[rep] = (call.kind, call, None)
    return comm


def _summary(ev: Events, comm: _Comm, launch: np.ndarray) -> dict[str, Any]:
    """The rank's ingest report: ops, collectives and point-to-point ops by type, linked kernels."""
    # device activities a runtime call launches (annotations on a stream launch nothing)
    activity = ev.gpu & np.fromiter((c != "gpu_user_annotation" for c in ev.cats), bool, len(ev.cats))
    device = int(np.count_nonzero(activity))
    linked = int(np.count_nonzero(launch[activity] >= 0))
    kinds = [k for k, _, _ in comm.values()]
    return {
        "format": FORMAT,
        "ops": len(ev.names),
        "collectives": dict(
            sorted(Counter(k.comm_type or "" for k in kinds if k.node_type == COLL_NODE).items())
        ),
        "p2p": dict(sorted(Counter(k.node_type for k in kinds if k.node_type != COLL_NODE).items())),
        "kernels": device,
        "linked_fraction": round(linked / device, 4) if device else None,
    }


def _columns(
    ev: Events, comm: _Comm, self_rank: int, groups: Mapping[str, Any], stated_groups: bool
) -> dict[str, Any]:
    """The op columns (all but ``rank``), with comm attributes on the communication ops."""
    n = len(ev.names)
    node_type = np.array(["COMP_NODE"] * n, dtype=object)
    # a trace whose pg_config lists one group ran every collective in it
    only_group = next(iter(groups)) if len(groups) == 1 and stated_groups else None
    cols: dict[str, Any] = {c: [None] * n for c in ATTR_COLUMNS}
    cols["is_cpu_op"] = (~ev.gpu).tolist()
    extra: dict[int, bytes] = {}
    for i, (kind, call, own) in comm.items():
        node_type[i] = kind.node_type
        info = own or (call.info if call else None)
        size = (
            own.size_bytes
            if own is not None and own.size_bytes is not None
            else (call.size if call else None)
        )
        cols["comm_type"][i] = kind.comm_type
        cols["comm_size"][i] = size
        pg = info.pg_name if info is not None else only_group
        cols["pg_name"][i] = pg
        if kind.node_type != COLL_NODE:
            peer = call.peer if call else None
            send = kind.node_type == "COMM_SEND_NODE"
            cols["comm_src"][i] = _int32(self_rank if send else peer)
            cols["comm_dst"][i] = _int32(peer if send else self_rank)
            cols["comm_tag"][i] = _int32(call.tag if call else None)
        ranks = info.ranks if info is not None else None
        if ranks is None and pg is not None and pg in groups:
            ranks = list(groups[pg].ranks) or None
        if ranks:
            extra[i] = AttributeProto(name="pg_ranks", int64_list={"values": ranks}).SerializeToString()
    attrs, orders = _lossless(ev, cols, extra)
    cols.update(
        id=np.arange(n, dtype=np.uint64),
        name=ev.names,
        type=node_type.tolist(),
        duration_micros=np.rint(ev.dur).astype(np.uint64),
        start_time_micros=np.rint(np.maximum(ev.ts, 0.0)).astype(np.uint64),
        attrs=attrs,
        attr_order=orders,
    )
    return cols


def _int32(value: int | None) -> int | None:
    """A rank or tag the int32 columns hold, else None (the event's JSON keeps it)."""
    return value if value is not None and -(2**31) <= value < 2**31 else None


def _lossless(
    ev: Events, cols: Mapping[str, list[Any]], extra: Mapping[int, bytes]
) -> tuple[list[bytes], list[str]]:
    """Each op's ``attrs`` (the ``kineto_event`` record, then ``pg_ranks``) and ``attr_order``.

    Records are framed by hand (field 10, then the attribute's name and string value),
    which is what protobuf writes, without a message object per op.
    """
    head = b"\x0a" + write_varint(len(KINETO_ATTR)) + KINETO_ATTR.encode() + _RAW_TAG
    token = {c: f"{c}:{member_number(ATTR_COLUMNS[c][1])}" for c in ATTR_COLUMNS}
    plain = token["is_cpu_op"] + ",*"  # every op that is no communication op
    special = set(extra) | {
        i for c in ATTR_COLUMNS if c != "is_cpu_op" for i, v in enumerate(cols[c]) if v is not None
    }
    attrs: list[bytes] = []
    orders: list[str] = []
    for i, body in enumerate(map(dumps, ev.raw)):
        inner = head + write_varint(len(body)) + body
        blob = b"\x52" + write_varint(len(inner)) + inner
        if i not in special:
            attrs.append(blob)
            orders.append(plain)
            continue
        tokens = [token[c] for c in ATTR_COLUMNS if cols[c][i] is not None] + ["*"]
        if i in extra:
            blob += b"\x52" + write_varint(len(extra[i])) + extra[i]
            tokens.append("*")
        attrs.append(blob)
        orders.append(",".join(tokens))
    return attrs, orders


def _deps(rank: int, prev: np.ndarray, launch: np.ndarray) -> pa.Table:
    """``data`` edges launch → device event and ``ctrl`` edges prev → event, in node order.

    Rows come as a ``.et`` file lists them (by destination, its data deps before its
    ctrl deps), so a trace re-read from its export compares equal.
    """
    dst_d = np.flatnonzero(launch >= 0)
    dst_c = np.flatnonzero(prev >= 0)
    src = np.concatenate([launch[dst_d], prev[dst_c]]).astype(np.uint64)
    dst = np.concatenate([dst_d, dst_c]).astype(np.uint64)
    is_ctrl = np.concatenate([np.zeros(len(dst_d), bool), np.ones(len(dst_c), bool)])
    order = np.lexsort((is_ctrl, dst))
    return pa.Table.from_pydict(
        {
            "rank": np.full(len(dst), rank, dtype=np.int32),
            "src": src[order],
            "dst": dst[order],
            "kind": np.where(is_ctrl[order], "ctrl", "data").tolist(),
            "pos": np.zeros(len(dst), dtype=np.int32),  # at most one edge of each kind per event
        },
        schema=DEPS_SCHEMA,
    )


def _metadata(doc: Mapping[str, Any], other: list[Any], rank: int | None, world: int | None) -> bytes:
    """A GlobalMetadata holding the document minus its op events (verbatim JSON)."""
    rest = {k: v for k, v in doc.items() if k != "traceEvents"}
    rest["traceEvents"] = other
    meta = GlobalMetadata(version="0.0.4")
    meta.attr.add(name="source_format", string_val=FORMAT)
    if rank is not None:
        meta.attr.add(name="rank", int64_val=rank)
    if world is not None:
        meta.attr.add(name="world_size", int64_val=world)
    meta.attr.add(name=DOCUMENT_ATTR, string_val=dumps(rest).decode())
    return meta.SerializeToString()


# ---------------------------------------------------------------- many ranks


def read_kineto(
    spec: str | Path | Sequence[tuple[int, Path]],
    *,
    name: str | None = None,
    docs: Mapping[Path, Any] | None = None,
) -> Trace:
    """Read Kineto trace file(s) alone into a :class:`Trace`.

    Parameters
    ----------
    spec
        One file (plain or gzip), or ``[(rank, path)]`` pairs (as :func:`etstore.formats.read_trace`
        resolves a directory). A single file's rank is its ``distributedInfo.rank``, else 0.
    name
        Trace name; defaults to the first file's name without its extensions.
    docs
        Already parsed documents by path (recognition parses them once).

    Returns
    -------
    Trace
        Ops and deps per rank as the module docstring says; ``params["recognised"]`` the
        ingest report (format, ops, collectives by type, linked fraction) and
        ``params["process_groups"]`` the groups of ``distributedInfo``.

    Raises
    ------
    TraceFormatError
        Invalid or truncated JSON, not a Kineto document, or a file whose
        ``distributedInfo`` names another world size than the others.

    Notes
    -----
    O(events log events) per file; the JSON decode (orjson) dominates.
    """
    with gc_paused():  # a decoded trace is many small acyclic dicts and lists
        return _read_kineto(spec, name=name, docs=docs)


def _read_kineto(
    spec: str | Path | Sequence[tuple[int, Path]], *, name: str | None, docs: Mapping[Path, Any] | None
) -> Trace:
    if isinstance(spec, (str, Path)):
        path = Path(spec)
        doc = (docs or {}).get(path)
        doc = load_json(path, limit=KINETO_COST.byte_limit()) if doc is None else doc
        file_rank, _ = stated_rank(doc) if isinstance(doc, Mapping) else (None, None)
        files: list[tuple[int, Path]] = [(file_rank or 0, path)]
        docs = {path: doc}
    else:
        files = list(spec)
    ops_parts, deps_parts, metas = [], [], []
    summaries: dict[int, dict[str, Any]] = {}
    pgs: dict[str, dict[str, Any]] = {}
    worlds: dict[int, Path] = {}
    for rank, path in files:
        doc = (docs or {}).get(path)
        doc = load_json(path, limit=KINETO_COST.byte_limit()) if doc is None else doc
        with values_in_range(path):
            one = kineto_rank(doc, path, rank)
        if one.world_size is not None:
            worlds.setdefault(one.world_size, path)
            if len(worlds) > 1:
                (w0, p0), (w1, p1) = list(worlds.items())[:2]
                raise TraceFormatError(
                    f"{p1}: distributedInfo.world_size is {w1} but {p0} says {w0} (files of different runs)"
                )
        ops_parts.append(one.ops)
        deps_parts.append(one.deps)
        metas.append((rank, one.metadata))
        summaries[rank] = one.summary
        for pg in process_groups(doc.get("distributedInfo")).values():
            pgs.setdefault(pg.name, {"desc": pg.desc, "ranks": list(pg.ranks), "backend": pg.backend})
    ops = pa.concat_tables(ops_parts).combine_chunks()
    deps = pa.concat_tables(deps_parts).combine_chunks()
    meta = pa.Table.from_pydict(
        {"rank": [r for r, _ in metas], "metadata": [m for _, m in metas]}, schema=META_SCHEMA
    )
    first = files[0][1].name
    stem = first.split(".")[0] if first else "trace"
    recognised = merge_summaries(summaries)
    partial = partial_ranks([r for r, _ in files], next(iter(worlds), None))
    warnings = ([partial] if partial else []) + collective_mismatches(ops)
    if warnings:
        recognised["warnings"] = warnings
    params: dict[str, Any] = {
        "recognised": recognised,
        "process_groups": pgs,
        # what the simulator and expand read: {pg_name: [ranks]}
        "comm_groups": {pg: info["ranks"] for pg, info in pgs.items() if info["ranks"]},
    }
    if worlds:
        params["world_size"] = next(iter(worlds))
    return Trace(
        ops=ops,
        deps=deps,
        meta=meta,
        name=name or stem,
        source=str(spec) if isinstance(spec, (str, Path)) else ",".join(str(p) for _, p in files),
        params=params,
    )


def merge_summaries(per_rank: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One ingest report from per-rank ones: totals, collectives by type, linked fraction."""
    collectives: Counter[str] = Counter()
    p2p: Counter[str] = Counter()
    ops = kernels = 0
    linked = 0.0
    fmt = FORMAT
    for s in per_rank.values():
        fmt = str(s.get("format", fmt))
        ops += int(s.get("ops", 0))
        collectives.update(s.get("collectives", {}))
        p2p.update(s.get("p2p", {}))
        k = int(s.get("kernels") or 0)
        kernels += k
        linked += (s.get("linked_fraction") or 0.0) * k
    return {
        "format": fmt,
        "ranks": len(per_rank),
        "ops": ops,
        "collectives": dict(sorted(collectives.items())),
        "p2p": dict(sorted(p2p.items())),
        "kernels": kernels,
        "linked_fraction": round(linked / kernels, 4) if kernels else None,
        "per_rank": {int(r): dict(s) for r, s in sorted(per_rank.items())},
    }
