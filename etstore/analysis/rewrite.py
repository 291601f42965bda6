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

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.analysis._chunks import ChunkConsumer, chunk_consumers, group_slots, piece_count, split_durations
from etstore.analysis._rankgraph import (
    RankGraph,
    has_bit,
    overlap_rank,
    rank_graphs,
    reach,
    reorder_rank,
    topo_order,
)
from etstore.analysis.hoists import apply_opportunity
from etstore.analysis.lane_split import apply_splits, splits_from_detail
from etstore.analysis.lanes import lanes_of
from etstore.analysis.split import SplitCost
from etstore.errors import RewriteError
from etstore.model import DEP_KINDS, LANE_KINDS, Trace, deps_table

__all__ = [
    "REWRITE_KINDS",
    "REWRITE_OF",
    "ChunkConsumer",
    "RewriteError",
    "check_rewrite",
    "chunk_consumers",
    "rewrite",
    "rewrite_recording",
    "rewrite_with_lineage",
    "split_durations",
]

log = logging.getLogger(__name__)

REWRITE_KINDS = ("overlap", "reorder", "chunk-split")


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
    only: Mapping[int, Collection[int]] | None = None,
    split: SplitCost | None = None,
) -> Trace:
    """A new trace applying every ``kind`` opportunity of ``trace`` (or those ``only`` names).

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
        order (from :func:`~etstore.app.overlap.find_opportunities`); default slot
        order.
    max_pieces
        ``chunk-split``: at most this many pieces per consumer (each ≥ 1 µs).
    name
        Name of the result (default ``<trace>-<kind>``).
    only
        Per rank, the op ids whose opportunities to apply, and no others: the collective
        (``overlap``), the send or collective (``reorder``), the consumer (``chunk-split``).
    split
        ``chunk-split``: what pieces cost and which ops split (:class:`~etstore.analysis.split.SplitCost`;
        default 4 µs a launch, no interference); ``params["split_ops"]`` lists each split op
        before and after.

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
    O(V + E) per rank plus searches around the changed edges (:mod:`etstore.analysis._reach`),
    and one ctrl edge per pair of comm ops whose order the bypass lost; ``chunk-split``
    O(V + E).
    """
    return rewrite_with_lineage(
        trace,
        kind,
        expansions=expansions,
        chunk_order=chunk_order,
        max_pieces=max_pieces,
        name=name,
        only=only,
        split=split,
    )[0]


def rewrite_with_lineage(
    trace: Trace,
    kind: str,
    *,
    expansions: pa.Table | None = None,
    chunk_order: Mapping[tuple[int, int], Sequence[int]] | None = None,
    max_pieces: int = 8,
    name: str | None = None,
    only: Mapping[int, Collection[int]] | None = None,
    split: SplitCost | None = None,
) -> tuple[Trace, pa.Table]:
    """:func:`rewrite` (the same parameters) plus the lineage (``rank``, ``id``, ``parent_id``) of
    every new op: what a store keeps with the result (``BECOMES`` edges; pieces to the op they
    split)."""
    if kind not in REWRITE_KINDS:
        raise RewriteError(f"unknown rewrite {kind!r}; expected one of {', '.join(REWRITE_KINDS)}")
    graphs = rank_graphs(trace)
    n = trace.num_ops
    row_key = np.arange(n, dtype=np.float64)
    new_ops = trace.ops
    changes = 0
    parent_ids = trace.ops["id"]
    cost = split or SplitCost()
    split_ops: list[dict[str, Any]] = []
    if kind in ("overlap", "reorder"):
        for g in graphs:
            mine = None
            if only is not None and g.rank not in only:  # nothing to apply on this rank
                continue
            if only is not None:
                wanted = {int(i) for i in only.get(g.rank, ())}
                mine = {k for k, i in enumerate(g.ids.tolist()) if int(i) in wanted}
            applied = overlap_rank(g, mine) if kind == "overlap" else reorder_rank(g, mine)
            changes += len(applied.freed)
            for s, target in applied.moved.items():
                row_key[g.first + s] = g.first + target - 0.5 + s * 1e-9
    else:
        if expansions is None:
            raise RewriteError(
                f"chunk-split of {trace.name!r} needs the expansion lineage (an expanded trace)"
            )
        new_ops, row_key, changes, piece_parent = _chunk_split(
            trace, graphs, expansions, chunk_order or {}, max_pieces, only, cost, split_ops
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
        params["split"] = cost.to_params()
        params["split_ops"] = split_ops
    if "execution" in trace.params:  # a recording's threads and streams stay chains of dependencies
        params["execution"] = trace.params["execution"]
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
    only: Mapping[int, Collection[int]] | None,
    cost: SplitCost,
    split_ops: list[dict[str, Any]],
) -> tuple[pa.Table, np.ndarray, int, list[int]]:
    """Split each chunk consumer that splits: (ops with pieces appended, row sort key,
    consumers split, id of the op each appended piece comes from); what each became is
    appended to ``split_ops``."""
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
        if only is not None and cid not in {int(i) for i in only.get(cc.rank, ())}:
            continue
        slots = list(chunk_order.get((cc.rank, cid), sorted(cc.writers)))
        slots = [s for s in slots if s in cc.writers] + [s for s in sorted(cc.writers) if s not in slots]
        k = piece_count(len(slots), int(dur[row]), max_pieces)
        if k < 2 or not cost.splits(names[row]):
            continue
        groups = group_slots(slots, k)
        durs = cost.pieces(int(dur[row]), k)
        split_ops.append(
            {"rank": cc.rank, "id": cid, "name": names[row], "before_us": int(dur[row]), "pieces_us": durs}
        )
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


# ---------------------------------------------------------------- recordings


def rewrite_recording(trace: Trace, details: Sequence[Mapping[str, Any]], *, name: str) -> Trace:
    """A recording with each opportunity ``detail`` applied, checked, of kind ``rewritten``: the
    hoists of ``overlap`` ones (:func:`etstore.analysis.hoists.apply_opportunity`), then the
    splits of ``chunk`` ones (:func:`etstore.analysis.lane_split.apply_splits`). It keeps the
    recording's params (so it replays) and says what was applied; a split op is listed in
    ``split_ops`` (``rank``, ``id``, ``name``, ``before_us``, ``pieces_us``).

    Raises
    ------
    RewriteError
        No opportunity given, an op of one is not in the trace, a split that is not one
        (:func:`~etstore.analysis.lane_split.apply_splits`), or the result fails
        :func:`check_rewrite`.
    """
    if not details:
        raise RewriteError(f"no opportunity to apply to {trace.name!r}; nothing was changed")
    moves = [dict(d) for d in details if d.get("moves")]
    splits = [dict(d) for d in details if d.get("splits")]
    out = trace
    try:
        if moves:
            out = apply_opportunity(out, moves)
        if splits:
            chosen = [sp for d in splits for sp in splits_from_detail(out, d)]
            out = apply_splits(out, lanes_of(out), chosen)
    except KeyError as exc:
        raise RewriteError(
            f"an opportunity names op {exc.args[0]} that {trace.name!r} does not have"
        ) from None
    out = out.replace(name=name)
    applied = "+".join(k for k, given in (("overlap", moves), ("chunk-split", splits)) if given)
    split_ops = [
        {
            "rank": s["rank"],
            "id": s["op"],
            "name": d.get("consumer", ""),
            "before_us": int(s.get("op_us", 0)),
            "pieces_us": [int(p["us"]) for p in s["pieces"]],
        }
        for d in splits
        for s in d["splits"]
    ]
    params = {
        **trace.params,
        "applied": applied,
        "parent": trace.name,
        "changes": sum(len(m["moved"]) for d in moves for m in d["moves"]) + len(split_ops),
        "parent_kind": trace.kind,
        "opportunities": [d.get("opportunity") for d in details if d.get("opportunity") is not None],
    }
    if split_ops:
        params["split_ops"] = split_ops
        params["split_pieces"] = out.params["split_pieces"]
        params["split"] = splits[0].get("split_cost") or SplitCost().to_params()  # as the finder priced them
    out = out.replace(kind="rewritten", params=params)
    check_rewrite(trace, out)
    return out


REWRITE_OF: Mapping[str, tuple[str, str]] = {
    "overlap": ("overlap", "op_id"),
    "reorder": ("reorder", "op_id"),
    "chunk": ("chunk-split", "other_id"),
}
"""Finder kind → (the rewrite that applies it, the row column naming the op it is keyed by)."""


# ---------------------------------------------------------------- check


_WHY = {
    "data": "whose data it needs",
    "overwrite": "which reads bytes it overwrites",
    "launch": "which launched it",
    "wait": "which it waited for",
    "group": "the collective before it in its process group",
}


def check_rewrite(original: Trace, rewritten: Trace) -> None:
    """Refuse a rewritten trace that lost a dependency or gained a cycle.

    Every edge ``src → dst`` of ``original`` that holds whatever the order (``data``,
    ``overwrite``, ``launch``, ``wait``, ``group``: not Chakra's issue order ``ctrl`` nor a
    recording's lane order ``thread``/``stream``) must still be implied in ``rewritten`` (a
    path of any edges, same rank, same ids).

    Raises
    ------
    RewriteError
        Names the rank and the first cycle op or lost dependency, and why it held.

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
    held = [k for k in DEP_KINDS if k != "ctrl" and k not in LANE_KINDS]  # what no rewrite may drop
    d = original.deps.filter(pc.is_in(original.deps["kind"], value_set=pa.array(held)))
    kind_of = {
        (r, s, t): k
        for r, s, t, k in zip(*(d[c].to_pylist() for c in ("rank", "src", "dst", "kind")), strict=True)
    }
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
            if not has_bit(bits[local[t]], col[local[s]]):
                raise RewriteError(
                    f"rewritten trace {rewritten.name!r}, rank {r}: op {t} no longer waits for op {s} "
                    f"({_WHY[kind_of[(r, s, t)]]})"
                )
