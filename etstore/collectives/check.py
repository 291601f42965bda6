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
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import short_name
from etstore.collectives._postcondition import Spec, alias, describe, spec
from etstore.collectives._symbolic import Ctx, Run, execute, explain_stuck, slot
from etstore.errors import UnsatisfiableError
from etstore.ir import BUF_CODE, BUFFERS, COLLECTIVES, COPY, RECV, REDUCE, SEND, NodeSemantics, node_semantics
from etstore.model import Trace

__all__ = ["CheckReport", "check_algorithm", "ensure_valid"]

log = logging.getLogger(__name__)

_I, _O = BUF_CODE["i"], BUF_CODE["o"]
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
    base: dict[str, Any] = {"collective": coll, "ranks": N, "chunks": C, "ops": n}
    refusal = _refusal(coll, N, C)
    if refusal:
        P.add(refusal)
        return CheckReport(ok=False, problems=P.result(), **base)
    sem = node_semantics(trace)
    P.extend(sem.issues)
    kind = sem.kind
    ids = ops["id"].to_numpy().astype(np.int64)
    label = [f"{nm or 'node'} (id {i})" for nm, i in zip(ops["name"].to_pylist(), ids.tolist(), strict=True)]
    counts = {k: int((kind == k).sum()) for k in (SEND, RECV, REDUCE, COPY)}
    base.update(sends=counts[SEND], recvs=counts[RECV], reduces=counts[REDUCE], copies=counts[COPY])
    csrc = pc.fill_null(ops["comm_src"], -1).to_numpy().astype(np.int64)
    cdst = pc.fill_null(ops["comm_dst"], -1).to_numpy().astype(np.int64)
    tag = pc.fill_null(ops["comm_tag"], 0).to_numpy().astype(np.int64)
    P.extend(_node_problems(trace, sem, rank, csrc, cdst, N, label))
    if P.items:
        return CheckReport(ok=False, problems=P.result(), **base)
    stream = _streams(kind, rank, csrc, cdst, tag, N)
    P.extend(_unmatched(kind, stream, N, label))
    P.extend(_shared_connections(ops, kind, rank, csrc, cdst, tag))
    succ_ptr, succ, indeg0 = _successors(trace, rank, ids, P)
    uses_output = bool(((sem.srcbuf == _O) | (sem.dstbuf == _O))[kind >= 0].any())
    modes = _modes(params, uses_output)
    root = 0
    if coll in ("broadcast", "reduce"):
        got = _infer_root(coll, kind, rank, N, params)
        if got is None:
            P.add(f"cannot tell the root of this {coll}: set params['root']")
            return CheckReport(ok=False, problems=P.result(), modes=modes, **base)
        root = got
    ctx = Ctx(
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
    want = spec(coll, N, C, root)
    stats: dict[str, Any] = {}
    stuck_reported = False
    for mode in modes:
        first = _check_layout(ctx, sem, want, mode, len(modes) > 1, P, explain=not stuck_reported)
        if not stats:
            stats = {"messages": first.messages, "chunks_moved": first.moved, "depth": first.depth}
        stuck_reported = stuck_reported or not all(first.done)
    problems = P.result()
    return CheckReport(ok=not problems, problems=problems, modes=modes, **base, **stats)


def _refusal(coll: str, N: int, C: int) -> str:
    """Why the trace cannot be checked at all (unknown collective, no sizes), or ``""``."""
    if coll not in COLLECTIVES:
        return (
            f"cannot check collective {coll!r}: params['collective'] must be one of {', '.join(COLLECTIVES)}"
        )
    if N < 1 or C < 1:
        return "cannot check: params must give ngpus and nchunksperloop (or nodes must carry total_chunk_cnt)"
    if coll in ("allgather", "reducescatter", "alltoall") and C % N:
        return f"nchunksperloop={C} is not a multiple of ngpus={N}, as {coll} requires"
    return ""


def _node_problems(
    trace: Trace,
    sem: NodeSemantics,
    rank: np.ndarray,
    csrc: np.ndarray,
    cdst: np.ndarray,
    N: int,
    label: list[str],
) -> list[str]:
    """Ranks, peers and chunk offsets out of range, and dependencies on absent nodes."""
    out: list[str] = []
    kind = sem.kind
    bad_rank = np.flatnonzero((rank < 0) | (rank >= N))
    for i in bad_rank[:3].tolist():
        out.append(f"rank {rank[i]} {label[i]}: rank outside 0..{N - 1}")
    if trace.num_missing:
        m = trace.missing.slice(0, 1).to_pylist()[0]
        out.append(
            f"{trace.num_missing} dependencies point to absent nodes, e.g. rank {m['rank']} node {m['dst']} "
            f"waits for node {m['src']}"
        )
    for mask, peer, what in ((kind == SEND, cdst, "comm_dst"), (kind == RECV, csrc, "comm_src")):
        bad = np.flatnonzero(mask & ((peer < 0) | (peer >= N) | (peer == rank)))
        for i in bad[:3].tolist():
            out.append(f"rank {rank[i]} {label[i]}: {what}={peer[i]} is not another rank in 0..{N - 1}")
    bad = np.flatnonzero(
        (kind >= 0)
        & (
            (sem.cnt < 1)
            | ((sem.srcoff < 0) & (kind != RECV))
            | ((sem.dstoff < 0) & ((kind == RECV) | (kind == COPY)))
        )
    )
    for i in bad[:3].tolist():
        out.append(f"rank {rank[i]} {label[i]}: needs msg_chunk_cnt >= 1 and chunk offsets >= 0")
    return out


def _streams(
    kind: np.ndarray, rank: np.ndarray, csrc: np.ndarray, cdst: np.ndarray, tag: np.ndarray, N: int
) -> np.ndarray:
    """Per node: its ``(src, dst, tag)`` message stream as one int (-1 for non-messages)."""
    is_send, is_recv = kind == SEND, kind == RECV
    src_rank = np.where(is_send, rank, csrc)
    dst_rank = np.where(is_send, cdst, rank)
    return np.where(is_send | is_recv, ((src_rank * N + dst_rank) << 32) | (tag & 0xFFFFFFFF), -1)


def _unmatched(kind: np.ndarray, stream: np.ndarray, N: int, label: list[str]) -> list[str]:
    """Streams with more receives than sends (or the reverse), naming the first node left over."""
    out: list[str] = []
    is_send, is_recv = kind == SEND, kind == RECV
    sends_per = Counter(stream[is_send].tolist())
    recvs_per = Counter(stream[is_recv].tolist())
    for st in sorted(set(sends_per) | set(recvs_per)):
        s_n, r_n = sends_per.get(st, 0), recvs_per.get(st, 0)
        if s_n == r_n:
            continue
        a, b, t = (st >> 32) // N, (st >> 32) % N, st & 0xFFFFFFFF
        if r_n > s_n:
            i = int(np.flatnonzero(is_recv & (stream == st))[s_n])
            out.append(
                f"rank {b} {label[i]} has no matching send: rank {b} posts {r_n} receive(s) from rank {a} "
                f"on tag {t}, but rank {a} sends {s_n}"
            )
        else:
            i = int(np.flatnonzero(is_send & (stream == st))[r_n])
            out.append(
                f"rank {a} {label[i]} is never received: rank {a} sends {s_n} message(s) to rank {b} "
                f"on tag {t}, but rank {b} posts {r_n} receive(s)"
            )
    return out


def _shared_connections(
    ops: pa.Table, kind: np.ndarray, rank: np.ndarray, csrc: np.ndarray, cdst: np.ndarray, tag: np.ndarray
) -> list[str]:
    """Two threadblocks on one (peer, channel) connection: MSCCL needs one per peer and channel."""
    out: list[str] = []
    tbv = ops["tb_id"]
    if tbv.null_count >= ops.num_rows:
        return out
    tb = pc.fill_null(tbv, -1).to_numpy().astype(np.int64)
    for mask, peer, what in ((kind == SEND, cdst, "send to"), (kind == RECV, csrc, "receive from")):
        seen: dict[tuple[int, int, int], int] = {}
        rows = np.flatnonzero(mask & (tb >= 0))
        for r_, p_, t_, b_ in zip(
            rank[rows].tolist(), peer[rows].tolist(), tag[rows].tolist(), tb[rows].tolist(), strict=True
        ):
            first_tb = seen.setdefault((r_, p_, t_), b_)
            if first_tb != b_:
                out.append(
                    f"rank {r_}: threadblocks {first_tb} and {b_} both {what} rank {p_} on channel {t_}; "
                    "message order between them is undefined (one threadblock per peer and channel)"
                )
    return out


def _successors(
    trace: Trace, rank: np.ndarray, ids: np.ndarray, P: _Problems
) -> tuple[np.ndarray, list[int], list[int]]:
    """The dependency graph as CSR over node rows: (successor offsets, successors, in-degrees)."""
    n = len(rank)
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
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(srow, minlength=n), out=succ_ptr[1:])
    return succ_ptr, drow[e_order].tolist(), np.bincount(drow, minlength=n).tolist()


def _physical(
    coll: str, mode: str, rank: np.ndarray, buf: np.ndarray, off: np.ndarray, cf: int
) -> tuple[list[int], list[int]]:
    """Per node: the physical (buffer, offset) of a logical one in ``mode`` (see :func:`alias`)."""
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


def _check_layout(
    ctx: Ctx, sem: NodeSemantics, want: Spec, mode: str, several: bool, P: _Problems, *, explain: bool
) -> Run:
    """Execute in one buffer layout, FIFO and LIFO; check outputs and order-dependence.

    Returns the FIFO run (its counts go into the report).
    """
    coll, C = ctx.coll, ctx.C
    cf = C // ctx.N if coll in ("allgather", "reducescatter", "alltoall") else C
    rank = np.asarray(ctx.rank, dtype=np.int64)
    sb, so = _physical(coll, mode, rank, sem.srcbuf, sem.srcoff, cf)
    db, do = _physical(coll, mode, rank, sem.dstbuf, sem.dstoff, cf)
    init = {}
    for r_, b_, j_, v_ in want.inputs:
        pb, pj = alias(coll, mode, r_, b_, j_, cf)
        init[slot(r_, pb, pj)] = v_
    runs = [execute(ctx, sb, so, db, do, init, lifo, P.cap) for lifo in (False, True)]
    first, second = runs
    for run in runs:
        P.extend(f"{mode}: {p}" if several else p for p in run.problems)
    if not all(first.done):
        if explain:
            P.extend(explain_stuck(ctx, first))
        return first
    prefix = f"{mode}: " if several else ""
    bad_out = 0
    for r_, b_, j_, expected, what in want.outputs:
        pb, pj = alias(coll, mode, r_, b_, j_, cf)
        got = first.slots.get(slot(r_, pb, pj))
        if got == expected:
            continue
        bad_out += 1
        if bad_out <= 5:
            detail = ""
            if got is not None:
                missing, extra = expected & ~got, got & ~expected
                if missing:
                    detail += f"; missing {describe(missing, C)}"
                if extra:
                    detail += f"; unexpected {describe(extra, C)}"
            P.add(
                f"{prefix}rank {r_} output {BUFFERS[pb]}[{pj}] should hold {what} but holds "
                f"{describe(got, C)}{detail}"
            )
    if bad_out > 5:
        P.add(f"{prefix}{bad_out - 5} more output chunk(s) are wrong")
    if all(second.done):
        for r_, b_, j_, _want, _what in want.outputs:
            pb, pj = alias(coll, mode, r_, b_, j_, cf)
            k_ = slot(r_, pb, pj)
            if first.slots.get(k_) != second.slots.get(k_):
                P.add(
                    f"{prefix}rank {r_} output {BUFFERS[pb]}[{pj}] depends on execution order "
                    f"({describe(first.slots.get(k_), C)} in one order, "
                    f"{describe(second.slots.get(k_), C)} in another): unordered accesses race on it"
                )
                break
    return first


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
