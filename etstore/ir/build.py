"""MSCCL-IR steps → ``algorithm`` :class:`~etstore.model.Trace`: how a step becomes Chakra nodes.

:func:`build_trace` validates a :class:`~etstore.ir.steps.StepTable`, then lays out
one node per step kind (``rrcs`` is RECV → reduce → SEND, chained), numbers them per
rank, fills the op columns and derives the dependencies: program order inside a
threadblock, and ``depid``/``deps`` between threadblocks (a ``nop`` step forwards
what it waits for to the next real step). See :mod:`etstore.ir` for the step table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.ir._validate import check_cycles, fail, resolve_targets, validate
from etstore.ir.steps import (
    BUFFERS,
    KIND_NAMES,
    KIND_NODE_TYPE,
    KIND_TABLE,
    NCOUNT,
    RECV,
    SEND,
    STEP_TYPES,
    Locate,
    StepTable,
)
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, Trace, encode_attrs

__all__ = ["build_trace"]


def _no_location(kind: str, index: int) -> str:
    return ""


def build_trace(
    st: StepTable,
    header: Mapping[str, Any],
    *,
    name: str,
    source: str = "",
    producer: str = "msccl-xml",
    extra_params: Mapping[str, Any] | None = None,
    locate: Locate | None = None,
) -> Trace:
    """Expand MSCCL-IR steps into an ``algorithm`` :class:`Trace` (see the table in :mod:`etstore.ir`).

    Parameters
    ----------
    st
        The steps, threadblocks and GPUs.
    header
        ``<algo>`` attributes, typed: ``name``, ``proto``, ``nchannels``,
        ``nchunksperloop``, ``ngpus``, ``coll``, ``inplace``, ``outofplace``,
        ``minBytes``, ``maxBytes`` and any extra ones (``redop``, ...).
    name, source, producer
        Trace name, where it came from, and ``params["producer"]``.
    extra_params
        Merged into ``params``.
    locate
        ``locate(kind, index) -> "file:line"`` for error messages (kind is ``gpu``,
        ``tb`` or ``step``).

    Returns
    -------
    Trace
        Kind ``algorithm``; ``params`` carry the header (``collective``, ``ngpus``,
        ``nchunksperloop``, ...), ``producer`` and ``gpu_chunks``.

    Raises
    ------
    TraceFormatError
        A peer, buffer range, step index or ``depid``/``deps`` is invalid, or the
        dependencies form a cycle; the message names gpu, threadblock and step.

    Notes
    -----
    O(S log S) for S steps (sorts for lookups); nop chains cost O(length) each.
    """
    origin = source or name
    loc = locate or _no_location
    tbrow = validate(st, header, origin, loc)
    target = resolve_targets(st, origin, loc)
    check_cycles(st, target, origin, loc)
    layout = _layout(st, origin)
    ops = _op_columns(st, tbrow, layout, int(header["nchunksperloop"]))
    deps = _step_deps(st, target, layout)
    params = _params(st, header, producer)
    if extra_params:
        params.update(extra_params)
    return Trace(ops=ops, deps=deps, name=name, kind="algorithm", source=source, params=params)


@dataclass(frozen=True)
class _Layout:
    """Where each step's nodes land: global node indices, per-rank ids and node kinds."""

    first_node: np.ndarray  # per step: its first node (global index)
    last_node: np.ndarray  # per step: its last node
    real: np.ndarray  # per step: makes at least one node
    node_step: np.ndarray  # per node: its step
    k: np.ndarray  # per node: position in its step's chain
    kind: np.ndarray  # per node: SEND/RECV/REDUCE/COPY
    nrank: np.ndarray  # per node: rank
    local_id: np.ndarray  # per node: id on its rank

    @property
    def total(self) -> int:
        return len(self.node_step)


def _layout(st: StepTable, origin: str) -> _Layout:
    """Lay the nodes of every step out in step order and number them per rank."""
    S = st.num_steps
    typ = st.type
    nn = NCOUNT[typ] if S else np.zeros(0, np.int64)
    first_node = np.zeros(S, dtype=np.int64)
    if S:
        np.cumsum(nn[:-1], out=first_node[1:])
    total = int(nn.sum()) if S else 0
    node_step = np.repeat(np.arange(S, dtype=np.int64), nn)
    k = np.arange(total, dtype=np.int64) - first_node[node_step]
    kind = KIND_TABLE[typ[node_step], k].astype(np.int64)
    nrank = st.rank[node_step]
    # ranks must be ascending: steps are grouped by gpu in document order, sort gpus
    if total and (np.diff(nrank) < 0).any():  # pragma: no cover - readers sort by gpu first
        raise fail(origin, "", "internal: steps are not grouped by ascending gpu")
    rank_first = np.zeros(total, dtype=np.int64)
    if total:
        cuts = np.flatnonzero(np.diff(nrank)) + 1
        starts = np.concatenate([[0], cuts])
        lengths = np.diff(np.concatenate([starts, [total]]))
        rank_first = np.repeat(starts, lengths)
    local_id = np.arange(total, dtype=np.int64) - rank_first
    return _Layout(first_node, first_node + nn - 1, nn > 0, node_step, k, kind, nrank, local_id)


def _op_columns(st: StepTable, tbrow: np.ndarray, lay: _Layout, nchunks: int) -> pa.Table:
    """The ops table (:data:`~etstore.model.OPS_SCHEMA`): peers from the threadblock, chunks from the step."""
    S, total, node_step, kind = st.num_steps, lay.total, lay.node_step, lay.kind
    tb_of = tbrow[node_step] if S else np.zeros(0, np.int64)
    is_send = kind == SEND
    is_recv = kind == RECV
    is_comm = is_send | is_recv
    chan = st.tb_chan[tb_of]
    comm_dst = pa.array(np.where(is_send, st.tb_send[tb_of], 0).astype(np.int32), mask=~is_send)
    comm_src = pa.array(np.where(is_recv, st.tb_recv[tb_of], 0).astype(np.int32), mask=~is_recv)
    comm_tag = pa.array(chan.astype(np.int32), mask=~is_comm)
    srcoff = st.srcoff[node_step]
    dstoff = st.dstoff[node_step]
    chunk_offset = np.where(is_send, srcoff, dstoff)
    msg_idx = np.where(srcoff >= 0, srcoff, dstoff)

    kind_arr = pa.array(kind.astype(np.int32))
    type_names = pc.take(pa.array(list(KIND_NODE_TYPE), pa.string()), kind_arr)
    prefixes = pc.take(pa.array([f"{k}_tb" for k in KIND_NAMES], pa.string()), kind_arr)
    names = pc.binary_join_element_wise(
        prefixes, _int_strings(st.tb[node_step]), "_s", _int_strings(st.s[node_step]), ""
    )
    if S:
        local = (st.tb_send[tbrow] < 0) & (st.tb_recv[tbrow] < 0)
        blobs, step_blob = _attr_blobs(st, np.where(local, st.tb_chan[tbrow], -1))
        attrs = pc.take(blobs, pa.array(step_blob[node_step]))
    else:
        attrs = pa.array([], pa.binary())
    cols = {
        "rank": pa.array(lay.nrank.astype(np.int32)),
        "id": pa.array(lay.local_id.astype(np.uint64)),
        "name": names,
        "type": type_names,
        "duration_micros": pa.array(np.zeros(total, np.uint64)),
        "start_time_micros": pa.array(np.zeros(total, np.uint64)),
        "is_cpu_op": pa.nulls(total, pa.bool_()),
        "comm_type": pa.nulls(total, pa.string()),
        "comm_size": pa.nulls(total, pa.int64()),
        "comm_src": comm_src,
        "comm_dst": comm_dst,
        "comm_tag": comm_tag,
        "pg_name": pa.nulls(total, pa.string()),
        "msg_chunk_cnt": pa.array(st.cnt[node_step]),
        "msg_chunk_idx": pa.array(msg_idx),
        "total_chunk_cnt": pa.array(np.full(total, nchunks, np.int64)),
        "chunk_offset": pa.array(chunk_offset),
        "tb_id": pa.array(st.tb[node_step]),
        "local_time_step": pa.array(st.s[node_step]),
        "attrs": attrs,
        "attr_order": pa.nulls(total, pa.string()),
    }
    return pa.Table.from_arrays([cols[f.name] for f in OPS_SCHEMA], schema=OPS_SCHEMA)


def _step_deps(st: StepTable, target: np.ndarray, lay: _Layout) -> pa.Table:
    """The deps table: program order inside threadblocks, then ``depid``/``deps`` across them."""
    total, real, first_node, last_node = lay.total, lay.real, lay.first_node, lay.last_node
    # program order: every node waits for the one before it in its threadblock
    prev_real, next_real = _neighbour_real(st, real)
    prog = np.full(total, -1, dtype=np.int64)
    inner = np.flatnonzero(lay.k > 0)
    prog[inner] = inner - 1
    chained = np.flatnonzero(real & (prev_real >= 0))
    prog[first_node[chained]] = last_node[prev_real[chained]]
    dst = np.flatnonzero(prog >= 0)
    src = prog[dst]
    has = np.flatnonzero(target >= 0)
    if len(has):
        ex_src, ex_dst = _cross_deps(st, target, lay, prev_real, next_real)
        src = np.concatenate([src, ex_src])
        dst = np.concatenate([dst, ex_dst])
        keep = src != dst  # a nop resolving to the step itself adds nothing
        edge = np.unique((dst[keep] << 32) | src[keep])  # sorted by destination, then source
        dst, src = edge >> 32, edge & 0xFFFFFFFF
    pos = _positions(dst)
    return pa.Table.from_arrays(
        [
            pa.array(lay.nrank[dst].astype(np.int32)),
            pa.array(lay.local_id[src].astype(np.uint64)),
            pa.array(lay.local_id[dst].astype(np.uint64)),
            pa.repeat(pa.scalar("data", pa.string()), len(src)),
            pa.array(pos.astype(np.int32)),
        ],
        schema=DEPS_SCHEMA,
    )


def _cross_deps(
    st: StepTable, target: np.ndarray, lay: _Layout, prev_real: np.ndarray, next_real: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Edges (global node indices) from ``depid``/``deps``; nops hand theirs to the next real step."""
    real, first_node, last_node = lay.real, lay.first_node, lay.last_node
    has = np.flatnonzero(target >= 0)
    direct = has[real[has] & real[target[has]]]
    ex_src = [last_node[target[direct]]]
    ex_dst = [first_node[direct]]
    if not real.all():
        memo: dict[int, list[int]] = {}
        ns_: list[int] = []
        nd_: list[int] = []
        # real steps whose target is a nop
        for row in has[real[has] & ~real[target[has]]].tolist():
            for n in _nop_completion(int(target[row]), st, target, real, last_node, prev_real, memo):
                ns_.append(n)
                nd_.append(int(first_node[row]))
        # nops with a target: the next real step of the threadblock inherits it
        for row in has[~real[has]].tolist():
            j = int(next_real[row])
            if j < 0:
                continue
            t = int(target[row])
            srcs = (
                [int(last_node[t])]
                if real[t]
                else _nop_completion(t, st, target, real, last_node, prev_real, memo)
            )
            for n in srcs:
                ns_.append(n)
                nd_.append(int(first_node[j]))
        ex_src.append(np.asarray(ns_, dtype=np.int64))
        ex_dst.append(np.asarray(nd_, dtype=np.int64))
    return np.concatenate(ex_src), np.concatenate(ex_dst)


def _attr_blobs(st: StepTable, local_chan: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Distinct ``attrs`` blobs for the steps and each step's index into them.

    ``local_chan`` is the channel of steps in threadblocks without peers (-1 for the
    others, whose channel is the ``comm_tag`` of their send/receive nodes).
    """
    off_s = np.clip(st.srcoff + 1, 0, (1 << 20) - 1)
    off_d = np.clip(st.dstoff + 1, 0, (1 << 20) - 1)
    chan = np.clip(local_chan + 1, 0, (1 << 8) - 1)
    key = (
        (st.type << 54)
        | (np.clip(st.srcbuf, 0, 3) << 52)
        | (np.clip(st.dstbuf, 0, 3) << 50)
        | (chan << 40)
        | (off_s << 20)
        | off_d
    )
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    blobs = []
    for i in first.tolist():
        attrs: list[tuple[str, str, Any]] = [
            ("msccl_type", "string_val", STEP_TYPES[st.type[i]]),
            ("srcbuf", "string_val", BUFFERS[st.srcbuf[i]] if 0 <= st.srcbuf[i] < 3 else "i"),
            ("srcoff", "int64_val", int(st.srcoff[i])),
            ("dstbuf", "string_val", BUFFERS[st.dstbuf[i]] if 0 <= st.dstbuf[i] < 3 else "o"),
            ("dstoff", "int64_val", int(st.dstoff[i])),
        ]
        if local_chan[i] >= 0:
            attrs.append(("chan", "int64_val", int(local_chan[i])))
        blobs.append(encode_attrs(attrs))
    return pa.array(blobs, pa.binary()), inverse.reshape(-1)


def _nop_completion(
    row: int,
    st: StepTable,
    target: np.ndarray,
    real: np.ndarray,
    last_node: np.ndarray,
    prev_real: np.ndarray,
    memo: dict[int, list[int]],
) -> list[int]:
    """Nodes that must finish before a (non-node) nop step counts as done."""
    if row in memo:
        return memo[row]
    memo[row] = []  # cycles were rejected before; guards re-entry
    out: list[int] = []
    p = int(prev_real[row])
    if p >= 0:
        out.append(int(last_node[p]))
    j = row
    while j >= 0 and (p < 0 or j > p) and st.rank[j] == st.rank[row] and st.tb[j] == st.tb[row]:
        t = int(target[j])
        if t >= 0:
            out.extend(
                [int(last_node[t])]
                if real[t]
                else _nop_completion(t, st, target, real, last_node, prev_real, memo)
            )
        j -= 1
    memo[row] = out
    return out


def _int_strings(values: np.ndarray) -> pa.Array:
    """Decimal strings of small non-negative integers (a lookup, cheaper than a cast)."""
    if len(values) == 0:
        return pa.array([], pa.string())
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi > 1 << 16:
        return pc.cast(pa.array(values), pa.string())
    table = pa.array([str(i) for i in range(hi + 1)], pa.string())
    return pc.take(table, pa.array(values))


def _neighbour_real(st: StepTable, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row of the previous and of the next real (node-making) step in the same threadblock (-1: none)."""
    S = st.num_steps
    if S == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.arange(S, dtype=np.int64)
    new = np.concatenate([[True], (st.rank[1:] != st.rank[:-1]) | (st.tb[1:] != st.tb[:-1])])
    block_start = np.maximum.accumulate(np.where(new, rows, 0))
    end = np.concatenate([new[1:], [True]])
    block_end = np.minimum.accumulate(np.where(end, rows, S)[::-1])[::-1]  # last row of the block
    upto = np.maximum.accumulate(np.where(real, rows, -1))
    prev = np.concatenate([[-1], upto[:-1]])
    prev = np.where(prev >= block_start, prev, -1)
    fromhere = np.minimum.accumulate(np.where(real, rows, S)[::-1])[::-1]
    nxt = np.concatenate([fromhere[1:], [S]])
    nxt = np.where(nxt <= block_end, nxt, -1)
    return prev, nxt


def _positions(dst: np.ndarray) -> np.ndarray:
    """Index of each edge among those with the same destination (edges sorted by dst)."""
    n = len(dst)
    if n == 0:
        return np.zeros(0, np.int64)
    new = np.concatenate([[True], dst[1:] != dst[:-1]])
    start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    return np.arange(n) - start


def _params(st: StepTable, header: Mapping[str, Any], producer: str) -> dict[str, Any]:
    ngpus = int(header["ngpus"])
    chunks = {b: [0] * ngpus for b in BUFFERS}
    for r, i, o, s in zip(
        st.gpu_rank.tolist(), st.i_chunks.tolist(), st.o_chunks.tolist(), st.s_chunks.tolist(), strict=True
    ):
        chunks["i"][r], chunks["o"][r], chunks["s"][r] = i, o, s
    params: dict[str, Any] = {
        "collective": header["coll"],
        "ngpus": ngpus,
        "nchunksperloop": int(header["nchunksperloop"]),
        "inplace": bool(header.get("inplace", False)),
        "outofplace": bool(header.get("outofplace", not header.get("inplace", False))),
        "producer": producer,
        "algo_name": str(header.get("name", "")),
        "proto": str(header.get("proto", "Simple")),
        "nchannels": int(header.get("nchannels", int(st.tb_chan.max()) + 1 if len(st.tb_chan) else 1)),
        "minBytes": int(header.get("minBytes", 0)),
        "maxBytes": int(header.get("maxBytes", 0)),
        "gpu_chunks": chunks,
    }
    extra = {k: v for k, v in header.items() if k not in _HEADER_KEYS}
    if extra:
        params["xml_attrs"] = {k: str(v) for k, v in extra.items()}
    return params


_HEADER_KEYS = frozenset(
    {
        "name",
        "proto",
        "nchannels",
        "nchunksperloop",
        "ngpus",
        "coll",
        "inplace",
        "outofplace",
        "minBytes",
        "maxBytes",
    }
)


# ---------------------------------------------------------------- trace → node semantics
