"""The algorithm trace of a synthesized schedule (the representation of ``docs/algorithms.md``).

Per transfer a send at the source and a receive at the destination, plus a
``reduce`` COMP in the receive's step for reduction phases; threadblocks are one
per (NPU, link, direction), steps in schedule order; dependencies chain each
threadblock and wait for a chunk's arrival (or its complete partial sum) before
it leaves again.

Every op and every dependency belongs to one rank (a send to its transfer's
source, a receive or reduction to its destination, an All-to-All copy to its
NPU) and everything computed per op is local to that rank, so the trace can be
built a rank range at a time (:func:`build_parts`) with memory for one range plus
the compact schedule. Only the per-transfer buffer table (All-to-All numbers its
scratch slots per NPU in arrival order) and the link tags are global; they are
computed once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms._synth_schedule import Schedule
from etstore.errors import OptionError
from etstore.ir.steps import BUF_CODE, BUFFERS, COPY, KIND_NAMES, KIND_NODE_TYPE, RECV, REDUCE, SEND
from etstore.model import Trace, deps_table, encode_attrs, ops_table
from etstore.topology import Topology

__all__ = ["build_parts", "build_trace", "op_count"]

# node kinds are the IR's (SEND, RECV, REDUCE, COPY = 0..3); at equal times: recv, reduce, copy, send
_ORDER = np.array([3, 0, 1, 2], dtype=np.int8)
_I, _O, _S = BUF_CODE["i"], BUF_CODE["o"], BUF_CODE["s"]

_Arrays4 = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


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


def op_count(schedule: Schedule, coll: str, n: int, k: int) -> int:
    """Ops of the algorithm trace, from the schedule alone: a send and a receive per transfer,
    a reduction per transfer of a reduction phase, and All-to-All's one local copy per own chunk."""
    return 2 * len(schedule) + int((schedule.phase == 0).sum()) + (n * k if coll == "alltoall" else 0)


def build_trace(topo: Topology, schedule: Schedule, coll: str, n: int, k: int, total_chunks: int) -> Trace:
    """The algorithm trace of a schedule (docs/algorithms.md). O(T log T) for T transfers.

    Per transfer: a send at the source and a recv at the destination, plus a
    ``reduce`` COMP in the recv's step for reduction phases (an MSCCL ``rrc``).
    Threadblocks: one per (NPU, link, direction), steps in schedule order, each
    chained to the previous one; All-to-All adds one ``copy`` per own chunk.
    The one-range case of :func:`build_parts`.
    """
    return _Plan.of(topo, schedule, coll, n, k, total_chunks).part(0, n)


def build_parts(
    topo: Topology, schedule: Schedule, coll: str, n: int, k: int, total_chunks: int, *, max_ops: int
) -> Iterator[Trace]:
    """The trace of :func:`build_trace` as consecutive rank ranges, each a :class:`Trace`.

    Parts cover ranks ``[a, b)`` in ascending, disjoint ranges over ``0..n-1``; each
    holds whole ranks, at least one, and at most ``max_ops`` ops unless one rank alone
    has more. A part's ops are exactly the whole trace's rows of its ranks (same order,
    same per-rank ids) and its deps the whole trace's deps of those ranks in their
    order; the whole trace lists deps rank by rank, so it is its parts end to end.

    Raises
    ------
    OptionError
        If ``max_ops`` < 1.

    Notes
    -----
    The global work (per-transfer buffers, link tags, transfers indexed by source and
    by destination NPU: 8 bytes per transfer, 18 more for All-to-All) is done once;
    memory beyond that is one part's. O(T log T) over all parts for T transfers.
    """
    if max_ops < 1:
        raise OptionError(f"synth: max_ops must be >= 1, got {max_ops}")
    plan = _Plan.of(topo, schedule, coll, n, k, total_chunks)
    return (plan.part(a, b) for a, b in plan.ranges(max_ops))


def _index_type(size: int) -> type[np.signedinteger]:
    """The narrowest of int32/int64 holding 0..size."""
    return np.int32 if size < 2**31 else np.int64


def _by_rank(nodes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(transfer ids ordered by (rank, id), first position of each rank 0..n): a stable counting sort."""
    key = nodes.astype(np.uint16) if n <= 1 << 16 else nodes  # a stable sort of 16-bit keys is a radix sort
    order = np.argsort(key, kind="stable").astype(_index_type(len(nodes)))
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(nodes, minlength=n), out=start[1:])
    return order, start


@dataclass(frozen=True, eq=False)
class _Plan:
    """The per-transfer work shared by every rank range, done once."""

    topo: Topology
    sched: Schedule
    coll: str
    n: int
    k: int
    total_chunks: int
    tags: np.ndarray  # per link, then 0 for local copies: its comm_tag
    bufs: _Arrays4 | None  # All-to-All only, per transfer: (src buffer, src offset, dst buffer, dst offset)

    @staticmethod
    def of(topo: Topology, sched: Schedule, coll: str, n: int, k: int, total_chunks: int) -> _Plan:
        tags = np.append(_link_tags(topo), 0).astype(np.int32)
        bufs = _alltoall_buffers(sched, n, k) if coll == "alltoall" else None
        return _Plan(topo, sched, coll, n, k, total_chunks, tags, bufs)

    @cached_property
    def by_src(self) -> tuple[np.ndarray, np.ndarray]:
        """Transfers by sending NPU (see :func:`_by_rank`)."""
        return _by_rank(self.sched.src, self.n)

    @cached_property
    def by_dst(self) -> tuple[np.ndarray, np.ndarray]:
        """Transfers by receiving NPU (see :func:`_by_rank`)."""
        return _by_rank(self.sched.dst, self.n)

    def ops_per_rank(self) -> np.ndarray:
        """Ops of each rank: its sends, receives, reductions and copies."""
        s = self.sched
        ops = np.diff(self.by_src[1]) + np.diff(self.by_dst[1])
        red = s.phase == 0
        if red.any():
            ops += np.bincount(s.link_dst[s.link[red]], minlength=self.n)
        if self.coll == "alltoall":
            ops += self.k
        return ops

    def ranges(self, max_ops: int) -> Iterator[tuple[int, int]]:
        """Consecutive ``[a, b)`` with at most ``max_ops`` ops each (or one rank that has more)."""
        if op_count(self.sched, self.coll, self.n, self.k) <= max_ops:
            yield 0, self.n
            return
        cum = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.ops_per_rank(), out=cum[1:])
        a = 0
        while a < self.n:
            b = max(int(np.searchsorted(cum, cum[a] + max_ops, side="right")) - 1, a + 1)
            yield a, b
            a = b

    def _transfers(self, end: str, a: int, b: int) -> np.ndarray:
        """Transfers whose ``end`` (``src`` or ``dst``) NPU is in ``[a, b)``, in (NPU, id) order."""
        if a == 0 and b == self.n:  # every transfer: no index needed
            return np.arange(len(self.sched), dtype=_index_type(len(self.sched)))
        order, start = self.by_src if end == "src" else self.by_dst
        return order[start[a] : start[b]]

    def part(self, a: int, b: int) -> Trace:
        """The trace of ranks ``[a, b)``."""
        op = _ops_in_order(self, self._transfers("src", a, b), self._transfers("dst", a, b), a, b)
        m = len(op.kind)
        rank_start = np.searchsorted(op.rank, np.arange(self.n + 1))
        op_id = np.arange(m, dtype=np.int64) - rank_start[op.rank]
        own_sb, own_so, own_db, own_do = _op_buffers(self, op)
        local_offset = np.where(op.kind == SEND, own_so, own_do)
        tb_id, step, chain_src, chain_dst = _threadblocks(self.topo, op, self.n)
        deps = _data_deps(op, self.coll, op_id, chain_src, chain_dst)
        attrs = _attr_column(own_sb, own_so, own_db, own_do)
        del own_sb, own_so, own_db, own_do
        tags = self.tags[np.minimum(op.link, self.topo.num_links)]
        kind32 = pa.array(op.kind.astype(np.int32))
        is_comm = (op.kind == SEND) | (op.kind == RECV)
        ops = ops_table(
            {
                "rank": op.rank,
                "id": op_id.astype(np.uint64),
                "name": pc.take(pa.array(list(KIND_NAMES)), kind32),
                "type": pc.take(pa.array(list(KIND_NODE_TYPE)), kind32),
                "comm_src": pa.array(op.peer, mask=op.kind != RECV),
                "comm_dst": pa.array(op.peer, mask=op.kind != SEND),
                "comm_tag": pa.array(tags, mask=~is_comm),
                "msg_chunk_cnt": np.ones(m, dtype=np.int64),
                "msg_chunk_idx": op.chunk,
                "chunk_offset": local_offset,
                "total_chunk_cnt": np.full(m, self.total_chunks, dtype=np.int64),
                "tb_id": tb_id,
                "local_time_step": step,
                "attrs": attrs,
            },
            num_rows=m,
        )
        shape = self.topo.name.split(",")[0]
        return Trace(ops, deps, name=f"synth-{self.coll}-{shape}-k{self.k}", kind="algorithm", source="synth")


class _Ops(NamedTuple):
    """The nodes of a rank range as columns, sorted by (rank, time, kind order, side, link)."""

    transfer: np.ndarray  # int64, schedule row (-1 for an All-to-All local copy)
    kind: np.ndarray  # int8, SEND/RECV/REDUCE/COPY
    rank: np.ndarray  # int32
    link: np.ndarray  # int64 (num_links for a local copy)
    side: np.ndarray  # int64, 0 sender, 1 receiver, 2 local
    chunk: np.ndarray  # int64, chunk id
    phase: np.ndarray  # int64, the transfer's phase (3 for a local copy)
    peer: np.ndarray  # int32, the other end of the transfer
    copy_chunk: np.ndarray  # per local copy in (rank, j) order: its chunk id
    copy_offset: np.ndarray  # per local copy: its buffer offset


def _end_ns(s: Schedule, rows: np.ndarray) -> np.ndarray:
    """``s.end_ns[rows]`` without computing it for every transfer (the same float sums)."""
    if s.stored_end_ns is not None:
        return s.stored_end_ns[rows]
    return s.start_ns[rows] + s.link_ns[s.link[rows]]


def _ops_in_order(p: _Plan, sends: np.ndarray, recvs: np.ndarray, a: int, b: int) -> _Ops:
    """Sends, receives, reductions (and All-to-All's local copies) of ranks [a, b), in per-rank issue order.

    ``sends``/``recvs`` are the transfers leaving/entering the range, ascending within
    each NPU, so the stable sort below ties exactly as it does over all transfers.
    """
    s, num_links = p.sched, p.topo.num_links
    reduces = recvs[s.phase[recvs] == 0]
    ins = np.concatenate([recvs, reduces])
    ns, nr, nd = len(sends), len(recvs), len(reduces)
    nc = (b - a) * p.k if p.coll == "alltoall" else 0
    link_s, link_i = s.link[sends], s.link[ins]
    op_transfer = np.concatenate([sends, ins, np.full(nc, -1)]).astype(np.int64)
    kinds = [np.full(ns, SEND), np.full(nr, RECV), np.full(nd, REDUCE), np.full(nc, COPY)]
    op_kind = np.concatenate(kinds).astype(np.int8)
    copy_rank = np.repeat(np.arange(a, b), p.k) if nc else np.zeros(0, dtype=np.int64)
    op_rank = np.concatenate([s.link_src[link_s], s.link_dst[link_i], copy_rank]).astype(np.int32)
    op_time = np.concatenate([s.start_ns[sends], _end_ns(s, ins), np.zeros(nc)]).astype(np.float64)
    op_link = np.concatenate([link_s, link_i, np.full(nc, num_links)]).astype(np.int64)
    op_side = np.concatenate([np.zeros(ns), np.ones(nr + nd), np.full(nc, 2)]).astype(np.int64)
    del link_s, link_i, ins
    copy_chunk = copy_offset = np.zeros(0, dtype=np.int64)
    if nc:  # an NPU's block for itself is a local copy i[r·k + j] → o[r·k + j]
        rr, jj = copy_rank.astype(np.int64), np.tile(np.arange(p.k), b - a)
        copy_chunk, copy_offset = rr * p.n * p.k + rr * p.k + jj, rr * p.k + jj
    minor = (_ORDER[op_kind].astype(np.int64) << 40) | (op_side << 36) | op_link
    order = np.lexsort((minor, op_time, op_rank))
    del minor, op_time
    transfer = op_transfer[order]
    kind = op_kind[order]
    tr = np.maximum(transfer, 0)
    t, m = len(s), len(order)
    chunk = s.chunk[tr].astype(np.int64) if t else np.zeros(m, dtype=np.int64)
    phase = np.where(kind == COPY, 3, s.phase[tr] if t else 0).astype(np.int64)
    peer = np.zeros(m, np.int32)
    if t:
        tl = s.link[tr]
        peer = np.where(kind == SEND, s.link_dst[tl], s.link_src[tl]).astype(np.int32)
    c_src = np.flatnonzero(kind == COPY)
    if len(c_src):  # copies keep (rank, j) order
        chunk[c_src] = copy_chunk
    return _Ops(
        transfer,
        kind,
        op_rank[order],
        op_link[order],
        op_side[order],
        chunk,
        phase,
        peer,
        copy_chunk,
        copy_offset,
    )


def _op_buffers(p: _Plan, op: _Ops) -> _Arrays4:
    """Per op: (source buffer, source offset, destination buffer, destination offset), offsets in chunks.

    All-Gather works in place in ``o``; the reductions, All-Reduce and Broadcast in ``i``;
    All-to-All's come from the per-transfer table.
    """
    m = len(op.kind)
    if p.bufs is None:
        buf = np.full(m, _O if p.coll == "allgather" else _I, dtype=np.int64)
        return buf, op.chunk, buf, op.chunk
    tr = np.maximum(op.transfer, 0)
    if len(p.sched):
        own = [col[tr].astype(np.int64) for col in p.bufs]
    else:
        own = [np.zeros(m, dtype=np.int64) for _ in range(4)]
    c_src = np.flatnonzero(op.kind == COPY)
    if len(c_src):  # copies keep (rank, j) order
        own[0][c_src], own[2][c_src] = _I, _O
        own[1][c_src] = own[3][c_src] = op.copy_offset
    return own[0], own[1], own[2], own[3]


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
    op: _Ops, coll: str, op_id: np.ndarray, chain_src: np.ndarray, chain_dst: np.ndarray
) -> pa.Table:
    """The deps table: threadblock chains plus data dependencies (all on one rank)."""
    m = len(op.kind)
    chunk, phase = op.chunk, op.phase
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
    # rank by rank, as readers list them: the trace built whole is then its parts end to end
    by_rank = np.argsort(op.rank[d_dst], kind="stable")
    d_src, d_dst = d_src[by_rank], d_dst[by_rank]
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


def _alltoall_buffers(s: Schedule, n: int, k: int) -> _Arrays4:
    """Per All-to-All transfer: (sender buffer, sender offset, receiver buffer, receiver offset).

    Reads ``i[d·k + j]`` at the origin, writes ``o[r·k + j]`` at the destination and
    parks chunks in ``s`` slots (one per chunk per NPU, numbered in arrival order) on
    the way. Buffers int8, offsets int32 while they fit.
    """
    t = len(s)
    c = s.chunk.astype(np.int64)
    src, dst = s.src, s.dst
    r = c // (n * k)
    d = (c // k) % n
    j = c % k
    from_origin = src == r
    to_final = dst == d
    # scratch slot at the NPU where a hop lands short of its destination, numbered in arrival order
    inter = np.flatnonzero(~to_final)
    slot_key = dst[inter].astype(np.int64) * (n * n * k) + c[inter]
    o = np.lexsort((_end_ns(s, inter), dst[inter]))
    slot = np.empty(len(inter), dtype=np.int64)
    slot[o] = _group_rank(dst[inter][o])[1] if len(inter) else slot
    lookup = np.argsort(slot_key)
    send_slot = np.zeros(t, dtype=np.int64)
    fwd = np.flatnonzero(~from_origin)
    if len(fwd):
        want = src[fwd].astype(np.int64) * (n * n * k) + c[fwd]
        send_slot[fwd] = slot[lookup[np.searchsorted(slot_key[lookup], want)]]
    recv_slot = np.zeros(t, dtype=np.int64)
    recv_slot[inter] = slot
    off = _index_type(max(n * k, len(inter)))
    sbuf = np.where(from_origin, _I, _S).astype(np.int8)
    soff = np.where(from_origin, d * k + j, send_slot).astype(off)
    dbuf = np.where(to_final, _O, _S).astype(np.int8)
    doff = np.where(to_final, r * k + j, recv_slot).astype(off)
    return sbuf, soff, dbuf, doff
