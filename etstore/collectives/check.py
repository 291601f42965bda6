"""Prove that an algorithm trace does what its collective promises, by symbolic execution.

Every chunk of every rank's input is a distinct symbol (one bit of a Python int); a
buffer slot holds the set of symbols reduced into it. Executing the trace's nodes in
a dependency order (receives take the n-th message of their ``(src, dst, tag)``
stream, sends never block, as in ASTRA-sim) moves and combines these sets; at the
end every output slot must hold exactly the symbols the collective defines, and no
reduction may add a symbol twice. Nodes that never become ready are a deadlock or
an unmatched receive; messages left over are unmatched sends.

The execution runs twice, once taking ready nodes first-in-first-out and once
last-in-first-out; if the final buffers differ, the result depends on timing (a
race on a buffer slot) and that is reported too.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from etstore.collective import short_name
from etstore.errors import UnsatisfiableError
from etstore.ir import (
    BUF_CODE,
    BUFFERS,
    COLLECTIVES,
    COPY,
    RECV,
    REDUCE,
    SEND,
    TYPE_CODE,
    node_semantics,
)
from etstore.model import Trace

__all__ = ["CheckReport", "check_algorithm", "ensure_valid"]

log = logging.getLogger(__name__)

_T_R, _T_RCS, _T_RRS, _T_RRC, _T_RRCS, _T_RE = (
    TYPE_CODE[t] for t in ("r", "rcs", "rrs", "rrc", "rrcs", "re")
)
_I, _O, _S = BUF_CODE["i"], BUF_CODE["o"], BUF_CODE["s"]
_ID_MASK = (1 << 40) - 1


@dataclass(frozen=True)
class CheckReport:
    """Outcome of :func:`check_algorithm`.

    ``ok`` is true when ``problems`` is empty. Counts are over the whole trace:
    ``messages`` matched send/receive pairs, ``chunks_moved`` chunks they carried,
    ``depth`` the longest chain of nodes (dependencies and messages) in the
    execution, ``modes`` the buffer layouts checked (``in-place``, ``out-of-place``).
    """

    ok: bool
    problems: list[str] = field(default_factory=list)
    collective: str = ""
    ranks: int = 0
    chunks: int = 0
    ops: int = 0
    sends: int = 0
    recvs: int = 0
    reduces: int = 0
    copies: int = 0
    messages: int = 0
    chunks_moved: int = 0
    depth: int = 0
    modes: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for people: verdict and counts."""
        head = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        return (
            f"{head}: {self.collective} on {self.ranks} ranks, {self.chunks} chunks, {self.ops} ops "
            f"({self.sends} sends, {self.recvs} recvs, {self.reduces} reduces, {self.copies} copies), "
            f"{self.messages} messages, depth {self.depth}, checked {', '.join(self.modes) or 'nothing'}"
        )


class _Problems:
    """A capped, de-duplicated list of problem strings."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.items: list[str] = []
        self.seen: set[str] = set()
        self.dropped = 0

    def add(self, text: str) -> None:
        if text in self.seen:
            return
        self.seen.add(text)
        if len(self.items) < self.cap:
            self.items.append(text)
        else:
            self.dropped += 1

    def extend(self, texts: Iterable[str]) -> None:
        for t in texts:
            self.add(t)

    def result(self) -> list[str]:
        if self.dropped:
            return [*self.items, f"... and {self.dropped} more problem(s)"]
        return list(self.items)


# ---------------------------------------------------------------- collective definitions


def _ranges(values: Iterable[int]) -> str:
    vals = sorted(set(values))
    out: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def _bits(v: int, limit: int = 1 << 30) -> list[int]:
    out = []
    while v and len(out) < limit:
        low = v & -v
        out.append(low.bit_length() - 1)
        v ^= low
    return out


def _describe(v: int | None, C: int) -> str:
    if v is None:
        return "no data"
    if v == 0:
        return "nothing"
    pairs = [(b // C, b % C) for b in _bits(v)]
    by_chunk: dict[int, list[int]] = {}
    for q, j in pairs:
        by_chunk.setdefault(j, []).append(q)
    parts = [
        f"chunk {j} of rank{'s' if len(qs) > 1 else ''} {_ranges(qs)}"
        for j, qs in sorted(by_chunk.items())[:4]
    ]
    if len(by_chunk) > 4:
        parts.append(f"{len(by_chunk) - 4} more chunk(s)")
    return "; ".join(parts)


@dataclass(frozen=True)
class _Spec:
    """Pre- and postcondition of a collective in logical buffer terms."""

    inputs: list[tuple[int, int, int, int]]  # rank, buffer, index, symbol set
    outputs: list[tuple[int, int, int, int, str]]  # rank, buffer, index, expected, what it is


def _spec(coll: str, N: int, C: int, root: int) -> _Spec:
    def bit(q: int, j: int) -> int:
        return 1 << (q * C + j)

    inputs: list[tuple[int, int, int, int]] = []
    outputs: list[tuple[int, int, int, int, str]] = []
    if coll in ("allreduce", "reduce"):
        total = [0] * C
        for q in range(N):
            for j in range(C):
                inputs.append((q, _I, j, bit(q, j)))
                total[j] |= bit(q, j)
        targets = range(N) if coll == "allreduce" else [root]
        for r in targets:
            for j in range(C):
                outputs.append((r, _O, j, total[j], f"the reduction of chunk {j} over all {N} ranks"))
    elif coll == "broadcast":
        for j in range(C):
            inputs.append((root, _I, j, bit(root, j)))
        for r in range(N):
            for j in range(C):
                outputs.append((r, _O, j, bit(root, j), f"chunk {j} of root rank {root}"))
    else:
        cf = C // N
        if coll == "allgather":
            for q in range(N):
                for j in range(cf):
                    inputs.append((q, _I, j, bit(q, q * cf + j)))
            for r in range(N):
                for q in range(N):
                    for j in range(cf):
                        outputs.append((r, _O, q * cf + j, bit(q, q * cf + j), f"chunk {j} of rank {q}"))
        elif coll == "reducescatter":
            for q in range(N):
                for j in range(C):
                    inputs.append((q, _I, j, bit(q, j)))
            for r in range(N):
                for j in range(cf):
                    c = r * cf + j
                    want = 0
                    for q in range(N):
                        want |= bit(q, c)
                    outputs.append((r, _O, j, want, f"the reduction of chunk {c} over all {N} ranks"))
        elif coll == "alltoall":
            for q in range(N):
                for j in range(C):
                    inputs.append((q, _I, j, bit(q, j)))
            for r in range(N):
                for q in range(N):
                    for j in range(cf):
                        outputs.append(
                            (r, _O, q * cf + j, bit(q, r * cf + j), f"chunk {r * cf + j} of rank {q}")
                        )
    return _Spec(inputs, outputs)


def _alias(coll: str, mode: str, rank: int, buf: int, idx: int, cf: int) -> tuple[int, int]:
    """Physical (buffer, index) of a logical slot; in-place layouts share input and output."""
    if mode == "out-of-place":
        return buf, idx
    if coll == "allgather":
        return (_O, rank * cf + idx) if buf == _I else (buf, idx)
    if coll == "reducescatter":
        return (_I, rank * cf + idx) if buf == _O else (buf, idx)
    return (_I, idx) if buf == _O else (buf, idx)


# ---------------------------------------------------------------- execution


@dataclass
class _Ctx:
    n: int
    N: int
    C: int
    coll: str
    rank: list[int]
    kind: list[int]
    stype: list[int]
    group: list[int]
    cnt: list[int]
    stream: list[int]
    succ_ptr: np.ndarray
    succ: list[int]
    indeg0: list[int]
    label: list[str]


@dataclass
class _Run:
    done: list[bool]
    slots: dict[int, Any]
    problems: list[str]
    messages: int
    moved: int
    depth: int
    waiting: dict[int, deque[int]]
    queues: dict[int, deque[tuple[tuple[Any, ...], int]]]


def _slot(rank: int, buf: int, idx: int) -> int:
    return ((rank * 3 + buf) << 32) | (idx & 0xFFFFFFFF)


def _execute(
    ctx: _Ctx,
    sb: list[int],
    so: list[int],
    db: list[int],
    do: list[int],
    init: dict[int, int],
    lifo: bool,
    cap: int,
) -> _Run:
    """Run the trace symbolically once; see the module docstring."""
    n, C = ctx.n, ctx.C
    kind, stype, group, cnt, stream, rank = ctx.kind, ctx.stype, ctx.group, ctx.cnt, ctx.stream, ctx.rank
    succ_ptr, succ, label = ctx.succ_ptr, ctx.succ, ctx.label
    indeg = list(ctx.indeg0)
    slots: dict[int, Any] = dict(init)
    temps: dict[int, tuple[Any, ...]] = {}
    queues: dict[int, deque[tuple[tuple[Any, ...], int]]] = {}
    waiting: dict[int, deque[int]] = {}
    done = [False] * n
    level = [0] * n
    problems: list[str] = []
    messages = moved = depth = 0
    ready: deque[int] = deque(i for i in range(n) if indeg[i] == 0)
    pop = ready.pop if lifo else ready.popleft

    def note(text: str) -> None:
        if len(problems) < cap:
            problems.append(text)

    def read(r: int, buf: int, off: int, k: int, who: int) -> tuple[Any, ...]:
        base = (r * 3 + buf) << 32
        vals = tuple(slots.get(base | (off + j)) for j in range(k))
        if None in vals:
            j = vals.index(None)
            note(f"rank {r} {label[who]} reads {BUFFERS[buf]}[{off + j}], which holds no data at that point")
        return vals

    def write(r: int, buf: int, off: int, vals: tuple[Any, ...]) -> None:
        base = (r * 3 + buf) << 32
        for j, v in enumerate(vals):
            slots[base | (off + j)] = v

    def combine(a: tuple[Any, ...], b: tuple[Any, ...], who: int) -> tuple[Any, ...]:
        out = []
        for x, y in zip(a, b, strict=False):
            if x is None or y is None:
                out.append(None)
                continue
            both = x & y
            if both:
                note(
                    f"rank {rank[who]} {label[who]} reduces {_describe(both & -both, C)} a second time "
                    "(a contribution would be counted twice)"
                )
            out.append(x | y)
        if len(a) != len(b):
            note(f"rank {rank[who]} {label[who]} reduces {len(a)} chunk(s) with {len(b)} chunk(s)")
        return tuple(out)

    def finish(i: int, lvl: int) -> None:
        nonlocal depth
        done[i] = True
        lvl += 1
        if lvl > depth:
            depth = lvl
        for p in range(succ_ptr[i], succ_ptr[i + 1]):
            s = succ[p]
            if lvl > level[s]:
                level[s] = lvl
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)

    def deliver(i: int, msg: tuple[Any, ...], sender: int) -> None:
        nonlocal messages, moved
        messages += 1
        moved += len(msg)
        if len(msg) != cnt[i]:
            note(
                f"rank {rank[i]} {label[i]} expects {cnt[i]} chunk(s) but the matching send "
                f"(rank {rank[sender]} {label[sender]}) carries {len(msg)}"
            )
        t = stype[i]
        if t in (_T_R, _T_RCS):
            write(rank[i], db[i], do[i], msg)
        if t != _T_R:
            temps[group[i]] = msg
        finish(i, max(level[i], level[sender] + 1))

    while ready:
        i = pop()
        k = kind[i]
        r = rank[i]
        if k == SEND:
            if stype[i] == TYPE_CODE["s"]:
                msg = read(r, sb[i], so[i], cnt[i], i)
            else:
                got = temps.get(group[i])
                if got is None:
                    note(f"rank {r} {label[i]} forwards data its step never received")
                    got = (None,) * cnt[i]
                msg = got
            st = stream[i]
            w = waiting.get(st)
            finish(i, level[i])
            if w:
                deliver(w.popleft(), msg, i)
            else:
                queues.setdefault(st, deque()).append((msg, i))
        elif k == RECV:
            st = stream[i]
            q = queues.get(st)
            if q:
                msg, sender = q.popleft()
                deliver(i, msg, sender)
            else:
                waiting.setdefault(st, deque()).append(i)
        elif k == REDUCE:
            t = stype[i]
            src = read(r, sb[i], so[i], cnt[i], i)
            if t == _T_RE:
                v = combine(read(r, db[i], do[i], cnt[i], i), src, i)
                write(r, db[i], do[i], v)
            else:
                got = temps.get(group[i])
                if got is None:
                    note(f"rank {r} {label[i]} reduces data its step never received")
                    got = (None,) * cnt[i]
                v = combine(got, src, i)
                temps[group[i]] = v
                if t != _T_RRS:
                    write(r, db[i], do[i], v)
            finish(i, level[i])
        elif k == COPY:
            write(r, db[i], do[i], read(r, sb[i], so[i], cnt[i], i))
            finish(i, level[i])
        else:
            finish(i, level[i])
    return _Run(done, slots, problems, messages, moved, depth, waiting, queues)


# ---------------------------------------------------------------- the check


def _norm_coll(params: Any) -> str:
    c = str(params.get("collective", params.get("coll", ""))).lower()
    return short_name(c) or c


def _modes(params: Any, uses_output: bool) -> tuple[str, ...]:
    inplace = params.get("inplace")
    outofplace = params.get("outofplace")
    modes = []
    if inplace:
        modes.append("in-place")
    if outofplace:
        modes.append("out-of-place")
    if not modes:
        modes.append("out-of-place" if uses_output else "in-place")
    return tuple(modes)


def _infer_root(coll: str, kind: np.ndarray, rank: np.ndarray, N: int, params: Any) -> int | None:
    if "root" in params:
        return int(params["root"])
    if coll == "broadcast":
        receivers = set(rank[kind == RECV].tolist())
        cands = [r for r in range(N) if r not in receivers]
    else:
        senders = set(rank[kind == SEND].tolist())
        cands = [r for r in range(N) if r not in senders]
    return cands[0] if len(cands) == 1 else None


def check_algorithm(trace: Trace, *, max_problems: int = 20) -> CheckReport:
    """Check that an algorithm trace delivers its collective, with no unmatched or stuck node.

    Parameters
    ----------
    trace
        An algorithm in the representation of ``docs/algorithms.md`` (from
        :func:`~etstore.ingest.msccl_xml.read_msccl_xml`, a generator, or a
        synthesizer); ``params`` must name the ``collective`` and should give
        ``ngpus``, ``nchunksperloop`` and ``inplace``/``outofplace``.
    max_problems
        At most this many problems are listed (a last line counts the rest).

    Returns
    -------
    CheckReport
        ``ok`` and the problems, each naming rank, node and buffer slot.

    Notes
    -----
    What is proven, per layout (in-place and/or out-of-place, as ``params`` say):

    * all-reduce: every rank's output chunk j holds chunk j of every rank, each
      exactly once; reduce: the same on the root;
    * all-gather: every rank's output holds every rank's input chunks in rank order;
    * reduce-scatter: rank r's output chunk j holds chunk r·k+j of every rank once;
    * all-to-all: rank r's output block q holds rank q's input block r;
    * broadcast: every rank's output equals the root's input;
    * every receive meets a send of the same size on its ``(src, dst, tag)``
      stream and every send is received; nothing waits forever.

    Cost: O(V + E) per execution, two executions per layout, with reductions on
    bitsets of N·C bits (N ranks, C chunks): O((V + E)·N·C/64) word operations.

    Examples
    --------
    >>> from etstore.collectives import generate
    >>> check_algorithm(generate("ring", coll="allreduce", ranks=4)).ok
    True
    """
    P = _Problems(max(1, max_problems))
    params = trace.params
    coll = _norm_coll(params)
    ops = trace.ops
    n = ops.num_rows
    rank = ops["rank"].to_numpy().astype(np.int64)
    N = int(params.get("ngpus") or (int(rank.max()) + 1 if n else 0))
    tcc = pc.max(ops["total_chunk_cnt"]).as_py() if n else None
    C = int(params.get("nchunksperloop") or tcc or 0)
    base = {"collective": coll, "ranks": N, "chunks": C, "ops": n}
    if coll not in COLLECTIVES:
        P.add(
            f"cannot check collective {coll!r}: params['collective'] must be one of {', '.join(COLLECTIVES)}"
        )
        return CheckReport(ok=False, problems=P.result(), **base)
    if N < 1 or C < 1:
        P.add("cannot check: params must give ngpus and nchunksperloop (or nodes must carry total_chunk_cnt)")
        return CheckReport(ok=False, problems=P.result(), **base)
    if coll in ("allgather", "reducescatter", "alltoall") and C % N:
        P.add(f"nchunksperloop={C} is not a multiple of ngpus={N}, as {coll} requires")
        return CheckReport(ok=False, problems=P.result(), **base)
    sem = node_semantics(trace)
    P.extend(sem.issues)
    kind = sem.kind
    ids = ops["id"].to_numpy().astype(np.int64)
    names = ops["name"].to_pylist()
    label = [f"{nm or 'node'} (id {i})" for nm, i in zip(names, ids.tolist(), strict=True)]
    counts = {k: int((kind == k).sum()) for k in (SEND, RECV, REDUCE, COPY)}
    base.update(sends=counts[SEND], recvs=counts[RECV], reduces=counts[REDUCE], copies=counts[COPY])

    bad_rank = np.flatnonzero((rank < 0) | (rank >= N))
    for i in bad_rank[:3].tolist():
        P.add(f"rank {rank[i]} {label[i]}: rank outside 0..{N - 1}")
    if trace.num_missing:
        m = trace.missing.slice(0, 1).to_pylist()[0]
        P.add(
            f"{trace.num_missing} dependencies point to absent nodes, e.g. rank {m['rank']} node {m['dst']} "
            f"waits for node {m['src']}"
        )
    # peers and streams
    csrc = pc.fill_null(ops["comm_src"], -1).to_numpy().astype(np.int64)
    cdst = pc.fill_null(ops["comm_dst"], -1).to_numpy().astype(np.int64)
    tag = pc.fill_null(ops["comm_tag"], 0).to_numpy().astype(np.int64)
    is_send, is_recv = kind == SEND, kind == RECV
    for mask, peer, what in ((is_send, cdst, "comm_dst"), (is_recv, csrc, "comm_src")):
        bad = np.flatnonzero(mask & ((peer < 0) | (peer >= N) | (peer == rank)))
        for i in bad[:3].tolist():
            P.add(f"rank {rank[i]} {label[i]}: {what}={peer[i]} is not another rank in 0..{N - 1}")
    bad = np.flatnonzero(
        (kind >= 0)
        & (
            (sem.cnt < 1)
            | ((sem.srcoff < 0) & (kind != RECV))
            | ((sem.dstoff < 0) & ((kind == RECV) | (kind == COPY)))
        )
    )
    for i in bad[:3].tolist():
        P.add(f"rank {rank[i]} {label[i]}: needs msg_chunk_cnt >= 1 and chunk offsets >= 0")
    if P.items:
        return CheckReport(ok=False, problems=P.result(), **base)
    src_rank = np.where(is_send, rank, csrc)
    dst_rank = np.where(is_send, cdst, rank)
    stream = np.where(is_send | is_recv, ((src_rank * N + dst_rank) << 32) | (tag & 0xFFFFFFFF), -1)
    sends_per = Counter(stream[is_send].tolist())
    recvs_per = Counter(stream[is_recv].tolist())
    for st in sorted(set(sends_per) | set(recvs_per)):
        s_n, r_n = sends_per.get(st, 0), recvs_per.get(st, 0)
        if s_n == r_n:
            continue
        a, b, t = (st >> 32) // N, (st >> 32) % N, st & 0xFFFFFFFF
        if r_n > s_n:
            rows = np.flatnonzero(is_recv & (stream == st))
            i = int(rows[s_n])
            P.add(
                f"rank {b} {label[i]} has no matching send: rank {b} posts {r_n} receive(s) from rank {a} "
                f"on tag {t}, but rank {a} sends {s_n}"
            )
        else:
            rows = np.flatnonzero(is_send & (stream == st))
            i = int(rows[r_n])
            P.add(
                f"rank {a} {label[i]} is never received: rank {a} sends {s_n} message(s) to rank {b} "
                f"on tag {t}, "
                f"but rank {b} posts {r_n} receive(s)"
            )
    # one threadblock per (peer, channel), as MSCCL connections require
    tbv = ops["tb_id"]
    if tbv.null_count < n:
        tb = pc.fill_null(tbv, -1).to_numpy().astype(np.int64)
        for mask, peer, what in ((is_send, cdst, "send to"), (is_recv, csrc, "receive from")):
            seen: dict[tuple[int, int, int], int] = {}
            rows = np.flatnonzero(mask & (tb >= 0))
            for r_, p_, t_, b_ in zip(
                rank[rows].tolist(), peer[rows].tolist(), tag[rows].tolist(), tb[rows].tolist(), strict=True
            ):
                other = seen.setdefault((r_, p_, t_), b_)
                if other != b_:
                    P.add(
                        f"rank {r_}: threadblocks {other} and {b_} both {what} rank {p_} on channel {t_}; "
                        "message order between them is undefined (one threadblock per peer and channel)"
                    )
    # dependencies
    key = (rank << 40) | ids
    order = np.argsort(key, kind="stable")
    skey = key[order]
    dep = trace.deps
    drank = dep["rank"].to_numpy().astype(np.int64)
    dsrc = (drank << 40) | dep["src"].to_numpy().astype(np.int64)
    ddst = (drank << 40) | dep["dst"].to_numpy().astype(np.int64)
    ps = np.minimum(np.searchsorted(skey, dsrc), max(n - 1, 0))
    pd = np.minimum(np.searchsorted(skey, ddst), max(n - 1, 0))
    ok_edge = (skey[ps] == dsrc) & (skey[pd] == ddst) if n else np.zeros(0, bool)
    if not ok_edge.all():
        j = int(np.flatnonzero(~ok_edge)[0])
        P.add(
            f"dependency rank {int(drank[j])} {int(dsrc[j] & _ID_MASK)} → {int(ddst[j] & _ID_MASK)}"
            " names a node that does not exist"
        )
    srow, drow = order[ps[ok_edge]], order[pd[ok_edge]]
    e_order = np.argsort(srow, kind="stable")
    succ = drow[e_order].tolist()
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(srow, minlength=n), out=succ_ptr[1:])
    indeg0 = np.bincount(drow, minlength=n).tolist()
    uses_output = bool(((sem.srcbuf == _O) | (sem.dstbuf == _O))[kind >= 0].any())
    modes = _modes(params, uses_output)
    root = 0
    if coll in ("broadcast", "reduce"):
        got = _infer_root(coll, kind, rank, N, params)
        if got is None:
            P.add(f"cannot tell the root of this {coll}: set params['root']")
            return CheckReport(ok=False, problems=P.result(), modes=modes, **base)
        root = got
    ctx = _Ctx(
        n=n,
        N=N,
        C=C,
        coll=coll,
        rank=rank.tolist(),
        kind=kind.tolist(),
        stype=sem.stype.tolist(),
        group=sem.group.tolist(),
        cnt=sem.cnt.tolist(),
        stream=stream.tolist(),
        succ_ptr=succ_ptr,
        succ=succ,
        indeg0=indeg0,
        label=label,
    )
    spec = _spec(coll, N, C, root)
    cf = C // N if coll in ("allgather", "reducescatter", "alltoall") else C
    stats: dict[str, int] = {}
    stuck_reported = False
    for mode in modes:

        def phys(buf: np.ndarray, off: np.ndarray, mode: str = mode) -> tuple[list[int], list[int]]:
            if mode == "out-of-place":
                return buf.tolist(), off.tolist()
            b, o = buf.copy(), off.copy()
            if coll == "allgather":
                m = b == _I
                b[m], o[m] = _O, rank[m] * cf + off[m]
            elif coll == "reducescatter":
                m = b == _O
                b[m], o[m] = _I, rank[m] * cf + off[m]
            else:
                b[b == _O] = _I
            return b.tolist(), o.tolist()

        sb, so = phys(sem.srcbuf, sem.srcoff)
        db, do = phys(sem.dstbuf, sem.dstoff)
        init = {}
        for r_, b_, j_, v_ in spec.inputs:
            pb, pj = _alias(coll, mode, r_, b_, j_, cf)
            init[_slot(r_, pb, pj)] = v_
        runs = [_execute(ctx, sb, so, db, do, init, lifo, P.cap) for lifo in (False, True)]
        first = runs[0]
        for run in runs:
            P.extend(f"{mode}: {p}" if len(modes) > 1 else p for p in run.problems)
        if not stats:
            stats = {"messages": first.messages, "chunks_moved": first.moved, "depth": first.depth}
        if not all(first.done):
            if not stuck_reported:
                _explain_stuck(ctx, first, P)
                stuck_reported = True
            continue
        prefix = f"{mode}: " if len(modes) > 1 else ""
        bad_out = 0
        for r_, b_, j_, want, what in spec.outputs:
            pb, pj = _alias(coll, mode, r_, b_, j_, cf)
            got = first.slots.get(_slot(r_, pb, pj))
            if got != want:
                bad_out += 1
                if bad_out <= 5:
                    detail = ""
                    if got is not None:
                        missing, extra = want & ~got, got & ~want
                        if missing:
                            detail += f"; missing {_describe(missing, C)}"
                        if extra:
                            detail += f"; unexpected {_describe(extra, C)}"
                    P.add(
                        f"{prefix}rank {r_} output {BUFFERS[pb]}[{pj}] should hold {what} but holds "
                        f"{_describe(got, C)}{detail}"
                    )
        if bad_out > 5:
            P.add(f"{prefix}{bad_out - 5} more output chunk(s) are wrong")
        other = runs[1]
        if all(other.done):
            for r_, b_, j_, _want, _what in spec.outputs:
                pb, pj = _alias(coll, mode, r_, b_, j_, cf)
                k_ = _slot(r_, pb, pj)
                if first.slots.get(k_) != other.slots.get(k_):
                    P.add(
                        f"{prefix}rank {r_} output {BUFFERS[pb]}[{pj}] depends on execution order "
                        f"({_describe(first.slots.get(k_), C)} in one order, "
                        f"{_describe(other.slots.get(k_), C)} in another): unordered accesses race on it"
                    )
                    break
    problems = P.result()
    return CheckReport(ok=not problems, problems=problems, modes=modes, **base, **stats)


def _explain_stuck(ctx: _Ctx, run: _Run, P: _Problems) -> None:
    """Report the nodes that never ran, with a wait-for cycle when there is one."""
    n = ctx.n
    stuck = [i for i in range(n) if not run.done[i]]
    preds: dict[int, list[int]] = {}
    for i in range(n):
        for p in range(ctx.succ_ptr[i], ctx.succ_ptr[i + 1]):
            s = ctx.succ[p]
            if not run.done[s] and not run.done[i]:
                preds.setdefault(s, []).append(i)
    # a posted receive waits for the first send of its stream that has not run
    pending_send: dict[int, int] = {}
    for i in stuck:
        if ctx.kind[i] == SEND:
            pending_send.setdefault(ctx.stream[i], i)
    waits: dict[int, list[int]] = {}
    for i in stuck:
        w = list(preds.get(i, []))
        if ctx.kind[i] == RECV and not w and ctx.stream[i] in pending_send:
            w.append(pending_send[ctx.stream[i]])
        waits[i] = w
    # find a cycle by walking the first wait edge
    color: dict[int, int] = {}
    cycle: list[int] = []
    for startn in stuck:
        if cycle or color.get(startn):
            continue
        path = [startn]
        color[startn] = 1
        it = [iter(waits[startn])]
        while it and not cycle:
            nxt = next(it[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                it.pop()
                continue
            c = color.get(nxt, 0)
            if c == 1:
                cycle = path[path.index(nxt) :]
            elif c == 0:
                color[nxt] = 1
                path.append(nxt)
                it.append(iter(waits.get(nxt, [])))

    def who(i: int) -> str:
        return f"rank {ctx.rank[i]} {ctx.label[i]}"

    if cycle:
        text = " → ".join(who(i) for i in cycle[:8]) + (" → ..." if len(cycle) > 8 else "")
        P.add(f"deadlock: {text} → {who(cycle[0])} (each waits for the next)")
    roots = [i for i in stuck if not waits[i]]
    for i in roots[:3]:
        if ctx.kind[i] == RECV:
            P.add(f"{who(i)} waits forever: no send on its stream ever runs")
    P.add(f"{len(stuck)} of {n} nodes never run, first {who(stuck[0])}")


def ensure_valid(trace: Trace) -> CheckReport:
    """:func:`check_algorithm`, raising when the algorithm is wrong.

    Raises
    ------
    UnsatisfiableError
        The algorithm fails the check; the message names the trace and lists the
        first problems (rank, node, buffer slot).

    Notes
    -----
    Same cost as :func:`check_algorithm`.
    """
    report = check_algorithm(trace)
    if not report.ok:
        shown = "; ".join(report.problems[:5])
        more = f" (+{len(report.problems) - 5} more)" if len(report.problems) > 5 else ""
        raise UnsatisfiableError(
            f"algorithm {trace.name!r} does not implement {report.collective or 'its collective'}: "
            f"{shown}{more}"
        )
    return report
