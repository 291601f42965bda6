"""Prove that an algorithm trace does what its collective promises, by symbolic execution.

First the verdict every consumer shares, :func:`etstore.ir.run_verdict`: does the
algorithm run to completion as MSCCL runs it (every message matched on its
``(src, dst, tag)`` stream, one threadblock per connection, no deadlock)? Its problems
come first in the report, a deadlock or hang before anything else, in the same words
the MSCCL-IR writer and the simulator use.

Then what it computes: every chunk of every rank's input is a distinct symbol (one bit
of a Python int); a buffer slot holds the set of symbols reduced into it. Executing the
trace's nodes in a dependency order (receives take the n-th message of their stream,
sends never block, as in ASTRA-sim) moves and combines these sets; at the end every
output slot must hold exactly the symbols the collective defines, and no reduction may
add a symbol twice. A collective without a postcondition here (MSCCL's ``custom``,
RCCL's ``gather``/``scatter``/``send``/``recv``/``alltoallv``, any other name) gets the
verdict and the execution without the postcondition, and the report says so.

The execution runs twice, once taking ready nodes first-in-first-out and once
last-in-first-out; if the final buffers differ, the result depends on timing (a
race on a buffer slot) and that is reported too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from etstore.algorithms._postcondition import Spec, alias, describe, spec
from etstore.algorithms._symbolic import Ctx, Run, execute, slot
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
    NodeSemantics,
    node_semantics,
    run_verdict,
)
from etstore.ir.verdict import dependency_csr, message_streams, node_labels
from etstore.model import Trace

__all__ = ["CheckReport", "check_algorithm", "ensure_valid"]

log = logging.getLogger(__name__)

_I, _O = BUF_CODE["i"], BUF_CODE["o"]
AS_WRITTEN = "as written"
"""The layout checked for a collective without a postcondition: buffers as the nodes name them."""


@dataclass(frozen=True)
class CheckReport:
    """Outcome of :func:`check_algorithm`.

    ``ok`` is true when ``problems`` is empty; ``verdict`` is the first problem (``"ok"``
    without one), a deadlock or hang first. ``hang`` says why the algorithm cannot run
    to completion as MSCCL runs it ("" when it can): the headline of
    :func:`etstore.ir.run_verdict`, a deadlock with its wait-for cycle, a receive that
    waits forever, a send never received, two threadblocks on one connection, a message
    whose ends disagree on its size. ``checked`` is false
    when the check could not start (no collective, no sizes, no root): ``problems[0]``
    says why, and only the run verdict follows. ``postcondition`` is false when the
    collective has none here (``custom`` and other names; see :func:`check_algorithm`).
    Counts are over the whole trace: ``messages`` matched send/receive pairs,
    ``chunks_moved`` chunks they carried, ``depth`` the longest chain of nodes
    (dependencies and messages) in the execution, ``modes`` the buffer layouts checked
    (``in-place``, ``out-of-place``, or ``as written`` without a postcondition).
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
    checked: bool = True
    postcondition: bool = True
    hang: str = ""

    @property
    def verdict(self) -> str:
        """``"ok"``, or the most serious problem: the words check, export and the simulator share."""
        return self.problems[0] if self.problems else "ok"

    def summary(self) -> str:
        """One line for people: verdict and counts."""
        head = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        if self.hang:
            head += ", cannot run to completion"
        what = ", ".join(self.modes) or "nothing"
        if self.checked and not self.postcondition:
            what += f" (no postcondition for {self.collective!r}: matched messages and no deadlock only)"
        return (
            f"{head}: {self.collective} on {self.ranks} ranks, {self.chunks} chunks, {self.ops} ops "
            f"({self.sends} sends, {self.recvs} recvs, {self.reduces} reduces, {self.copies} copies), "
            f"{self.messages} messages, depth {self.depth}, checked {what}"
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

    def extend(self, texts: Iterable[str], more: int = 0) -> None:
        """Add ``texts``; ``more`` counts problems the caller already left off."""
        for t in texts:
            self.add(t)
        self.dropped += more

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
        :func:`~etstore.formats.msccl_xml.read_msccl_xml`, a generator, or a
        synthesizer); ``params`` must name the ``collective`` and should give
        ``ngpus``, ``nchunksperloop`` and ``inplace``/``outofplace``.
    max_problems
        At most this many problems are listed (a last line counts the rest).

    Returns
    -------
    CheckReport
        ``ok`` and the problems, each naming rank, node and buffer slot; the first
        (``verdict``) is a deadlock or hang when there is one (``hang``).

    Notes
    -----
    What is proven, for every collective: the run verdict of
    :func:`etstore.ir.run_verdict` (every receive meets a send on its ``(src, dst,
    tag)`` stream and every send is received, with the same chunk count; one
    threadblock per peer and channel; nothing waits forever, a deadlock named with its
    wait-for cycle), no read of a slot that holds no data and no contribution reduced
    twice. Then, per layout (in-place and/or out-of-place, as ``params`` say):

    * all-reduce: every rank's output chunk j holds chunk j of every rank, each
      exactly once; reduce: the same on the root;
    * all-gather: every rank's output holds every rank's input chunks in rank order;
    * reduce-scatter: rank r's output chunk j holds chunk r·k+j of every rank once;
    * all-to-all: rank r's output block q holds rank q's input block r;
    * broadcast: every rank's output equals the root's input.

    A collective with no postcondition here (``custom`` from msccl-tools, RCCL's
    ``gather``, ``scatter``, ``send``, ``recv``, ``alltoallv``, any other name) is
    executed once with its buffers as written: every input slot (``i``, as many as
    ``params["gpu_chunks"]`` declare) holds its own symbol and other slots start
    empty (reading one is no problem there); ``postcondition`` is false and the
    summary says so.

    Cost: O(V + E) per execution, two executions per layout, with reductions on
    bitsets of N·C bits (N ranks, C chunks): O((V + E)·N·C/64) word operations.

    Examples
    --------
    >>> from etstore.algorithms import generate
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
    sem = node_semantics(trace)
    kind = sem.kind
    counts = {k: int((kind == k).sum()) for k in (SEND, RECV, REDUCE, COPY)}
    base.update(sends=counts[SEND], recvs=counts[RECV], reduces=counts[REDUCE], copies=counts[COPY])
    verdict = run_verdict(trace, sem=sem, ranks=N, max_problems=P.cap) if N >= 1 else None
    base["hang"] = "" if verdict is None or verdict.ok else verdict.headline
    refusal = _refusal(coll, N, C)
    if refusal:
        P.add(refusal)
        if verdict is not None:
            P.extend(verdict.problems, verdict.more)
        return CheckReport(ok=False, problems=P.result(), checked=False, postcondition=False, **base)
    assert verdict is not None  # N >= 1 past the refusal
    postcondition = coll in COLLECTIVES
    base["postcondition"] = postcondition
    P.extend(verdict.problems, verdict.more)
    P.extend(sem.issues)
    label = node_labels(ops)
    chunk_problems = _chunk_problems(sem, rank, label)
    P.extend(chunk_problems)
    if not verdict.ran or sem.issues or chunk_problems:
        return CheckReport(ok=False, problems=P.result(), **base)
    ids = ops["id"].to_numpy().astype(np.int64)
    csrc = pc.fill_null(ops["comm_src"], -1).to_numpy().astype(np.int64)
    cdst = pc.fill_null(ops["comm_dst"], -1).to_numpy().astype(np.int64)
    tag = pc.fill_null(ops["comm_tag"], 0).to_numpy().astype(np.int64)
    stream = message_streams(kind, rank, csrc, cdst, tag, N)
    succ_ptr, succ, indeg0, _ = dependency_csr(trace, rank, ids)  # a dangling edge is in the verdict
    uses_output = bool(((sem.srcbuf == _O) | (sem.dstbuf == _O))[kind >= 0].any())
    modes = _modes(params, uses_output) if postcondition else (AS_WRITTEN,)
    root = 0
    if coll in ("broadcast", "reduce"):
        got = _infer_root(coll, kind, rank, N, params)
        if got is None:
            P.add(f"cannot tell the root of this {coll}: set params['root']")
            base["postcondition"] = False
            return CheckReport(ok=False, problems=P.result(), modes=modes, checked=False, **base)
        root = got
    want, symbols = (spec(coll, N, C, root), C) if postcondition else _inputs_only(params, N, C)
    ctx = Ctx(
        n=n,
        N=N,
        C=symbols,
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
        lenient=not postcondition,
    )
    stats: dict[str, Any] = {}
    for mode in modes:
        first = _check_layout(ctx, sem, want, mode, len(modes) > 1, P)
        if not stats:
            stats = {"messages": first.messages, "chunks_moved": first.moved, "depth": first.depth}
    problems = P.result()
    return CheckReport(ok=not problems, problems=problems, modes=modes, **base, **stats)


def _refusal(coll: str, N: int, C: int) -> str:
    """Why the trace cannot be checked at all (no collective, no sizes), or ``""``."""
    if not coll:
        return (
            "cannot check: params['collective'] names no collective (one of "
            f"{', '.join(COLLECTIVES)}, or any other name for a check without postcondition)"
        )
    if N < 1 or C < 1:
        return "cannot check: params must give ngpus and nchunksperloop (or nodes must carry total_chunk_cnt)"
    if coll in ("allgather", "reducescatter", "alltoall") and C % N:
        return f"nchunksperloop={C} is not a multiple of ngpus={N}, as {coll} requires"
    return ""


def _inputs_only(params: Any, N: int, C: int) -> tuple[Spec, int]:
    """A collective without postcondition: rank q's input chunk j is a symbol, nothing is expected.

    Returns the spec and the symbols per rank (the largest input buffer, at least C).
    """
    declared = (params.get("gpu_chunks") or {}).get("i") or []
    sizes = [int(declared[q]) if q < len(declared) else C for q in range(N)]
    per_rank = max([C, *sizes])
    inputs = [(q, _I, j, 1 << (q * per_rank + j)) for q in range(N) for j in range(sizes[q])]
    return Spec(inputs, []), per_rank


def _chunk_problems(sem: NodeSemantics, rank: np.ndarray, label: list[str]) -> list[str]:
    """Nodes that move no chunk or name a negative chunk offset."""
    kind = sem.kind
    bad = np.flatnonzero(
        (kind >= 0)
        & (
            (sem.cnt < 1)
            | ((sem.srcoff < 0) & (kind != RECV))
            | ((sem.dstoff < 0) & ((kind == RECV) | (kind == COPY)))
        )
    )
    return [
        f"rank {rank[i]} {label[i]}: needs msg_chunk_cnt >= 1 and chunk offsets >= 0"
        for i in bad[:3].tolist()
    ]


def _physical(
    coll: str, mode: str, rank: np.ndarray, buf: np.ndarray, off: np.ndarray, cf: int
) -> tuple[list[int], list[int]]:
    """Per node: the physical (buffer, offset) of a logical one in ``mode`` (see :func:`alias`)."""
    if mode != "in-place":
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


def _check_layout(ctx: Ctx, sem: NodeSemantics, want: Spec, mode: str, several: bool, P: _Problems) -> Run:
    """Execute in one buffer layout, FIFO and LIFO; check outputs and order-dependence.

    Without outputs to check (no postcondition) only the FIFO run is made. Nodes that
    never run are the run verdict's to explain. Returns the FIFO run (its counts go
    into the report).
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
    orders = (False, True) if want.outputs else (False,)
    runs = [execute(ctx, sb, so, db, do, init, lifo, P.cap) for lifo in orders]
    first, second = runs[0], runs[-1]
    for run in runs:
        P.extend(f"{mode}: {p}" if several else p for p in run.problems)
    if not all(first.done):
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
        first problems (rank, node, buffer slot), the verdict (a deadlock or hang
        when there is one) first.

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
