"""Run an MSCCL++ plan abstractly: its one-sided operations become sends, receives, copies and
reductions, ordered by what the plan's synchronisation guarantees.

Why an abstract run: in MSCCL++ a GPU writes into (``put``) and reads from (``get``) its
peers' memory without the peer taking part, and semaphores (``signal``/``wait``), device
barriers, device semaphores and LL packet flags say when that is safe. The trace has no
such thing: its cross-rank order is messages, its local order dependencies. So the plan's
threadblocks are executed as the executor would (each runs its ops in order; a wait
blocks until the matching signal, the n-th wait of a channel taking the n-th signal of its
pair; a barrier until all its threadblocks arrive; ``sem_acquire`` until a permit; a
packet read until the packet is written) while each threadblock carries a *frontier*: for
every rank, the last node of each lane it knows finished before its current point.

Lanes are chains of nodes: a threadblock's own nodes (its program order), and, per
threadblock, the nodes it creates on another rank's memory (a put lands there as a
receive, a get reads there as a send). A node created on rank x depends on the frontier's
nodes of rank x; a signal hands the signaller's frontier to the matching wait. So a put's
receive follows what its writer knew of the target (the target's signal that the slot
was free), and the target's reads follow the receive once its wait says the data is in.

Scale: chunk offsets are multiplied by the plan's ``split`` (the least common multiple
of its threadblock-group sizes), so each member of a group moves its own slice.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from etstore.errors import TraceFormatError
from etstore.formats._mscclpp_schema import LOCAL, REMOTE, SWITCH, Entry, Op, Plan
from etstore.ir import COPY, RECV, REDUCE, SEND

__all__ = ["Graph", "Node", "run_plan"]

log = logging.getLogger(__name__)

Frontier = dict[int, dict[int, int]]  # rank → lane → last known node
Slot = tuple[int, str, int, int]  # rank, buffer, offset, chunks (trace units)
_KIND_WORD = {SEND: "send", RECV: "recv", REDUCE: "reduce", COPY: "copy"}
_PACKET_READS = frozenset({"upkt", "rppkt", "gstorepkt"})
_PACKET_REDUCE = frozenset({"repkt", "respkt", "recpkt", "recspkt"})


@dataclass
class Node:
    """One node of the trace to be: where it runs, what it does, which op made it."""

    rank: int
    lane: int
    kind: int
    step: int
    src: Slot
    dst: Slot
    peer: int
    at: tuple[int, int, int, int]
    op: str
    stype: str
    entries: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        g, t, k, m = self.at
        return f"{_KIND_WORD[self.kind]}_{self.op}_g{g}_tb{t}_op{k}{'' if m < 0 else f'_{m}'}"


@dataclass
class Graph:
    """What the run made: nodes, dependencies and messages as node indices, lanes as keys."""

    nodes: list[Node] = field(default_factory=list)
    deps: list[tuple[int, int]] = field(default_factory=list)
    messages: list[tuple[int, int]] = field(default_factory=list)
    lanes: list[tuple[int, int, int]] = field(default_factory=list)  # (owner rank, creator rank, creator tb)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Ctx:
    """A threadblock being run: its ops (pipelines flattened), where it is, what it knows."""

    rank: int
    tb: int
    ops: list[Op]
    pc: int = 0
    front: Frontier = field(default_factory=dict)
    blocked: str = ""


def _snapshot(front: Frontier) -> Frontier:
    return {x: dict(d) for x, d in front.items()}


def _merge(front: Frontier, other: Frontier) -> None:
    for x, d in other.items():
        mine = front.setdefault(x, {})
        for lane, nid in d.items():
            if mine.get(lane, -1) < nid:
                mine[lane] = nid


class _Run:
    """The state of one abstract run (see the module docstring)."""

    def __init__(self, plan: Plan, source: str) -> None:
        self.plan, self.source, self.split = plan, source, plan.split
        self.g = Graph()
        self.lane_of: dict[tuple[int, int, int], int] = {}
        self.lane_last: dict[int, int] = {}
        self.seen: dict[int, dict[int, int]] = {}
        self.step = 0
        self.signals: dict[tuple[int, str, int], list[Frontier]] = {}
        self.taken: dict[tuple[int, str, int], int] = {}
        self.permits: dict[tuple[int, int], deque[Frontier]] = {}
        self.barriers: dict[tuple[int, int], list[tuple[_Ctx, Frontier]]] = {}
        self.packets: dict[tuple[int, str, int], int] = {}
        self.waiting: dict[tuple[object, ...], list[_Ctx]] = {}
        self.ready: deque[_Ctx] = deque()
        self.pairs = _pairings(plan)
        for gpu in plan.gpus:
            for sid, init in enumerate(gpu.sem_init):
                self.permits[(gpu.id, sid)] = deque({} for _ in range(init))

    # ---------------------------------------------------------------- nodes

    def new_step(self) -> int:
        self.step += 1
        return self.step

    def node(
        self,
        ctx: _Ctx,
        owner: int,
        kind: int,
        op: Op,
        stype: str,
        src: Slot,
        dst: Slot,
        *,
        peer: int = -1,
        step: int | None = None,
    ) -> int:
        """A node on rank ``owner`` made by ``ctx``, after what ``ctx`` knows of that rank."""
        key = (owner, ctx.rank, ctx.tb)
        lane = self.lane_of.get(key)
        if lane is None:
            lane = self.lane_of[key] = len(self.g.lanes)
            self.g.lanes.append(key)
            self.seen[lane] = {}
        nid = len(self.g.nodes)
        prev = self.lane_last.get(lane)
        if prev is not None:
            self.g.deps.append((prev, nid))
        seen = self.seen[lane]
        for other, m in ctx.front.get(owner, {}).items():
            if other != lane and seen.get(other, -1) < m:
                self.g.deps.append((m, nid))
                seen[other] = m
        ctx.front.setdefault(owner, {})[lane] = nid
        self.lane_last[lane] = nid
        self.g.nodes.append(
            Node(
                owner,
                lane,
                kind,
                step if step is not None else self.new_step(),
                src,
                dst,
                peer,
                op.at,
                op.name,
                stype,
            )
        )
        return nid

    def message(
        self,
        ctx: _Ctx,
        op: Op,
        src: Slot,
        dst: Slot,
        *,
        reduce_from: Slot | None = None,
        packet: bool = False,
    ) -> tuple[int, int]:
        """A send on ``src``'s rank and its receive on ``dst``'s rank; with ``reduce_from`` the
        receive is fused with a reduction ``dst = message ⊕ reduce_from`` (an ``rrc`` step)."""
        s = self.node(ctx, src[0], SEND, op, "s", src, dst, peer=dst[0])
        if reduce_from is None:
            r = self.node(ctx, dst[0], RECV, op, "r", src, dst, peer=src[0])
        else:
            step = self.new_step()
            r = self.node(ctx, dst[0], RECV, op, "rrc", reduce_from, dst, peer=src[0], step=step)
            self.node(ctx, dst[0], REDUCE, op, "rrc", reduce_from, dst, step=step)
        self.g.messages.append((s, r))
        if packet:
            self.wrote_packets(dst, r)
        return s, r

    def wrote_packets(self, slot: Slot, nid: int) -> None:
        rank, buf, off, cnt = slot
        for j in range(off, off + cnt):
            self.packets[(rank, buf, j)] = nid
            self.wake(("pkt", rank, buf, j))

    # ---------------------------------------------------------------- scheduling

    def wake(self, key: tuple[object, ...]) -> None:
        for ctx in self.waiting.pop(key, []):
            ctx.blocked = ""
            self.ready.append(ctx)

    def block(self, ctx: _Ctx, key: tuple[object, ...], why: str) -> bool:
        ctx.blocked = why
        self.waiting.setdefault(key, []).append(ctx)
        return False

    def go(self) -> Graph:
        ctxs = [
            _Ctx(g.id, t.id, [x for op in t.ops for x in (op.inner if op.name == "pipeline" else (op,))])
            for g in self.plan.gpus
            for t in g.tbs
        ]
        self.ready.extend(ctxs)
        while self.ready:
            ctx = self.ready.popleft()
            while ctx.pc < len(ctx.ops) and self.execute(ctx, ctx.ops[ctx.pc]):
                ctx.pc += 1
        stuck = [c for c in ctxs if c.pc < len(c.ops)]
        if stuck:
            first = stuck[0]
            op = first.ops[first.pc]
            why = first.blocked or "waits forever"
            if op.name == "barrier":  # arrivals are counted now, when nothing more can arrive
                key = (first.rank, int(op.raw["barrier_id"]))
                why = (
                    f"waits at barrier {key[1]} for {op.raw['num_threadblocks']} threadblocks, "
                    f"{len(self.barriers.get(key, []))} arrive"
                )
            more = f" (+{len(stuck) - 1} more threadblock(s) stuck)" if len(stuck) > 1 else ""
            raise TraceFormatError(
                f"{self.source}: the plan cannot run to completion: {op.place} {why}{more}"
            )
        for (rank, ctype, c), snaps in self.signals.items():
            extra = len(snaps) - self.taken.get((rank, ctype, c), 0)
            if extra > 0:
                self.g.notes.append(
                    f"gpu {rank} {ctype} channel {c}: {extra} signal(s) never waited for (the next launch "
                    "would find them)"
                )
        return self.g

    # ---------------------------------------------------------------- operations

    def execute(self, ctx: _Ctx, op: Op) -> bool:
        """Run ``op`` for ``ctx``; False when it has to wait (``ctx`` is then parked)."""
        name = op.name
        if name in ("nop", "flush", "pipeline"):  # __syncthreads, proxy completion: no data, no order
            return True
        if name in ("signal", "rlxsignal"):
            self.signal(ctx, op)
            return True
        if name in ("wait", "rlxwait"):
            return self.wait(ctx, op)
        if name == "barrier":
            return self.barrier(ctx, op)
        if name == "sem_release":
            snap = _snapshot(ctx.front)
            for sid in op.raw["semaphore_ids"]:
                self.permits[(ctx.rank, sid)].append(snap)
                self.wake(("sem", ctx.rank, sid))
            return True
        if name == "sem_acquire":
            return self.acquire(ctx, op)
        if not self.packets_ready(ctx, op):
            return False
        if name in ("copy", "cpkt", "upkt"):
            a, b = self.slot(op, op.src[0]), self.slot(op, op.dst[0])
            nid = self.node(ctx, ctx.rank, COPY, op, "cpy", a, b)
            if name == "cpkt":
                self.wrote_packets(b, nid)
        elif name in ("put", "pws", "pwsf", "ppkt", "rppkt"):
            self.put(ctx, op)
        elif name == "get":
            for ea, eb in zip(op.src, op.dst, strict=True):
                self.message(ctx, op, self.slot(op, ea), self.slot(op, eb))
        elif name in ("glres", "gstore", "gstorepkt"):
            self.switch(ctx, op)
        else:
            self.reduce(ctx, op)
        _own_entries(self.g.nodes, op, self.slot)
        return True

    def slot(self, op: Op, e: Entry, rank: int | None = None) -> Slot:
        """Where an operand lies, in trace units (this threadblock's slice of a group)."""
        m, g = op.tbg
        cnt = e.size * self.split // g
        holder = rank if rank is not None else e.rank if e.kind != SWITCH else op.at[0]
        return (holder, e.buf, e.index * self.split + m * cnt, cnt)

    def packets_ready(self, ctx: _Ctx, op: Op) -> bool:
        """LL packets are read by spinning on their flags: wait until every slot read was written."""
        reads: list[Slot] = []
        if op.name in _PACKET_READS:
            reads = [self.slot(op, op.src[0])]
        elif op.name in _PACKET_REDUCE:
            reads = [self.slot(op, e) for e in op.src[1:]]
        writers: list[int] = []
        for rank, buf, off, cnt in reads:
            for j in range(off, off + cnt):
                w = self.packets.get((rank, buf, j))
                if w is None:
                    return self.block(
                        ctx,
                        ("pkt", rank, buf, j),
                        f"reads the LL packet at {buf}[{j // self.split}], which nothing writes",
                    )
                writers.append(w)
        mine = ctx.front.setdefault(ctx.rank, {})
        for w in writers:
            lane = self.g.nodes[w].lane
            if mine.get(lane, -1) < w:
                mine[lane] = w
        return True

    def signal(self, ctx: _Ctx, op: Op) -> None:
        snap = _snapshot(ctx.front)
        for _peer, c in op.channels:
            key = self.pairs.get((ctx.rank, op.channel_type, c))
            if key is None:
                self.g.notes.append(
                    f"{op.place}: {op.channel_type} channel {c} has no paired channel at its peer"
                )
                continue
            self.signals.setdefault(key, []).append(snap)
            self.wake(("sig", *key))

    def wait(self, ctx: _Ctx, op: Op) -> bool:
        need: dict[tuple[int, str, int], int] = {}
        for _peer, c in op.channels:
            key = (ctx.rank, op.channel_type, c)
            need[key] = need.get(key, 0) + 1
        for key, count in need.items():
            if self.taken.get(key, 0) + count > len(self.signals.get(key, [])):
                peer = dict((c, p) for p, c in op.channels)[key[2]]
                return self.block(
                    ctx,
                    ("sig", *key),
                    f"waits on {key[1]} channel {key[2]} for a signal from gpu {peer} that never comes",
                )
        for key, count in need.items():
            start = self.taken.get(key, 0)
            for snap in self.signals[key][start : start + count]:
                _merge(ctx.front, snap)
            self.taken[key] = start + count
        return True

    def barrier(self, ctx: _Ctx, op: Op) -> bool:
        if ctx.blocked == "released":
            ctx.blocked = ""
            return True
        key = (ctx.rank, int(op.raw["barrier_id"]))
        group = self.barriers.setdefault(key, [])
        group.append((ctx, _snapshot(ctx.front)))
        want = int(op.raw["num_threadblocks"])
        if len(group) < want:
            ctx.blocked = "at a barrier"
            return False
        merged: Frontier = {}
        for _, snap in group:
            _merge(merged, snap)
        for member, _ in group:
            _merge(member.front, merged)
            if member is not ctx:  # parked on this barrier op: it passes when run again
                member.blocked = "released"
                self.ready.append(member)
        self.barriers[key] = []
        return True

    def acquire(self, ctx: _Ctx, op: Op) -> bool:
        need: dict[int, int] = {}
        for sid in op.raw["semaphore_ids"]:
            need[sid] = need.get(sid, 0) + 1
        for sid, count in need.items():
            if len(self.permits[(ctx.rank, sid)]) < count:
                return self.block(
                    ctx, ("sem", ctx.rank, sid), f"acquires semaphore {sid}, which is never released"
                )
        for sid, count in need.items():
            for _ in range(count):
                _merge(ctx.front, self.permits[(ctx.rank, sid)].popleft())
        return True

    def put(self, ctx: _Ctx, op: Op) -> None:
        packet = op.name in ("ppkt", "rppkt")
        if op.name == "rppkt":
            a = self.slot(op, op.src[0])
            for b in op.dst:
                self.message(ctx, op, a, self.slot(op, b), packet=True)
            return
        for ea, eb in zip(op.src, op.dst, strict=True):
            self.message(ctx, op, self.slot(op, ea), self.slot(op, eb), packet=packet)
        if op.name in ("pws", "pwsf"):
            if op.channel_type == "port":
                self.signal(ctx, op)
            else:
                self.g.notes.append(
                    f"{op.place}: through a memory channel the executor puts without signalling"
                )

    def switch(self, ctx: _Ctx, op: Op) -> None:
        """NVLS multimem ops: the group's buffers are read (and reduced) on this rank and stored to all."""
        r = ctx.rank
        d = op.dst[0]
        others = [q for q in d.group if q != r]
        if op.name == "glres":
            s = op.src[0]
            here_src, here_dst = self.slot(op, s, r), self.slot(op, d, r)
            acc = here_src
            for q in others:
                self.message(ctx, op, self.slot(op, s, q), here_dst, reduce_from=acc)
                acc = here_dst
            if not others:
                self.node(ctx, r, COPY, op, "cpy", here_src, here_dst)
            for q in others:
                self.message(ctx, op, here_dst, self.slot(op, d, q))
            return
        a = self.slot(op, op.src[0])
        packet = op.name == "gstorepkt"
        nid = self.node(ctx, r, COPY, op, "cpy", a, self.slot(op, d, r))
        if packet:
            self.wrote_packets(self.slot(op, d, r), nid)
        for q in others:
            self.message(ctx, op, a, self.slot(op, d, q), packet=packet)

    def reduce(self, ctx: _Ctx, op: Op) -> None:
        """``dst[0] = src[0] ⊕ src[1] ⊕ ...`` (remote sources read through the channel), then the
        local packet copy and the remote writes of ``dst[0]``."""
        r = ctx.rank
        packet = op.name in _PACKET_REDUCE
        target = self.slot(op, op.dst[0])
        operands = [self.slot(op, e) for e in op.src]
        for s in operands:
            if s[0] == r and s[1] == target[1] and s != target and _overlap(s, target):
                raise TraceFormatError(
                    f"{self.source}: {op.place}: reads {s[1]}[{s[2] // self.split}...] that partly overlaps "
                    "what it writes; etstore models a reduction chunk by chunk"
                )
        base = next((k for k, s in enumerate(operands) if s == target), 0)
        have = operands[base] == target  # the target already holds one operand
        acc = operands[base]
        for k, s in enumerate(operands):
            if k == base:
                continue
            if s[0] != r:  # a remote operand: its message fused with the reduction
                self.message(ctx, op, s, target, reduce_from=acc)
            else:
                if not have:
                    self.node(ctx, r, COPY, op, "cpy", acc, target)
                self.node(ctx, r, REDUCE, op, "re", s, target)
            have, acc = True, target
        if not have:
            self.node(ctx, r, COPY, op, "cpy", acc, target)
        first_remote = 1
        if op.name in ("recpkt", "recspkt"):
            copy_to = self.slot(op, op.dst[1])
            nid = self.node(ctx, r, COPY, op, "cpy", target, copy_to)
            self.wrote_packets(copy_to, nid)
            first_remote = 2
        for e in op.dst[first_remote:]:
            self.message(ctx, op, target, self.slot(op, e), packet=packet)


def _overlap(a: Slot, b: Slot) -> bool:
    return a[2] < b[2] + b[3] and b[2] < a[2] + a[3]


def _own_entries(nodes: list[Node], op: Op, slot_of: Callable[..., Slot]) -> None:
    """Mark on the op's nodes which of its operands each holds: ``[side, index, field]`` triples
    (side 0 source, 1 destination; field 0 the node's source, 1 its destination), so a writer
    can give each operand its chunk range back from the trace."""
    mine = [n for n in nodes[_first_of(nodes, op) :] if n.at == op.at]
    for side, entries in ((0, op.src), (1, op.dst)):
        for k, e in enumerate(entries):
            for n, fld in _holders(mine, op, e, side, slot_of):
                n.entries += [side, k, fld]
                break


def _first_of(nodes: list[Node], op: Op) -> int:
    i = len(nodes)
    while i > 0 and nodes[i - 1].at == op.at:
        i -= 1
    return i


def _holders(
    mine: list[Node], op: Op, e: Entry, side: int, slot_of: Callable[..., Slot]
) -> Iterable[tuple[Node, int]]:
    """Nodes of the op holding operand ``e`` in their source or destination, best first."""
    ranks = [op.at[0]] if e.kind == LOCAL else [e.rank] if e.kind == REMOTE else [op.at[0], *e.group]
    for rank in ranks:
        want = slot_of(op, e, rank)
        for fld in (side, 1 - side):
            for n in mine:
                if (n.src if fld == 0 else n.dst) == want:
                    yield n, fld


def _pairings(plan: Plan) -> dict[tuple[int, str, int], tuple[int, str, int]]:
    """(rank, type, channel) → the channel at the peer that it signals: the k-th channel of a
    type from a to b pairs with the k-th from b to a (the executor's per-peer connection tags)."""
    by: dict[tuple[int, str], tuple[int, ...]] = {}
    for g in plan.gpus:
        by[(g.id, "memory")] = g.mem_peers
        by[(g.id, "port")] = g.port_peers
    out: dict[tuple[int, str, int], tuple[int, str, int]] = {}
    for (a, ctype), peers in by.items():
        count: dict[int, int] = {}
        for c, b in enumerate(peers):
            k = count.get(b, 0)
            count[b] = k + 1
            back = [j for j, p in enumerate(by[(b, ctype)]) if p == a]
            if k < len(back):
                out[(a, ctype, c)] = (b, ctype, back[k])
    return out


def run_plan(plan: Plan, source: str) -> Graph:
    """Run ``plan`` abstractly (see the module docstring) and return the nodes it makes.

    Raises
    ------
    TraceFormatError
        The plan cannot run to completion (a wait never signalled, a barrier short of
        threadblocks, a semaphore never released, a packet never written), naming the
        first stuck op; or a reduction partly overlaps its own destination.
    """
    run = _Run(plan, source)
    graph = run.go()
    for note in graph.notes:
        log.warning("%s: %s", source, note)
    return graph
