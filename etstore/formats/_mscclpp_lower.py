"""Any algorithm trace → an MSCCL++ execution plan: two-sided steps lowered to one-sided ops.

Why this lowering: MSCCL-IR (and every etstore producer) speaks of sends and receives on
connections, MSCCL++ of writes into a peer's memory and semaphores. Each message gets a
scratch range of its own on the receiver, so a write can never land on data still in use:

* the sender ``put``s its chunks into that range, then ``signal``s the message's channel;
* the receiver ``wait``s on it, then copies (``r``), reduces (``rrc``: ``re``), or reduces
  and forwards in one op (``rrcs``/``rcs``/``rrs``: ``res``, which with one source is a
  copy that also writes the peer);
* local steps are ``copy`` and ``re``; a dependency between two threadblocks of a rank is
  a device semaphore (``sem_release`` after the step waited for, ``sem_acquire`` before
  the waiting one), the releases a waiting step needs counted in order;
* a ``nop`` (``__syncthreads``) goes wherever the executor needs one: after a wait or an
  acquire before data is touched, before a signal or a release after data was, and
  between two data ops that touch the same local chunks.

One memory channel per message stream ``(src, dst, tag)`` (the k-th channel of a rank to a
peer pairs with the peer's k-th, so both sides list the streams between them in one
order); one MSCCL++ threadblock per trace threadblock, its steps in the order of one
deadlock-free execution; a threadblock past the executor's 64 operations is cut into
consecutive threadblocks handing over through a semaphore.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from etstore.errors import UnsatisfiableError
from etstore.ir import BUFFERS, COPY, RECV, REDUCE, SEND, STEP_TYPES, node_semantics, run_verdict
from etstore.ir.verdict import dependency_csr, message_streams
from etstore.model import Trace

__all__ = ["MAX_CHANNEL", "MAX_OPERATION", "lower"]

MAX_OPERATION = 64  # operations per threadblock (execution_common.hpp)
MAX_CHANNEL = 16  # channels, and remote buffers, per threadblock of each type
UINT64_MAX = (1 << 64) - 1


def _fail(trace: Trace, what: str) -> UnsatisfiableError:
    return UnsatisfiableError(f"cannot write {trace.name!r} as an MSCCL++ plan: {what}")


@dataclass
class _Step:
    rank: int
    stype: str
    src: tuple[str, int]
    dst: tuple[str, int]
    cnt: int
    tb: int
    pos: int
    send: int = -1  # message index
    recv: int = -1


@dataclass
class _Msg:
    src: int
    dst: int
    tag: int
    cnt: int
    slot: int = -1  # scratch offset on the receiver


@dataclass
class _Tb:
    """One MSCCL++ threadblock being written: its ops with GPU-level references."""

    ops: list[dict[str, Any]] = field(default_factory=list)
    dirty: set[tuple[str, int]] = field(default_factory=set)  # chunks written since the last nop
    read: set[tuple[str, int]] = field(default_factory=set)
    synced: bool = True  # a nop follows the last wait/acquire
    data_since_nop: bool = False

    def nop(self) -> None:
        if self.ops and self.ops[-1]["name"] == "nop":
            return
        self.ops.append({"name": "nop"})
        self.dirty.clear()
        self.read.clear()
        self.synced, self.data_since_nop = True, False

    def sync(self, op: dict[str, Any]) -> None:
        """A signal or release: the data before it must be complete first."""
        if self.data_since_nop:
            self.nop()
        self.ops.append(op)

    def block(self, op: dict[str, Any]) -> None:
        """A wait or an acquire: data after it must wait for every thread."""
        self.ops.append(op)
        self.synced = False

    def data(
        self, op: dict[str, Any], reads: list[tuple[str, int, int]], writes: list[tuple[str, int, int]]
    ) -> None:
        r = {(b, j) for b, o, n in reads for j in range(o, o + n)}
        w = {(b, j) for b, o, n in writes for j in range(o, o + n)}
        if not self.synced or (r & self.dirty) or (w & (self.dirty | self.read)):
            self.nop()
        self.ops.append(op)
        self.dirty |= w
        self.read |= r
        self.data_since_nop = True


def _steps(trace: Trace) -> tuple[list[_Step], list[_Msg], int, list[tuple[int, int]]]:
    """Steps in execution order, the messages between them, the ranks, and the dependencies
    (as step indices) between steps of different threadblocks."""
    sem = node_semantics(trace)
    if sem.issues:
        raise _fail(trace, sem.issues[0])
    ops = trace.ops
    kind = sem.kind
    bad = np.flatnonzero(kind < 0)
    if len(bad):
        row = ops.slice(int(bad[0]), 1).to_pylist()[0]
        raise _fail(
            trace,
            f"rank {row['rank']} node {row['id']} ({row['name']!r}) is neither a send, a receive, "
            "nor a reduce/copy COMP node",
        )
    verdict = run_verdict(trace)
    if not verdict.ok:
        raise _fail(trace, verdict.headline)
    rank = ops["rank"].to_numpy().astype(np.int64)
    ids = ops["id"].to_numpy().astype(np.int64)
    n_ranks = int(trace.params.get("ngpus") or (int(rank.max()) + 1 if len(rank) else 1))
    csrc = pc.fill_null(ops["comm_src"], -1).to_numpy().astype(np.int64)
    cdst = pc.fill_null(ops["comm_dst"], -1).to_numpy().astype(np.int64)
    tag = pc.fill_null(ops["comm_tag"], 0).to_numpy().astype(np.int64)
    tb = pc.fill_null(ops["tb_id"], -1).to_numpy().astype(np.int64)
    stream = message_streams(kind, rank, csrc, cdst, tag, n_ranks)
    succ_ptr, succ, indeg, _ = dependency_csr(trace, rank, ids)
    pos, pairs = _run(kind.tolist(), stream.tolist(), succ_ptr.tolist(), succ, indeg)
    groups = sem.group.tolist()
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        rows_of.setdefault(g, []).append(i)
    order = sorted(rows_of, key=lambda g: min(pos[r] for r in rows_of[g]))
    step_of = {g: j for j, g in enumerate(order)}
    steps: list[_Step] = []
    for g in order:
        rows = rows_of[g]
        kinds = [int(kind[r]) for r in rows]
        pick = (
            rows[kinds.index(REDUCE)]
            if REDUCE in kinds
            else rows[kinds.index(COPY)]
            if COPY in kinds
            else rows[0]
        )
        steps.append(
            _Step(
                int(rank[rows[0]]),
                STEP_TYPES[int(sem.stype[rows[0]])],
                (BUFFERS[int(sem.srcbuf[pick])], int(sem.srcoff[pick])),
                (BUFFERS[int(sem.dstbuf[pick])], int(sem.dstoff[pick])),
                int(sem.cnt[rows[0]]),
                int(tb[rows[0]]),
                len(steps),
            )
        )
    msgs: list[_Msg] = []
    for s, r in sorted(pairs, key=lambda p: pos[p[0]]):
        steps[step_of[groups[s]]].send = steps[step_of[groups[r]]].recv = len(msgs)
        msgs.append(_Msg(int(rank[s]), int(rank[r]), int(tag[s]), int(sem.cnt[s])))
    edges: set[tuple[int, int]] = set()
    for i, g in enumerate(groups):
        for p in range(int(succ_ptr[i]), int(succ_ptr[i + 1])):
            a, b = step_of[g], step_of[groups[succ[p]]]
            if a != b and steps[a].tb != steps[b].tb:
                edges.add((a, b))
    return steps, msgs, n_ranks, sorted(edges, key=lambda e: (e[1], -e[0]))


def _run(
    kind: list[int], stream: list[int], succ_ptr: list[int], succ: list[int], indeg: list[int]
) -> tuple[list[int], list[tuple[int, int]]]:
    """One execution in dependency order (sends never block, a receive takes its stream's next
    message): each node's position in it and the (send, receive) pairs it matched."""
    n = len(kind)
    pos = [n] * n
    ready = deque(i for i in range(n) if indeg[i] == 0)
    queued: dict[int, deque[int]] = {}
    waiting: dict[int, deque[int]] = {}
    pairs: list[tuple[int, int]] = []
    clock = 0

    def finish(i: int) -> None:
        nonlocal clock
        pos[i] = clock
        clock += 1
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            indeg[succ[p]] -= 1
            if indeg[succ[p]] == 0:
                ready.append(succ[p])

    while ready:
        i = ready.popleft()
        if kind[i] == SEND:
            finish(i)
            w = waiting.get(stream[i])
            if w:
                r = w.popleft()
                pairs.append((i, r))
                finish(r)
            else:
                queued.setdefault(stream[i], deque()).append(i)
        elif kind[i] == RECV:
            q = queued.get(stream[i])
            if q:
                pairs.append((q.popleft(), i))
                finish(i)
            else:
                waiting.setdefault(stream[i], deque()).append(i)
        else:
            finish(i)
    return pos, pairs


def lower(trace: Trace, *, name: str | None = None) -> dict[str, Any]:
    """The MSCCL++ plan (a JSON-able dict) of any algorithm trace; see the module docstring.

    Raises
    ------
    UnsatisfiableError
        The trace cannot run to completion (the run verdict of ``etstore check``), has a
        node that is no send, receive, reduction or copy, or needs more than the executor
        holds per threadblock (16 memory channels, 16 remote buffers).
    """
    params = trace.params
    steps, msgs, n_ranks, edges = _steps(trace)
    declared = params.get("gpu_chunks") or {}
    size = {(r, b): _declared(declared, b, r) for r in range(n_ranks) for b in BUFFERS}
    local_src = {"s", "rrs", "rrc", "rrcs", "cpy", "re"}
    local_dst = {"r", "rcs", "rrc", "rrcs", "cpy", "re"}
    for st in steps:
        if st.stype in local_src:
            size[(st.rank, st.src[0])] = max(size[(st.rank, st.src[0])], st.src[1] + st.cnt)
        if st.stype in local_dst:
            size[(st.rank, st.dst[0])] = max(size[(st.rank, st.dst[0])], st.dst[1] + st.cnt)
    for m in msgs:  # a fresh scratch range per message, on its receiver, in execution order
        m.slot = size[(m.dst, "s")]
        size[(m.dst, "s")] += m.cnt
    streams: dict[int, list[tuple[int, int, int]]] = {r: [] for r in range(n_ranks)}
    for m in msgs:
        key = (m.src, m.dst, m.tag)
        for r in (m.src, m.dst):
            if key not in streams[r]:
                streams[r].append(key)
    chan: dict[tuple[int, tuple[int, int, int]], int] = {}
    peers: dict[int, list[int]] = {}
    for r in range(n_ranks):  # both ends list the streams between them in one order
        keys = sorted(streams[r], key=lambda k: (_peer_of(r, k), k))
        peers[r] = [_peer_of(r, k) for k in keys]
        for c, k in enumerate(keys):
            chan[(r, k)] = c
    remote = {r: sorted({m.dst for m in msgs if m.src == r}) for r in range(n_ranks)}
    blocks, sems = _emit(steps, msgs, edges, chan, remote)
    gpus = []
    for r in range(n_ranks):
        i_chunks, o_chunks = size[(r, "i")], size[(r, "o")]
        if not i_chunks and not o_chunks:
            i_chunks = int(params.get("nchunksperloop") or 1)
        gpus.append(
            {
                "id": r,
                "input_chunks": i_chunks,
                "output_chunks": o_chunks,
                "scratch_chunks": size[(r, "s")],
                "threadblocks": [
                    _finish_tb(trace, r, t, ops, remote[r]) for t, ops in enumerate(blocks.get(r, []))
                ],
                "channels": [{"channel_type": "memory", "connected_to": peers[r]}] if peers[r] else [],
                "remote_buffers": [
                    {"rank": b, "type": "s", "access_channel_types": ["memory"]} for b in remote[r]
                ],
                "semaphores": [{"init_value": 0} for _ in range(sems.get(r, 0))],
            }
        )
    max_bytes = int(params.get("maxBytes") or 0)
    return {
        "name": name or str(params.get("algo_name") or trace.name),
        "collective": str(params.get("collective") or "custom"),
        "protocol": "Simple",
        "inplace": bool(params.get("inplace")),
        "reuse_resources": False,
        "gpus": gpus,
        "num_threads_per_block": 1024,
        "use_double_scratch_buffer": False,
        "buffer_alignment": 16,
        "min_message_size": int(params.get("minBytes") or 0),
        "max_message_size": max_bytes if 0 < max_bytes < (1 << 63) - 1 else UINT64_MAX,
    }


def _peer_of(rank: int, stream: tuple[int, int, int]) -> int:
    return stream[1] if stream[0] == rank else stream[0]


def _declared(declared: Any, buf: str, rank: int) -> int:
    vals = declared.get(buf) if isinstance(declared, dict) else None
    return int(vals[rank]) if isinstance(vals, list) and rank < len(vals) else 0


def _emit(
    steps: list[_Step],
    msgs: list[_Msg],
    edges: list[tuple[int, int]],
    chan: dict[tuple[int, tuple[int, int, int]], int],
    remote: dict[int, list[int]],
) -> tuple[dict[int, list[list[dict[str, Any]]]], dict[int, int]]:
    """Per rank: the ops of each threadblock (with GPU-level channel and buffer references),
    and the number of device semaphores they use."""
    per_rank: dict[int, list[int]] = {}
    for st in steps:
        if st.tb not in per_rank.setdefault(st.rank, []):
            per_rank[st.rank].append(st.tb)
    for ts in per_rank.values():
        ts.sort()
    # a step waits for a step of another threadblock: one semaphore per (rank, from, to) pair,
    # released after each step some later step needs and acquired once per such need, in order
    sem_id: dict[tuple[int, int, int], int] = {}
    covered: dict[tuple[int, int, int], int] = {}
    acquire: dict[int, list[int]] = {}
    release: dict[int, list[int]] = {}
    for a, b in edges:
        key = (steps[b].rank, steps[a].tb, steps[b].tb)
        if covered.get(key, -1) >= a:
            continue  # the threadblock already waited for this step or a later one of it
        covered[key] = a
        sid = sem_id.setdefault(key, sum(1 for k in sem_id if k[0] == key[0]))
        acquire.setdefault(b, []).append(sid)
        release.setdefault(a, []).append(sid)
    blocks = {(r, t): _Tb() for r, ts in per_rank.items() for t in ts}
    for j, st in enumerate(steps):
        tb = blocks[(st.rank, st.tb)]
        if j in acquire:
            tb.block({"name": "sem_acquire", "semaphore_ids": acquire[j]})
        _step_ops(tb, st, msgs, chan, remote)
        if j in release:
            tb.sync({"name": "sem_release", "semaphore_ids": release[j]})
    sems = {r: sum(1 for k in sem_id if k[0] == r) for r in per_rank}
    out: dict[int, list[list[dict[str, Any]]]] = {}
    for r, ts in per_rank.items():
        for t in ts:
            pieces = _cut(blocks[(r, t)].ops, sems[r])
            sems[r] += len(pieces) - 1
            out.setdefault(r, []).extend(pieces)
    return out, sems


def _step_ops(
    tb: _Tb,
    st: _Step,
    msgs: list[_Msg],
    chan: dict[tuple[int, tuple[int, int, int]], int],
    remote: dict[int, list[int]],
) -> None:
    """The ops of one step (see the module docstring)."""
    n = st.cnt
    got = ("s", -1, n)  # the received message's scratch range (steps that receive)
    if st.recv >= 0:
        m = msgs[st.recv]
        tb.block(
            {"name": "wait", "_channels": [chan[(st.rank, (m.src, m.dst, m.tag))]], "channel_type": "memory"}
        )
        got = ("s", m.slot, n)
    out = None
    if st.send >= 0:
        m2 = msgs[st.send]
        out = {"_remote": remote[st.rank].index(m2.dst), "index": m2.slot, "size": n}
    src = _local(st.src, n)
    dst = _local(st.dst, n)
    t = st.stype
    if t == "s":
        tb.data(
            {"name": "put", "src_buff": [src], "dst_buff": [out], "channel_type": "memory"}, [_r(src)], []
        )
    elif t == "r":
        tb.data({"name": "copy", "src_buff": [_local(got[:2], n)], "dst_buff": [dst]}, [got], [_r(dst)])
    elif t == "cpy":
        tb.data({"name": "copy", "src_buff": [src], "dst_buff": [dst]}, [_r(src)], [_r(dst)])
    elif t == "re":
        tb.data(
            {"name": "re", "src_buff": [dst, src], "dst_buff": [dst], "reduce_op": "sum"},
            [_r(src), _r(dst)],
            [_r(dst)],
        )
    elif t == "rrc":
        tb.data(
            {"name": "re", "src_buff": [src, _local(got[:2], n)], "dst_buff": [dst], "reduce_op": "sum"},
            [_r(src), got],
            [_r(dst)],
        )
    elif t == "rcs":
        tb.data(
            {
                "name": "res",
                "src_buff": [_local(got[:2], n)],
                "dst_buff": [dst, out],
                "channel_type": "memory",
                "reduce_op": "sum",
            },
            [got],
            [_r(dst)],
        )
    elif t == "rrs":
        tmp = _local(got[:2], n)
        tb.data(
            {
                "name": "res",
                "src_buff": [tmp, src],
                "dst_buff": [tmp, out],
                "channel_type": "memory",
                "reduce_op": "sum",
            },
            [got, _r(src)],
            [got],
        )
    elif t == "rrcs":
        tb.data(
            {
                "name": "res",
                "src_buff": [src, _local(got[:2], n)],
                "dst_buff": [dst, out],
                "channel_type": "memory",
                "reduce_op": "sum",
            },
            [_r(src), got],
            [_r(dst)],
        )
    if st.send >= 0:
        m2 = msgs[st.send]
        tb.sync(
            {
                "name": "signal",
                "_channels": [chan[(st.rank, (m2.src, m2.dst, m2.tag))]],
                "channel_type": "memory",
            }
        )


def _local(where: tuple[str, int], n: int) -> dict[str, Any]:
    return {"type": where[0], "index": where[1], "size": n}


def _r(entry: dict[str, Any]) -> tuple[str, int, int]:
    return (entry["type"], entry["index"], entry["size"])


def _cut(ops: list[dict[str, Any]], first_sem: int) -> list[list[dict[str, Any]]]:
    """A threadblock's ops in pieces of at most MAX_OPERATION, each after the previous one: the
    last op of a piece releases a semaphore the next one acquires first."""
    if len(ops) <= MAX_OPERATION:
        return [ops]
    pieces: list[list[dict[str, Any]]] = []
    rest = list(ops)
    sem = first_sem
    head: list[dict[str, Any]] = []
    while rest:
        room = MAX_OPERATION - len(head) - (0 if len(rest) + len(head) <= MAX_OPERATION else 2)
        body, rest = rest[:room], rest[room:]
        piece = head + body
        if rest:
            piece += [{"name": "nop"}, {"name": "sem_release", "semaphore_ids": [sem]}]
            head = [{"name": "sem_acquire", "semaphore_ids": [sem]}, {"name": "nop"}]
            sem += 1
        pieces.append(piece)
    return pieces


def _finish_tb(
    trace: Trace, rank: int, t: int, ops: list[dict[str, Any]], remote: list[int]
) -> dict[str, Any]:
    """Threadblock-local ids for the channels and remote buffers the ops name."""
    channels: list[int] = []
    buffers: list[int] = []
    out_ops = []
    for op in ops:
        op = dict(op)
        if "_channels" in op:
            ids = []
            for c in op.pop("_channels"):
                if c not in channels:
                    channels.append(c)
                ids.append(channels.index(c))
            op = {"name": op["name"], "channel_ids": ids, **{k: v for k, v in op.items() if k != "name"}}
        if "dst_buff" in op:
            dsts = []
            for e in op["dst_buff"]:
                if "_remote" in e:
                    b = e["_remote"]
                    if b not in buffers:
                        buffers.append(b)
                    e = {"buffer_id": buffers.index(b), "index": e["index"], "size": e["size"]}
                dsts.append(e)
            op["dst_buff"] = dsts
        out_ops.append(op)
    if len(channels) > MAX_CHANNEL or len(buffers) > MAX_CHANNEL:
        raise _fail(
            trace,
            f"rank {rank} threadblock {t} uses {len(channels)} memory channels and {len(buffers)} remote "
            f"buffers; the executor holds {MAX_CHANNEL} of each per threadblock",
        )
    return {
        "id": t,
        "ops": out_ops,
        "channels": [{"channel_type": "memory", "channel_ids": channels}] if channels else [],
        "remote_buffer_refs": (
            [{"access_channel_type": "memory", "remote_buffer_ids": buffers}] if buffers else []
        ),
    }
