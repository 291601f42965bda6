"""Algorithm trace → node semantics: what every node does to which buffer slots.

The inverse of :mod:`etstore.ir.build`, for any algorithm trace (read, generated or
synthesized): the MSCCL-IR writer and the checker call :func:`node_semantics` to
recover each node's step, step type, buffers and chunk offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.ir.steps import (
    BUF_CODE,
    COPY,
    KIND_NAMES,
    RECV,
    REDUCE,
    SEND,
    SEQ_TO_TYPE,
    STEP_NODES,
    STEP_TYPES,
    TYPE_CODE,
)
from etstore.model import Trace, decode_attrs

__all__ = ["NodeSemantics", "default_buffers", "node_semantics"]


@dataclass(frozen=True)
class NodeSemantics:
    """What every node of an algorithm trace does, as columns aligned with ``trace.ops``.

    ``kind``: SEND/RECV/REDUCE/COPY, or -1 for a node without data effect.
    ``group``: nodes sharing a value form one MSCCL-IR step (fused nodes).
    ``stype``: the step's type code (:data:`STEP_TYPES`). ``srcbuf``/``dstbuf``:
    buffer codes; ``srcoff``/``dstoff``/``cnt``: chunks. ``explicit``: whether the
    buffers came from ``attrs`` (else the defaults of :func:`node_semantics`).
    ``chan``: the channel recorded for nodes of peerless threadblocks (-1 if none).
    ``issues``: human-readable problems found while interpreting.
    """

    kind: np.ndarray
    group: np.ndarray
    stype: np.ndarray
    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    cnt: np.ndarray
    explicit: np.ndarray
    chan: np.ndarray
    issues: list[str]


def default_buffers(collective: str) -> tuple[int, int]:
    """(source, destination) buffer codes assumed when a node carries no ``srcbuf``/``dstbuf``."""
    if collective == "allgather":
        return BUF_CODE["o"], BUF_CODE["o"]
    if collective == "alltoall":
        return BUF_CODE["i"], BUF_CODE["o"]
    return BUF_CODE["i"], BUF_CODE["i"]


def _int_col(table: pa.Table, name: str, fill: int) -> np.ndarray:
    return pc.fill_null(table[name], fill).to_numpy().astype(np.int64)


def node_semantics(trace: Trace) -> NodeSemantics:
    """Recover the data semantics of every node (see :class:`NodeSemantics`).

    Nodes sharing ``(rank, tb_id, local_time_step)`` form one step; the sequence of
    their kinds gives the step type (``RECV, reduce, SEND`` is ``rrcs``) unless the
    ``msccl_type`` attribute names it. Buffers and offsets come from the
    ``srcbuf``/``srcoff``/``dstbuf``/``dstoff`` attributes; without them the node
    reads and writes ``chunk_offset`` in the collective's default buffer
    (:func:`default_buffers`).

    Notes
    -----
    O(V log V); attribute blobs are decoded once per distinct value.
    """
    ops = trace.ops
    n = ops.num_rows
    names = ops["name"].to_numpy(zero_copy_only=False)
    kind = _node_kinds(ops)
    cnt = _int_col(ops, "msg_chunk_cnt", 1)
    chunk_offset = _int_col(ops, "chunk_offset", -1)
    coll = str(trace.params.get("collective", trace.params.get("coll", "allreduce")))
    dsrc, ddst = default_buffers(coll)
    bufs = _Buffers(
        srcbuf=np.where(kind == RECV, ddst, dsrc).astype(np.int64),
        srcoff=chunk_offset.copy(),
        dstbuf=np.full(n, ddst, dtype=np.int64),
        dstoff=chunk_offset.copy(),
        explicit=np.zeros(n, dtype=bool),
        declared=np.full(n, -1, dtype=np.int64),
        chan=np.full(n, -1, dtype=np.int64),
    )
    _read_attrs(ops["attrs"], bufs)
    rank = ops["rank"].to_numpy().astype(np.int64)
    tbv = _int_col(ops, "tb_id", 0)
    ltv = _int_col(ops, "local_time_step", 0)
    group = _step_groups(ops, kind, rank, tbv, ltv)
    issues: list[str] = []
    stype = _step_types(kind, group, bufs.declared, rank, tbv, ltv, issues)
    # a declared msccl_type must agree with the nodes (nop-like declarations are kept)
    declared = bufs.declared
    mismatch = (declared >= 0) & (stype >= 0) & (declared != stype)
    for r in np.flatnonzero(mismatch)[:5].tolist():
        issues.append(
            f"rank {int(rank[r])} {names[r]}: attribute msccl_type={STEP_TYPES[declared[r]]!r} but the "
            "step's "
            f"nodes form {STEP_TYPES[stype[r]]!r}"
        )
    return NodeSemantics(
        kind,
        group,
        stype,
        bufs.srcbuf,
        bufs.srcoff,
        bufs.dstbuf,
        bufs.dstoff,
        cnt,
        bufs.explicit,
        bufs.chan,
        issues,
    )


def _node_kinds(ops: pa.Table) -> np.ndarray:
    """SEND/RECV by node type; COMP nodes named ``reduce*`` or ``copy*`` are REDUCE/COPY; else -1."""
    n = ops.num_rows
    types = ops["type"].to_numpy(zero_copy_only=False)
    names = ops["name"].to_numpy(zero_copy_only=False)
    kind = np.full(n, -1, dtype=np.int64)
    kind[types == "COMM_SEND_NODE"] = SEND
    kind[types == "COMM_RECV_NODE"] = RECV
    comp = types == "COMP_NODE"
    if comp.any():
        lower = np.char.lower(names[comp].astype(str))
        kcomp = np.full(len(lower), -1, dtype=np.int64)
        kcomp[np.char.startswith(lower, "reduce")] = REDUCE
        kcomp[np.char.startswith(lower, "copy")] = COPY
        kind[comp] = kcomp
    return kind


@dataclass(frozen=True)
class _Buffers:
    """Per node: buffers and offsets (defaults, overwritten from ``attrs``), declared type, channel."""

    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    explicit: np.ndarray
    declared: np.ndarray
    chan: np.ndarray


def _read_attrs(attrs: pa.ChunkedArray, bufs: _Buffers) -> None:
    """Fill ``bufs`` in place from the ``attrs`` blobs, decoding each distinct blob once."""
    n = len(attrs)
    if attrs.null_count >= n:
        return
    enc = pc.dictionary_encode(attrs).combine_chunks()
    idx = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    dic = enc.dictionary.to_pylist()
    info = np.full((len(dic), 7), -2, dtype=np.int64)  # msccl_type, srcbuf, srcoff, dstbuf, dstoff, ok, chan
    for j, blob in enumerate(dic):
        try:
            a = decode_attrs(blob)
        except Exception:  # a foreign blob we cannot parse: keep defaults
            continue
        if "srcbuf" in a and "dstbuf" in a and "srcoff" in a and "dstoff" in a:
            sb, db = BUF_CODE.get(str(a["srcbuf"]), -1), BUF_CODE.get(str(a["dstbuf"]), -1)
            if sb >= 0 and db >= 0:
                info[j, 1:5] = (sb, int(a["srcoff"]), db, int(a["dstoff"]))
                info[j, 5] = 1
        t = a.get("msccl_type")
        if isinstance(t, str) and t in TYPE_CODE:
            info[j, 0] = TYPE_CODE[t]
        c = a.get("chan")
        info[j, 6] = int(c) if isinstance(c, int) and c >= 0 else -1
    rows = np.flatnonzero(idx >= 0)
    got = info[idx[rows]]
    ok = got[:, 5] == 1
    r_ok = rows[ok]
    bufs.srcbuf[r_ok], bufs.srcoff[r_ok] = got[ok, 1], got[ok, 2]
    bufs.dstbuf[r_ok], bufs.dstoff[r_ok] = got[ok, 3], got[ok, 4]
    bufs.explicit[r_ok] = True
    bufs.declared[rows] = got[:, 0]
    bufs.chan[rows] = got[:, 6]


def _step_groups(
    ops: pa.Table, kind: np.ndarray, rank: np.ndarray, tbv: np.ndarray, ltv: np.ndarray
) -> np.ndarray:
    """Group number of each node: equal for nodes of one (rank, tb_id, local_time_step) step."""
    n = ops.num_rows
    grouped = (
        pc.is_valid(ops["tb_id"]).to_numpy(zero_copy_only=False)
        & pc.is_valid(ops["local_time_step"]).to_numpy(zero_copy_only=False)
        & (kind >= 0)
    )
    key = np.where(grouped, (rank << 42) | ((tbv & 0x1FFFFF) << 21) | (ltv & 0x1FFFFF), -1 - np.arange(n))
    _, group = np.unique(key, return_inverse=True)
    return group.reshape(-1).astype(np.int64)


def _step_types(
    kind: np.ndarray,
    group: np.ndarray,
    declared: np.ndarray,
    rank: np.ndarray,
    tbv: np.ndarray,
    ltv: np.ndarray,
    issues: list[str],
) -> np.ndarray:
    """Step type code of each node from the kinds of its group (in ops order); -1 when none fits."""
    n = len(kind)
    stype = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return stype
    order = np.lexsort((np.arange(n), group))
    g_sorted = group[order]
    starts = np.flatnonzero(np.concatenate([[True], g_sorted[1:] != g_sorted[:-1]]))
    ends = np.concatenate([starts[1:], [n]])
    single = (ends - starts) == 1
    # fast path for one-node groups
    srows = order[starts[single]]
    simple = {SEND: TYPE_CODE["s"], RECV: TYPE_CODE["r"], REDUCE: TYPE_CODE["re"], COPY: TYPE_CODE["cpy"]}
    for kd, code in simple.items():
        stype[srows[kind[srows] == kd]] = code
    for s0, e0 in zip(starts[~single].tolist(), ends[~single].tolist(), strict=True):
        rows = order[s0:e0]
        seq = tuple(int(kind[r]) for r in rows)
        t = SEQ_TO_TYPE.get(seq)
        d = int(declared[rows[0]])
        if t is not None and d >= 0 and STEP_NODES[STEP_TYPES[d]] == seq:
            t = STEP_TYPES[d]  # rrs and rrcs have the same nodes; the attribute tells them apart
        if t is None:
            r0 = int(rows[0])
            issues.append(
                f"rank {int(rank[r0])} tb {int(tbv[r0])} step {int(ltv[r0])}: nodes "
                f"{', '.join(KIND_NAMES[k] if k >= 0 else 'other' for k in seq)} do not form an MSCCL-IR step"
            )
            continue
        stype[rows] = TYPE_CODE[t]
    return stype
