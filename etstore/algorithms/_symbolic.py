"""Symbolic execution of an algorithm trace.

Nodes run in a dependency order (receives take the n-th message of their
``(src, dst, tag)`` stream, sends never block, as in ASTRA-sim); buffer slots hold
symbol sets (see :mod:`etstore.algorithms._postcondition`) that sends move and
reductions combine. Problems with the data found on the way are collected as text;
unmatched messages, chunk counts that differ between a send and its receive, and nodes
that never run are :func:`etstore.ir.run_verdict`'s to report.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from etstore.algorithms._postcondition import describe
from etstore.ir import BUFFERS, COPY, RECV, REDUCE, SEND, TYPE_CODE

__all__ = ["Ctx", "Run", "execute", "slot"]

_T_S, _T_R, _T_RCS, _T_RRS, _T_RE = (TYPE_CODE[t] for t in ("s", "r", "rcs", "rrs", "re"))


@dataclass
class Ctx:
    """The trace as plain lists for the interpreter: per node rank, kind, step, stream, successors.

    ``lenient``: a slot nothing wrote reads as empty rather than as a problem (a
    collective without postcondition, whose inputs beyond ``i`` are unknown).
    """

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
    lenient: bool = False


@dataclass
class Run:
    """One execution: which nodes ran, the final slots, problems met, and message counts."""

    done: list[bool]
    slots: dict[int, Any]
    problems: list[str]
    messages: int
    moved: int
    depth: int
    waiting: dict[int, deque[int]]
    queues: dict[int, deque[tuple[tuple[Any, ...], int]]]


def slot(rank: int, buf: int, idx: int) -> int:
    """The key of buffer slot ``buf[idx]`` on ``rank``."""
    return ((rank * 3 + buf) << 32) | (idx & 0xFFFFFFFF)


def execute(
    ctx: Ctx,
    sb: list[int],
    so: list[int],
    db: list[int],
    do: list[int],
    init: dict[int, int],
    lifo: bool,
    cap: int,
) -> Run:
    """Run the trace symbolically once; see the module docstring.

    ``sb``/``so``/``db``/``do`` are each node's physical source and destination
    (buffer, offset); ``init`` the input slots; ready nodes are taken LIFO or FIFO;
    at most ``cap`` problems are kept. O(V + E) node steps.
    """
    m = _Machine(ctx, sb, so, db, do, init, cap)
    ready = m.ready
    pop = ready.pop if lifo else ready.popleft
    kind = ctx.kind
    while ready:
        i = pop()
        k = kind[i]
        if k == SEND:
            m.send(i)
        elif k == RECV:
            m.recv(i)
        elif k == REDUCE:
            m.reduce(i)
        elif k == COPY:
            m.copy(i)
        else:
            m.finish(i, m.level[i])
    return Run(m.done, m.slots, m.problems, m.messages, m.moved, m.depth, m.waiting, m.queues)


class _Machine:
    """State of one symbolic execution: slots, step temporaries, message streams, readiness."""

    def __init__(
        self,
        ctx: Ctx,
        sb: list[int],
        so: list[int],
        db: list[int],
        do: list[int],
        init: dict[int, int],
        cap: int,
    ) -> None:
        self.ctx, self.sb, self.so, self.db, self.do, self.cap = ctx, sb, so, db, do, cap
        self.indeg = list(ctx.indeg0)
        self.slots: dict[int, Any] = dict(init)
        self.temps: dict[int, tuple[Any, ...]] = {}  # by step group: the message or partial result
        self.queues: dict[int, deque[tuple[tuple[Any, ...], int]]] = {}  # sent, not yet received
        self.waiting: dict[int, deque[int]] = {}  # receives posted before their send
        self.done = [False] * ctx.n
        self.level = [0] * ctx.n
        self.problems: list[str] = []
        self.messages = self.moved = self.depth = 0
        self.ready: deque[int] = deque(i for i in range(ctx.n) if self.indeg[i] == 0)

    def note(self, text: str) -> None:
        if len(self.problems) < self.cap:
            self.problems.append(text)

    def read(self, r: int, buf: int, off: int, k: int, who: int) -> tuple[Any, ...]:
        base = (r * 3 + buf) << 32
        vals = tuple(self.slots.get(base | (off + j)) for j in range(k))
        if None in vals and self.ctx.lenient:
            return tuple(0 if v is None else v for v in vals)
        if None in vals:
            j = vals.index(None)
            self.note(
                f"rank {r} {self.ctx.label[who]} reads {BUFFERS[buf]}[{off + j}], which holds no data at "
                "that point"
            )
        return vals

    def write(self, r: int, buf: int, off: int, vals: tuple[Any, ...]) -> None:
        base = (r * 3 + buf) << 32
        for j, v in enumerate(vals):
            self.slots[base | (off + j)] = v

    def combine(self, a: tuple[Any, ...], b: tuple[Any, ...], who: int) -> tuple[Any, ...]:
        """Union of symbol sets slot by slot, noting a symbol that is reduced in twice."""
        ctx = self.ctx
        out: list[Any] = []
        for x, y in zip(a, b, strict=False):
            if x is None or y is None:
                out.append(None)
                continue
            both = x & y
            if both:
                self.note(
                    f"rank {ctx.rank[who]} {ctx.label[who]} reduces {describe(both & -both, ctx.C)} a second "
                    "time (a contribution would be counted twice)"
                )
            out.append(x | y)
        if len(a) != len(b):
            self.note(
                f"rank {ctx.rank[who]} {ctx.label[who]} reduces {len(a)} chunk(s) with {len(b)} chunk(s)"
            )
        return tuple(out)

    def finish(self, i: int, lvl: int) -> None:
        """Node ``i`` is done at depth ``lvl``: release its successors."""
        ctx, level, indeg = self.ctx, self.level, self.indeg
        self.done[i] = True
        lvl += 1
        if lvl > self.depth:
            self.depth = lvl
        for p in range(ctx.succ_ptr[i], ctx.succ_ptr[i + 1]):
            s = ctx.succ[p]
            if lvl > level[s]:
                level[s] = lvl
            indeg[s] -= 1
            if indeg[s] == 0:
                self.ready.append(s)

    def deliver(self, i: int, msg: tuple[Any, ...], sender: int) -> None:
        """Receive ``i`` gets ``msg`` from ``sender``: stored (``r``, ``rcs``) and/or kept for its step."""
        ctx = self.ctx
        self.messages += 1
        self.moved += len(msg)
        t = ctx.stype[i]
        if t in (_T_R, _T_RCS):
            self.write(ctx.rank[i], self.db[i], self.do[i], msg)
        if t != _T_R:
            self.temps[ctx.group[i]] = msg
        self.finish(i, max(self.level[i], self.level[sender] + 1))

    def step_value(self, i: int, what: str) -> tuple[Any, ...]:
        """What node ``i``'s step received (or reduced) before it, noting when there is nothing."""
        ctx = self.ctx
        got = self.temps.get(ctx.group[i])
        if got is None:
            self.note(f"rank {ctx.rank[i]} {ctx.label[i]} {what} data its step never received")
            got = (None,) * ctx.cnt[i]
        return got

    def send(self, i: int) -> None:
        ctx = self.ctx
        if ctx.stype[i] == _T_S:
            msg = self.read(ctx.rank[i], self.sb[i], self.so[i], ctx.cnt[i], i)
        else:
            msg = self.step_value(i, "forwards")
        st = ctx.stream[i]
        w = self.waiting.get(st)
        self.finish(i, self.level[i])
        if w:
            self.deliver(w.popleft(), msg, i)
        else:
            self.queues.setdefault(st, deque()).append((msg, i))

    def recv(self, i: int) -> None:
        st = self.ctx.stream[i]
        q = self.queues.get(st)
        if q:
            msg, sender = q.popleft()
            self.deliver(i, msg, sender)
        else:
            self.waiting.setdefault(st, deque()).append(i)

    def reduce(self, i: int) -> None:
        ctx = self.ctx
        r, t, k = ctx.rank[i], ctx.stype[i], ctx.cnt[i]
        src = self.read(r, self.sb[i], self.so[i], k, i)
        if t == _T_RE:
            v = self.combine(self.read(r, self.db[i], self.do[i], k, i), src, i)
            self.write(r, self.db[i], self.do[i], v)
        else:
            v = self.combine(self.step_value(i, "reduces"), src, i)
            self.temps[ctx.group[i]] = v
            if t != _T_RRS:
                self.write(r, self.db[i], self.do[i], v)
        self.finish(i, self.level[i])

    def copy(self, i: int) -> None:
        r = self.ctx.rank[i]
        self.write(r, self.db[i], self.do[i], self.read(r, self.sb[i], self.so[i], self.ctx.cnt[i], i))
        self.finish(i, self.level[i])
