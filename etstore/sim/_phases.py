"""One phase of ASTRA-sim's native collective implementations, as ops per index of a dimension.

A :class:`Block` holds what every NPU of one logical dimension does in one phase (a
chunk's reduce-scatter, all-reduce, all-gather or all-to-all on that dimension): its
sends, receives and delays, grouped by the NPU's index ``0..n-1`` in the dimension,
with the peers as indices. A :class:`Program` is a phase whose indices all run the same
ops (ring, direct, halving-doubling), kept once with a peer rule per row.
:mod:`etstore.sim._native` places them on ranks and chains them into a collective. The
programs follow ASTRA-sim's ``Ring.cc``, ``AllToAll.cc``, ``HalvingDoubling.cc`` and
``DoubleBinaryTreeAllReduce.cc``; the memory hop of each packet follows
``PacketBundle.cc``, ``MemBus.cc`` and ``LogGP.cc`` (:class:`SharedBus`).
docs/simulator.md derives each one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from etstore.sim._templates import K_DELAY, K_RECV, K_SEND, P_NONE, P_ROT, P_XOR

__all__ = [
    "P_NONE",
    "P_ROT",
    "P_XOR",
    "Block",
    "Hop",
    "Program",
    "Reduce",
    "SharedBus",
    "direct_phase",
    "halving_doubling_phase",
    "ring_phase",
    "tree_phase",
]

Reduce = Callable[[int], float]  # ns to reduce a message of that many bytes

_MEM_G_NS_PER_BYTE = 0.0038  # ASTRA-sim's NPU <-> memory LogGP link under model-shared-bus
Hop = Callable[[int, str], float]  # NPU <-> memory time of a packet of that size and kind


@dataclass(frozen=True)
class SharedBus:
    """ASTRA-sim's ``model-shared-bus``: packets cross LogGP links instead of one endpoint delay.

    A packet of ``b`` bytes goes NPU ↔ memory-access unit over a LogGP link of
    ``(L, o, G)`` (``H1 = 2o + L + (b-1)·G``) and, for every hop through memory, over
    the NPU ↔ memory link (``H2``, the same with ASTRA-sim's fixed ``G = 0.0038``
    ns/byte); a reduction is also processed there (``(b // 100) · local_reduction_delay
    + 50`` ns). Each transfer is truncated to whole ns. LogGP's gap ``g`` and the
    queueing of concurrent transfers are not modelled, except a tree node's second
    child waiting for the first's processing: exact with one packet in flight per rank
    (ring, halving-doubling, tree; one active chunk per dimension).
    """

    L: float = 0.0
    o: float = 0.0
    G: float = 0.0
    local_reduction_delay: int = 1

    def hop(self, b: int, packet: str, integer_ns: bool) -> float:
        """NPU ↔ memory time of one packet: ``to_ma`` (a phase's first packet), ``plain``,
        ``sb`` (sent back), ``pr`` (processed) or ``pr_sb``."""

        def link(g_per_byte: float) -> float:
            t = 2 * self.o + self.L + (b - 1) * g_per_byte
            return float(math.floor(t)) if integer_ns else t

        h1, h2 = link(self.G), link(_MEM_G_NS_PER_BYTE)
        proc = (b // 100) * self.local_reduction_delay + 50
        return {
            "to_ma": h2 + h1,
            "plain": h1 + h2,
            "sb": h1 + 2 * h2 + h1,
            "pr": h1 + 2 * h2 + proc + h2,
            "pr_sb": h1 + 2 * h2 + proc + 2 * h2 + h1,
            "pr_sb_queued": h1 + 2 * h2 + 2 * proc + 2 * h2 + h1,
        }[packet]


@dataclass(frozen=True)
class Block:
    """One phase on one logical dimension, per index 0..n-1 (rows grouped by index)."""

    starts: np.ndarray  # (n + 1,) rows of index i
    kind: np.ndarray
    dur: np.ndarray
    peer: np.ndarray  # index of the peer in the dimension, -1 for delays
    size: np.ndarray
    edge_starts: np.ndarray  # (n + 1,) edges of index i
    esrc: np.ndarray  # block rows
    edst: np.ndarray
    entry: np.ndarray  # (n,) block row every op of the phase waits behind
    exit: np.ndarray  # (n,) block row that ends the phase on that index


@dataclass(frozen=True)
class Program:
    """A phase whose every index runs the same ops; only peers differ, by a rule per row.

    A ring's or halving-doubling's phase on ``n`` NPUs is ``O(n)`` rows per index, so laying
    it out for every index (:meth:`block`) costs ``O(n^2)``; kept as one program with
    rules, a collective over thousands of ranks stays ``O(n)`` (:class:`~._templates.Uniform`).
    """

    n: int
    kind: np.ndarray
    dur: np.ndarray
    size: np.ndarray
    mode: np.ndarray  # P_NONE, P_ROT or P_XOR per row
    val: np.ndarray  # the rule's value per row (ROT: in 0..n-1)
    esrc: np.ndarray
    edst: np.ndarray
    entry: int
    exit: int

    def peers(self, idx: np.ndarray) -> np.ndarray:
        """(len(idx), rows): the peer index of every row for indices ``idx``, -1 for delays."""
        i = np.asarray(idx, dtype=np.int64)[:, None]
        rot = (i + self.val[None, :]) % self.n
        xor = i ^ self.val[None, :]
        out: np.ndarray = np.where(self.mode == P_ROT, rot, np.where(self.mode == P_XOR, xor, -1))
        return out

    def block(self) -> Block:
        """Every index's rows laid out, as a block that mixes with non-uniform ones (trees)."""
        n, m = self.n, len(self.kind)
        base = np.arange(n, dtype=np.int64) * m
        return Block(
            starts=np.arange(n + 1, dtype=np.int64) * m,
            kind=np.tile(self.kind, n),
            dur=np.tile(self.dur, n),
            peer=self.peers(np.arange(n)).reshape(-1),
            size=np.tile(self.size, n),
            edge_starts=np.arange(n + 1, dtype=np.int64) * len(self.esrc),
            esrc=(base[:, None] + self.esrc[None, :]).reshape(-1),
            edst=(base[:, None] + self.edst[None, :]).reshape(-1),
            entry=base + self.entry,
            exit=base + self.exit,
        )


# ---------------------------------------------------------------- per-phase programs


def _chain(
    n: int,
    e0: float,
    send: tuple[int, np.ndarray],
    recv: tuple[int, np.ndarray],
    size: np.ndarray,
    after: np.ndarray,
) -> Program:
    """E0 (the first packet's memory hop), then per step k: send, receive, delay ``after[k]``
    (ring, halving-doubling).

    ``send``/``recv`` are (rule, values per step): the peer of each step's send and receive;
    step k+1's send and receive are issued when step k's delay ends (one packet in flight,
    as ASTRA-sim's Ring).
    """
    m = len(size)
    k = np.arange(m)
    kinds = np.empty(1 + 3 * m, dtype=np.int8)
    kinds[0] = K_DELAY
    kinds[1::3], kinds[2::3], kinds[3::3] = K_SEND, K_RECV, K_DELAY
    durs = np.zeros(1 + 3 * m)
    durs[0] = e0
    durs[3::3] = after
    sizes = np.zeros(1 + 3 * m, dtype=np.int64)
    sizes[1::3] = sizes[2::3] = size
    mode = np.full(1 + 3 * m, P_NONE, dtype=np.int8)
    val = np.zeros(1 + 3 * m, dtype=np.int64)
    mode[1::3], val[1::3] = send[0], send[1]
    mode[2::3], val[2::3] = recv[0], recv[1]
    s_idx, r_idx, d_idx = 1 + 3 * k, 2 + 3 * k, 3 + 3 * k
    prev = np.concatenate([[0], d_idx[:-1]])
    esrc = np.concatenate([prev, prev, r_idx])
    edst = np.concatenate([s_idx, r_idx, d_idx])
    return Program(n, kinds, durs, sizes, mode, val, esrc, edst, 0, 3 * m)


def _packet(k: int, per_round: int, kind: str) -> tuple[str, bool]:
    """(memory-hop kind, reduces?) of packet ``k`` of a one-packet-at-a-time phase.

    Packets come in rounds of one "zero-latency" packet (to the memory-access unit)
    and ``per_round`` packets from received messages; a received packet is processed
    (reduced) in reduce-scatter and in an all-reduce's even rounds, and sent back
    through memory unless it is its round's last (Ring.cc / HalvingDoubling.cc
    ``insert_packet``).
    """
    pos, rnd = k % (per_round + 1), k // (per_round + 1)
    if pos == 0:
        return "to_ma", False
    pr = kind == "RS" or (kind == "AR" and rnd % 2 == 0)
    sb = pos < per_round
    return ("pr_sb" if sb else "pr") if pr else ("sb" if sb else "plain"), pr


def _steps(sizes: Sequence[int], per_round: int, kind: str, hop: Hop, reduce: Reduce) -> np.ndarray:
    """The delay of packets 1..m (``sizes[k]``: packet k's bytes): its memory hop and reduction."""
    out = []
    for k in range(1, len(sizes)):
        pk, pr = _packet(k, per_round, kind)
        out.append(hop(sizes[k], pk) + (reduce(sizes[k]) if pr else 0.0))
    return np.array(out, dtype=np.float64)


def ring_phase(n: int, kind: str, c: int, hop: Hop, reduce: Reduce) -> Program:
    """ASTRA-sim's Ring phase on ``n`` NPUs entered with ``c`` bytes."""
    if kind == "AR":
        m, msg = 2 * (n - 1), c // n
    elif kind in ("RS", "AG"):
        m, msg = n - 1, c // n if kind == "RS" else c
    else:
        m, msg = n * (n - 1) // 2, c // n
    after = _steps([msg] * (m + 1), n - 1, kind, hop, reduce)
    right, left = np.full(m, 1 % n, dtype=np.int64), np.full(m, (n - 1) % n, dtype=np.int64)
    return _chain(n, hop(msg, "to_ma"), (P_ROT, right), (P_ROT, left), np.full(m, msg), after)


def halving_doubling_phase(n: int, kind: str, c: int, hop: Hop, reduce: Reduce) -> Program:
    """ASTRA-sim's HalvingDoubling phase: partner ``i XOR 2^k``; a packet is the *next* message,
    so reductions are charged at the next message's size and only ``log2 n - 1`` are paid."""
    lg = round(math.log2(n))
    if kind == "AG":
        offs = [n >> (k + 1) for k in range(lg)]
        sizes = [c << k for k in range(lg)]
        last = c << lg
    else:
        offs = [1 << k for k in range(lg)]
        sizes = [c >> (k + 1) for k in range(lg)]
        last = c >> (lg + 1)
        if kind == "AR":
            offs += offs[::-1]
            sizes += sizes[::-1]
            last = c
    after = _steps([*sizes, last], lg - 1, kind, hop, reduce)
    partner = (P_XOR, np.array(offs, dtype=np.int64))
    return _chain(n, hop(sizes[0], "to_ma"), partner, partner, np.array(sizes, dtype=np.int64), after)


def direct_phase(n: int, kind: str, c: int, hop: Hop, reduce: Reduce, local: bool) -> Program:
    """ASTRA-sim's AllToAll ("direct") phase: a message to every peer at once per round.

    Rows per index: E0; round 1: per ``k`` a send to ``i+k``, a receive from ``i-k`` and
    its delay (the memory hop, plus a reduction for reduce-scatter and all-reduce); then,
    for all-reduce, round 2: ASTRA-sim sends the j-th message (to ``i+j``) once every
    round-1 message has arrived (join A) and j round-1 delays have ended, whichever they
    are. The engine has no "j of n" join, so each round-1 delay sends an empty message to
    its own NPU, and the j-th of ``n-1`` receives posted at the phase's start (matched in
    order) ends with the j-th delay to end. Round 2's receives cost the memory hop (plus a
    reduction on a communicator group's ring, whose packet count makes round 2 reduce
    too). The exit X joins the last round's delays.

    ASTRA-sim also waits for a delay that ends *after* the last arrival before sending
    the first messages of round 2; that is not expressible here, so such messages leave
    at the last arrival: earlier by less than one delay (docs/simulator.md).
    """
    msg = c if kind == "AG" else c // n
    pr = kind in ("AR", "RS")
    # the round's packets are sent back through memory except its last; with the shared bus
    # (where that differs) direct is refused, so all are priced as sent back
    red1 = dict.fromkeys(range(1, n), hop(msg, "pr_sb" if pr else "sb") + (reduce(msg) if pr else 0.0))
    red2 = hop(msg, "pr_sb") + reduce(msg) if local else hop(msg, "to_ma")
    kinds: list[int] = [K_DELAY]
    durs: list[float] = [hop(msg, "to_ma")]
    rel: list[int] = [0]
    selfmsg: set[int] = set()  # rows of the empty messages an NPU sends itself
    esrc: list[int] = []
    edst: list[int] = []

    def op(kind_: int, dur: float, peer: int) -> int:
        kinds.append(kind_)
        durs.append(dur)
        rel.append(peer)
        return len(kinds) - 1

    def dep(a: int, b: int) -> None:
        esrc.append(a)
        edst.append(b)

    def round_(gates: dict[int, list[int]], delay: dict[int, float]) -> tuple[dict[int, int], dict[int, int]]:
        recv, done = {}, {}
        for k in range(1, n):
            s, r, d = op(K_SEND, 0.0, k), op(K_RECV, 0.0, -k), op(K_DELAY, delay[k], 0)
            for g in gates[k]:
                dep(g, s)
                dep(g, r)
            dep(r, d)
            recv[k], done[k] = r, d
        return recv, done

    recv, done = round_({k: [0] for k in range(1, n)}, red1)
    if kind == "AR":
        arrived = op(K_DELAY, 0.0, 0)
        for r in recv.values():
            dep(r, arrived)
        # "j reductions have ended", whichever: each reduction sends an empty message to its
        # own NPU and the j-th of n-1 receives posted at the start matches the j-th to end
        ended = [op(K_RECV, 0.0, 0) for _ in range(1, n)]
        for t in ended:
            dep(0, t)
            selfmsg.add(t)
        for d in done.values():
            s = op(K_SEND, 0.0, 0)
            dep(d, s)
            selfmsg.add(s)
        _, done = round_({j: [arrived, ended[j - 1]] for j in range(1, n)}, dict.fromkeys(recv, red2))
    exit_ = op(K_DELAY, 0.0, 0)
    for d in done.values():
        dep(d, exit_)
    kind_a = np.array(kinds, dtype=np.int8)
    is_msg = kind_a != K_DELAY
    sizes = np.where(is_msg, msg, 0).astype(np.int64)
    sizes[list(selfmsg)] = 0
    return Program(
        n,
        kind_a,
        np.array(durs),
        sizes,
        np.where(is_msg, P_ROT, P_NONE).astype(np.int8),
        np.where(is_msg, np.array(rel, dtype=np.int64) % n, 0),
        np.array(esrc, dtype=np.int64),
        np.array(edst, dtype=np.int64),
        0,
        exit_,
    )


def _tree(n: int, root_max: bool) -> tuple[list[int], list[int], list[int]]:
    """(parent, left, right) per index of ASTRA-sim's BinaryTree: a root with one child, under it
    a complete tree, numbered in order (root last for ``root_max``, first otherwise)."""
    depth = 1
    t = n
    while t > 1:
        depth += 1
        t //= 2
    parent = [-1] * n
    left = [-1] * n
    right = [-1] * n
    counter = [1 if not root_max else 0]

    def build(level: int) -> int:  # in-order numbering of a complete subtree of `level` levels
        lo = build(level - 1) if level > 1 else -1
        me = counter[0]
        counter[0] += 1
        hi = build(level - 1) if level > 1 else -1
        left[me], right[me] = lo, hi
        for ch in (lo, hi):
            if ch >= 0:
                parent[ch] = me
        return me

    sub = build(depth - 1)
    root = n - 1 if root_max else 0
    parent[sub] = root
    if root_max:
        left[root] = sub
    else:
        right[root] = sub
    return parent, left, right


def tree_phase(n: int, c: int, hop: Hop, reduce: Reduce, root_max: bool) -> Block:
    """ASTRA-sim's DoubleBinaryTreeAllReduce on one tree, every message ``c`` bytes.

    An inner node's two children's packets are processed, the second also sent back
    and, on the shared bus, processed after the first (one processing unit per NPU):
    the send up waits for the later arrival plus the longer of the two, so both are
    charged that one.
    """
    parent, left, right = _tree(n, root_max)
    red = hop(c, "pr_sb") + reduce(c)
    red2 = hop(c, "pr_sb_queued") + reduce(c)
    kinds: list[int] = []
    durs: list[float] = []
    sizes: list[int] = []
    peers: list[int] = []
    esrc: list[int] = []
    edst: list[int] = []
    starts = [0]
    estarts = [0]
    entry: list[int] = []
    exits: list[int] = []

    def op(kind: int, dur: float, peer: int) -> int:
        kinds.append(kind)
        durs.append(dur)
        sizes.append(c if kind != K_DELAY else 0)
        peers.append(peer)
        return len(kinds) - 1

    def dep(a: int, b: int) -> None:
        esrc.append(a)
        edst.append(b)

    for i in range(n):
        kids = [x for x in (left[i], right[i]) if x >= 0]
        if not kids:  # leaf: hop to memory, send up and wait for the result, hop back
            e0 = op(K_DELAY, hop(c, "to_ma"), -1)
            s, r = op(K_SEND, 0.0, parent[i]), op(K_RECV, 0.0, parent[i])
            d = op(K_DELAY, hop(c, "plain"), -1)
            for a, b in ((e0, s), (e0, r), (r, d)):
                dep(a, b)
            entry.append(e0)
            exits.append(d)
        elif parent[i] < 0:  # root: reduce its child's data, send it back down
            r = op(K_RECV, 0.0, kids[0])
            d = op(K_DELAY, red, -1)
            s = op(K_SEND, 0.0, kids[0])
            x = op(K_DELAY, 0.0, -1)
            for a, b in ((r, d), (d, s), (d, x)):
                dep(a, b)
            entry.append(r)
            exits.append(x)
        else:  # inner node: reduce both children, send up, reduce the parent's, send down
            j = op(K_DELAY, 0.0, -1)
            rl, rr = op(K_RECV, 0.0, kids[0]), op(K_RECV, 0.0, kids[1])
            dl, dr = op(K_DELAY, red2, -1), op(K_DELAY, red2, -1)
            s, r = op(K_SEND, 0.0, parent[i]), op(K_RECV, 0.0, parent[i])
            d = op(K_DELAY, red, -1)
            sl, sr = op(K_SEND, 0.0, kids[0]), op(K_SEND, 0.0, kids[1])
            x = op(K_DELAY, 0.0, -1)
            for a, b in ((j, rl), (j, rr), (rl, dl), (rr, dr), (dl, s), (dr, s), (dl, r), (dr, r)):
                dep(a, b)
            for a, b in ((r, d), (d, sl), (d, sr), (d, x)):
                dep(a, b)
            entry.append(j)
            exits.append(x)
        starts.append(len(kinds))
        estarts.append(len(esrc))
    return Block(
        starts=np.array(starts, dtype=np.int64),
        kind=np.array(kinds, dtype=np.int8),
        dur=np.array(durs),
        peer=np.array(peers, dtype=np.int64),
        size=np.array(sizes, dtype=np.int64),
        edge_starts=np.array(estarts, dtype=np.int64),
        esrc=np.array(esrc, dtype=np.int64),
        edst=np.array(edst, dtype=np.int64),
        entry=np.array(entry, dtype=np.int64),
        exit=np.array(exits, dtype=np.int64),
    )
