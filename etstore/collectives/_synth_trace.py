"""The algorithm trace of a synthesized schedule (the representation of ``docs/algorithms.md``).

Per transfer a send at the source and a receive at the destination, plus a
``reduce`` COMP in the receive's step for reduction phases; threadblocks are one
per (NPU, link, direction), steps in schedule order; dependencies chain each
threadblock and wait for a chunk's arrival (or its complete partial sum) before
it leaves again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collectives._synth_schedule import Schedule
from etstore.ir.steps import BUF_CODE, BUFFERS, COPY, KIND_NAMES, KIND_NODE_TYPE, RECV, REDUCE, SEND
from etstore.model import Trace, deps_table, encode_attrs, ops_table
from etstore.topology import Topology

__all__ = ["build_trace"]

# node kinds are the IR's (SEND, RECV, REDUCE, COPY = 0..3); at equal times: recv, reduce, copy, send
_ORDER = np.array([3, 0, 1, 2], dtype=np.int8)
_I, _O, _S = BUF_CODE["i"], BUF_CODE["o"], BUF_CODE["s"]


def _join(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (i, j) with ``a[i] == b[j]`` (many-to-many). O((|a| + |b|) log |b| + pairs)."""
    order = np.argsort(b, kind="stable")
    sb = b[order]
    lo = np.searchsorted(sb, a, side="left")
    hi = np.searchsorted(sb, a, side="right")
    counts = hi - lo
    total = int(counts.sum())
    ia = np.repeat(np.arange(len(a)), counts)
    first = np.cumsum(counts) - counts
    ib = order[np.arange(total) - np.repeat(first, counts) + np.repeat(lo, counts)]
    return ia, ib


def _group_rank(keys_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted keys: (is-first-of-group mask, index within the group)."""
    m = len(keys_sorted)
    new = np.ones(m, dtype=bool)
    new[1:] = keys_sorted[1:] != keys_sorted[:-1]
    start = np.maximum.accumulate(np.where(new, np.arange(m), 0))
    return new, np.arange(m) - start


def build_trace(topo: Topology, schedule: Schedule, coll: str, n: int, k: int, total_chunks: int) -> Trace:
    """The algorithm trace of a schedule (docs/algorithms.md). O(T log T) for T transfers.

    Per transfer: a send at the source and a recv at the destination, plus a
    ``reduce`` COMP in the recv's step for reduction phases (an MSCCL ``rrc``).
    Threadblocks: one per (NPU, link, direction), steps in schedule order, each
    chained to the previous one; All-to-All adds one ``copy`` per own chunk.
    """
    sched = _Columns.of(schedule)
    t = len(sched)
    op = _ops_in_order(topo, sched, coll, n, k)
    m = len(op.kind)
    rank_start = np.searchsorted(op.rank, np.arange(n + 1))
    op_id = np.arange(m, dtype=np.int64) - rank_start[op.rank]
    tr = np.maximum(op.transfer, 0)
    chunk, own_sb, own_so, own_db, own_do = _op_buffers(sched, op, coll, n, k)
    local_offset = np.where(op.kind == SEND, own_so, own_do)
    tb_id, step, chain_src, chain_dst = _threadblocks(topo, op, n)
    deps = _data_deps(sched, op, coll, chunk, op_id, chain_src, chain_dst)
    attrs = _attr_column(own_sb, own_so, own_db, own_do)
    peer = np.zeros(m, np.int32)
    if t:
        peer = np.where(op.kind == SEND, sched.dst[tr], sched.src[tr]).astype(np.int32)
    tags = np.append(_link_tags(topo), 0)[np.minimum(op.link, topo.num_links)]
    kind32 = pa.array(op.kind.astype(np.int32))
    is_comm = (op.kind == SEND) | (op.kind == RECV)
    ops = ops_table(
        {
            "rank": op.rank,
            "id": op_id.astype(np.uint64),
            "name": pc.take(pa.array(list(KIND_NAMES)), kind32),
            "type": pc.take(pa.array(list(KIND_NODE_TYPE)), kind32),
            "comm_src": pa.array(peer, mask=op.kind != RECV),
            "comm_dst": pa.array(peer, mask=op.kind != SEND),
            "comm_tag": pa.array(tags.astype(np.int32), mask=~is_comm),
            "msg_chunk_cnt": np.ones(m, dtype=np.int64),
            "msg_chunk_idx": chunk,
            "chunk_offset": local_offset,
            "total_chunk_cnt": np.full(m, total_chunks, dtype=np.int64),
            "tb_id": tb_id,
            "local_time_step": step,
            "attrs": attrs,
        },
        num_rows=m,
    )
    shape = topo.name.split(",")[0]
    return Trace(ops, deps, name=f"synth-{coll}-{shape}-k{k}", kind="algorithm", source="synth")


@dataclass(frozen=True)
class _Columns:
    """A schedule's columns with the derived ones (src, dst, end) computed once."""

    link: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    phase: np.ndarray

    @staticmethod
    def of(sched: Schedule) -> _Columns:
        return _Columns(
            sched.link,
            sched.src,
            sched.dst,
            sched.chunk.astype(np.int64),
            sched.start_ns,
            sched.end_ns,
            sched.phase,
        )

    def __len__(self) -> int:
        return len(self.link)


class _Ops(NamedTuple):
    """Every node of the trace as columns, sorted by (rank, time, kind order, side, link)."""

    transfer: np.ndarray  # int64, schedule row (-1 for an All-to-All local copy)
    kind: np.ndarray  # int8, SEND/RECV/REDUCE/COPY
    rank: np.ndarray  # int32
    time: np.ndarray  # float64, ns
    link: np.ndarray  # int64 (num_links for a local copy)
    side: np.ndarray  # int64, 0 sender, 1 receiver, 2 local
    copy_chunk: np.ndarray  # per local copy in (rank, j) order: its chunk id
    copy_offset: np.ndarray  # per local copy: its buffer offset


def _ops_in_order(topo: Topology, sched: _Columns, coll: str, n: int, k: int) -> _Ops:
    """Sends, receives, reductions (and All-to-All's local copies), in per-rank issue order."""
    t = len(sched)
    r_idx = np.flatnonzero(sched.phase == 0)
    parts_transfer = [np.arange(t), np.arange(t), r_idx]
    parts_kind = [np.full(t, SEND), np.full(t, RECV), np.full(len(r_idx), REDUCE)]
    parts_rank = [sched.src, sched.dst, sched.dst[r_idx]]
    parts_time = [sched.start_ns, sched.end_ns, sched.end_ns[r_idx]]
    parts_link = [sched.link, sched.link, sched.link[r_idx]]
    parts_side = [np.zeros(t), np.ones(t), np.ones(len(r_idx))]
    copy_chunk = copy_offset = np.zeros(0, dtype=np.int64)
    if coll == "alltoall":  # an NPU's block for itself is a local copy i[r·k + j] → o[r·k + j]
        rr = np.repeat(np.arange(n), k)
        jj = np.tile(np.arange(k), n)
        parts_transfer.append(np.full(n * k, -1))
        parts_kind.append(np.full(n * k, COPY))
        parts_rank.append(rr)
        parts_time.append(np.zeros(n * k))
        parts_link.append(np.full(n * k, topo.num_links))
        parts_side.append(np.full(n * k, 2))
        copy_chunk, copy_offset = rr * n * k + rr * k + jj, rr * k + jj
    op_transfer = np.concatenate(parts_transfer).astype(np.int64)
    op_kind = np.concatenate(parts_kind).astype(np.int8)
    op_rank = np.concatenate(parts_rank).astype(np.int32)
    op_time = np.concatenate(parts_time).astype(np.float64)
    op_link = np.concatenate(parts_link).astype(np.int64)
    op_side = np.concatenate(parts_side).astype(np.int64)
    minor = (_ORDER[op_kind].astype(np.int64) << 40) | (op_side << 36) | op_link
    order = np.lexsort((minor, op_time, op_rank))
    return _Ops(
        op_transfer[order],
        op_kind[order],
        op_rank[order],
        op_time[order],
        op_link[order],
        op_side[order],
        copy_chunk,
        copy_offset,
    )


def _op_buffers(
    sched: _Columns, op: _Ops, coll: str, n: int, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per op: (chunk, source buffer, source offset, destination buffer, destination offset)."""
    t = len(sched)
    m = len(op.kind)
    sb, so, db, do = _buffers(sched, coll, n, k)
    tr = np.maximum(op.transfer, 0)
    chunk = sched.chunk[tr] if t else np.zeros(m, dtype=np.int64)
    own_sb, own_so, own_db, own_do = sb[tr], so[tr], db[tr], do[tr]
    c_src = np.flatnonzero(op.kind == COPY)
    if len(c_src):
        pos = np.arange(len(c_src))  # copies keep (rank, j) order
        chunk = chunk.copy()
        chunk[c_src] = op.copy_chunk[pos]
        own_sb, own_so, own_db, own_do = own_sb.copy(), own_so.copy(), own_db.copy(), own_do.copy()
        own_sb[c_src], own_db[c_src] = _I, _O
        own_so[c_src] = own_do[c_src] = op.copy_offset[pos]
    return chunk, own_sb, own_so, own_db, own_do


def _threadblocks(topo: Topology, op: _Ops, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tb_id, step, chain_src, chain_dst): one threadblock per (rank, link side), steps in time order.

    A receive and its reduction share a step; each op waits for the previous one of
    its threadblock (the chain edges, as op indices).
    """
    m = len(op.kind)
    tb_key = (op.rank.astype(np.int64) * 3 + op.side) * (topo.num_links + 1) + op.link
    tb_order = np.argsort(tb_key, kind="stable")
    new_tb, _ = _group_rank(tb_key[tb_order])
    tb_global = np.cumsum(new_tb) - 1
    rank_of_tb = op.rank[tb_order][new_tb]
    tb_local = tb_global - np.searchsorted(rank_of_tb, np.arange(n + 1))[op.rank[tb_order]]
    opens = (op.kind[tb_order] != REDUCE).astype(np.int64)
    csum = np.cumsum(opens)
    tb_base = np.maximum.accumulate(np.where(new_tb, csum - opens, 0))
    tb_id = np.empty(m, dtype=np.int64)
    step = np.empty(m, dtype=np.int64)
    tb_id[tb_order] = tb_local
    step[tb_order] = csum - tb_base - 1
    chain_src = tb_order[:-1][~new_tb[1:]]
    chain_dst = tb_order[1:][~new_tb[1:]]
    return tb_id, step, chain_src, chain_dst


def _data_deps(
    sched: _Columns,
    op: _Ops,
    coll: str,
    chunk: np.ndarray,
    op_id: np.ndarray,
    chain_src: np.ndarray,
    chain_dst: np.ndarray,
) -> pa.Table:
    """The deps table: threadblock chains plus data dependencies (all on one rank)."""
    t = len(sched)
    m = len(op.kind)
    tr = np.maximum(op.transfer, 0)
    phase = np.where(op.kind == COPY, 3, sched.phase[tr] if t else 0).astype(np.int64)
    big = np.int64(int(chunk.max()) + 1 if m else 1)
    key = (op.rank.astype(np.int64) * 4 + phase) * big + chunk
    sends = np.flatnonzero(op.kind == SEND)
    recvs = np.flatnonzero(op.kind == RECV)
    reduces = np.flatnonzero(op.kind == REDUCE)
    dep_src = [chain_src]
    dep_dst = [chain_dst]
    fwd = sends[phase[sends] != 0]
    recv_fwd = recvs[phase[recvs] != 0]
    ia, ib = _join(key[fwd], key[recv_fwd])  # a forwarded chunk waits for its arrival
    dep_src.append(recv_fwd[ib])
    dep_dst.append(fwd[ia])
    red_sends = sends[phase[sends] == 0]
    ja, jb = _join(key[red_sends], key[reduces])  # a partial sum leaves once all its inputs are in
    dep_src.append(reduces[jb])
    dep_dst.append(red_sends[ja])
    if coll == "allreduce":  # the owner broadcasts a chunk once its reduction is complete
        has_recv = np.zeros(len(fwd), dtype=bool)
        has_recv[ia] = True
        first = fwd[~has_recv]
        ka, kb = _join(op.rank[first].astype(np.int64) * 4 * big + chunk[first], key[reduces])
        dep_src.append(reduces[kb])
        dep_dst.append(first[ka])
    d_src = np.concatenate(dep_src)
    d_dst = np.concatenate(dep_dst)
    by_dst = np.argsort(d_dst, kind="stable")
    pos = np.empty(len(d_dst), dtype=np.int64)
    pos[by_dst] = _group_rank(d_dst[by_dst])[1] if len(d_dst) else pos
    return deps_table(op.rank[d_dst], op_id[d_src].astype(np.uint64), op_id[d_dst].astype(np.uint64), pos=pos)


def _attr_column(sb: np.ndarray, so: np.ndarray, db: np.ndarray, do: np.ndarray) -> pa.Array:
    """``attrs`` with srcbuf/srcoff/dstbuf/dstoff per op, one encoded blob per distinct value."""
    key = (sb.astype(np.int64) << 60) | (db.astype(np.int64) << 58) | (so.astype(np.int64) << 29) | do
    uniq, inverse = np.unique(key, return_inverse=True)
    blobs = [
        encode_attrs(
            [
                ("srcbuf", "string_val", BUFFERS[(u >> 60) & 3]),
                ("srcoff", "int64_val", (u >> 29) & 0x1FFFFFFF),
                ("dstbuf", "string_val", BUFFERS[(u >> 58) & 3]),
                ("dstoff", "int64_val", u & 0x1FFFFFFF),
            ]
        )
        for u in uniq.tolist()
    ]
    return pc.take(pa.array(blobs, pa.binary()), pa.array(inverse.reshape(-1).astype(np.int32)))


def _link_tags(topo: Topology) -> np.ndarray:
    """``comm_tag`` per link: its index among parallel links of the same (src, dst), usually 0."""
    key = topo.src.astype(np.int64) * topo.num_npus + topo.dst
    order = np.argsort(key, kind="stable")
    tags = np.empty(topo.num_links, dtype=np.int64)
    if topo.num_links:
        tags[order] = _group_rank(key[order])[1]
    return tags


_Arrays4 = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _buffers(sched: _Columns, coll: str, n: int, k: int) -> _Arrays4:
    """Per transfer: (sender buffer, sender offset, receiver buffer, receiver offset), offsets in chunks.

    All-Gather works in place in ``o``; the reductions, All-Reduce and Broadcast in
    ``i``; All-to-All reads ``i[d·k + j]`` at the origin, writes ``o[r·k + j]`` at the
    destination and parks chunks in ``s`` slots (one per chunk per NPU) on the way.
    """
    t = len(sched)
    c = sched.chunk
    if coll != "alltoall":
        buf = np.full(t, _O if coll == "allgather" else _I, dtype=np.int64)
        return buf, c, buf, c
    r = c // (n * k)
    d = (c // k) % n
    j = c % k
    from_origin = sched.src == r
    to_final = sched.dst == d
    # scratch slot at the NPU where a hop lands short of its destination, numbered in arrival order
    inter = np.flatnonzero(~to_final)
    slot_key = sched.dst[inter].astype(np.int64) * (n * n * k) + c[inter]
    o = np.lexsort((sched.end_ns[inter], sched.dst[inter]))
    slot = np.empty(len(inter), dtype=np.int64)
    slot[o] = _group_rank(sched.dst[inter][o])[1] if len(inter) else slot
    lookup = np.argsort(slot_key)
    send_slot = np.zeros(t, dtype=np.int64)
    fwd = np.flatnonzero(~from_origin)
    if len(fwd):
        want = sched.src[fwd].astype(np.int64) * (n * n * k) + c[fwd]
        send_slot[fwd] = slot[lookup[np.searchsorted(slot_key[lookup], want)]]
    recv_slot = np.zeros(t, dtype=np.int64)
    recv_slot[inter] = slot
    sbuf = np.where(from_origin, _I, _S)
    soff = np.where(from_origin, d * k + j, send_slot)
    dbuf = np.where(to_final, _O, _S)
    doff = np.where(to_final, r * k + j, recv_slot)
    return sbuf, soff, dbuf, doff
