"""PyTorch execution traces (``torch.profiler.ExecutionTraceObserver`` JSON) → :class:`Trace`.

Every ET node becomes one op with the node's id, so nothing the source had is dropped:
the node's whole JSON record stays in the op's lossless attributes (``pytorch_et_node``),
and a linked Kineto event's record beside it (``kineto_event``). Schemas 1.0.1 (flat
``parent``/``inputs``/``input_types`` keys) through 1.1.1-chakra.0.0.4 (``ctrl_deps``,
``inputs: {values, shapes, types}``, ``attrs`` list) read alike.

What each node becomes (see ``docs/pytorch.md``):

* the ``[pytorch|profiler|execution_trace|process/thread]`` roots and
  ``## process_group:init ##`` → ``METADATA_NODE``;
* one node per communication call → ``COMM_COLL_NODE`` (or ``COMM_SEND_NODE`` /
  ``COMM_RECV_NODE``): the call's ``record_param_comms`` record, else its backend
  annotation (``nccl:all_reduce``, ``gloo:broadcast``, ...), else the ``c10d::`` op
  itself. NCCL and gloo (and RCCL, MPI, UCC) alike; the ET alone is enough;
* every other node → ``COMP_NODE`` with ``is_cpu_op`` true.

Dependencies (``src`` finishes before ``dst`` issues), all from a lower node id (entry
order) to a higher one, so the result is acyclic:

* ``data``: a node that reads bytes of a storage depends on the last node before it that
  wrote them (:mod:`._torch_flow`; a collective also writes the buffers it reads);
* ``ctrl``: each thread's nodes in the order they ran, the waits between threads and on
  the device (:mod:`._torch_lanes`; without Kineto, each ET thread in entry order), and
  each process group's communication nodes in order.

Durations are not in the ET: without Kineto every op lasts 0 µs and the trace says so
(``params["durations"] = "absent"``). With Kineto (:mod:`etstore.formats._torch_link`)
CPU ops take their self time and start, and device kernels join as ops.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.errors import TraceFormatError
from etstore.formats._frames import (
    KINETO_COST,
    PYTORCH_ET_COST,
    ReadCost,
    load_json,
    require_together_budget,
    write_varint,
)
from etstore.formats._guard import values_in_range
from etstore.formats._torch_check import collective_mismatches, partial_ranks
from etstore.formats._torch_comm import COLL_NODE, RECV_NODE, SEND_NODE, comm_args, is_comm_kernel
from etstore.formats._torch_et_nodes import (
    PG_INIT,
    ROOT,
    Comm,
    EtNodes,
    Groups,
    classify,
    declared_groups,
    parse_nodes,
    tensors,
)
from etstore.formats._torch_etplus import et_plus_link, split_device_nodes
from etstore.formats._torch_files import Spec, assign_ranks, doc_kind, name_rank, trace_paths
from etstore.formats._torch_flow import Flow, returns_alias, storage_flow
from etstore.formats._torch_lanes import issuers, run_threads, thread_lanes
from etstore.formats._torch_link import LinkResult, dumps, link_rank, recorded_window
from etstore.formats._torch_rank import RankColumns, add_unrecorded_runs, data_releases
from etstore.formats.et import split_missing
from etstore.formats.files import KINETO, sniff_format
from etstore.gcpause import gc_paused
from etstore.model import ATTR_COLUMNS, DEP_KINDS, META_SCHEMA, OPS_SCHEMA, Trace, deps_table, member_number
from etstore.proto import GlobalMetadata

__all__ = ["read_pytorch_et"]

FORMAT = "pytorch-et"
NODE_ATTR = "pytorch_et_node"
KINETO_ATTR = "kineto_event"

# calls that block their thread until a collective's work is done (c10d and functional waits,
# awaitables' "## ... wait() ##" annotations)
_WAIT_CALL = re.compile(r"(?:^c10d::wait|wait_tensor|\bwait\(\))")
_STRING_VAL_TAG = write_varint((member_number("string_val") << 3) | 2)


# ---------------------------------------------------------------- one rank's tables


def _node_types(nodes: EtNodes, comm: Comm) -> list[str]:
    types = []
    for name, kind in zip(nodes.names, comm.kind, strict=True):
        if kind is not None:
            types.append(kind.node_type)
        elif ROOT.match(name) or name == PG_INIT:
            types.append("METADATA_NODE")
        else:
            types.append("COMP_NODE")
    return types


def _data_edges(nodes: EtNodes, comm: Comm) -> Flow:
    """Rows ``(producer, consumer)``: a consumer reads bytes of a storage the producer wrote last;
    and the rows each writer overwrites the bytes of."""
    return storage_flow(
        nodes.names,
        nodes.parent_row,
        [tensors(*io) for io in nodes.inputs],
        [tensors(*io) for io in nodes.outputs],
        [k is not None and k.node_type != SEND_NODE for k in comm.kind],  # a collective fills its buffers
        [returns_alias(a.get("op_schema")) for a in nodes.attrs],
    )


def _chain(rows: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges between consecutive ``rows`` (ascending) that share a key."""
    order = np.lexsort((rows, keys))
    r, k = rows[order], keys[order]
    same = k[1:] == k[:-1]
    return r[:-1][same], r[1:][same]


_Parsed = tuple[EtNodes, Groups, Comm, tuple[list[dict[str, Any]], list[dict[str, Any]]] | None]
"""A rank's parsed ET: nodes, declared groups, communication columns, and for an ET+ its host
and device nodes as JSON."""


def _rank_columns(nodes: EtNodes, comm: Comm, link: LinkResult | None, *, lanes: bool = True) -> RankColumns:
    """One rank's op columns and edges; ``lanes``: the execution model of a Kineto-linked ET (an
    ET+ lacks the runtime calls and threads it reads: its ops chain by ET thread, as without Kineto)."""
    n = len(nodes.names)
    types = _node_types(nodes, comm)
    raw_kineto = link.raw if link is not None else [None] * n
    extras = [
        [(NODE_ATTR, raw)] + ([(KINETO_ATTR, k)] if k is not None else [])
        for raw, k in zip(nodes.raw, raw_kineto, strict=True)
    ]
    rank = RankColumns(
        ids=nodes.ids,
        names=list(nodes.names),
        types=types,
        is_cpu=[None if t == "METADATA_NODE" else True for t in types],
        dur=link.self_us.copy() if link is not None else np.zeros(n, dtype=np.int64),
        start=link.start_us.copy() if link is not None else np.zeros(n, dtype=np.int64),
        comm=comm,
        extras=extras,
    )
    flow = _data_edges(nodes, comm)
    rank.edge(flow.src, flow.dst, "data")
    if link is not None and lanes:  # what a rewrite of the recording must keep in order
        rank.edge(flow.over_src, flow.over_dst, "overwrite")
    executes = np.flatnonzero(np.asarray([t != "METADATA_NODE" for t in types]))
    if link is not None and link.kernels.names:
        _add_kernels(rank, nodes, link)
    runs: list[int] = []
    if link is not None and lanes:
        runs = add_unrecorded_runs(rank, comm.unrun)
        _add_host_waits(rank, nodes, link, executes, runs)
    else:
        rank.edge(*_chain(executes, nodes.tids[executes]), "ctrl")
    comm_rows = np.asarray([r for r, k in enumerate(rank.comm.kind) if k is not None], dtype=np.int64)
    if len(comm_rows):
        pg_names = np.asarray([rank.comm.pg[r] or "" for r in comm_rows.tolist()], dtype=object)
        _, pg_key = np.unique(pg_names, return_inverse=True)
        order = "group" if link is not None and lanes else "ctrl"  # Chakra's issue order without Kineto
        rank.edge(*_chain(comm_rows, pg_key.astype(np.int64)), order)
    return rank


def _add_kernels(rank: RankColumns, nodes: EtNodes, link: LinkResult) -> None:
    """Device activities as ops: launch and stream-order edges; an NCCL/RCCL kernel becomes
    the communication node of the call that launched it."""
    k = link.kernels
    n = len(rank.names)
    rows = rank.append(k.names, False, k.dur_us, k.start_us, [[(KINETO_ATTR, raw)] for raw in k.raw])
    c = rank.comm
    for j, name in enumerate(k.names):
        if not is_comm_kernel(name) and "nccl" not in name.lower():
            continue
        row, depth = int(k.launcher[j]), 0
        while row >= 0 and c.kind[row] is None and depth < 8:
            row, depth = int(nodes.parent_row[row]), depth + 1
        if row >= 0 and c.kind[row] is not None:
            kind = c.kind[row]
            assert kind is not None
            c.kind[n + j], c.kind[row] = kind, None
            c.size[n + j], c.size[row] = c.size[row], None
            c.pg[n + j], c.pg[row] = c.pg[row], None
            c.peer[n + j], c.peer[row] = c.peer[row], None
            c.tag[n + j], c.tag[row] = c.tag[row], None
            rank.types[n + j], rank.types[row] = kind.node_type, "COMP_NODE"
        elif is_comm_kernel(name):
            parsed = comm_args(k.args[j], kernel_name=name)
            if parsed.kind is not None and parsed.kind.node_type == COLL_NODE:
                size = (
                    parsed.in_nelems * parsed.elem_bytes if parsed.in_nelems and parsed.elem_bytes else None
                )
                c.kind[n + j], c.size[n + j], c.pg[n + j] = parsed.kind, size, parsed.pg_name
                rank.types[n + j] = COLL_NODE
    launched = k.launcher >= 0
    rank.edge(k.launcher[launched], rows[launched], "launch")
    rank.edge(*_chain(rows, k.stream), "stream")
    rank.edge(rows[k.held[0]], rows[k.held[1]], "wait")  # waits across streams


def _add_host_waits(
    rank: RankColumns, nodes: EtNodes, link: LinkResult, executes: np.ndarray, runs: list[int]
) -> None:
    """Blocking runtime calls as ops after the device work that released them, and each host
    thread as a chain of ops lasting their thread time (:mod:`._torch_lanes`)."""
    w = link.waits
    n, m = len(rank.names), len(w.names)
    first_kernel = len(nodes.names)
    rows = rank.append(w.names, True, w.own_us, w.start_us, [[(KINETO_ATTR, dumps(raw))] for raw in w.raw])
    released = w.releaser >= 0
    rank.edge(first_kernel + w.releaser[released], rows[released], "wait")
    # where each call sits in its thread: just after the op of its thread that started last before it
    tids = run_threads(nodes.tids, link.thread)
    timed = executes[link.linked[executes]]
    timed = timed[np.lexsort((timed, rank.start[timed], tids[timed]))]  # by thread, then start, then entry
    at = np.searchsorted(
        np.rec.fromarrays([tids[timed], rank.start[timed]]),
        np.rec.fromarrays([tids[w.row], w.start_us]),
        "right",
    )
    p = np.where(at > 0, timed[np.maximum(at - 1, 0)], w.row)
    p = np.where(tids[p] == tids[w.row], p, w.row)
    k_end = link.kernels.start_us + link.kernels.dur_us
    incl = np.concatenate([link.incl_us, np.zeros(n - first_kernel, dtype=np.int64), w.dur_us])
    seq = np.concatenate([executes, rows])
    seq_end = rank.start[seq] + incl[seq]
    lanes = thread_lanes(
        rows=seq,
        thread=np.concatenate([tids[executes], tids[w.row]]),
        after=np.concatenate([2 * executes, 2 * p + 1]),
        start=rank.start[seq],
        end=seq_end,
        timed=np.concatenate([link.linked[executes], np.ones(m, dtype=bool)]),
        released_at=np.concatenate(
            [
                np.full(len(executes), -1, dtype=np.int64),
                np.where(released, k_end[np.maximum(w.releaser, 0)], -1),
            ]
        ),
        keep_own=np.asarray([rank.comm.kind[i] is not None for i in seq.tolist()], dtype=bool),
        is_wait=np.asarray([_WAIT_CALL.search(rank.names[i]) is not None for i in seq.tolist()], dtype=bool),
        is_sync=np.arange(len(seq)) >= len(executes),
        activity=link.activity,
        issuer=issuers(rank.comm.issued_by, seq, tids),
        data_release=data_releases(rank, seq, tids, seq_end, runs),
    )
    for kind in ("thread", "launch", "wait"):
        sel = lanes.kind == kind
        rank.edge(lanes.src[sel], lanes.dst[sel], kind)
    rank.dur[lanes.rows] = lanes.dur
    rank.start[lanes.rows] = lanes.start


def _extras_blob(extras: list[tuple[str, bytes]]) -> bytes:
    """Raw ``Node.attr`` records (field 10) of string attributes."""
    out = bytearray()
    for name, value in extras:
        key = name.encode()
        body = b"\x0a" + write_varint(len(key)) + key + _STRING_VAL_TAG + write_varint(len(value)) + value
        out += b"\x52" + write_varint(len(body)) + body
    return bytes(out)


_TOKENS = {c: f"{c}:{member_number(member)}" for c, (_, member) in ATTR_COLUMNS.items()}


def _ops_table(rank_no: int, r: RankColumns) -> pa.Table:
    c = r.comm
    n = len(r.names)
    comm_type = [k.comm_type if k is not None and k.node_type == COLL_NODE else None for k in c.kind]
    src = [
        p if k is not None and k.node_type == RECV_NODE else None for k, p in zip(c.kind, c.peer, strict=True)
    ]
    dst = [
        p if k is not None and k.node_type == SEND_NODE else None for k, p in zip(c.kind, c.peer, strict=True)
    ]
    cols: dict[str, Any] = {
        "rank": np.full(n, rank_no, dtype=np.int32),
        "id": r.ids.astype(np.uint64),
        "name": r.names,
        "type": r.types,
        "duration_micros": r.dur.astype(np.uint64),
        "start_time_micros": r.start.astype(np.uint64),
        "is_cpu_op": r.is_cpu,
        "comm_type": comm_type,
        "comm_size": c.size,
        "comm_src": src,
        "comm_dst": dst,
        "comm_tag": c.tag,
        "pg_name": [pg if k is not None else None for k, pg in zip(c.kind, c.pg, strict=True)],
    }
    present = {k: [v is not None for v in cols[k]] for k in _TOKENS if k in cols}
    cols["attrs"] = [_extras_blob(e) for e in r.extras]
    cols["attr_order"] = [
        ",".join([_TOKENS[k] for k in present if present[k][i]] + ["*"] * len(r.extras[i])) for i in range(n)
    ]
    arrays = []
    for f in OPS_SCHEMA:
        arrays.append(pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=OPS_SCHEMA)


def _deps(rank_no: int, r: RankColumns) -> pa.Table:
    src = np.concatenate(r.src) if r.src else np.zeros(0, dtype=np.int64)
    dst = np.concatenate(r.dst) if r.dst else np.zeros(0, dtype=np.int64)
    kind = np.concatenate(
        [np.full(len(s), DEP_KINDS.index(k), dtype=np.int8) for s, k in zip(r.src, r.kinds, strict=True)]
    )
    key = np.stack([dst, kind, src], axis=1)
    _, first = np.unique(key, axis=0, return_index=True)  # one edge per (dst, kind, src), in creation order
    keep = np.sort(first)
    kinds = [DEP_KINDS[k] for k in kind[keep].tolist()]
    return deps_table(rank_no, r.ids[src[keep]], r.ids[dst[keep]], kinds)


def _metadata(header: Mapping[str, Any]) -> bytes:
    """A GlobalMetadata message carrying the ET's header keys (schema, pid, time, ...)."""
    meta = GlobalMetadata()
    for key, value in header.items():
        a = meta.attr.add(name=str(key))
        if isinstance(value, bool):
            a.bool_val = value
        elif isinstance(value, int) and -(2**63) <= value < 2**63:
            a.int64_val = value
        elif isinstance(value, str):
            a.string_val = value
        else:
            a.string_val = json.dumps(value)
    return bytes(meta.SerializeToString())


def read_pytorch_et(
    spec: Spec, *, name: str | None = None, kineto: Spec | None = None, docs: Mapping[Path, Any] | None = None
) -> Trace:
    """Read PyTorch execution traces (one per rank), optionally linked with their Kineto traces.

    Parameters
    ----------
    spec
        An ET file (``.json`` or ``.json.gz``), a directory, a glob, a list of files or a
        ``{rank: file}`` mapping. A directory may also hold the Kineto traces of the same
        ranks; they are linked unless ``kineto`` is given.
    name
        The trace's name (default: the first file's name without rank and extension).
    kineto
        The Kineto trace(s) of the same ranks, in any form ``spec`` takes. Ranks are
        matched by ``distributedInfo.rank``, else by the number in the file name.
    docs
        Kineto documents already parsed, by path (recognition parses them once): not read again.

    Returns
    -------
    Trace
        One op per ET node (plus one per linked device activity). ``params`` holds
        ``durations`` (``"absent"`` without Kineto, ``"kineto"`` with it), ``recognised``
        (``{"format": "pytorch-et", "ops", "collectives": {comm_type: count},
        "linked_fraction"}``), ``comm_groups`` (``{pg_name: [ranks]}``), ``schemas`` and
        ``device_events`` (``{"kept", "in_kineto"}``: kernels, memcpys and memsets launched
        by linked ops, of all the Kineto files hold).

    Raises
    ------
    TraceFormatError
        A file that is not valid JSON (e.g. truncated), not an execution trace, an ET
        without nodes or with a repeated node id, two files for one rank, or a Kineto
        trace of a rank that no given ET holds. Or the files, held together as they are
        read, would not fit the memory budget (checked before any is read).

    Notes
    -----
    O(V + T) per rank for V nodes holding T tensor arguments, plus the Kineto link's
    O(E + V log V) for E events. Ranks come from the files' own ``record_param_comms``
    records where present (collectives of the default group name the rank).
    """
    # a decoded trace is millions of small dicts and lists, none in a cycle
    with gc_paused(), values_in_range(spec if isinstance(spec, (str, Path)) else "PyTorch execution trace"):
        return _read(spec, name=name, kineto=kineto, docs=docs or {})


def _read(spec: Spec, *, name: str | None, kineto: Spec | None, docs: Mapping[Path, Any]) -> Trace:
    ets: list[tuple[int | None, Path, int | None]] = []
    parsed: dict[Path, _Parsed] = {}
    found_kineto: list[tuple[int | None, Path, Any]] = []
    files = [(given, path, _read_cost(path, spec)) for given, path in trace_paths(spec)]
    kineto_files = trace_paths(kineto)
    # every rank's nodes and Kineto document are held until the trace is assembled: the sum must fit
    require_together_budget([(p, c) for _, p, c in files] + [(p, KINETO_COST) for _, p in kineto_files])
    for given, path, cost in files:
        doc = load_json(path, limit=cost.byte_limit())
        kind = doc_kind(doc)
        if kind == "kineto" and not isinstance(spec, (Mapping, list, tuple)):
            found_kineto.append((given, path, doc))
            continue
        if kind != "et":
            raise TraceFormatError(f"{path}: not a PyTorch execution trace (expected a 'nodes' list)")
        doc, device = split_device_nodes(doc)  # an ET+ (Chakra's trace linker) carries its Kineto times
        nodes = parse_nodes(doc, path)
        try:
            groups = declared_groups(nodes)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{path}: {exc}") from None
        comm = classify(nodes, groups)
        parsed[path] = (nodes, groups, comm, None if device is None else (doc["nodes"], device))
        ets.append((given, path, comm.rank))
    if not ets:
        raise TraceFormatError(f"{spec}: no PyTorch execution trace among the files")
    ranks = assign_ranks(ets, "execution trace")
    kdocs = found_kineto
    if kineto is not None:
        limit = KINETO_COST.byte_limit()
        kdocs = [(g, p, docs[p] if p in docs else load_json(p, limit=limit)) for g, p in kineto_files]
    links = _kineto_by_rank(kdocs, ranks)
    return _assemble(ranks, parsed, links, name=name, source=str(spec))


def _read_cost(path: Path, spec: Spec) -> ReadCost:
    """What reading ``path`` of ``spec`` costs: an execution trace's, or a Kineto trace's
    where a directory or glob holds one (the files listed or mapped must be execution traces)."""
    if isinstance(spec, (str, Path)) and not Path(spec).is_file():
        try:
            if sniff_format(path) == KINETO:
                return KINETO_COST
        except TraceFormatError:  # no trace: refused by name once read
            pass
    return PYTORCH_ET_COST


def _kineto_by_rank(
    kdocs: list[tuple[int | None, Path, Any]], ranks: Mapping[int, tuple[Path, int | None]]
) -> dict[int, tuple[Path, Any]]:
    """Pair each Kineto document with the ET rank it belongs to."""
    if not kdocs:
        return {}
    for _, path, doc in kdocs:
        if doc_kind(doc) != "kineto":
            raise TraceFormatError(f"{path}: not a Kineto trace (expected a 'traceEvents' list)")
    if len(kdocs) == 1 and len(ranks) == 1:
        (rank, (et_path, content)), (_, kpath, doc) = next(iter(ranks.items())), kdocs[0]
        info = doc.get("distributedInfo") or {}
        krank = info.get("rank") if isinstance(info, dict) else None
        et_states_rank = content is not None or name_rank(et_path) is not None
        if isinstance(krank, int) and krank != rank and et_states_rank:
            raise TraceFormatError(f"{kpath}: Kineto trace of rank {krank}, but {et_path} is rank {rank}")
        return {rank: (kpath, doc)}
    items = []
    for given, path, doc in kdocs:
        info = doc.get("distributedInfo") or {}
        krank = info.get("rank") if isinstance(info, dict) else None
        items.append((given, path, krank if isinstance(krank, int) else None))
    by_rank = assign_ranks(items, "Kineto trace")
    docs = {p: d for _, p, d in kdocs}
    extra = sorted(set(by_rank) - set(ranks))
    if extra:
        raise TraceFormatError(
            f"{by_rank[extra[0]][0]}: Kineto trace of rank {extra[0]}, but the execution traces hold ranks "
            f"{sorted(ranks)}"
        )
    return {r: (p, docs[p]) for r, (p, _) in by_rank.items()}


def _assemble(
    ranks: Mapping[int, tuple[Path, int | None]],
    parsed: Mapping[Path, _Parsed],
    links: Mapping[int, tuple[Path, Any]],
    *,
    name: str | None,
    source: str,
) -> Trace:
    ops_parts, deps_parts, metas = [], [], []
    comm_groups: dict[str, list[int]] = {}
    collectives: Counter[str] = Counter()
    linked = linkable = et_plus = 0
    device = [0, 0]  # device activities kept (launched by linked ops), and in the Kineto files
    schemas = set()
    steps: dict[str, list[list[Any]]] = {}  # rank → its ProfilerStep#N annotations [name, start µs, dur µs]
    windows: dict[str, list[int]] = {}  # rank → [first start, last end] µs of what it recorded
    worlds: set[int] = set()  # the Kineto files' distributedInfo.world_size
    unrun: list[str] = []
    for rank_no in sorted(ranks):
        path = ranks[rank_no][0]
        nodes, groups, comm, plus = parsed[path]
        link = None
        if rank_no in links:
            kpath, doc = links[rank_no]
            is_root = np.asarray([bool(ROOT.match(x)) for x in nodes.names])
            link = link_rank(doc, kpath, nodes.names, nodes.rf_ids, nodes.tids, nodes.parent_row, ~is_root)
        elif plus is not None:
            link = et_plus_link(nodes, *plus)
            et_plus += 1
        if link is not None:
            linked += int(link.linked.sum())
            linkable += link.num_linkable
            device[0] += len(link.kernels.names)
            device[1] += link.num_device_events
            steps[str(rank_no)] = [list(x) for x in link.steps]
            windows[str(rank_no)] = recorded_window(link)
            if link.world_size:
                worlds.add(link.world_size)
            for pg in link.groups.values():
                comm_groups.setdefault(pg.name, list(pg.ranks))
        for pg_name, pg_ranks in [*groups.ranks.items(), *comm.group_ranks.items()]:
            comm_groups.setdefault(pg_name, pg_ranks)
        r = _rank_columns(nodes, comm, link, lanes=plus is None)
        unrun += [
            f"rank {rank_no}: {nodes.names[c]} (ET node {int(nodes.ids[c])}) has no record of its run on "
            "the backend's worker, as the rank's other calls have (the execution trace ended first?): "
            "the call stands for the collective, with the call's time, not the exchange's"
            for c in comm.unrun
        ]
        ops_parts.append(_ops_table(rank_no, r))
        deps_parts.append(_deps(rank_no, r))
        metas.append(_metadata(nodes.header))
        schemas.add(str(nodes.header.get("schema", "")))
        for k in r.comm.kind:
            if k is not None:
                collectives[k.comm_type or k.node_type.removeprefix("COMM_").removesuffix("_NODE")] += 1
    timed = len(links) + et_plus
    if timed and timed < len(ranks):  # ranks without Kineto times count as unlinked
        linkable += sum(len(parsed[ranks[r][0]][0].names) for r in ranks if str(r) not in steps)
    ops = pa.concat_tables(ops_parts).combine_chunks()
    present, missing = split_missing(ops, pa.concat_tables(deps_parts).combine_chunks())
    meta = pa.Table.from_pydict({"rank": sorted(ranks), "metadata": metas}, schema=META_SCHEMA)
    groups_world = max((max(v) + 1 for v in comm_groups.values() if v), default=0)
    world = max([groups_world, *worlds, max(ranks) + 1])
    partial = partial_ranks(list(ranks), world)
    warnings = ([partial] if partial else []) + collective_mismatches(ops) + unrun
    params: dict[str, Any] = {
        "durations": ("et+" if et_plus else "kineto") if timed else "absent",
        "world_size": world,
        **(
            {"execution": "recorded", "profiler_steps": steps, "windows": windows}
            if links and not et_plus
            else {}
        ),
        "recognised": {
            "format": FORMAT,
            "ops": ops.num_rows,
            "collectives": dict(sorted(collectives.items())),
            "linked_fraction": (linked / linkable if linkable else 0.0) if timed else None,
            **({"et_plus_ranks": et_plus} if et_plus else {}),
            **({"warnings": warnings} if warnings else {}),
        },
        "comm_groups": {k: v for k, v in sorted(comm_groups.items()) if v},
        "device_events": {"kept": device[0], "in_kineto": device[1]},
        "schemas": sorted(schemas),
    }
    first = Path(source) if Path(source).is_dir() else ranks[min(ranks)][0]
    default = first.name.split(".json")[0] or FORMAT
    return Trace(
        ops=ops, deps=present, missing=missing, meta=meta, name=name or default, source=source, params=params
    )
