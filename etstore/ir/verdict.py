"""Whether an algorithm trace can run to completion: the one verdict the checker, the MSCCL-IR
writer and the simulator share.

MSCCL/RCCL run an algorithm as written: a receive takes the next message of its
``(src, dst, channel)`` connection, and the runtime has no way to drop a message or to
make one up. So an algorithm runs to completion only if every send is received and
every receive is sent, with the same number of chunks, and no set of nodes waits on
itself (a deadlock). Its connections must be unambiguous too: one threadblock per
(peer, channel), since two threadblocks on one connection share its step counters and
overwrite each other's messages. :func:`run_verdict` decides this on the trace's nodes
and dependencies alone (no buffer contents): it matches messages per stream, then runs
the nodes in dependency order (sends never block, a receive waits for the n-th message
of its stream) and explains every node that never runs, naming the wait-for cycle of a
deadlock with its ranks and nodes.

:func:`etstore.algorithms.check_algorithm` adds to it what the collective computes;
the problems this module finds read the same wherever they are reported.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import find_cycle
from etstore.ir.semantics import NodeSemantics, node_semantics
from etstore.ir.steps import RECV, SEND
from etstore.model import Trace

__all__ = [
    "RunVerdict",
    "dependency_csr",
    "message_streams",
    "node_labels",
    "run_verdict",
]

_ID_MASK = (1 << 40) - 1


@dataclass(frozen=True)
class RunVerdict:
    """Outcome of :func:`run_verdict`.

    ``problems`` lists what stops the algorithm from running to completion as MSCCL
    runs it, the most serious first (``headline``: a deadlock with its wait-for cycle,
    then unmatched messages, shared connections, size mismatches); ``more`` counts
    those left off. ``ran`` is false when peers, ranks or dependencies were too broken
    to match messages at all. ``messages`` counts matched send/receive pairs, ``stuck``
    the nodes that never run.
    """

    problems: tuple[str, ...] = ()
    more: int = 0
    ran: bool = True
    messages: int = 0
    stuck: int = 0

    @property
    def ok(self) -> bool:
        """Whether nothing stops the algorithm from running to completion."""
        return not self.problems

    @property
    def headline(self) -> str:
        """``"ok"``, or the most serious problem (a deadlock or hang first)."""
        return self.problems[0] if self.problems else "ok"


def node_labels(ops: pa.Table) -> list[str]:
    """How problems name each node: ``"<name> (id <id>)"``."""
    ids = ops["id"].to_pylist()
    return [f"{nm or 'node'} (id {i})" for nm, i in zip(ops["name"].to_pylist(), ids, strict=True)]


def message_streams(
    kind: np.ndarray, rank: np.ndarray, csrc: np.ndarray, cdst: np.ndarray, tag: np.ndarray, N: int
) -> np.ndarray:
    """Per node: its ``(src, dst, tag)`` message stream as one int (-1 for non-messages)."""
    is_send, is_recv = kind == SEND, kind == RECV
    src_rank = np.where(is_send, rank, csrc)
    dst_rank = np.where(is_send, cdst, rank)
    return np.where(is_send | is_recv, ((src_rank * N + dst_rank) << 32) | (tag & 0xFFFFFFFF), -1)


def dependency_csr(
    trace: Trace, rank: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, list[int], list[int], str]:
    """The dependency graph as CSR over op rows: (successor offsets, successors, in-degrees, problem).

    ``problem`` names the first dependency whose end is no node (such edges are left out), or "".
    """
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
    ok_edge = (skey[ps] == dsrc) & (skey[pd] == ddst) if n else np.zeros(len(drank), bool)
    problem = ""
    if not ok_edge.all():
        j = int(np.flatnonzero(~ok_edge)[0])
        problem = (
            f"dependency rank {int(drank[j])} {int(dsrc[j] & _ID_MASK)} → {int(ddst[j] & _ID_MASK)}"
            " names a node that does not exist"
        )
    srow, drow = order[ps[ok_edge]], order[pd[ok_edge]]
    e_order = np.argsort(srow, kind="stable")
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(srow, minlength=n), out=succ_ptr[1:])
    return succ_ptr, drow[e_order].tolist(), np.bincount(drow, minlength=n).tolist(), problem


def run_verdict(
    trace: Trace, *, sem: NodeSemantics | None = None, ranks: int | None = None, max_problems: int = 20
) -> RunVerdict:
    """Decide whether ``trace`` runs to completion as MSCCL/RCCL would run it (see the module docstring).

    Parameters
    ----------
    trace
        An algorithm in the representation of ``docs/algorithms.md``.
    sem
        Its :func:`~etstore.ir.node_semantics`, when the caller has it already.
    ranks
        Number of ranks; default ``params["ngpus"]``, else the highest rank + 1.
    max_problems
        At most this many problems are kept (``more`` counts the rest).

    Returns
    -------
    RunVerdict
        The problems, most serious first: a deadlock named with its wait-for cycle
        across ranks, a receive that waits forever, a send that is never received, two
        threadblocks on one connection, a message whose two ends disagree on its size.

    Notes
    -----
    Problems, each naming rank and node: ranks, peers or dependencies that point
    nowhere; a receive without a send and a send never received on a ``(src, dst,
    tag)`` stream; two threadblocks on one (peer, channel) connection; a receive whose
    matching send carries a different number of chunks; nodes that never run (with the
    deadlock's cycle when there is one). O(V + E): one pass in dependency order.

    Examples
    --------
    >>> from etstore.algorithms import generate
    >>> run_verdict(generate("ring", coll="allreduce", ranks=4)).headline
    'ok'
    """
    ops = trace.ops
    n = ops.num_rows
    sem = sem if sem is not None else node_semantics(trace)
    kind = sem.kind
    rank = ops["rank"].to_numpy().astype(np.int64)
    N = ranks if ranks is not None else int(trace.params.get("ngpus") or (int(rank.max()) + 1 if n else 0))
    label = node_labels(ops)
    csrc = pc.fill_null(ops["comm_src"], -1).to_numpy().astype(np.int64)
    cdst = pc.fill_null(ops["comm_dst"], -1).to_numpy().astype(np.int64)
    tag = pc.fill_null(ops["comm_tag"], 0).to_numpy().astype(np.int64)
    limit = max(1, max_problems)
    broken = _broken(trace, kind, rank, csrc, cdst, N, label)
    if broken:
        return RunVerdict(tuple(broken[:limit]), max(0, len(broken) - limit), ran=False)
    stream = message_streams(kind, rank, csrc, cdst, tag, N)
    found = _unmatched(kind, stream, N, label)
    found += _shared_connections(ops, kind, rank, csrc, cdst, tag)
    ids = ops["id"].to_numpy().astype(np.int64)
    succ_ptr, succ, indeg, edge_problem = dependency_csr(trace, rank, ids)
    if edge_problem:
        found.append(edge_problem)
    run = _Schedule(kind.tolist(), stream.tolist(), sem.cnt.tolist(), succ_ptr.tolist(), succ, indeg)
    run.go()
    rank_l = rank.tolist()
    for r, s in run.mismatched:
        found.append(
            f"rank {rank_l[r]} {label[r]} expects {run.cnt[r]} chunk(s) but the matching send "
            f"(rank {rank_l[s]} {label[s]}) carries {run.cnt[s]}"
        )
    stuck_lines = _explain_stuck(run, rank_l, label) if run.stuck else []
    deadlock = [p for p in stuck_lines if p.startswith("deadlock: ")]
    ordered = list(dict.fromkeys([*deadlock, *found, *stuck_lines]))
    return RunVerdict(
        tuple(ordered[:limit]), max(0, len(ordered) - limit), messages=run.messages, stuck=run.stuck
    )


def _broken(
    trace: Trace,
    kind: np.ndarray,
    rank: np.ndarray,
    csrc: np.ndarray,
    cdst: np.ndarray,
    N: int,
    label: list[str],
) -> list[str]:
    """Ranks, peers and dependencies that point nowhere: with these, messages cannot be matched."""
    out: list[str] = []
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
    return out


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


class _Schedule:
    """One run in dependency order: sends never block, a receive takes its stream's next message."""

    def __init__(
        self,
        kind: list[int],
        stream: list[int],
        cnt: list[int],
        succ_ptr: list[int],
        succ: list[int],
        indeg: list[int],
    ) -> None:
        self.kind, self.stream, self.cnt = kind, stream, cnt
        self.succ_ptr, self.succ, self.indeg = succ_ptr, succ, list(indeg)
        self.done = [False] * len(kind)
        self.messages = 0
        self.stuck = 0
        self.mismatched: list[tuple[int, int]] = []  # (receive, send) carrying different chunk counts

    def go(self) -> None:
        kind, stream = self.kind, self.stream
        succ_ptr, succ, indeg, done = self.succ_ptr, self.succ, self.indeg, self.done
        ready = deque(i for i, d in enumerate(indeg) if d == 0)
        queued: dict[int, deque[int]] = {}  # sent, not yet received
        waiting: dict[int, deque[int]] = {}  # receives posted before their send
        pop, push = ready.popleft, ready.append
        while ready:
            i = pop()
            k = kind[i]
            finished = i
            if k == SEND:
                w = waiting.get(stream[i])
                if w:  # the send is done, and so is the receive that waited for it
                    r = w.popleft()
                    self._matched(r, i)
                    done[i] = True
                    for p in range(succ_ptr[i], succ_ptr[i + 1]):
                        s = succ[p]
                        indeg[s] -= 1
                        if indeg[s] == 0:
                            push(s)
                    finished = r
                else:
                    queued.setdefault(stream[i], deque()).append(i)
            elif k == RECV:
                q = queued.get(stream[i])
                if q:
                    self._matched(i, q.popleft())
                else:
                    waiting.setdefault(stream[i], deque()).append(i)
                    continue
            done[finished] = True
            for p in range(succ_ptr[finished], succ_ptr[finished + 1]):
                s = succ[p]
                indeg[s] -= 1
                if indeg[s] == 0:
                    push(s)
        self.stuck = done.count(False)

    def _matched(self, r: int, s: int) -> None:
        """Receive ``r`` takes the message of send ``s``."""
        self.messages += 1
        if self.cnt[r] != self.cnt[s] and len(self.mismatched) < 100:
            self.mismatched.append((r, s))


def _explain_stuck(run: _Schedule, rank: list[int], label: list[str]) -> list[str]:
    """Problems naming the nodes that never ran, with a wait-for cycle when there is one."""
    n = len(run.done)
    done, kind, stream = run.done, run.kind, run.stream
    stuck = [i for i in range(n) if not done[i]]
    preds: dict[int, list[int]] = {}
    for i in stuck:
        for p in range(run.succ_ptr[i], run.succ_ptr[i + 1]):
            s = run.succ[p]
            if not done[s]:
                preds.setdefault(s, []).append(i)
    # a posted receive waits for the first send of its stream that has not run
    pending_send: dict[int, int] = {}
    for i in stuck:
        if kind[i] == SEND:
            pending_send.setdefault(stream[i], i)
    waits: dict[int, list[int]] = {}
    for i in stuck:
        w = list(preds.get(i, []))
        if kind[i] == RECV and not w and stream[i] in pending_send:
            w.append(pending_send[stream[i]])
        waits[i] = w
    src = np.asarray([i for i in stuck for _ in waits[i]], dtype=np.int64)
    dst = np.asarray([j for i in stuck for j in waits[i]], dtype=np.int64)
    cycle = [int(i) for i in find_cycle(max(stuck) + 1, src, dst)]

    def who(i: int) -> str:
        return f"rank {rank[i]} {label[i]}"

    out: list[str] = []
    if cycle:
        text = " → ".join(who(i) for i in cycle[:8]) + (" → ..." if len(cycle) > 8 else "")
        out.append(f"deadlock: {text} → {who(cycle[0])} (each waits for the next)")
    roots = [i for i in stuck if not waits[i]]
    for i in roots[:3]:
        if kind[i] == RECV:
            out.append(f"{who(i)} waits forever: no send on its stream ever runs")
    out.append(f"{len(stuck)} of {n} nodes never run, first {who(stuck[0])}")
    return out
