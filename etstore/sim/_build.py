"""The simulation arrays: a trace and its expanded collectives, flattened for the event loop.

Two steps, both columnar (numpy over the ops table, no Python object per op):

* :func:`build` decodes the ops (kind, duration, peer), maps dependencies to rows
  and expands every collective instance into its ranks' sub-ops (sends, receives,
  delays) plus one join per node, which ends the collective on that rank;
* :func:`loop_inputs` derives what the loop consumes: CSR successors, in-degrees,
  the NPU slot each op takes and gives back, and the key a message is matched on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import generations
from etstore.model import Trace
from etstore.sim import _templates as tpl
from etstore.sim._algorithms import Algorithms, CollectiveInstance, sim_collectives
from etstore.sim._defer import Deferred
from etstore.sim._holds import collective_holds, recorded_blocks, rewire_holds
from etstore.sim._kinds import (
    K_COLL,
    K_COMP,
    K_CPU,
    K_DELAY,
    K_JOIN,
    K_MEM,
    K_RECV,
    K_SEND,
    SUB_TAG_BASE,
)
from etstore.sim._slots import blocks_hold_slot, op_slots
from etstore.sim.config import SimConfig
from etstore.sim.network import Network
from etstore.sim.result import not_stuck

__all__ = ["Built", "LoopInputs", "TypeNames", "build", "loop_inputs"]

log = logging.getLogger(__name__)


class TypeNames:
    """Node type names of a column, dictionary-encoded (no Python string per op)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        enc = pc.dictionary_encode(column).combine_chunks()
        self.names: list[str] = [str(x) for x in enc.dictionary.to_pylist()]
        self.codes = enc.indices.to_numpy(zero_copy_only=False)

    def mask(self, name: str) -> np.ndarray:
        """Rows whose type is ``name``."""
        if name not in self.names:
            return np.zeros(len(self.codes), dtype=bool)
        mask: np.ndarray = self.codes == self.names.index(name)
        return mask

    def __getitem__(self, i: int) -> str:
        return self.names[int(self.codes[i])]


@dataclass(frozen=True, eq=False)
class Built:
    """The trace's ops (rows ``0..n0-1``) followed by collective sub-ops and joins."""

    arrays: dict[str, np.ndarray]  # kind, dur, rank, peer, tag, size, owner, local per op
    esrc: np.ndarray  # dependency edges between ops, int64
    edst: np.ndarray
    n0: int  # ops of the trace itself
    join_of: np.ndarray  # per trace op: the row of its collective's join, else -1
    instances: list[CollectiveInstance]
    ranks: np.ndarray  # distinct ranks of the trace, ascending
    types: TypeNames
    ids: np.ndarray  # node id per trace op, uint64
    is_coll: np.ndarray  # per trace op: a COMM_COLL_NODE
    is_step: np.ndarray  # per trace op: a step of an expanded collective (chunk attributes, or a block's op)
    hold_acq: np.ndarray  # rows that take the comm slot for an expanded collective's block (_holds)
    hold_rel: np.ndarray  # rows that give it back, same order
    hold_key: np.ndarray  # per block: (rank << 40) | id of the collective node it replaced, uint64
    deferred: Deferred | None  # instances the loop expands as they start (their joins are rows here)
    join_indeg: np.ndarray  # per row: in-edges from deferred sub-ops (a join waits for its rank's sinks)


@dataclass(frozen=True, eq=False)
class LoopInputs:
    """Per op (all int64 unless noted), what the event loop and its diagnostics read."""

    kind: np.ndarray
    dur: np.ndarray  # ns, float
    rank: np.ndarray
    peer: np.ndarray
    tag: np.ndarray
    size: np.ndarray  # bytes
    owner: np.ndarray  # trace op a sub-op belongs to (itself for trace ops)
    local: np.ndarray  # row of a sub-op in its template, -1 otherwise
    succ: np.ndarray  # CSR successors: succ[ptr[i]:ptr[i + 1]]
    ptr: np.ndarray
    indeg: np.ndarray
    acq: np.ndarray  # NPU slot taken when the op starts, -1 for none
    rel: np.ndarray  # slot given back when it ends, -1 for none
    free: list[float]  # free places per slot
    msrc: np.ndarray  # message source and destination NPU of sends and receives
    mdst: np.ndarray
    mkey: np.ndarray  # dense match key of sends and receives, -1 for other ops
    prio: np.ndarray  # issue order among ops waiting for one slot: a trace op's rank of (rank, node id)


class _Plan:
    """Op columns and edges collected part by part, concatenated once."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("kind", "dur", "rank", "peer", "tag", "size", "owner", "local")
        }
        self.esrc: list[np.ndarray] = []
        self.edst: list[np.ndarray] = []
        self.count = 0

    def add(self, **cols: np.ndarray) -> int:
        """Append ops (missing columns are -1); returns the row of the first."""
        first = self.count
        n = len(cols["kind"])
        for k, v in self.parts.items():
            v.append(np.asarray(cols[k]) if k in cols else np.full(n, -1, dtype=np.int64))
        self.count += n
        return first

    def edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Append dependency edges ``src -> dst`` (rows)."""
        self.esrc.append(np.asarray(src, dtype=np.int64))
        self.edst.append(np.asarray(dst, dtype=np.int64))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every column, concatenated."""
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}


@dataclass(eq=False)
class _Ops:
    """Decoded columns of the trace's ops; ``kind`` and ``dur`` change as collectives expand."""

    rank: np.ndarray
    ids: np.ndarray
    types: TypeNames
    durm: np.ndarray  # duration_micros, float
    csize: np.ndarray
    has_size: np.ndarray
    ctag: np.ndarray
    is_coll: np.ndarray
    is_step: np.ndarray  # an algorithm's step (chunk attributes): priced as one, slots per _slots
    all_ranks: np.ndarray
    kind: np.ndarray
    dur: np.ndarray  # ns
    peer: np.ndarray


def _col(table: pa.Table, name: str, fill: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values with nulls filled, validity mask) of a column."""
    arr = table[name]
    valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
    vals = pc.fill_null(arr, fill).to_numpy(zero_copy_only=False).astype(dtype)
    return vals, valid


def _factorize(*cols: np.ndarray) -> np.ndarray:
    """A dense integer id per distinct row of the given integer columns."""
    if len(cols[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    key = np.zeros(len(cols[0]), dtype=np.int64)
    span = 1
    for c in cols:
        u, inv = np.unique(c, return_inverse=True)
        if span * max(len(u), 1) >= (1 << 62):
            stacked = np.stack([np.asarray(x, dtype=np.int64) for x in cols], axis=1)
            return np.unique(stacked, axis=0, return_inverse=True)[1].ravel().astype(np.int64)
        key = key * len(u) + inv
        span *= max(len(u), 1)
    return key


# ---------------------------------------------------------------- build


def _decode_ops(trace: Trace, net: Network, config: SimConfig) -> _Ops:
    """Kind, duration and peer of every trace op; raises on ranks, peers or fields the replay lacks."""
    ops = trace.ops
    n0 = ops.num_rows
    rank = ops["rank"].to_numpy().astype(np.int64)
    ids = ops["id"].to_numpy().astype(np.uint64)
    types = TypeNames(ops["type"])
    durm, _ = _col(ops, "duration_micros", 0, np.float64)  # absent: 0, as ASTRA-sim's feeder reads it
    is_cpu, _ = _col(ops, "is_cpu_op", False, bool)
    csize, has_size = _col(ops, "comm_size", 0, np.int64)
    csrc, has_src = _col(ops, "comm_src", -1, np.int64)
    cdst, has_dst = _col(ops, "comm_dst", -1, np.int64)
    ctag, _ = _col(ops, "comm_tag", 0, np.int64)

    all_ranks = np.unique(rank)
    if len(all_ranks) and (all_ranks.min() < 0 or all_ranks.max() >= net.num_nodes):
        raise not_stuck(
            f"trace {trace.name!r} has ranks {int(all_ranks.min())}..{int(all_ranks.max())} but topology "
            f"{net.topo.name} has NPUs 0..{net.num_nodes - 1}"
        )
    unit = config.duration_unit_ns
    is_comp = types.mask("COMP_NODE")
    is_send = types.mask("COMM_SEND_NODE")
    is_recv = types.mask("COMM_RECV_NODE")
    is_coll = types.mask("COMM_COLL_NODE")
    is_mem = types.mask("MEM_LOAD_NODE") | types.mask("MEM_STORE_NODE")
    kind = np.full(n0, K_DELAY, dtype=np.int64)
    kind[is_comp & ~is_cpu] = K_COMP
    kind[is_comp & is_cpu] = K_CPU
    kind[is_send] = K_SEND
    kind[is_recv] = K_RECV
    kind[is_mem] = K_MEM
    is_step, step_cost = _algorithm_steps(ops, is_comp, csize, has_size, config)
    dur = np.where(is_comp, np.where(durm > 0, durm * unit, config.min_comp_ns), 0.0)
    dur = np.where(is_comp & is_step & (durm <= 0) & has_size, step_cost, dur)
    dur = np.where(is_mem, durm * unit, dur)
    if config.integer_ns:
        dur = np.floor(dur)
    for mask, has, what in ((is_send, has_dst, "comm_dst"), (is_recv, has_src, "comm_src")):
        bad = mask & ~has
        if bad.any():
            i = int(np.argmax(bad))
            raise not_stuck(
                f"trace {trace.name!r}: rank {int(rank[i])} node {int(ids[i])} ({types[i]}) has no {what}"
            )
    peer = np.where(is_send, cdst, np.where(is_recv, csrc, -1))
    bad = (is_send | is_recv) & ((peer < 0) | (peer >= net.num_nodes))
    if bad.any():
        i = int(np.argmax(bad))
        raise not_stuck(
            f"trace {trace.name!r}: rank {int(rank[i])} node {int(ids[i])} names peer {int(peer[i])}, "
            f"outside the topology's NPUs 0..{net.num_nodes - 1}"
        )
    return _Ops(rank, ids, types, durm, csize, has_size, ctag, is_coll, is_step, all_ranks, kind, dur, peer)


def _algorithm_steps(
    ops: pa.Table, is_comp: np.ndarray, csize: np.ndarray, has_size: np.ndarray, config: SimConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(is_step, cost): ops that carry an algorithm's chunk attributes, and a step's local cost (ns).

    ``expand`` copies an algorithm's chunk attributes (``total_chunk_cnt``) onto the
    ops that replace a collective and writes the bytes of each reduction or copy in
    its ``comm_size``; such a step is charged as inside a collective node: a
    zero-duration reduction or copy costs :func:`_templates.step_cost_ns`, and under
    ``expanded_slots="collective"`` it takes no NPU slot (:mod:`._slots`).
    """
    total, has_total = _col(ops, "total_chunk_cnt", 0, np.int64)
    is_step = has_total & (total > 0)
    cost = np.zeros(len(is_step))
    sized = is_step & is_comp & has_size
    if sized.any():
        cost[sized] = tpl.step_cost_ns(
            csize[sized],
            tpl.copy_steps(ops["name"])[sized],
            local_mem_bw_gb_per_s=config.local_mem_bw_gb_per_s,
            reduction_mem_accesses=config.reduction_mem_accesses,
            copy_mem_accesses=config.copy_mem_accesses,
            integer_ns=config.integer_ns,
            min_ns=config.min_comp_ns,
        )
    return is_step, cost


def _dependency_rows(trace: Trace, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trace dependencies as op rows ``(src, dst)``; edges naming absent nodes are dropped."""
    n0 = len(rank)
    key = (rank.astype(np.uint64) << np.uint64(40)) | ids
    korder = np.argsort(key, kind="stable")
    skey = key[korder]
    deps = trace.deps
    if deps.num_rows:
        drank = deps["rank"].to_numpy().astype(np.uint64) << np.uint64(40)
        ks, kd = drank | deps["src"].to_numpy(), drank | deps["dst"].to_numpy()
        es = korder[np.clip(np.searchsorted(skey, ks), 0, max(n0 - 1, 0))]
        ed = korder[np.clip(np.searchsorted(skey, kd), 0, max(n0 - 1, 0))]
        ok = (key[es] == ks) & (key[ed] == kd)
        if not ok.all():
            log.warning("%d dependencies name nodes absent from their rank; ignored", int((~ok).sum()))
        es, ed = es[ok].astype(np.int64), ed[ok].astype(np.int64)
    else:
        es = ed = np.zeros(0, dtype=np.int64)
    if trace.num_missing:
        log.warning("trace %s: %d dependencies on absent nodes are ignored", trace.name, trace.num_missing)
    return es, ed


def _expand_node(
    plan: _Plan, t: tpl.Template, p: int, row: int, rank: int, grp: np.ndarray, tag_base: int
) -> int:
    """Add algorithm rank ``p``'s part of ``t`` for trace op ``row``; returns the row of its join."""
    a, b = int(t.starts[p]), int(t.starts[p + 1])
    m = b - a
    sk = t.kind[a:b]
    skind = np.where(sk == tpl.K_SEND, K_SEND, np.where(sk == tpl.K_RECV, K_RECV, K_DELAY))
    speer = np.where(t.peer[a:b] >= 0, grp[np.clip(t.peer[a:b], 0, None)], -1)
    first = plan.add(
        kind=skind,
        dur=t.dur_ns[a:b],
        rank=np.full(m, rank),
        peer=speer,
        tag=tag_base + t.tag[a:b],
        size=t.size[a:b],
        owner=np.full(m, row),
        local=np.arange(a, b),
    )
    join = plan.add(
        kind=np.array([K_JOIN]),
        dur=np.zeros(1),
        rank=np.array([rank]),
        owner=np.array([row]),
        local=np.array([-1]),
    )
    ea, eb = int(t.edge_starts[p]), int(t.edge_starts[p + 1])
    plan.edges(first + t.esrc[ea:eb], first + t.edst[ea:eb])
    roots = first + np.flatnonzero(t.root[a:b])
    sinks = first + np.flatnonzero(t.sink[a:b])
    plan.edges(np.full(len(roots), row), roots)
    plan.edges(sinks, np.full(len(sinks), join))
    if m == 0:  # nothing to do on this rank (a 1-rank group): the join follows the node at once
        plan.edges(np.array([row]), np.array([join]))
    return join


def _defer_node(
    plan: _Plan, deferred: Deferred, t: tpl.AnyTemplate, grp: np.ndarray, rows: list[int], rank: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Joins for one instance the loop expands as it starts; returns (rows, their joins, sinks each
    join waits for).

    A rank whose part is empty gets an edge from its collective op to its join, as the
    full expansion gives it; every other join waits for its part's sinks (counted in
    ``join_indeg`` by the caller).
    """
    pos_of = {int(r): p for p, r in enumerate(grp)}
    by_p = np.empty(len(grp), dtype=np.int64)
    for row in rows:
        by_p[pos_of[int(rank[row])]] = row
    first = plan.add(
        kind=np.full(len(grp), K_JOIN),
        dur=np.zeros(len(grp)),
        rank=rank[by_p],
        owner=by_p,
        local=np.full(len(grp), -1),
    )
    joins = first + np.arange(len(grp), dtype=np.int64)
    empty = t.counts() == 0
    plan.edges(by_p[empty], joins[empty])
    sinks = deferred.add(t, grp, by_p, joins)
    return by_p, joins, sinks


def _expand_collectives(
    plan: _Plan,
    ops: _Ops,
    instances: list[CollectiveInstance],
    algos: Algorithms,
    config: SimConfig,
    deferred: Deferred | None,
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Expand every instance into its ranks' sub-ops, or leave it to the loop (``deferred``), or
    mark it replayed; returns ``join_of`` and, for deferred instances, (joins, sinks per join)."""
    join_of = np.full(len(ops.rank), -1, dtype=np.int64)
    waits: list[tuple[np.ndarray, np.ndarray]] = []
    full: dict[int, tpl.Template] = {}
    kind, dur, rank = ops.kind, ops.dur, ops.rank
    unit = config.duration_unit_ns
    for idx, inst in enumerate(instances):
        t, label = algos.template(inst.type, inst.size, tuple(inst.group))
        inst.algorithm = label if t is not None else "replay"
        if t is None:  # replay the node's own duration on the comm slot
            for row in inst.rows:
                kind[row] = K_DELAY
                dur[row] = np.floor(ops.durm[row] * unit) if config.integer_ns else ops.durm[row] * unit
            continue
        grp = np.asarray(algos.placement(inst.type, tuple(inst.group)), dtype=np.int64)
        if deferred is not None and t.num_ops > 0:
            rows, joins, sinks = _defer_node(plan, deferred, t, grp, inst.rows, rank)
            join_of[rows] = joins
            kind[rows] = K_COLL
            dur[rows] = 0.0
            waits.append((joins, sinks))
            continue
        pos_of = {int(r): p for p, r in enumerate(grp)}
        laid = full.setdefault(id(t), t.full())  # every rank's ops, laid out once per template
        tag_base = SUB_TAG_BASE + idx * (laid.num_tags + 1)
        for row in inst.rows:
            r = int(rank[row])
            join_of[row] = _expand_node(plan, laid, pos_of[r], row, r, grp, tag_base)
            kind[row] = K_COLL
            dur[row] = 0.0
    return join_of, waits


def _hold_slots(
    trace: Trace, plan: _Plan, ops: _Ops, es: np.ndarray, ed: np.ndarray, config: SimConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Acquire and release ops around every recorded block of an expanded trace (:mod:`._holds`).

    Returns the rewired trace edges and the acquire rows, release rows and parent
    keys per block (empty when the trace records no blocks, or under the ``"astra"``
    execution model, where each op takes its own slot). Block members become steps:
    they take no slot of their own.
    """
    empty = np.zeros(0, dtype=np.int64)
    holds = collective_holds(trace, ops.rank, ops.ids) if blocks_hold_slot(config) else None
    if holds is None:
        return es, ed, empty, empty, empty.astype(np.uint64)
    nb = holds.count
    acq_row = plan.count + np.arange(nb, dtype=np.int64)
    rel_row = acq_row + nb
    es2, ed2 = rewire_holds(holds, es, ed, acq_row, rel_row)
    if recorded_blocks(trace.params or {})[1]:
        # a rewrite may have wired an op between a block's entries and its other ops; a
        # hold that would close a cycle is dropped rather than stall the replay
        n = plan.count + 2 * nb
        if (generations(n, es2, ed2) < 0).any():
            log.warning(
                "trace %s: its rewrite reorders collective blocks; they hold no comm slot", trace.name
            )
            return es, ed, empty, empty, empty.astype(np.uint64)
    ops.is_step |= holds.member >= 0
    zeros = np.zeros(nb)
    for kind in (K_DELAY, K_JOIN):  # acquire ops, then release ops: rows acq_row, rel_row
        plan.add(
            kind=np.full(nb, kind), dur=zeros, rank=holds.rank, owner=holds.first_row, local=np.full(nb, -1)
        )
    return es2, ed2, acq_row, rel_row, holds.parent_key


def build(
    trace: Trace,
    net: Network,
    config: SimConfig,
    algos: Algorithms,
    groups: Mapping[str, Sequence[int]] | None,
    *,
    defer: bool = False,
) -> Built:
    """Flatten trace + expanded collectives into the loop's arrays.

    With ``defer`` (the native loop), collectives run by a template are left for the
    loop to expand as they start (:mod:`._defer`): only their joins become rows here.

    Raises
    ------
    SimulationError
        Ranks or peers outside the topology, ops without the fields they need,
        collectives that do not line up across their group.
    TemplateError
        An algorithm cannot be expanded for a collective.
    """
    ops = _decode_ops(trace, net, config)
    n0 = len(ops.rank)
    plan = _Plan()
    plan.add(
        kind=ops.kind,
        dur=ops.dur,
        rank=ops.rank,
        peer=ops.peer,
        tag=ops.ctag,
        size=np.where(ops.has_size, ops.csize, 0),
        owner=np.arange(n0),
        local=np.full(n0, -1),
    )
    es, ed = _dependency_rows(trace, ops.rank, ops.ids)
    instances = sim_collectives(trace, groups) if ops.is_coll.any() else []
    deferred = Deferred() if defer else None
    join_of, waits = _expand_collectives(plan, ops, instances, algos, config, deferred)
    es, ed, hold_acq, hold_rel, hold_key = _hold_slots(trace, plan, ops, es, ed, config)
    # trace edges leave a collective from its join
    if len(es):
        top = np.flatnonzero(es < n0)
        es[top] = np.where(join_of[es[top]] >= 0, join_of[es[top]], es[top])
    plan.edges(es, ed)
    arrays = plan.arrays()
    arrays["kind"][:n0] = ops.kind
    arrays["dur"][:n0] = ops.dur
    join_indeg = np.zeros(plan.count, dtype=np.int64)
    for joins, sinks in waits:
        join_indeg[joins] = sinks
    return Built(
        arrays=arrays,
        esrc=np.concatenate(plan.esrc) if plan.esrc else np.zeros(0, np.int64),
        edst=np.concatenate(plan.edst) if plan.edst else np.zeros(0, np.int64),
        n0=n0,
        join_of=join_of,
        instances=instances,
        ranks=ops.all_ranks,
        types=ops.types,
        ids=ops.ids,
        is_coll=ops.is_coll,
        is_step=ops.is_step,
        hold_acq=hold_acq,
        hold_rel=hold_rel,
        hold_key=hold_key,
        deferred=deferred if deferred is not None and deferred.count else None,
        join_indeg=join_indeg,
    )


# ---------------------------------------------------------------- loop inputs


def _successors(esrc: np.ndarray, edst: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(succ, ptr, indeg): CSR successors in edge order, and in-degrees."""
    order = np.argsort(esrc, kind="stable")
    succ = edst[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(esrc, minlength=n), out=ptr[1:])
    indeg = np.bincount(edst, minlength=n)
    return succ, ptr, indeg


def _message_keys(
    kind: np.ndarray, rank: np.ndarray, peer: np.ndarray, tag: np.ndarray, size: np.ndarray, config: SimConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(msrc, mdst, mkey): the n-th send and n-th receive of one key match."""
    is_msg = (kind == K_SEND) | (kind == K_RECV)
    msrc = np.where(kind == K_SEND, rank, peer)
    mdst = np.where(kind == K_SEND, peer, rank)
    mkey = np.full(len(kind), -1, dtype=np.int64)
    if is_msg.any():
        cols = [msrc[is_msg], mdst[is_msg], tag[is_msg]]
        if config.match_on_size:
            cols.append(size[is_msg])
        mkey[is_msg] = _factorize(*cols)
    return msrc, mdst, mkey


def _hold_prio(prio: np.ndarray, built: Built, rank: np.ndarray, by_id: np.ndarray) -> None:
    """Acquire ops wait where their removed collective nodes would have, in node-id order.

    One (rank, id) order of trace ops and removed nodes together: acquires of nodes no
    trace op separates are ordered by node id too (as the instances are), not by row,
    which follows the file and may differ from rank to rank.
    """
    n0 = built.n0
    keys = ((rank[:n0].astype(np.uint64) << np.uint64(40)) | built.ids)[by_id]
    hord = np.argsort(built.hold_key, kind="stable")
    before = np.searchsorted(keys, built.hold_key[hord])  # trace ops ahead of each acquire, by key
    prio[by_id] = np.arange(n0, dtype=np.int64) + np.searchsorted(before, np.arange(n0), side="right")
    prio[built.hold_acq[hord]] = before + np.arange(len(hord), dtype=np.int64)


def loop_inputs(built: Built, config: SimConfig) -> LoopInputs:
    """What the event loop reads, derived from :func:`build`'s arrays (O(V + E log E))."""
    a = built.arrays
    n = len(a["kind"])
    kind = a["kind"].astype(np.int64)
    rank = a["rank"].astype(np.int64)
    peer = a["peer"].astype(np.int64)
    tag = a["tag"].astype(np.int64)
    size = a["size"].astype(np.int64)
    succ, ptr, indeg = _successors(built.esrc, built.edst, n)
    indeg = indeg + built.join_indeg
    acq, rel, free = op_slots(built, kind, rank, config)
    msrc, mdst, mkey = _message_keys(kind, rank, peer, tag, size, config)
    # ASTRA-sim issues a rank's dependency-free nodes in ascending node id; ids are uint64,
    # so the loop gets each trace op's position in (rank, id) order instead
    prio = np.zeros(n, dtype=np.int64)
    by_id = np.lexsort((built.ids, rank[: built.n0]))
    prio[by_id] = 2 * np.arange(built.n0, dtype=np.int64)
    if len(built.hold_acq):
        _hold_prio(prio, built, rank, by_id)
    return LoopInputs(
        kind=kind,
        dur=a["dur"],
        rank=rank,
        peer=peer,
        tag=tag,
        size=size,
        owner=a["owner"].astype(np.int64),
        local=a["local"],
        succ=succ,
        ptr=ptr,
        indeg=indeg,
        acq=acq,
        rel=rel,
        free=free,
        msrc=msrc,
        mdst=mdst,
        mkey=mkey,
        prio=prio,
    )
