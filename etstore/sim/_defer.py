"""Collectives the native loop expands as they start, packed for ``_simloop.run``.

Expanding every collective instance before the loop costs memory in proportion to the
whole expanded run (30M sub-ops and 12 GiB for a 1,024-rank transformer whose groups
run rings); ASTRA-sim makes a collective's messages as it runs. With the native loop,
:func:`etstore.sim._build.build` records each instance here instead — its template
(one per algorithm, size and group, shared by every instance of that shape), its
group's NPUs and the join op of every rank — and the loop makes an instance's sub-ops
when its first rank starts it and reuses their memory once its last rank has joined
(``_simdefer.c``). The ops, their edges and the order the loop walks them are those of
the full expansion, so results are the same bit for bit (``tests/sim/test_defer.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from etstore.sim import _templates as tpl
from etstore.sim._kinds import K_DELAY, K_RECV, K_SEND
from etstore.sim.config import SimConfig
from etstore.sim.network import Network

__all__ = ["SPEC_FIELDS", "Deferred", "PairTotals"]

SPEC_FIELDS = (
    "t_op", "t_nkeys", "t_n", "t_poff", "pstart",
    "tkind", "tpeer", "tkey", "tindeg", "tpart", "tsink", "tsptr", "tsucc", "tdur", "tsize",
    "b_tid", "b_goff", "b_mtoff", "grp", "bmt",
    "i_bind", "i_joff", "i_join", "coll_inst", "coll_p", "num_npus",
)  # fmt: skip
"""What :meth:`Deferred.spec` returns, in order: the layout ``_simdefer.c`` reads."""

_LOOP_KIND = np.array([K_SEND, K_RECV, K_DELAY], dtype=np.int64)  # indexed by tpl.K_SEND/K_RECV/K_DELAY


@dataclass(frozen=True, eq=False)
class PairTotals:
    """Sub-op messages summed per (source, destination) NPU pair: what the link tables need."""

    src: np.ndarray
    dst: np.ndarray
    first: np.ndarray  # earliest start of a message of the pair, ns
    last: np.ndarray  # latest arrival, ns
    nbytes: np.ndarray
    count: np.ndarray

    @classmethod
    def from_loop(cls, raw: tuple[bytes, ...], num_npus: int) -> PairTotals:
        """The loop's raw pair columns (keys ``src * num_npus + dst``, then values)."""
        key, first, last, nbytes, count = (
            np.frombuffer(b, dtype=np.int64 if i in (0, 4) else np.float64) for i, b in enumerate(raw)
        )
        order = np.argsort(key, kind="stable")
        return cls(
            key[order] // num_npus,
            key[order] % num_npus,
            first[order],
            last[order],
            nbytes[order],
            count[order],
        )


@dataclass(frozen=True, eq=False)
class _Packed:
    """One template's columns in loop terms."""

    kind: np.ndarray
    dur: np.ndarray
    peer: np.ndarray
    size: np.ndarray
    key: np.ndarray
    indeg: np.ndarray
    part: np.ndarray
    sink: np.ndarray
    sptr: np.ndarray  # CSR over template rows, local
    succ: np.ndarray
    nkeys: int


def _pack(t: tpl.Template, match_on_size: bool) -> _Packed:
    """Template rows with their rank, successors (CSR in the template's edge order) and message keys."""
    m = int(t.starts[-1])
    part = np.repeat(np.arange(t.n, dtype=np.int64), np.diff(t.starts))
    epart = np.repeat(np.arange(t.n, dtype=np.int64), np.diff(t.edge_starts))
    src = t.starts[epart] + t.esrc
    dst = t.starts[epart] + t.edst
    order = np.argsort(src, kind="stable")
    sptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=m), out=sptr[1:])
    kind = t.kind.astype(np.int64)
    is_send, is_recv = kind == tpl.K_SEND, kind == tpl.K_RECV
    msg = is_send | is_recv
    key = np.full(m, -1, dtype=np.int64)
    nkeys = 0
    if msg.any():
        # the pair and tag a message matches on; the group maps ranks one to one, so these
        # are the classes the full expansion's global (source, destination, tag) keys form
        cols = [
            np.where(is_send, part, t.peer)[msg],
            np.where(is_send, t.peer, part)[msg],
            t.tag[msg],
        ]
        if match_on_size:
            cols.append(t.size[msg])
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        key[msg] = inv.ravel()
        nkeys = len(uniq)
    return _Packed(
        kind=_LOOP_KIND[kind],
        dur=t.dur_ns.astype(np.float64),
        peer=t.peer.astype(np.int64),
        size=t.size.astype(np.float64),
        key=key,
        indeg=np.bincount(dst, minlength=m).astype(np.int64),
        part=part,
        sink=t.sink.astype(np.int64),
        sptr=sptr,
        succ=dst[order].astype(np.int64),
        nkeys=nkeys,
    )


@dataclass
class Deferred:
    """Instances recorded by ``build`` for the loop to expand; :meth:`spec` packs them."""

    templates: list[tpl.Template] = field(default_factory=list)
    bindings: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (template, group NPUs)
    inst_bind: list[int] = field(default_factory=list)
    inst_joins: list[np.ndarray] = field(default_factory=list)  # join row of each algorithm rank
    coll_rows: list[np.ndarray] = field(default_factory=list)  # collective op rows, algorithm rank order
    sub_ops: int = 0  # sub-ops the loop will make in all
    _tid: dict[int, int] = field(default_factory=dict)
    _sinks: list[np.ndarray] = field(default_factory=list)  # per template: sinks of each rank
    _bid: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict)

    def add(self, t: tpl.Template, group: np.ndarray, rows: np.ndarray, joins: np.ndarray) -> np.ndarray:
        """One instance of ``t`` on ``group``: rank p's collective op ``rows[p]`` ends with ``joins[p]``.

        Returns how many sub-ops each join waits for (its rank's sinks), counted once per template.
        """
        tid = self._tid.setdefault(id(t), len(self.templates))
        if tid == len(self.templates):
            self.templates.append(t)
            part = np.repeat(np.arange(t.n), np.diff(t.starts))
            self._sinks.append(np.bincount(part[t.sink], minlength=t.n))
        gkey = (tid, tuple(int(x) for x in group))
        bid = self._bid.setdefault(gkey, len(self.bindings))
        if bid == len(self.bindings):
            self.bindings.append((tid, np.asarray(group, dtype=np.int64)))
        self.inst_bind.append(bid)
        self.inst_joins.append(np.asarray(joins, dtype=np.int64))
        self.coll_rows.append(np.asarray(rows, dtype=np.int64))
        self.sub_ops += int(t.starts[-1])
        return self._sinks[tid]

    @property
    def count(self) -> int:
        return len(self.inst_bind)

    def _sends(self, bid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(template rows, source NPU, destination NPU, bytes) of binding ``bid``'s sends."""
        tid, grp = self.bindings[bid]
        t = self.templates[tid]
        rows = np.flatnonzero(t.kind == tpl.K_SEND)
        part = np.searchsorted(t.starts, rows, side="right") - 1
        return rows, grp[part], grp[t.peer[rows]], t.size[rows]

    def destinations(self) -> np.ndarray:
        """Every NPU a deferred collective sends to (the routes the aware loop must know)."""
        out = [np.unique(self._sends(bid)[2]) for bid in range(len(self.bindings))]
        return np.unique(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)

    def spec(
        self, n: int, perm: np.ndarray, inv: np.ndarray, net: Network, config: SimConfig, aware: bool
    ) -> tuple[object, ...]:
        """The ``deferred`` argument of ``_simloop.run`` for ops renumbered by ``perm`` (``inv`` its inverse).

        Congestion-unaware, every binding's message times are computed here once
        (:meth:`Network.message_times_ns`, as for the trace's own sends).
        """
        packed = [_pack(t, config.match_on_size) for t in self.templates]
        t_op = np.zeros(len(packed) + 1, dtype=np.int64)
        np.cumsum([len(p.kind) for p in packed], out=t_op[1:])
        t_poff = np.zeros(len(packed), dtype=np.int64)
        if packed:
            t_poff[1:] = np.cumsum([t.n + 1 for t in self.templates])[:-1]
        tsptr_parts, tsucc_parts, base = [np.zeros(1, dtype=np.int64)], [], 0
        for p, row0 in zip(packed, t_op[:-1], strict=True):
            tsptr_parts.append(p.sptr[1:] + base)
            tsucc_parts.append(p.succ + row0)  # successors as packed rows
            base += len(p.succ)

        def cat(name: str, dtype: type) -> np.ndarray:
            arrs = [getattr(p, name) for p in packed]
            return np.ascontiguousarray(np.concatenate(arrs) if arrs else np.zeros(0), dtype=dtype)

        b_tid = np.array([b[0] for b in self.bindings], dtype=np.int64)
        sizes = [len(b[1]) for b in self.bindings]
        b_goff = np.zeros(len(self.bindings), dtype=np.int64)
        if sizes:
            b_goff[1:] = np.cumsum(sizes)[:-1]
        grp = np.concatenate([b[1] for b in self.bindings]) if self.bindings else np.zeros(0, np.int64)
        b_mtoff = np.full(len(self.bindings), -1, dtype=np.int64)
        bmt = np.zeros(0)
        if not aware and self.bindings:
            bmt, b_mtoff = self._message_times(packed, net, config)
        i_joff = np.zeros(self.count, dtype=np.int64)
        if self.count:
            i_joff[1:] = np.cumsum([len(j) for j in self.inst_joins])[:-1]
        i_join = inv[np.concatenate(self.inst_joins)] if self.count else np.zeros(0, np.int64)
        coll_inst = np.full(n, -1, dtype=np.int64)
        coll_p = np.full(n, -1, dtype=np.int64)
        for i, rows in enumerate(self.coll_rows):
            coll_inst[rows] = i
            coll_p[rows] = np.arange(len(rows))
        i64 = np.int64
        return (
            t_op,
            np.array([p.nkeys for p in packed], dtype=i64),
            np.array([t.n for t in self.templates], dtype=i64),
            t_poff,
            np.ascontiguousarray(
                np.concatenate([t.starts for t in self.templates]) if packed else np.zeros(0), dtype=i64
            ),
            cat("kind", i64),
            cat("peer", i64),
            cat("key", i64),
            cat("indeg", i64),
            cat("part", i64),
            cat("sink", i64),
            np.ascontiguousarray(np.concatenate(tsptr_parts), dtype=i64),
            np.ascontiguousarray(np.concatenate(tsucc_parts) if tsucc_parts else np.zeros(0), dtype=i64),
            cat("dur", np.float64),
            cat("size", np.float64),
            b_tid,
            b_goff,
            b_mtoff,
            np.ascontiguousarray(grp, dtype=i64),
            np.ascontiguousarray(bmt, dtype=np.float64),
            np.array(self.inst_bind, dtype=i64),
            i_joff,
            np.ascontiguousarray(i_join, dtype=i64),
            np.ascontiguousarray(coll_inst[perm]),
            np.ascontiguousarray(coll_p[perm]),
            int(max(net.num_nodes, 1)),
        )

    def _message_times(
        self, packed: list[_Packed], net: Network, config: SimConfig
    ) -> tuple[np.ndarray, np.ndarray]:
        """(times, offsets): per binding and template row, the congestion-unaware message time (sends).

        Bindings whose times come out equal (groups of one shape placed alike, e.g. every
        data-parallel ring of a torus) share one copy.
        """
        offs = np.full(len(self.bindings), -1, dtype=np.int64)
        parts: list[np.ndarray] = []
        seen: dict[bytes, int] = {}
        size = 0
        for bid, (tid, _) in enumerate(self.bindings):
            rows, src, dst, nbytes = self._sends(bid)
            mt = np.zeros(len(packed[tid].kind))
            if len(rows):
                mt[rows] = net.message_times_ns(
                    src, dst, nbytes, integer_ns=config.integer_ns, overhead_ns=config.message_overhead_ns
                )
            key = mt.tobytes()
            if key not in seen:
                seen[key] = size
                parts.append(mt)
                size += len(mt)
            offs[bid] = seen[key]
        return (np.concatenate(parts) if parts else np.zeros(0)), offs
