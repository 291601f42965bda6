"""Rewrite a trace to apply overlap, reorder and chunk-split opportunities.

Three rewrites, each returning a new :class:`~etstore.model.Trace` of kind
``rewritten`` whose ``params`` name what was applied (see ``docs/overlap.md``):

``overlap``
    A ctrl (issue-order) edge ``C → X`` from a collective to a compute op that does
    not need ``C``'s data is bypassed: ``X`` depends on ``C``'s predecessors instead,
    so it runs while ``C`` is in flight. Repeated until no such edge is left.
``reorder``
    A ctrl edge ``X → S`` from a compute op to a send or collective that does not
    need ``X``'s data is bypassed the other way: ``S`` depends on ``X``'s
    predecessors and ``S``'s successors also wait for ``X``; ``S`` moves ahead of
    ``X`` in file (issue) order, never past another send, receive or collective.
``chunk-split``
    On an expanded trace, a compute op consuming an expanded collective's output is
    split into pieces, piece ``j`` waiting only for the ops that write its chunks,
    so consumption pipelines with arrival. The last piece keeps the op's id and all
    of its original dependencies.

Guarantees, checked by :func:`check_rewrite`: no data edge is removed (every data
dependency still holds), the result is acyclic, and every edge added was implied
by the original order. Communication ops (sends, collectives) keep their relative
order on each rank, so collective instances still match across ranks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import generations
from etstore.errors import RewriteError
from etstore.model import Trace, deps_table

__all__ = [
    "REWRITE_KINDS",
    "ChunkConsumer",
    "RewriteError",
    "check_rewrite",
    "chunk_consumers",
    "rewrite",
    "rewrite_stored",
    "split_durations",
]

log = logging.getLogger(__name__)

REWRITE_KINDS = ("overlap", "reorder", "chunk-split")
_COMM = ("COMM_SEND_NODE", "COMM_COLL_NODE")
_MSG = ("COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")

Edge = tuple[int, int]




# ---------------------------------------------------------------- per-rank graphs


@dataclass
class RankGraph:
    """One rank's ops (local rows ``0..n-1`` in file order) and its edge set."""

    rank: int
    first: int  # row of local op 0 in ``trace.ops``
    ids: np.ndarray
    types: list[str]
    edges: dict[Edge, str]  # (src, dst) -> kind, insertion order = original order

    @property
    def n(self) -> int:
        return len(self.ids)

    def arrays(self, kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Edge endpoints as two int arrays (only ``kind`` edges when given)."""
        pairs = [e for e, k in self.edges.items() if kind is None or k == kind]
        if not pairs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a = np.asarray(pairs, dtype=np.int64)
        return a[:, 0], a[:, 1]

    def preds(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in self.edges:
            out[v].append(u)
        return out

    def succs(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in self.edges:
            out[u].append(v)
        return out


def rank_graphs(trace: Trace) -> list[RankGraph]:
    """Split ``trace`` into per-rank graphs over local rows. O(V + E log V)."""
    out = []
    deps = trace.deps
    d_rank = deps["rank"].to_numpy()
    order = np.argsort(d_rank, kind="stable")
    d_rank = d_rank[order]
    d_src = deps["src"].to_numpy()[order]
    d_dst = deps["dst"].to_numpy()[order]
    d_kind = (
        np.asarray(deps["kind"].to_pylist(), dtype=object)[order] if deps.num_rows else np.zeros(0, object)
    )
    types = trace.ops["type"].to_pylist()
    all_ids = trace.ops["id"].to_numpy()
    for r, (a, b) in trace.rank_slices().items():
        ids = all_ids[a:b]
        lo, hi = np.searchsorted(d_rank, r, "left"), np.searchsorted(d_rank, r, "right")
        sorter = np.argsort(ids, kind="stable")
        edges: dict[Edge, str] = {}
        if hi > lo:
            s = sorter[np.searchsorted(ids, d_src[lo:hi], sorter=sorter)]
            d = sorter[np.searchsorted(ids, d_dst[lo:hi], sorter=sorter)]
            for u, v, k in zip(s.tolist(), d.tolist(), d_kind[lo:hi].tolist(), strict=True):
                if (u, v) not in edges or k == "data":  # a data edge wins over a ctrl duplicate
                    edges[(u, v)] = k
        out.append(RankGraph(r, a, ids, types[a:b], edges))
    return out


def topo_order(g: RankGraph) -> list[int]:
    """A topological order of the rank (file order when it already is one).

    Raises
    ------
    RewriteError
        The rank's dependencies form a cycle.
    """
    src, dst = g.arrays()
    if len(src) == 0 or bool(np.all(src < dst)):
        return list(range(g.n))
    gen = generations(g.n, src, dst)
    if (gen < 0).any():
        bad = int(np.flatnonzero(gen < 0)[0])
        raise RewriteError(
            f"rank {g.rank}: dependency cycle through op {int(g.ids[bad])}; break it before rewriting"
        )
    return np.argsort(gen, kind="stable").tolist()  # type: ignore[no-any-return]


def reach(
    g: RankGraph,
    order: Sequence[int],
    sources: Sequence[int],
    *,
    kind: str | None = None,
    backward: bool = False,
) -> list[int]:
    """Per op, a bitset (Python int) of the sources it is reachable from (itself included).

    ``backward=True`` walks edges in reverse: bit ``j`` of op ``v`` then says ``v`` is
    an ancestor of ``sources[j]``. Only ``kind`` edges are walked when given.

    Notes
    -----
    O((V + E) · K / w) for K sources and word size w: one pass in topological order,
    OR-ing the bitsets of each op's predecessors.
    """
    bits = [0] * g.n
    for j, s in enumerate(sources):
        bits[s] |= 1 << j
    into: list[list[int]] = [[] for _ in range(g.n)]
    for (u, v), k in g.edges.items():
        if kind is None or k == kind:
            if backward:
                into[u].append(v)
            else:
                into[v].append(u)
    for v in reversed(order) if backward else order:
        acc = bits[v]
        for u in into[v]:
            acc |= bits[u]
        bits[v] = acc
    return bits


def _bit(bits: int, j: int) -> bool:
    return bool((bits >> j) & 1)


# ---------------------------------------------------------------- overlap / reorder


@dataclass(frozen=True)
class Applied:
    """What one rank's overlap or reorder rewrite did: ``freed[(comm, compute)]`` pairs."""

    freed: list[tuple[int, int]]  # (comm local row, compute local row) no longer ordered
    moved: dict[int, int]  # comm local row -> local row it moves in front of (reorder)


def _restore_comm_order(g: RankGraph, order: Sequence[int], comm: list[int], before: list[int]) -> None:
    """Add ctrl edges so every pair of comm ops ordered before stays ordered (in place)."""
    after = reach(g, order, comm)
    for v in comm:
        lost = before[v] & ~after[v]
        j = 0
        while lost:
            if lost & 1 and comm[j] != v:
                g.edges.setdefault((comm[j], v), "ctrl")
            lost >>= 1
            j += 1


def overlap_rank(g: RankGraph) -> Applied:
    """Bypass ctrl edges collective → independent compute on one rank (in place).

    Notes
    -----
    O((V + E) · K / w) for K communication ops on the rank, plus one step per
    bypassed edge times the collective's in-degree.
    """
    order = topo_order(g)
    comm = [i for i, t in enumerate(g.types) if t in _COMM]
    col = {c: j for j, c in enumerate(comm)}
    desc_data = reach(g, order, comm, kind="data")
    desc_all = reach(g, order, comm)
    preds = g.preds()

    def candidate(u: int, v: int) -> bool:
        return g.types[u] == "COMM_COLL_NODE" and g.types[v] == "COMP_NODE" and not _bit(desc_data[v], col[u])

    work = [e for e, k in g.edges.items() if k == "ctrl" and candidate(*e)]
    while work:
        u, v = work.pop()
        if g.edges.get((u, v)) != "ctrl":
            continue
        del g.edges[(u, v)]
        for p in preds[u]:
            if (p, v) not in g.edges:
                g.edges[(p, v)] = "ctrl"
                if candidate(p, v):
                    work.append((p, v))
    _restore_comm_order(g, order, comm, desc_all)
    desc_new = reach(g, order, comm)
    freed = [
        (c, v)
        for v in range(g.n)
        if g.types[v] == "COMP_NODE"
        for c in comm
        if g.types[c] == "COMM_COLL_NODE" and _bit(desc_all[v] & ~desc_new[v], col[c])
    ]
    return Applied(freed, {})


def reorder_rank(g: RankGraph) -> Applied:
    """Bypass ctrl edges independent compute → send/collective on one rank (in place).

    Notes
    -----
    O((V + E) · K / w) for K communication ops on the rank, plus one step per
    bypassed edge times the degrees of its endpoints.
    """
    order = topo_order(g)
    comm = [i for i, t in enumerate(g.types) if t in _COMM]
    col = {c: j for j, c in enumerate(comm)}
    anc_data = reach(g, order, comm, kind="data", backward=True)
    anc_all = reach(g, order, comm, backward=True)
    desc_all = reach(g, order, comm)
    preds, succs = g.preds(), g.succs()

    def candidate(x: int, s: int) -> bool:
        return g.types[x] == "COMP_NODE" and g.types[s] in _COMM and not _bit(anc_data[x], col[s])

    work = [e for e, k in g.edges.items() if k == "ctrl" and candidate(*e)]
    passed: dict[int, list[int]] = {}
    while work:
        x, s = work.pop()
        if g.edges.get((x, s)) != "ctrl":
            continue
        del g.edges[(x, s)]
        passed.setdefault(s, []).append(x)
        for b in succs[s]:
            g.edges.setdefault((x, b), "ctrl")  # what waited for S still waits for X
        for p in preds[x]:
            if (p, s) not in g.edges:
                g.edges[(p, s)] = "ctrl"
                if candidate(p, s):
                    work.append((p, s))
    _restore_comm_order(g, order, comm, desc_all)
    anc_new = reach(g, order, comm, backward=True)
    freed = [
        (s, v)
        for s in comm
        for v in range(g.n)
        if g.types[v] == "COMP_NODE" and _bit(anc_all[v] & ~anc_new[v], col[s])
    ]
    # file order: in front of the earliest compute op it passed, never past another message op
    moved: dict[int, int] = {}
    msg_rows = [i for i, t in enumerate(g.types) if t in _MSG]
    for s, xs in passed.items():
        target = min(xs)
        prev_msg = max((m for m in msg_rows if m < s), default=-1)
        target = max(target, prev_msg + 1)
        if target < s:
            moved[s] = target
    return Applied(freed, moved)


# ---------------------------------------------------------------- chunk-split


@dataclass(frozen=True)
class ChunkConsumer:
    """A compute op consuming one expanded collective's output on one rank.

    ``writers[slot]`` are the local rows of the expansion ops that write that chunk
    slot (receives and reductions; sends only read). ``expansion_preds`` are the
    consumer's predecessors inside the expansion.
    """

    rank: int
    coll_id: int
    consumer: int  # local row
    writers: dict[int, list[int]]
    expansion_preds: list[int]


def chunk_consumers(trace: Trace, graphs: Sequence[RankGraph], expansions: pa.Table) -> list[ChunkConsumer]:
    """Consumers of expanded collectives that could start per chunk.

    ``expansions`` has columns ``rank``, ``id`` (an op of ``trace``) and ``coll_id``
    (the collective it expands, in the parent trace). A consumer is a ``COMP_NODE``
    outside every expansion with a predecessor in exactly one expansion whose
    writers cover at least two chunk slots (``chunk_offset`` .. ``+ msg_chunk_cnt``).

    Notes
    -----
    O(V + E) over the trace.
    """
    off_all = pc.fill_null(trace.ops["chunk_offset"], -1).to_numpy()
    cnt_all = pc.fill_null(trace.ops["msg_chunk_cnt"], 1).to_numpy()
    by_rank: dict[int, dict[int, int]] = {}
    for r, i, c in zip(
        expansions["rank"].to_pylist(),
        expansions["id"].to_pylist(),
        expansions["coll_id"].to_pylist(),
        strict=True,
    ):
        by_rank.setdefault(int(r), {})[int(i)] = int(c)
    out: list[ChunkConsumer] = []
    for g in graphs:
        of = by_rank.get(g.rank)
        if not of:
            continue
        local_of = {k: of[int(i)] for k, i in enumerate(g.ids.tolist()) if int(i) in of}
        preds = g.preds()
        writers_of: dict[int, dict[int, list[int]]] = {}
        for k, c in local_of.items():
            row = g.first + k
            if g.types[k] == "COMM_SEND_NODE" or off_all[row] < 0:
                continue
            for slot in range(int(off_all[row]), int(off_all[row]) + max(int(cnt_all[row]), 1)):
                writers_of.setdefault(c, {}).setdefault(slot, []).append(k)
        for v in range(g.n):
            if v in local_of or g.types[v] != "COMP_NODE":
                continue
            inside = [u for u in preds[v] if u in local_of]
            colls = {local_of[u] for u in inside}
            if len(colls) != 1:
                continue
            c = colls.pop()
            writers = writers_of.get(c, {})
            if len(writers) >= 2:
                out.append(ChunkConsumer(g.rank, c, v, writers, sorted(inside)))
    return out


def split_durations(total: int, pieces: int) -> list[int]:
    """``total`` split into ``pieces`` integers that sum to it, the first ones larger by 1."""
    q, rem = divmod(int(total), pieces)
    return [q + 1 if j < rem else q for j in range(pieces)]


def group_slots(slots: Sequence[int], pieces: int) -> list[list[int]]:
    """Consecutive slots (already in arrival order) grouped into ``pieces`` near-equal groups."""
    sizes = split_durations(len(slots), pieces)
    out, at = [], 0
    for s in sizes:
        out.append(list(slots[at : at + s]))
        at += s
    return out


def piece_count(num_slots: int, duration_micros: int, max_pieces: int) -> int:
    """Pieces of a split consumer: one per slot, at most ``max_pieces``, each ≥ 1 µs."""
    return max(1, min(num_slots, max_pieces, int(duration_micros)))


# ---------------------------------------------------------------- assembly


def _assemble(trace: Trace, graphs: Sequence[RankGraph], new_ops: pa.Table, row_order: np.ndarray) -> Trace:
    rank, src, dst, kind = [], [], [], []
    for g in graphs:
        for (u, v), k in g.edges.items():
            rank.append(g.rank)
            src.append(int(g.ids[u]))
            dst.append(int(g.ids[v]))
            kind.append(k)
    ops = new_ops.take(pa.array(row_order))
    deps = deps_table(np.asarray(rank, dtype=np.int32), src, dst, kind)
    return trace.replace(ops=ops, deps=deps)


def rewrite(
    trace: Trace,
    kind: str,
    *,
    expansions: pa.Table | None = None,
    chunk_order: Mapping[tuple[int, int], Sequence[int]] | None = None,
    max_pieces: int = 8,
    name: str | None = None,
) -> Trace:
    """A new trace applying every ``kind`` opportunity of ``trace``.

    Parameters
    ----------
    trace
        Any acyclic trace (``chunk-split``: an expanded one).
    kind
        ``"overlap"``, ``"reorder"`` or ``"chunk-split"`` (module docstring).
    expansions
        ``chunk-split`` only: columns ``rank``, ``id``, ``coll_id`` naming the ops of
        ``trace`` that expand each collective (the store's lineage).
    chunk_order
        ``chunk-split`` only: per ``(rank, consumer id)``, its chunk slots in arrival
        order (from :func:`~etstore.query.overlap.find_opportunities`); default slot
        order.
    max_pieces
        ``chunk-split``: at most this many pieces per consumer (each ≥ 1 µs).
    name
        Name of the result (default ``<trace>-<kind>``).

    Returns
    -------
    Trace
        kind ``rewritten``; ``params`` has ``applied`` (the kind), ``parent``, ``changes``
        (edges bypassed / ops moved / consumers split) and the parent's params.

    Raises
    ------
    RewriteError
        Unknown ``kind``, a dependency cycle, ``chunk-split`` without ``expansions``,
        or a result that fails :func:`check_rewrite`.

    Notes
    -----
    O((V + E) · K / w) per rank for K sends and collectives (bitset reachability);
    ``chunk-split`` O(V + E).
    """
    return _rewrite(trace, kind, expansions, chunk_order, max_pieces, name)[0]


def _rewrite(
    trace: Trace,
    kind: str,
    expansions: pa.Table | None,
    chunk_order: Mapping[tuple[int, int], Sequence[int]] | None,
    max_pieces: int,
    name: str | None,
) -> tuple[Trace, pa.Table]:
    """:func:`rewrite` plus the lineage (``rank``, ``id``, ``parent_id``) of every new op."""
    if kind not in REWRITE_KINDS:
        raise RewriteError(f"unknown rewrite {kind!r}; expected one of {', '.join(REWRITE_KINDS)}")
    graphs = rank_graphs(trace)
    n = trace.num_ops
    row_key = np.arange(n, dtype=np.float64)
    new_ops = trace.ops
    changes = 0
    parent_ids = trace.ops["id"]
    if kind in ("overlap", "reorder"):
        for g in graphs:
            applied = overlap_rank(g) if kind == "overlap" else reorder_rank(g)
            changes += len(applied.freed)
            for s, target in applied.moved.items():
                row_key[g.first + s] = g.first + target - 0.5 + s * 1e-9
    else:
        if expansions is None:
            raise RewriteError(
                f"chunk-split of {trace.name!r} needs the expansion lineage (an expanded trace)"
            )
        new_ops, row_key, changes, piece_parent = _chunk_split(
            trace, graphs, expansions, chunk_order or {}, max_pieces
        )
        parent_ids = pa.concat_arrays([trace.ops["id"].combine_chunks(), pa.array(piece_parent, pa.uint64())])
    order = np.argsort(row_key, kind="stable")
    out = _assemble(trace, graphs, new_ops, order)
    params: dict[str, Any] = {
        "applied": kind,
        "parent": trace.name,
        "changes": changes,
        "parent_kind": trace.kind,
        "parent_params": dict(trace.params),
    }
    if kind == "chunk-split":
        params["max_pieces"] = max_pieces
    out = out.replace(name=name or f"{trace.name}-{kind}", kind="rewritten", params=params)
    check_rewrite(trace, out)
    lineage = pa.table(
        {"rank": out.ops["rank"], "id": out.ops["id"], "parent_id": parent_ids.take(pa.array(order))}
    )
    return out, lineage


def _chunk_split(
    trace: Trace,
    graphs: Sequence[RankGraph],
    expansions: pa.Table,
    chunk_order: Mapping[tuple[int, int], Sequence[int]],
    max_pieces: int,
) -> tuple[pa.Table, np.ndarray, int, list[int]]:
    """Split each chunk consumer: (ops with pieces appended, row sort key, consumers split,
    id of the op each appended piece comes from)."""
    ops = trace.ops
    n = ops.num_rows
    dur = ops["duration_micros"].to_numpy().copy()
    names = ops["name"].to_pylist()
    keys = list(np.arange(n, dtype=np.float64))
    extra_rows: list[int] = []
    extra_ids: list[int] = []
    extra_names: list[str] = []
    extra_dur: list[int] = []
    extra_parent: list[int] = []
    # rows of the table being built: n originals, then the new pieces
    done = 0
    by_rank = {g.rank: g for g in graphs}
    for cc in chunk_consumers(trace, graphs, expansions):
        g = by_rank[cc.rank]
        row = g.first + cc.consumer
        cid = int(g.ids[cc.consumer])
        slots = list(chunk_order.get((cc.rank, cid), sorted(cc.writers)))
        slots = [s for s in slots if s in cc.writers] + [s for s in sorted(cc.writers) if s not in slots]
        k = piece_count(len(slots), int(dur[row]), max_pieces)
        if k < 2:
            continue
        groups = group_slots(slots, k)
        durs = split_durations(int(dur[row]), k)
        next_id = int(g.ids.max()) + 1 if g.n else 0
        piece_local: list[int] = []
        for j in range(k - 1):
            local = g.n
            g.ids = np.append(g.ids, np.uint64(next_id))
            g.types.append("COMP_NODE")
            extra_rows.append(row)
            extra_ids.append(next_id)
            extra_names.append(f"{names[row]}.chunk{j}")
            extra_dur.append(durs[j])
            extra_parent.append(cid)
            keys.append(row - 1 + (j + 1) / k)
            piece_local.append(local)
            next_id += 1
        piece_local.append(cc.consumer)
        # the consumer's own row becomes the last piece
        in_edges = [(u, kind) for (u, v), kind in g.edges.items() if v == cc.consumer]
        for u, _kind in in_edges:
            del g.edges[(u, cc.consumer)]
        inside = set(cc.expansion_preds)
        for u, kind in in_edges:
            g.edges[(u, piece_local[-1] if u in inside else piece_local[0])] = kind
        for j, grp in enumerate(groups):
            for s in grp:
                for w in cc.writers[s]:
                    g.edges.setdefault((w, piece_local[j]), "data")
            if j:
                g.edges.setdefault((piece_local[j - 1], piece_local[j]), "ctrl")
        names[row] = f"{names[row]}.chunk{k - 1}"
        dur[row] = durs[-1]
        done += 1
    # append piece rows (copies of the consumer row) and patch name/id/duration columns
    if extra_rows:
        pieces = ops.take(pa.array(extra_rows))
        pieces = pieces.set_column(
            pieces.schema.get_field_index("id"), "id", pa.array(extra_ids, pa.uint64())
        )
        all_ops = pa.concat_tables([ops, pieces])
    else:
        all_ops = ops
    all_names = names + extra_names
    all_dur = np.concatenate([dur, np.asarray(extra_dur, dtype=np.uint64)])
    all_ops = all_ops.set_column(
        all_ops.schema.get_field_index("name"), "name", pa.array(all_names, pa.string())
    )
    all_ops = all_ops.set_column(
        all_ops.schema.get_field_index("duration_micros"), "duration_micros", pa.array(all_dur, pa.uint64())
    )
    return all_ops, np.asarray(keys), done, extra_parent


# ---------------------------------------------------------------- check


def check_rewrite(original: Trace, rewritten: Trace) -> None:
    """Refuse a rewritten trace that lost a data dependency or gained a cycle.

    Every data edge ``src → dst`` of ``original`` must still be implied in
    ``rewritten`` (a path of any edges, same rank, same ids).

    Raises
    ------
    RewriteError
        Names the rank and the first cycle op or lost dependency.

    Notes
    -----
    O((V + E) · M / w) for M data edges not kept verbatim (usually none).
    """
    graphs = {g.rank: g for g in rank_graphs(rewritten)}
    have = set(
        zip(
            rewritten.deps["rank"].to_pylist(),
            rewritten.deps["src"].to_pylist(),
            rewritten.deps["dst"].to_pylist(),
            strict=True,
        )
    )
    try:
        orders = {r: topo_order(g) for r, g in graphs.items()}
    except RewriteError as exc:
        raise RewriteError(f"rewritten trace {rewritten.name!r} is cyclic: {exc}") from exc
    d = original.deps.filter(pc.equal(original.deps["kind"], "data"))
    missing: dict[int, list[tuple[int, int]]] = {}
    for r, s, t in zip(d["rank"].to_pylist(), d["src"].to_pylist(), d["dst"].to_pylist(), strict=True):
        if (r, s, t) not in have:
            missing.setdefault(r, []).append((s, t))
    for r, pairs in missing.items():
        g = graphs.get(r)
        if g is None:
            raise RewriteError(f"rewritten trace {rewritten.name!r} lost rank {r}")
        local = {int(i): k for k, i in enumerate(g.ids.tolist())}
        for s, t in pairs:
            if s not in local or t not in local:
                raise RewriteError(
                    f"rewritten trace {rewritten.name!r}, rank {r}: op {s if s not in local else t} is gone "
                    f"but op {t} needed op {s}'s data"
                )
        srcs = sorted({local[s] for s, _ in pairs})
        col = {v: j for j, v in enumerate(srcs)}
        bits = reach(g, orders[r], srcs)
        for s, t in pairs:
            if not _bit(bits[local[t]], col[local[s]]):
                raise RewriteError(
                    f"rewritten trace {rewritten.name!r}, rank {r}: op {t} no longer waits for op {s} "
                    "whose data it needs"
                )


def rewrite_stored(
    store: Any,
    trace: str,
    kind: str,
    *,
    name: str | None = None,
    topo: Any = None,
    config: Any = None,
    run_id: int | None = None,
    max_pieces: int = 8,
) -> Any:
    """Rewrite a stored trace and store the result with ``parent = trace``.

    ``chunk-split`` reads the expansion lineage and orders each consumer's chunks by
    simulated arrival (:func:`~etstore.query.overlap.find_opportunities` with
    ``topo``/``config``/``run_id``). Every op of the result is linked to the op it
    comes from (``BECOMES`` edges; pieces to the op they split).

    Returns
    -------
    IngestReport
        Of the stored result (``report.trace.name``); ``created`` is false when the
        same rewritten content was already stored.

    Raises
    ------
    UnknownTraceError
        No such trace.
    RewriteError
        As :func:`rewrite`, or ``chunk-split`` of a trace without expansion lineage.
    """
    from etstore.query.overlap import EXPANSIONS_SQL, find_opportunities

    if kind not in REWRITE_KINDS:
        raise RewriteError(f"unknown rewrite {kind!r}; expected one of {', '.join(REWRITE_KINDS)}")
    original = store.load(trace)
    expansions = None
    order: dict[tuple[int, int], list[int]] = {}
    if kind == "chunk-split":
        expansions = store.sql(EXPANSIONS_SQL, {"trace": trace}).to_arrow()
        if expansions.num_rows == 0:
            raise RewriteError(
                f"chunk-split needs an expanded trace; {trace!r} has no ops expanded from a collective"
            )
        found = find_opportunities(
            store,
            trace,
            topo=topo,
            config=config,
            run_id=run_id,
            kinds=("chunk",),
            max_pieces=max_pieces,
            record=False,
        )
        for r, other, detail in zip(
            found["rank"].to_pylist(), found["other_id"].to_pylist(), found["detail"].to_pylist(), strict=True
        ):
            order[(int(r), int(other))] = [int(s) for s, _ in json.loads(detail)["chunks"]]
    out, lineage = _rewrite(original, kind, expansions, order, max_pieces, name)
    if not out.params.get("changes"):
        raise RewriteError(f"{kind} finds nothing to change in {trace!r}; nothing was stored")
    return store.ingest(out, name=name, parent=trace, lineage=lineage)
