"""Collectives the native loop expands as they run, packed for ``_simloop.run``.

Expanding every collective instance before the loop costs memory in proportion to the
whole expanded run (30M sub-ops and 12 GiB for a 1,024-rank transformer whose groups
run rings); ASTRA-sim makes a collective's messages as it runs. With the native loop,
:func:`etstore.sim._build.build` records each instance here instead — its template
(one per algorithm, size and group, shared by every instance of that shape), its
group's NPUs and the join op of every rank — and the loop makes each sub-op of a rank's
part when it first becomes due (a predecessor ended, or the part started) and reuses its
memory once it has ended and, a send, been matched (``_simdefer.c``). A template whose
ranks all run the same ops (:class:`~._templates.Uniform`: ASTRA-sim's ring, direct,
halving-doubling) is packed as one program, its peers, match keys and message times
computed per rank, so a ring over ``g`` ranks costs ``O(g)`` here instead of ``O(g^2)``.
The ops, their edges and the order the loop walks them are those of the full expansion,
so results are the same bit for bit (``tests/sim/test_simloop.py``, ``test_defer.py``).
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
    "i_bind", "i_joff", "i_join", "coll_inst", "coll_p",
    "t_comp", "t_kstride", "t_mtstride", "rptr", "rrow", "trule", "tmtc", "r_mode", "r_dn", "r_stride",
    "num_npus",
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
    """One template's columns in loop terms: its programs (every rank's, or one for all)."""

    kind: np.ndarray
    dur: np.ndarray
    peer: np.ndarray  # absolute algorithm rank (rule -1), or the rule's value
    size: np.ndarray
    key: np.ndarray  # match key in the instance's block; one program: the class at the sender
    indeg: np.ndarray
    part: np.ndarray  # program of the row
    sink: np.ndarray
    sptr: np.ndarray  # CSR over template rows, local
    succ: np.ndarray
    pstart: np.ndarray  # (programs + 1,) rows of each program
    roots: np.ndarray  # (programs + 1,) CSR into root_rows
    root_rows: np.ndarray  # local rows without a predecessor, ascending per program
    mode: np.ndarray  # peer rule per row (tpl.P_*), with dn and stride
    dn: np.ndarray
    stride: np.ndarray
    mtc: np.ndarray  # a send's message-time class (one program), or its row
    nkeys: int  # keys of an instance
    kstride: int  # one program: key classes per sender (0: keys are absolute)
    mtstride: int  # one program: message-time classes per rank
    rep: np.ndarray  # one program: a send row of each message-time class
    comp: bool  # one program for every rank (peers by rule)


def _csr(src: np.ndarray, dst: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sptr, succ, indeg) over ``m`` rows, successors in the edges' order per source."""
    order = np.argsort(src, kind="stable")
    sptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=m), out=sptr[1:])
    return sptr, dst[order].astype(np.int64), np.bincount(dst, minlength=m).astype(np.int64)


def _roots(root: np.ndarray, pstart: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each program's root rows."""
    rows = np.flatnonzero(root).astype(np.int64)
    return np.searchsorted(rows, pstart).astype(np.int64), rows


def _pack(t: tpl.Template, match_on_size: bool) -> _Packed:
    """Template rows with their rank, successors (CSR in the template's edge order) and message keys."""
    m = int(t.starts[-1])
    part = np.repeat(np.arange(t.n, dtype=np.int64), np.diff(t.starts))
    epart = np.repeat(np.arange(t.n, dtype=np.int64), np.diff(t.edge_starts))
    sptr, succ, indeg = _csr(t.starts[epart] + t.esrc, t.starts[epart] + t.edst, m)
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
    roots, root_rows = _roots(t.root, t.starts)
    zero = np.zeros(m, dtype=np.int64)
    return _Packed(
        kind=_LOOP_KIND[kind],
        dur=t.dur_ns.astype(np.float64),
        peer=t.peer.astype(np.int64),
        size=t.size.astype(np.float64),
        key=key,
        indeg=indeg,
        part=part,
        sink=t.sink.astype(np.int64),
        sptr=sptr,
        succ=succ,
        pstart=t.starts.astype(np.int64),
        roots=roots,
        root_rows=root_rows,
        mode=zero,
        dn=zero,
        stride=zero,
        mtc=np.arange(m, dtype=np.int64),
        nkeys=nkeys,
        kstride=0,
        mtstride=0,
        rep=np.zeros(0, dtype=np.int64),
        comp=False,
    )


def _pack_uniform(t: tpl.Uniform, match_on_size: bool) -> _Packed | None:
    """One program for every rank: keys and message times by class; None where a class would
    not be one destination (two rules on one tag), so the caller lays every rank out instead."""
    m = t.rows
    kind = t.kind.astype(np.int64)
    is_send, is_recv = kind == tpl.K_SEND, kind == tpl.K_RECV
    msg = is_send | is_recv
    if (t.mode[msg] == tpl.P_NONE).any():
        return None
    rule = np.stack([t.tag[msg], t.mode[msg], t.dn[msg], t.stride[msg]], axis=1)
    per_tag = np.unique(rule, axis=0)
    if len(np.unique(per_tag[:, 0])) != len(per_tag):
        return None
    # a receive from p's peer by rule v matches that peer's send by rule -v (rotation) or v
    # (xor); with one rule per tag, (tag, rule, value at the sender) is one (destination, tag)
    sval = np.where(is_recv & (t.mode == tpl.P_ROT), (-t.val) % np.maximum(t.dn, 1), t.val)
    key = np.full(m, -1, dtype=np.int64)
    nclass = 0
    if msg.any():
        cols = [t.tag[msg], t.mode[msg], t.dn[msg], t.stride[msg], sval[msg]]
        if match_on_size:
            cols.append(t.size[msg])
        uniq, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        key[msg] = inv.ravel()
        nclass = len(uniq)
    mtc = np.zeros(m, dtype=np.int64)
    rep = np.zeros(0, dtype=np.int64)
    if is_send.any():  # sends alike in rule and size take one time per rank
        sends = np.flatnonzero(is_send)
        cols = [t.mode[sends], t.dn[sends], t.stride[sends], t.val[sends], t.size[sends]]
        _, first, inv = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
        mtc[sends] = inv.ravel()
        rep = sends[first]
    sptr, succ, indeg = _csr(t.esrc, t.edst, m)
    pstart = np.array([0, m], dtype=np.int64)
    roots, root_rows = _roots(t.root, pstart)
    return _Packed(
        kind=_LOOP_KIND[kind],
        dur=t.dur_ns.astype(np.float64),
        peer=t.val.astype(np.int64),
        size=t.size.astype(np.float64),
        key=key,
        indeg=indeg,
        part=np.zeros(m, dtype=np.int64),
        sink=t.sink.astype(np.int64),
        sptr=sptr,
        succ=succ,
        pstart=pstart,
        roots=roots,
        root_rows=root_rows,
        mode=t.mode.astype(np.int64),
        dn=t.dn,
        stride=t.stride,
        mtc=mtc,
        nkeys=t.n * nclass,
        kstride=nclass,
        mtstride=len(rep),
        rep=rep,
        comp=True,
    )


@dataclass
class Deferred:
    """Instances recorded by ``build`` for the loop to expand; :meth:`spec` packs them."""

    templates: list[tpl.AnyTemplate] = field(default_factory=list)
    bindings: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (template, group NPUs)
    inst_bind: list[int] = field(default_factory=list)
    inst_joins: list[np.ndarray] = field(default_factory=list)  # join row of each algorithm rank
    coll_rows: list[np.ndarray] = field(default_factory=list)  # collective op rows, algorithm rank order
    sub_ops: int = 0  # sub-ops the loop will make in all
    _tid: dict[int, int] = field(default_factory=dict)
    _sinks: list[np.ndarray] = field(default_factory=list)  # per template: sinks of each rank
    _bid: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict)
    _packed: list[_Packed] = field(default_factory=list)

    def add(self, t: tpl.AnyTemplate, group: np.ndarray, rows: np.ndarray, joins: np.ndarray) -> np.ndarray:
        """One instance of ``t`` on ``group``: rank p's collective op ``rows[p]`` ends with ``joins[p]``.

        Returns how many sub-ops each join waits for (its rank's sinks), counted once per template.
        """
        tid = self._tid.setdefault(id(t), len(self.templates))
        if tid == len(self.templates):
            self.templates.append(t)
            if isinstance(t, tpl.Uniform):
                self._sinks.append(np.full(t.n, int(t.sink.sum()), dtype=np.int64))
            else:
                part = np.repeat(np.arange(t.n), np.diff(t.starts))
                self._sinks.append(np.bincount(part[t.sink], minlength=t.n))
        gkey = (tid, tuple(int(x) for x in group))
        bid = self._bid.setdefault(gkey, len(self.bindings))
        if bid == len(self.bindings):
            self.bindings.append((tid, np.asarray(group, dtype=np.int64)))
        self.inst_bind.append(bid)
        self.inst_joins.append(np.asarray(joins, dtype=np.int64))
        self.coll_rows.append(np.asarray(rows, dtype=np.int64))
        self.sub_ops += t.num_ops
        return self._sinks[tid]

    @property
    def count(self) -> int:
        return len(self.inst_bind)

    def _packs(self, match_on_size: bool) -> list[_Packed]:
        """Every template packed (once): one program where the template is uniform and allows it."""
        for t in self.templates[len(self._packed) :]:
            one = _pack_uniform(t, match_on_size) if isinstance(t, tpl.Uniform) else None
            self._packed.append(one if one is not None else _pack(t.full(), match_on_size))
        return self._packed

    def _sends(self, bid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(message-time slots, source NPU, destination NPU, bytes) of binding ``bid``'s sends.

        Every rank's send rows, or, for one program, each rank's message-time classes."""
        tid, grp = self.bindings[bid]
        p = self._packed[tid]
        if p.comp:  # one program: n ranks x classes
            t = self.templates[tid]
            assert isinstance(t, tpl.Uniform)
            ranks = np.arange(t.n, dtype=np.int64)
            dst = t.peers(ranks, p.rep)
            slots = (ranks[:, None] * p.mtstride + np.arange(p.mtstride)[None, :]).ravel()
            src = np.repeat(grp, p.mtstride)
            return slots, src, grp[dst.ravel()], np.tile(p.size[p.rep], t.n)
        rows = np.flatnonzero(p.kind == K_SEND)
        return rows, grp[p.part[rows]], grp[p.peer[rows]], p.size[rows]

    def destinations(self, config: SimConfig) -> np.ndarray:
        """Every NPU a deferred collective sends to (the routes the aware loop must know)."""
        self._packs(config.match_on_size)
        out = [np.unique(self._sends(bid)[2]) for bid in range(len(self.bindings))]
        return np.unique(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)

    def spec(
        self, n: int, perm: np.ndarray, inv: np.ndarray, net: Network, config: SimConfig, aware: bool
    ) -> tuple[object, ...]:
        """The ``deferred`` argument of ``_simloop.run`` for ops renumbered by ``perm`` (``inv`` its inverse).

        Congestion-unaware, every binding's message times are computed here once
        (:meth:`Network.message_times_ns`, as for the trace's own sends).
        """
        packed = self._packs(config.match_on_size)
        i64 = np.int64
        t_op = np.zeros(len(packed) + 1, dtype=i64)
        np.cumsum([len(p.kind) for p in packed], out=t_op[1:])
        nprog = [len(p.pstart) for p in packed]
        t_poff = np.zeros(len(packed), dtype=i64)
        if packed:
            t_poff[1:] = np.cumsum(nprog)[:-1]
        tsptr_parts: list[np.ndarray] = [np.zeros(1, dtype=i64)]
        tsucc_parts, rptr_parts, rrow_parts = [], [], []
        base = rbase = 0
        for p, row0 in zip(packed, t_op[:-1], strict=True):
            tsptr_parts.append(p.sptr[1:] + base)
            tsucc_parts.append(p.succ + row0)  # successors as packed rows
            rptr_parts.append(p.roots + rbase)
            rrow_parts.append(p.root_rows + row0)  # roots as packed rows
            base += len(p.succ)
            rbase += len(p.root_rows)

        def cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(0), dtype=dtype)

        def col(name: str, dtype: type) -> np.ndarray:
            return cat([getattr(p, name) for p in packed], dtype)

        # peer rules, numbered once over every template (-1: the peer is absolute)
        rules = np.stack([col("mode", i64), col("dn", i64), col("stride", i64)], axis=1)
        ruled = rules[:, 0] != tpl.P_NONE
        trule = np.full(len(rules), -1, dtype=i64)
        table = np.zeros((0, 3), dtype=i64)
        if ruled.any():
            table, rinv = np.unique(rules[ruled], axis=0, return_inverse=True)
            trule[ruled] = rinv.ravel()
        b_tid = np.array([b[0] for b in self.bindings], dtype=i64)
        sizes = [len(b[1]) for b in self.bindings]
        b_goff = np.zeros(len(self.bindings), dtype=i64)
        if sizes:
            b_goff[1:] = np.cumsum(sizes)[:-1]
        grp = np.concatenate([b[1] for b in self.bindings]) if self.bindings else np.zeros(0, i64)
        b_mtoff = np.full(len(self.bindings), -1, dtype=i64)
        bmt = np.zeros(0)
        if not aware and self.bindings:
            bmt, b_mtoff = self._message_times(net, config)
        i_joff = np.zeros(self.count, dtype=i64)
        if self.count:
            i_joff[1:] = np.cumsum([len(j) for j in self.inst_joins])[:-1]
        i_join = inv[np.concatenate(self.inst_joins)] if self.count else np.zeros(0, i64)
        coll_inst = np.full(n, -1, dtype=i64)
        coll_p = np.full(n, -1, dtype=i64)
        for i, rows in enumerate(self.coll_rows):
            coll_inst[rows] = i
            coll_p[rows] = np.arange(len(rows))
        return (
            t_op,
            np.array([p.nkeys for p in packed], dtype=i64),
            np.array([t.n for t in self.templates], dtype=i64),
            t_poff,
            col("pstart", i64),
            col("kind", i64),
            col("peer", i64),
            col("key", i64),
            col("indeg", i64),
            col("part", i64),
            col("sink", i64),
            cat(tsptr_parts, i64),
            cat(tsucc_parts, i64),
            col("dur", np.float64),
            col("size", np.float64),
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
            np.array([p.comp for p in packed], dtype=i64),
            np.array([p.kstride for p in packed], dtype=i64),
            np.array([p.mtstride for p in packed], dtype=i64),
            cat(rptr_parts, i64),
            cat(rrow_parts, i64),
            trule,
            col("mtc", i64),
            np.ascontiguousarray(table[:, 0], dtype=i64),
            np.ascontiguousarray(table[:, 1], dtype=i64),
            np.ascontiguousarray(table[:, 2], dtype=i64),
            int(max(net.num_nodes, 1)),
        )

    def _message_times(self, net: Network, config: SimConfig) -> tuple[np.ndarray, np.ndarray]:
        """(times, offsets): per binding, the congestion-unaware time of each of its message-time
        slots (a template row, or a rank's class of one program).

        Bindings whose times come out equal (groups of one shape placed alike, e.g. every
        data-parallel ring of a torus) share one copy.
        """
        offs = np.full(len(self.bindings), -1, dtype=np.int64)
        parts: list[np.ndarray] = []
        seen: dict[bytes, int] = {}
        size = 0
        for bid, (tid, _) in enumerate(self.bindings):
            p = self._packed[tid]
            slots, src, dst, nbytes = self._sends(bid)
            mt = np.zeros(self.templates[tid].n * p.mtstride if p.comp else len(p.kind))
            if len(slots):
                mt[slots] = net.message_times_ns(
                    src, dst, nbytes, integer_ns=config.integer_ns, overhead_ns=config.message_overhead_ns
                )
            key = mt.tobytes()
            if key not in seen:
                seen[key] = size
                parts.append(mt)
                size += len(mt)
            offs[bid] = seen[key]
        return (np.concatenate(parts) if parts else np.zeros(0)), offs
