"""MSCCL-IR steps ⇄ algorithm :class:`~etstore.model.Trace`: how a step becomes Chakra nodes.

The reader (``etstore.ingest.msccl_xml``) and the generators fill a :class:`StepTable`
(one row per MSCCL-IR step, columnar) and call :func:`build_trace`; the writer and the
checker go the other way with :func:`node_semantics`, which recovers what every node
of any algorithm trace does to which buffer slots.

Step → nodes (runtime semantics of the MSCCL interpreter; ``src`` of a received step
is the *local* operand):

====== ============================= ===================================================
type   nodes (chained)               data effect
====== ============================= ===================================================
s      SEND                          send ``src[srcoff:+cnt]``
r      RECV                          ``dst[dstoff:+cnt] = msg``
rcs    RECV → SEND                   ``dst = msg``; forward ``msg``
rrs    RECV → reduce → SEND          forward ``msg ⊕ src`` (nothing stored)
rrc    RECV → reduce                 ``dst = msg ⊕ src``
rrcs   RECV → reduce → SEND          ``dst = msg ⊕ src``; forward it
cpy    copy                          ``dst = src``
re     reduce                        ``dst = dst ⊕ src``
nop    (none)                        dependency only (also ``d``, ``st``)
====== ============================= ===================================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import ALGORITHM_COLLECTIVES
from etstore.errors import TraceFormatError
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, Trace, decode_attrs, encode_attrs

__all__ = [
    "BUFFERS",
    "COLLECTIVES",
    "COPY",
    "RECV",
    "REDUCE",
    "SEND",
    "STEP_NODES",
    "STEP_TYPES",
    "NodeSemantics",
    "StepTable",
    "build_trace",
    "node_semantics",
]

log = logging.getLogger(__name__)

STEP_TYPES: tuple[str, ...] = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop", "d", "st")
TYPE_CODE: dict[str, int] = {t: i for i, t in enumerate(STEP_TYPES)}
SEND, RECV, REDUCE, COPY = 0, 1, 2, 3
KIND_NAMES: tuple[str, ...] = ("send", "recv", "reduce", "copy")
_KIND_NODE_TYPE: tuple[str, ...] = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMP_NODE")
STEP_NODES: dict[str, tuple[int, ...]] = {
    "s": (SEND,),
    "r": (RECV,),
    "rcs": (RECV, SEND),
    "rrs": (RECV, REDUCE, SEND),
    "rrc": (RECV, REDUCE),
    "rrcs": (RECV, REDUCE, SEND),
    "cpy": (COPY,),
    "re": (REDUCE,),
    "nop": (),
    "d": (),
    "st": (),
}
_SEQ_TO_TYPE: dict[tuple[int, ...], str] = {v: k for k, v in STEP_NODES.items() if v}
BUFFERS: tuple[str, ...] = ("i", "o", "s")
BUF_CODE: dict[str, int] = {b: i for i, b in enumerate(BUFFERS)}
COLLECTIVES = ALGORITHM_COLLECTIVES

_NCOUNT = np.array([len(STEP_NODES[t]) for t in STEP_TYPES], dtype=np.int64)
_KIND_TABLE = np.full((len(STEP_TYPES), 3), -1, dtype=np.int8)
for _t, _seq in STEP_NODES.items():
    _KIND_TABLE[TYPE_CODE[_t], : len(_seq)] = _seq
_SENDS = np.array([SEND in STEP_NODES[t] for t in STEP_TYPES])
_RECVS = np.array([RECV in STEP_NODES[t] for t in STEP_TYPES])
# which buffers a step type touches on its own GPU (the others name the peer's buffer)
_LOCAL_SRC = np.array([t in ("s", "rrs", "rrc", "rrcs", "cpy", "re") for t in STEP_TYPES])
_LOCAL_DST = np.array([t in ("r", "rcs", "rrc", "rrcs", "cpy", "re") for t in STEP_TYPES])

Locate = Callable[[str, int], str]


def _no_location(kind: str, index: int) -> str:
    return ""


@dataclass(frozen=True)
class StepTable:
    """MSCCL-IR steps in columns, ordered by rank, then threadblock, then program order.

    Step columns (one row per step): ``rank``, ``tb``, ``s`` (the step's index in its
    threadblock), ``type`` (index into :data:`STEP_TYPES`), ``srcbuf``/``dstbuf``
    (index into :data:`BUFFERS`), ``srcoff``/``dstoff``/``cnt`` (chunks),
    ``depid``/``deps`` (threadblock and step this one waits for, -1 for none).
    Threadblock columns: ``tb_rank``, ``tb_id``, ``tb_send``, ``tb_recv``, ``tb_chan``.
    GPU columns: ``gpu_rank``, ``i_chunks``, ``o_chunks``, ``s_chunks``.
    """

    rank: np.ndarray
    tb: np.ndarray
    s: np.ndarray
    type: np.ndarray
    srcbuf: np.ndarray
    srcoff: np.ndarray
    dstbuf: np.ndarray
    dstoff: np.ndarray
    cnt: np.ndarray
    depid: np.ndarray
    deps: np.ndarray
    tb_rank: np.ndarray
    tb_id: np.ndarray
    tb_send: np.ndarray
    tb_recv: np.ndarray
    tb_chan: np.ndarray
    gpu_rank: np.ndarray
    i_chunks: np.ndarray
    o_chunks: np.ndarray
    s_chunks: np.ndarray

    @property
    def num_steps(self) -> int:
        return len(self.rank)

    @classmethod
    def from_lists(cls, **cols: Sequence[int]) -> StepTable:
        """Build from plain sequences (generators, tests); dtypes are normalised."""
        return cls(**{k: np.asarray(cols[k], dtype=np.int64) for k in cls.__dataclass_fields__})


# ---------------------------------------------------------------- steps → trace


def _fail(origin: str, where: str, what: str) -> TraceFormatError:
    prefix = f"{where}: " if where else (f"{origin}: " if origin else "")
    return TraceFormatError(f"{prefix}{what}")


def _step_label(st: StepTable, i: int) -> str:
    return f"gpu {int(st.rank[i])} tb {int(st.tb[i])} step {int(st.s[i])}"


def _validate(st: StepTable, header: Mapping[str, Any], origin: str, locate: Locate) -> np.ndarray:
    """Check the step table; returns each step's threadblock row. Raises TraceFormatError."""
    ngpus = int(header["ngpus"])
    if ngpus < 1:
        raise _fail(origin, "", f"ngpus must be at least 1, got {ngpus}")
    # gpus
    bad = np.flatnonzero((st.gpu_rank < 0) | (st.gpu_rank >= ngpus))
    if len(bad):
        i = int(bad[0])
        raise _fail(
            origin,
            locate("gpu", i),
            f"gpu id {int(st.gpu_rank[i])} is outside 0..{ngpus - 1} (ngpus={ngpus})",
        )
    order = np.argsort(st.gpu_rank, kind="stable")
    dup = np.flatnonzero(np.diff(st.gpu_rank[order]) == 0)
    if len(dup):
        i = int(order[dup[0] + 1])
        raise _fail(origin, locate("gpu", i), f"gpu id {int(st.gpu_rank[i])} appears twice")
    for col in ("i_chunks", "o_chunks", "s_chunks"):
        neg = np.flatnonzero(getattr(st, col) < 0)
        if len(neg):
            i = int(neg[0])
            raise _fail(origin, locate("gpu", i), f"gpu {int(st.gpu_rank[i])}: {col} must not be negative")
    # threadblocks
    tkey = (st.tb_rank << 32) | (st.tb_id & 0xFFFFFFFF)
    torder = np.argsort(tkey, kind="stable")
    dup = np.flatnonzero(np.diff(tkey[torder]) == 0)
    if len(dup):
        i = int(torder[dup[0] + 1])
        raise _fail(
            origin,
            locate("tb", i),
            f"gpu {int(st.tb_rank[i])}: threadblock id {int(st.tb_id[i])} appears twice",
        )
    neg = np.flatnonzero(st.tb_id < 0)
    if len(neg):
        i = int(neg[0])
        raise _fail(origin, locate("tb", i), f"gpu {int(st.tb_rank[i])}: threadblock id must not be negative")
    for col, what in (("tb_send", "send"), ("tb_recv", "recv")):
        peer = getattr(st, col)
        bad = np.flatnonzero((peer < -1) | (peer >= ngpus) | (peer == st.tb_rank))
        if len(bad):
            i = int(bad[0])
            raise _fail(
                origin,
                locate("tb", i),
                f"gpu {int(st.tb_rank[i])} tb {int(st.tb_id[i])}: {what} peer {int(peer[i])} must be -1 or "
                f"another gpu in 0..{ngpus - 1}",
            )
    neg = np.flatnonzero(st.tb_chan < 0)
    if len(neg):
        i = int(neg[0])
        raise _fail(
            origin,
            locate("tb", i),
            f"gpu {int(st.tb_rank[i])} tb {int(st.tb_id[i])}: chan must not be negative",
        )
    if st.num_steps == 0:
        return np.zeros(0, dtype=np.int64)
    # steps: their threadblock
    skey = (st.rank << 32) | (st.tb & 0xFFFFFFFF)
    sorted_t = tkey[torder]
    pos = np.minimum(np.searchsorted(sorted_t, skey), len(sorted_t) - 1)
    tbrow = torder[pos]
    assert (tkey[tbrow] == skey).all(), "every step belongs to a declared threadblock"
    typ = st.type
    if ((typ < 0) | (typ >= len(STEP_TYPES))).any():  # pragma: no cover - readers map names first
        raise _fail(origin, "", "internal: step type code out of range")
    # peers present for sends / receives
    bad = np.flatnonzero(_SENDS[typ] & (st.tb_send[tbrow] < 0))
    if len(bad):
        i = int(bad[0])
        raise _fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: type {STEP_TYPES[typ[i]]!r} sends, but its threadblock has send=-1",
        )
    bad = np.flatnonzero(_RECVS[typ] & (st.tb_recv[tbrow] < 0))
    if len(bad):
        i = int(bad[0])
        raise _fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: type {STEP_TYPES[typ[i]]!r} receives, but its threadblock has recv=-1",
        )
    data = _NCOUNT[typ] > 0
    bad = np.flatnonzero(data & (st.cnt < 1))
    if len(bad):
        i = int(bad[0])
        raise _fail(
            origin, locate("step", i), f"{_step_label(st, i)}: cnt must be at least 1, got {int(st.cnt[i])}"
        )
    # buffer bounds on the local side
    grow = np.full(ngpus, -1, dtype=np.int64)
    grow[st.gpu_rank] = np.arange(len(st.gpu_rank))
    sizes = (
        np.stack([st.i_chunks, st.o_chunks, st.s_chunks], axis=1)
        if len(st.gpu_rank)
        else np.zeros((0, 3), np.int64)
    )
    g = grow[st.rank]
    for local, buf, off, side in (
        (_LOCAL_SRC, st.srcbuf, st.srcoff, "src"),
        (_LOCAL_DST, st.dstbuf, st.dstoff, "dst"),
    ):
        used = local[typ]
        bad = np.flatnonzero(used & ((buf < 0) | (buf > 2)))
        if len(bad):
            i = int(bad[0])
            raise _fail(origin, locate("step", i), f"{_step_label(st, i)}: {side}buf must be one of i, o, s")
        limit = np.where(used, sizes[g, np.clip(buf, 0, 2)], 0)
        bad = np.flatnonzero(used & ((off < 0) | (off + st.cnt > limit)))
        if len(bad):
            i = int(bad[0])
            raise _fail(
                origin,
                locate("step", i),
                f"{_step_label(st, i)}: {side}buf {BUFFERS[buf[i]]}[{int(off[i])}:"
                f"{int(off[i] + st.cnt[i])}] is outside the {int(limit[i])} chunks gpu {int(st.rank[i])} "
                f"declares for buffer {BUFFERS[buf[i]]!r}",
            )
    return tbrow


def _step_index(st: StepTable, origin: str, locate: Locate) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (rank, tb, s) keys and the step row of each; raises on duplicate step indices."""
    key = (st.rank << 42) | ((st.tb & 0x1FFFFF) << 21) | (st.s & 0x1FFFFF)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    dup = np.flatnonzero(np.diff(sk) == 0)
    if len(dup):
        i = int(order[dup[0] + 1])
        raise _fail(
            origin, locate("step", i), f"{_step_label(st, i)}: step index {int(st.s[i])} appears twice"
        )
    return sk, order


def _resolve_targets(st: StepTable, origin: str, locate: Locate) -> np.ndarray:
    """Row of each step's depid/deps target (-1 when it has none)."""
    if ((st.s < 0) | (st.s >= 1 << 21) | (st.tb >= 1 << 21)).any():
        i = int(np.flatnonzero((st.s < 0) | (st.s >= 1 << 21) | (st.tb >= 1 << 21))[0])
        raise _fail(origin, locate("step", i), f"{_step_label(st, i)}: step index out of range")
    sk, order = _step_index(st, origin, locate)
    target = np.full(st.num_steps, -1, dtype=np.int64)
    has = np.flatnonzero(st.depid >= 0)
    if len(has) == 0:
        return target
    tkey = (st.rank[has] << 42) | ((st.depid[has] & 0x1FFFFF) << 21) | (st.deps[has] & 0x1FFFFF)
    pos = np.minimum(np.searchsorted(sk, tkey), len(sk) - 1)
    found = (sk[pos] == tkey) & (st.deps[has] >= 0) & (st.depid[has] < 1 << 21) & (st.deps[has] < 1 << 21)
    if not found.all():
        i = int(has[np.flatnonzero(~found)[0]])
        raise _fail(
            origin,
            locate("step", i),
            f"{_step_label(st, i)}: depid={int(st.depid[i])} deps={int(st.deps[i])} points nowhere "
            f"(gpu {int(st.rank[i])} has no step {int(st.deps[i])} in threadblock {int(st.depid[i])})",
        )
    target[has] = order[pos]
    return target


def _check_cycles(st: StepTable, target: np.ndarray, origin: str, locate: Locate) -> None:
    """Raise if the cross-threadblock dependencies close a cycle (program order + depid)."""
    has = np.flatnonzero(target >= 0)
    if len(has) == 0:
        return
    verts = np.unique(np.concatenate([has, target[has]]))  # rows, document order = (rank, tb, program order)
    succ: dict[int, list[int]] = {int(v): [] for v in verts}
    rk, tbv = st.rank[verts], st.tb[verts]
    same = (rk[1:] == rk[:-1]) & (tbv[1:] == tbv[:-1])
    for a, b in zip(verts[:-1][same].tolist(), verts[1:][same].tolist(), strict=True):
        succ[a].append(b)
    for d, t in zip(has.tolist(), target[has].tolist(), strict=True):
        succ[t].append(d)
    indeg = dict.fromkeys(succ, 0)
    for outs in succ.values():
        for b in outs:
            indeg[b] += 1
    stack = [v for v, n in indeg.items() if n == 0]
    seen = 0
    while stack:
        v = stack.pop()
        seen += 1
        for b in succ[v]:
            indeg[b] -= 1
            if indeg[b] == 0:
                stack.append(b)
    if seen == len(succ):
        return
    # walk back along unresolved predecessors to print one cycle
    pred: dict[int, int] = {}
    for a, outs in succ.items():
        for b in outs:
            if indeg[b] > 0 and indeg[a] > 0:
                pred.setdefault(b, a)
    v = next(x for x, n in indeg.items() if n > 0 and x in pred)
    path: list[int] = []
    on: set[int] = set()
    while v not in on:
        on.add(v)
        path.append(v)
        v = pred[v]
    cycle = path[path.index(v) :][::-1]
    text = " → ".join(f"tb {int(st.tb[c])} step {int(st.s[c])}" for c in cycle[:12])
    more = " → ..." if len(cycle) > 12 else ""
    first = cycle[0]
    raise _fail(
        origin,
        locate("step", first),
        f"dependency cycle on gpu {int(st.rank[first])}: {text}{more} → tb {int(st.tb[first])} step "
        f"{int(st.s[first])} (depid/deps and program order wait on each other)",
    )


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
    """Expand MSCCL-IR steps into an ``algorithm`` :class:`Trace` (see the module table).

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
    tbrow = _validate(st, header, origin, loc)
    target = _resolve_targets(st, origin, loc)
    _check_cycles(st, target, origin, loc)

    S = st.num_steps
    typ = st.type
    nn = _NCOUNT[typ] if S else np.zeros(0, np.int64)
    first_node = np.zeros(S, dtype=np.int64)
    if S:
        np.cumsum(nn[:-1], out=first_node[1:])
    total = int(nn.sum()) if S else 0
    last_node = first_node + nn - 1
    real = nn > 0

    # ---- nodes
    node_step = np.repeat(np.arange(S, dtype=np.int64), nn)
    k = np.arange(total, dtype=np.int64) - first_node[node_step]
    kind = _KIND_TABLE[typ[node_step], k].astype(np.int64)
    nrank = st.rank[node_step]
    # ranks must be ascending: steps are grouped by gpu in document order, sort gpus
    if total and (np.diff(nrank) < 0).any():  # pragma: no cover - readers sort by gpu first
        raise _fail(origin, "", "internal: steps are not grouped by ascending gpu")
    rank_first = np.zeros(total, dtype=np.int64)
    if total:
        cuts = np.flatnonzero(np.diff(nrank)) + 1
        starts = np.concatenate([[0], cuts])
        lengths = np.diff(np.concatenate([starts, [total]]))
        rank_first = np.repeat(starts, lengths)
    local_id = np.arange(total, dtype=np.int64) - rank_first

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
    nchunks = int(header["nchunksperloop"])

    kind_arr = pa.array(kind.astype(np.int32))
    type_names = pc.take(pa.array(list(_KIND_NODE_TYPE), pa.string()), kind_arr)
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
        "rank": pa.array(nrank.astype(np.int32)),
        "id": pa.array(local_id.astype(np.uint64)),
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
    ops = pa.Table.from_arrays([cols[f.name] for f in OPS_SCHEMA], schema=OPS_SCHEMA)

    # ---- dependencies (global node indices)
    # program order: every node waits for the one before it in its threadblock
    prev_real, next_real = _neighbour_real(st, real)
    prog = np.full(total, -1, dtype=np.int64)
    inner = np.flatnonzero(k > 0)
    prog[inner] = inner - 1
    chained = np.flatnonzero(real & (prev_real >= 0))
    prog[first_node[chained]] = last_node[prev_real[chained]]
    dst = np.flatnonzero(prog >= 0)
    src = prog[dst]
    has = np.flatnonzero(target >= 0)
    if len(has):
        ex_src: list[np.ndarray | list[int]] = []
        ex_dst: list[np.ndarray | list[int]] = []
        direct = has[real[has] & real[target[has]]]
        ex_src.append(last_node[target[direct]])
        ex_dst.append(first_node[direct])
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
        src = np.concatenate([src, *ex_src])
        dst = np.concatenate([dst, *ex_dst])
        keep = src != dst  # a nop resolving to the step itself adds nothing
        edge = np.unique((dst[keep] << 32) | src[keep])  # sorted by destination, then source
        dst, src = edge >> 32, edge & 0xFFFFFFFF
    pos = _positions(dst)
    deps = pa.Table.from_arrays(
        [
            pa.array(nrank[dst].astype(np.int32)),
            pa.array(local_id[src].astype(np.uint64)),
            pa.array(local_id[dst].astype(np.uint64)),
            pa.repeat(pa.scalar("data", pa.string()), len(src)),
            pa.array(pos.astype(np.int32)),
        ],
        schema=DEPS_SCHEMA,
    )
    params = _params(st, header, producer)
    if extra_params:
        params.update(extra_params)
    return Trace(ops=ops, deps=deps, name=name, kind="algorithm", source=source, params=params)


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
    issues: list[str] = []
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
    cnt = _int_col(ops, "msg_chunk_cnt", 1)
    chunk_offset = _int_col(ops, "chunk_offset", -1)
    coll = str(trace.params.get("collective", trace.params.get("coll", "allreduce")))
    dsrc, ddst = default_buffers(coll)

    srcbuf = np.where(kind == RECV, ddst, dsrc).astype(np.int64)
    dstbuf = np.full(n, ddst, dtype=np.int64)
    srcoff = chunk_offset.copy()
    dstoff = chunk_offset.copy()
    explicit = np.zeros(n, dtype=bool)
    declared = np.full(n, -1, dtype=np.int64)
    chan = np.full(n, -1, dtype=np.int64)
    attrs = ops["attrs"]
    if attrs.null_count < n:
        enc = pc.dictionary_encode(attrs).combine_chunks()
        idx = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        dic = enc.dictionary.to_pylist()
        info = np.full(
            (len(dic), 7), -2, dtype=np.int64
        )  # msccl_type, srcbuf, srcoff, dstbuf, dstoff, ok, chan
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
        has = idx >= 0
        rows = np.flatnonzero(has)
        got = info[idx[rows]]
        ok = got[:, 5] == 1
        r_ok = rows[ok]
        srcbuf[r_ok], srcoff[r_ok], dstbuf[r_ok], dstoff[r_ok] = (
            got[ok, 1],
            got[ok, 2],
            got[ok, 3],
            got[ok, 4],
        )
        explicit[r_ok] = True
        declared[rows] = got[:, 0]
        chan[rows] = got[:, 6]

    # step groups
    rank = ops["rank"].to_numpy().astype(np.int64)
    tb = ops["tb_id"]
    lts = ops["local_time_step"]
    grouped = (
        pc.is_valid(tb).to_numpy(zero_copy_only=False)
        & pc.is_valid(lts).to_numpy(zero_copy_only=False)
        & (kind >= 0)
    )
    tbv = _int_col(ops, "tb_id", 0)
    ltv = _int_col(ops, "local_time_step", 0)
    key = np.where(grouped, (rank << 42) | ((tbv & 0x1FFFFF) << 21) | (ltv & 0x1FFFFF), -1 - np.arange(n))
    _, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1).astype(np.int64)

    # step type from the kinds of each group (in ops order)
    stype = np.full(n, -1, dtype=np.int64)
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
        t = _SEQ_TO_TYPE.get(seq)
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
    # a declared msccl_type must agree with the nodes (nop-like declarations are kept)
    mismatch = (declared >= 0) & (stype >= 0) & (declared != stype)
    for r in np.flatnonzero(mismatch)[:5].tolist():
        issues.append(
            f"rank {int(rank[r])} {names[r]}: attribute msccl_type={STEP_TYPES[declared[r]]!r} but the "
            "step's "
            f"nodes form {STEP_TYPES[stype[r]]!r}"
        )
    return NodeSemantics(kind, group, stype, srcbuf, srcoff, dstbuf, dstoff, cnt, explicit, chan, issues)
