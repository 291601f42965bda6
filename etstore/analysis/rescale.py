"""Re-scale a trace: the same training step on another number of ranks, as the framework would run it.

Why: a trace collected at one size (8 GPUs) is asked about at another (16 NPUs), and a
parallel layout changes what each rank does in ways a plain copy of ranks gets wrong.

The layout is ``dp × tp``, tensor-parallel ranks adjacent (rank ``r`` is replica ``r // tp``,
shard ``r % tp``, as ``etstore workload`` lays them out); ``tp`` comes from ``params["tp"]``,
else from the caller (``source_tp``); a recording is a data-parallel (DDP) step, ``tp`` 1.
Each new rank repeats the ops, dependencies and durations of a template rank: itself where
the parent has it, else the rank at its place in the parent's replicas. Then:

* **data parallel**: the data-parallel groups hold the new replicas; what a rank moves
  (gradients) and computes is unchanged. Only all-reduce, reduce, broadcast and barrier keep
  their size when their group changes; other collectives over it are refused.
* **tensor parallel**: ``COMP_NODE`` durations and the data-parallel (gradient) collective
  sizes × ``tp_old / tp_new``, the shard ratio: what FLOPs from op shapes would give for a
  matmul sharded along one dimension, while which ops are sharded is in no trace (the notes
  say so). Tensor-parallel collectives move activations and point-to-point messages keep
  their size; a peer keeps its offset from the sender in the layout.
* **pipeline parallel**: refused, as is what cannot be rescaled correctly (one line each;
  ``docs/whatif.md``, "Re-scaling a trace", lists them).

The result is a ``workload`` whose ``params["rescaled"]`` records the parent, both layouts,
the template rule and the notes; ``ranks``, ``world_size``, ``tp``, ``comm_groups`` and the
per-rank entries of ``params`` (a recording's ``windows``) follow the new ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError, RewriteError
from etstore.model import CHUNK_COLUMNS, Trace, TraceKind
from etstore.units import budget_exceeded

__all__ = ["Layout", "rescale", "source_layout", "target_layout"]

RECORDED = "recorded"
SIZE_KEEPING = frozenset({"ALL_REDUCE", "REDUCE", "BROADCAST", "BARRIER"})
"""Collectives whose ``comm_size`` does not depend on the size of their group."""
FUNCTIONAL = "_c10d_functional::"
"""Name prefix of PyTorch's functional collectives (DTensor, tensor parallelism), not DDP's."""
DP, TP = "dp", "tp"


@dataclass(frozen=True)
class Layout:
    """A ``dp × tp`` layout (``pp`` 1), tensor-parallel ranks adjacent.

    >>> Layout(dp=4, tp=2).ranks, Layout(dp=4, tp=2).coords(5)
    (8, (2, 1))
    """

    dp: int
    tp: int

    @property
    def ranks(self) -> int:
        return self.dp * self.tp

    def degree(self, cls: str) -> int:
        """The size of a group of class ``cls`` (``dp`` or ``tp``)."""
        return self.dp if cls == DP else self.tp

    def coords(self, rank: Any) -> tuple[Any, Any]:
        """(replica, shard) of a rank, or of an array of ranks."""
        return rank // self.tp, rank % self.tp

    def group(self, cls: str, coord: int) -> list[int]:
        """Members of the ``tp`` group of replica ``coord``, or the ``dp`` group of shard ``coord``."""
        if cls == TP:
            return list(range(coord * self.tp, (coord + 1) * self.tp))
        return list(range(coord, self.ranks, self.tp))

    def groups(self, cls: str) -> int:
        """How many groups of class ``cls`` there are (one per coordinate)."""
        return self.dp if cls == TP else self.tp

    def __str__(self) -> str:
        return f"{self.ranks} ranks (dp {self.dp} x tp {self.tp})"


def _positive(label: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OptionError(f"rescale: {label} must be a positive integer, got {value!r}")
    return value


def source_layout(trace: Trace, source_tp: int | None = None) -> Layout:
    """The layout ``trace`` was made with: ``tp`` from its params, a recording's 1, or ``source_tp``.

    Raises
    ------
    OptionError
        The layout is not known, contradicts the trace, or has ``pp`` other than 1.
    """
    params = trace.params or {}
    if params.get("pp", 1) != 1:
        raise OptionError(
            f"rescale: {trace.name!r} has pp {params['pp']}: pipeline-parallel traces are not rescaled "
            "(changing the stage count moves layers between ranks)"
        )
    stated = params.get("tp")
    recorded = params.get("execution") == RECORDED
    if source_tp is not None:
        _positive("--from-tp", source_tp)
    if stated is not None and source_tp is not None and stated != source_tp:
        raise OptionError(f"rescale: {trace.name!r} says tp {stated}; --from-tp {source_tp} contradicts it")
    if recorded and source_tp not in (None, 1):
        raise OptionError(
            "rescale: a recording is rescaled as a data-parallel (DDP) step, tp 1; its tensor-parallel "
            "layout (which tensors are sharded, along which dimension) is not in the trace"
        )
    tp = stated if stated is not None else source_tp if source_tp is not None else 1 if recorded else None
    if tp is None:
        raise OptionError(
            f"rescale: the params of {trace.name!r} name no tp; give --from-tp (1: purely data parallel)"
        )
    tp = _positive("the trace's tp", tp)
    ranks = trace.ranks
    if ranks != list(range(len(ranks))) or not ranks:
        raise RewriteError(f"rescale: {trace.name!r} holds ranks {ranks[:8]}...; rescale needs ranks 0..N-1")
    if len(ranks) % tp:
        raise OptionError(f"rescale: {trace.name!r} has {len(ranks)} ranks, not a multiple of its tp {tp}")
    return Layout(dp=len(ranks) // tp, tp=tp)


def target_layout(
    old: Layout,
    *,
    ranks: int | None = None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
) -> Layout:
    """The layout asked for: ``tp`` defaults to the trace's, ``dp`` to ``ranks / tp``.

    >>> target_layout(Layout(dp=4, tp=2), ranks=16)
    Layout(dp=8, tp=2)
    >>> target_layout(Layout(dp=4, tp=2), ranks=8, tp=4)
    Layout(dp=2, tp=4)
    """
    if pp is not None and _positive("--pp", pp) != 1:
        raise OptionError(
            f"rescale: pp {pp} is not supported: changing the pipeline stage count moves layers between "
            "ranks, which a trace of per-rank ops cannot do"
        )
    tp1 = _positive("--tp", tp) if tp is not None else old.tp
    if ranks is None and dp is None:
        raise OptionError("rescale: give --ranks N (and/or --dp D)")
    if dp is not None:
        _positive("--dp", dp)
    if ranks is not None:
        _positive("--ranks", ranks)
        if ranks % tp1:
            raise OptionError(f"rescale: --ranks {ranks} is not a multiple of tp {tp1}")
    dp1 = dp if dp is not None else (ranks or 0) // tp1
    if ranks is not None and dp1 * tp1 != ranks:
        raise OptionError(f"rescale: --ranks {ranks} is not dp {dp1} x tp {tp1} x pp 1")
    return Layout(dp=dp1, tp=tp1)


# ---------------------------------------------------------------- groups


def _classify(trace: Trace, old: Layout) -> dict[str, tuple[str, int]]:
    """``{group name: (class, coordinate)}`` of every group in ``params["comm_groups"]``."""
    groups = (trace.params or {}).get("comm_groups") or {}
    out: dict[str, tuple[str, int]] = {}
    for name, members in groups.items():
        m = [int(r) for r in members]
        found = None
        if not m:
            raise RewriteError(f"rescale: group {name!r} has no ranks")
        for cls in (DP, TP):  # a one-rank group of a one-rank trace is both: DP first (DDP on one rank)
            coord = m[0] // old.tp if cls == TP else m[0] % old.tp
            if m == old.group(cls, coord):
                found = (cls, coord)
                break
        if found is None:
            raise RewriteError(
                f"rescale: group {name!r} (ranks {m[:8]}) is neither a tensor- nor a data-parallel group "
                f"of {old} with tensor-parallel ranks adjacent"
            )
        out[str(name)] = found
    return out


def _new_names(classes: Mapping[str, tuple[str, int]], old: Layout, new: Layout) -> dict[str, list[str]]:
    """Per class, the names of the new groups by coordinate: ``<prefix><coordinate>`` when the
    old names follow that pattern (``tp0``, ``dp1``, ``0``), the old name when one group stays one."""
    out: dict[str, list[str]] = {}
    for cls in (DP, TP):
        mine = [(coord, name) for name, (c, coord) in classes.items() if c == cls]
        if not mine:
            continue
        named = dict(mine)
        if len(named) < len(mine):
            raise RewriteError(f"rescale: two {cls} groups hold the same ranks; cannot tell which one grows")
        count = new.groups(cls)
        prefixes = {name[: len(name) - len(str(coord))] for coord, name in mine if name.endswith(str(coord))}
        if len(prefixes) == 1 and all(name.endswith(str(coord)) for coord, name in mine):
            prefix = prefixes.pop()
            out[cls] = [f"{prefix}{c}" for c in range(count)]
        elif len(mine) == 1 and old.groups(cls) == 1 and count == 1:
            out[cls] = [mine[0][1]]
        else:
            raise RewriteError(
                f"rescale: cannot name the {count} new {cls} groups from {sorted(named.values())[:4]} "
                "(expected names ending in the group's index)"
            )
    if DP in out and TP in out and set(out[DP]) & set(out[TP]):
        raise RewriteError("rescale: the new data- and tensor-parallel groups would share names")
    return out


# ---------------------------------------------------------------- checks


def _check(trace: Trace, old: Layout, new: Layout, cls_of_row: np.ndarray, coll: np.ndarray) -> None:
    """Refuse what cannot be rescaled correctly (one line each; see the module docstring)."""
    ops = trace.ops
    types = ops["type"].to_numpy(zero_copy_only=False)
    comm = np.asarray(ops["comm_type"].to_pylist(), dtype=object)
    recorded = (trace.params or {}).get("execution") == RECORDED
    if recorded and old.tp != new.tp:
        raise RewriteError(
            f"rescale: tp of a recording: which of its tensors are sharded, along which dimension, is not "
            f"in the trace; {trace.name!r} is rescaled only in dp"
        )
    if recorded:
        functional = pc.any(pc.starts_with(ops["name"], FUNCTIONAL)).as_py()
        if functional:
            raise RewriteError(
                f"rescale: {trace.name!r} holds functional collectives ({FUNCTIONAL}...), which tensor "
                "parallelism issues; a recording is rescaled only as a data-parallel (DDP) step"
            )
        if np.isin(types, ("COMM_SEND_NODE", "COMM_RECV_NODE")).any():
            raise RewriteError(
                f"rescale: {trace.name!r} is a recording with sends and receives (pipeline stages?); "
                "a recording is rescaled only as a data-parallel (DDP) step"
            )
    roots = coll & (
        ops["comm_src"].is_valid().to_numpy(zero_copy_only=False)
        | ops["comm_dst"].is_valid().to_numpy(zero_copy_only=False)
    )
    if roots.any():
        raise RewriteError(f"rescale: {trace.name!r} has collectives with a root rank (comm_src/comm_dst)")
    for cls, label in ((DP, "dp"), (TP, "tp")):
        mine = coll & (cls_of_row == cls)
        a, b = old.degree(cls), new.degree(cls)
        if a > 1 and b == 1 and mine.any() and not recorded:  # DDP keeps them over one rank
            raise RewriteError(
                f"rescale: {label} {a} -> 1 would leave its collectives over one rank each; whether the "
                "framework issues them there (DDP does, etstore workload does not) is not in the trace"
            )
        if a == 1 and b > 1 and not mine.any():
            raise RewriteError(
                f"rescale: {label} 1 -> {b}: the trace has no {label} collectives to grow (a framework "
                f"issues them only when {label} > 1); rescale a trace made with {label} > 1"
            )
        if cls == DP and a != b:
            other = sorted(set(comm[mine].tolist()) - SIZE_KEEPING)
            if other:
                raise RewriteError(
                    f"rescale: dp {a} -> {b} would change what {other[0]} over a data-parallel group moves "
                    "per rank (a 1/dp share), which the trace does not say; only all-reduce, reduce, "
                    "broadcast and barrier keep their size"
                )


def _check_groups_match(out: Trace, groups: Mapping[str, list[int]]) -> None:
    """Every member of each new group issues as many collectives (else their instances would not match)."""
    coll = out.ops.filter(pc.equal(out.ops["type"], "COMM_COLL_NODE")).select(["rank", "pg_name"])
    counts = coll.group_by(["pg_name", "rank"]).aggregate([("rank", "count")])
    seen: dict[Any, tuple[set[int], set[int]]] = {}
    for name, rank, n in zip(
        *(counts[c].to_pylist() for c in ("pg_name", "rank", "rank_count")), strict=True
    ):
        ranks, sizes = seen.setdefault(name, (set(), set()))
        ranks.add(rank)
        sizes.add(n)
    for name, (ranks, sizes) in seen.items():
        members = groups.get(name) if name is not None else None
        if len(sizes) > 1 or (members is not None and ranks != set(members)):
            raise RewriteError(
                f"rescale: the members of group {name!r} would issue different numbers of collectives (the "
                "trace's ranks are not alike; rescale needs every replica and shard to run the same step)"
            )


# ---------------------------------------------------------------- assembly


def _templates(old: Layout, new: Layout) -> np.ndarray:
    """The parent rank each new rank repeats: itself where it exists, else its place in a replica.

    >>> _templates(Layout(dp=2, tp=2), Layout(dp=4, tp=2)).tolist()
    [0, 1, 2, 3, 0, 1, 2, 3]
    """
    r = np.arange(new.ranks, dtype=np.int64)
    d, t = new.coords(r)
    return np.where(r < old.ranks, r, (d % old.dp) * old.tp + (t % old.tp))


def _take_ranks(table: pa.Table, old_ranks: int, templates: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """``table``'s rows of each template rank in turn, and the new rank of each row (O(rows))."""
    rank = table["rank"].to_numpy().astype(np.int64) if table.num_rows else np.zeros(0, np.int64)
    order = np.argsort(rank, kind="stable") if len(rank) > 1 and (np.diff(rank) < 0).any() else None
    sorted_rank = rank if order is None else rank[order]
    bounds = np.searchsorted(sorted_rank, np.arange(old_ranks + 1))
    starts, lens = bounds[templates], bounds[templates + 1] - bounds[templates]
    offsets = np.cumsum(lens) - lens
    idx = np.repeat(starts - offsets, lens) + np.arange(int(lens.sum()))
    rows = idx if order is None else order[idx]
    new_rank = np.repeat(np.arange(len(templates), dtype=np.int32), lens)
    return _set(table.take(pa.array(rows, pa.int64())), "rank", pa.array(new_rank, pa.int32())), rows


def _set(table: pa.Table, column: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(column), column, values)


def _signed(delta: np.ndarray, n: int, tie: int) -> np.ndarray:
    """An offset along a ring of ``n`` as the shortest signed step; half-way goes ``tie``'s way.

    >>> _signed(np.array([1, 3, 2]), 4, -1).tolist()
    [1, -1, -2]
    """
    delta = delta % n
    out = np.where(2 * delta > n, delta - n, delta)
    return np.where(2 * delta == n, tie * delta, out)


def _peers(
    column: pa.ChunkedArray,
    p2p: np.ndarray,
    tpl: np.ndarray,
    new_rank: np.ndarray,
    old: Layout,
    new: Layout,
    tie: int,
) -> pa.Array:
    """A sender's or receiver's peer moved with it: the same offset in replicas and shards."""
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(column, 0).to_numpy().astype(np.int64)
    moving = valid & p2p
    if ((values < 0) | (values >= old.ranks))[moving].any():
        raise RewriteError("rescale: a send or receive names a peer outside the trace's ranks")
    (dp_, tp_), (ds, ts) = old.coords(values), old.coords(tpl)
    dd, dt = _signed(dp_ - ds, old.dp, tie), _signed(tp_ - ts, old.tp, tie)
    d1, t1 = new.coords(new_rank)
    moved = ((d1 + dd) % new.dp) * new.tp + (t1 + dt) % new.tp
    if (moving & (moved == new_rank) & (values != tpl)).any():
        raise RewriteError("rescale: a send or receive would reach its own rank in the new layout")
    return pa.array(np.where(moving, moved, values), pa.int32(), mask=~valid)


def _row_classes(
    trace: Trace, old: Layout, new: Layout, classes: Mapping[str, tuple[str, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op of the parent: its group's class (``""`` none), whether a collective, whether one without
    ``pg_name`` (all ranks: the one group of its class, which must stay one)."""
    pg_values = trace.ops["pg_name"].to_pylist()
    is_coll = pc.equal(trace.ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    unknown = sorted(
        {str(v) for v, c in zip(pg_values, is_coll.tolist(), strict=True) if c and v is not None}
        - set(classes)
    )
    if unknown:
        raise RewriteError(f"rescale: group {unknown[0]!r} is not in the trace's params comm_groups")
    world = DP if old.tp == 1 else TP if old.dp == 1 else ""
    nameless = is_coll & ~trace.ops["pg_name"].is_valid().to_numpy(zero_copy_only=False)
    if nameless.any() and (not world or new.groups(world) != 1):
        raise RewriteError(
            "rescale: collectives without pg_name span all ranks; in the new layout they need a group name"
        )
    cls_of_row = np.array([classes[v][0] if v in classes else "" for v in pg_values], dtype=object)
    cls_of_row[nameless] = world
    return cls_of_row, is_coll, nameless


def _shard(ops: pa.Table, grads: np.ndarray, tp0: int, tp1: int) -> pa.Table:
    """Compute durations and gradient (data-parallel collective) sizes × ``tp0 / tp1``."""
    size = ops["comm_size"]
    scaled = pc.fill_null(size, 0).to_numpy().astype(np.int64)
    scaled = np.where(grads, scaled * tp0 // tp1, scaled)
    ops = _set(
        ops, "comm_size", pa.array(scaled, pa.int64(), mask=~size.is_valid().to_numpy(zero_copy_only=False))
    )
    comp = pc.equal(ops["type"], "COMP_NODE").to_numpy(zero_copy_only=False)
    dur = ops["duration_micros"].to_numpy().astype(np.float64)
    return _set(
        ops, "duration_micros", pa.array(np.where(comp, np.rint(dur * tp0 / tp1), dur).astype(np.uint64))
    )


def _params(
    trace: Trace,
    old: Layout,
    new: Layout,
    templates: np.ndarray,
    classes: Mapping[str, tuple[str, int]],
    names: Mapping[str, list[str]],
    notes: list[str],
) -> dict[str, Any]:
    """The parent's params for the new ranks and groups, with the derivation in ``rescaled``."""
    params = dict(trace.params or {})
    keys = {str(r) for r in range(old.ranks)}
    for key, value in list(params.items()):  # keyed by every rank: a recording's windows, profiler_steps
        if key != "comm_groups" and isinstance(value, Mapping) and set(value) == keys:
            params[key] = {str(r): value[str(t)] for r, t in enumerate(templates.tolist())}
    if "comm_groups" in params:
        groups: dict[str, list[int]] = {}
        for key in params["comm_groups"]:
            c = classes[str(key)][0]
            for coord, gname in enumerate(names[c]):
                groups.setdefault(gname, new.group(c, coord))
        params["comm_groups"] = groups
    for key, value in (("ranks", new.ranks), ("world_size", new.ranks), ("tp", new.tp)):
        if key in params:
            params[key] = value
    params["rescaled"] = {
        "parent": trace.name,
        "from": {"ranks": old.ranks, "dp": old.dp, "tp": old.tp, "pp": 1},
        "to": {"ranks": new.ranks, "dp": new.dp, "tp": new.tp, "pp": 1},
        "templates": "rank r repeats rank r of the parent where it exists, else rank "
        "(d mod dp_old) * tp_old + (t mod tp_old) of replica d, shard t",
        "notes": notes,
    }
    return params


def rescale(
    trace: Trace,
    *,
    ranks: int | None = None,
    dp: int | None = None,
    tp: int | None = None,
    pp: int | None = None,
    source_tp: int | None = None,
    name: str | None = None,
) -> Trace:
    """``trace`` on ``ranks`` = ``dp × tp`` ranks, as the framework would run it (module docstring).

    Parameters
    ----------
    trace
        A ``workload`` (or ``rescaled``): generated (``params["tp"]``), recorded (a DDP step), or any other
        with ``source_tp``.
    ranks, dp, tp, pp
        The new layout; ``tp`` defaults to the trace's, ``dp`` to ``ranks / tp``; ``pp``
        must be 1.
    source_tp
        The trace's tensor-parallel degree where its params do not say.
    name
        Of the result (default ``<trace>-<N>r``, ``-tp<T>`` added when tp changes).

    Returns
    -------
    Trace
        kind ``workload``; ``params["rescaled"]``: parent, ``from`` and ``to`` layouts,
        template rule and notes.

    Raises
    ------
    OptionError
        A bad or inconsistent layout, or one over the memory budget.
    RewriteError
        What cannot be rescaled correctly (module docstring), in one line.

    Notes
    -----
    O(result ops + deps), columnar: each new rank's rows are taken from its template's.
    """
    if trace.kind not in (TraceKind.WORKLOAD.value, TraceKind.RESCALED.value):
        raise RewriteError(
            f"rescale: {trace.name!r} is of kind {trace.kind}; rescale the workload it comes from, then "
            "expand or rewrite the result"
        )
    chunked = [c for c in CHUNK_COLUMNS if trace.ops[c].null_count < trace.num_ops]
    if chunked:
        raise RewriteError(f"rescale: {trace.name!r} holds an algorithm's chunk-level ops ({chunked[0]})")
    old = source_layout(trace, source_tp)
    new = target_layout(old, ranks=ranks, dp=dp, tp=tp, pp=pp)
    if new == old:
        raise OptionError(f"rescale: {trace.name!r} already has {old}; nothing to change")
    per_rank_bytes = (trace.ops.nbytes + trace.deps.nbytes + trace.missing.nbytes) / old.ranks
    too_big = budget_exceeded(
        2.5 * per_rank_bytes * new.ranks, f"rescale of {trace.name!r} to {new.ranks:,} ranks"
    )
    if too_big is not None:
        raise OptionError(too_big)
    classes = _classify(trace, old)
    names = _new_names(classes, old, new)
    cls_of_row, is_coll, nameless = _row_classes(trace, old, new, classes)
    _check(trace, old, new, cls_of_row, is_coll)

    templates = _templates(old, new)
    ops, rows = _take_ranks(trace.ops, old.ranks, templates)
    new_rank = ops["rank"].to_numpy().astype(np.int64)
    d1, t1 = new.coords(new_rank)
    cls = cls_of_row[rows]
    # groups: each op of a known group moves to the group of its class at the rank's new coordinate
    new_pg = np.asarray(ops["pg_name"].to_pylist(), dtype=object)
    for c, coord in ((DP, t1), (TP, d1)):
        sel = (cls == c) & ~nameless[rows]
        if sel.any():
            new_pg[sel] = np.asarray(names[c], dtype=object)[coord[sel]]
    ops = _set(ops, "pg_name", pa.array(new_pg.tolist(), pa.string()))
    notes = [
        f"{label} groups: {old.degree(c)} -> {new.degree(c)} ranks"
        for c, label in ((DP, "data-parallel"), (TP, "tensor-parallel"))
        if old.degree(c) != new.degree(c)
    ]
    if old.tp != new.tp:
        ops = _shard(ops, is_coll[rows] & (cls == DP), old.tp, new.tp)
        notes.append(
            f"compute: every COMP_NODE's duration x {old.tp}/{new.tp}, the shard ratio, not FLOPs from op "
            f"shapes (which ops are sharded is not in the trace); data-parallel collective sizes x "
            f"{old.tp}/{new.tp}"
        )
    else:
        notes.append("compute and collective sizes unchanged (data parallel: the same step on each rank)")
    p2p = np.isin(ops["type"].to_numpy(zero_copy_only=False), ("COMM_SEND_NODE", "COMM_RECV_NODE"))
    if p2p.any():
        tpl = templates[new_rank]
        for column, tie in (("comm_dst", 1), ("comm_src", -1)):
            ops = _set(ops, column, _peers(ops[column], p2p, tpl, new_rank, old, new, tie))
    if (trace.params or {}).get("execution") == RECORDED:
        notes.append(
            "new ranks repeat their template's recorded durations and start times, collectives included"
        )
    params = _params(trace, old, new, templates, classes, names, notes)
    out = Trace(
        ops=ops,
        deps=_take_ranks(trace.deps, old.ranks, templates)[0],
        missing=_take_ranks(trace.missing, old.ranks, templates)[0],
        meta=_take_ranks(trace.meta, old.ranks, templates)[0],
        name=name or f"{trace.name}-{new.ranks}r" + (f"-tp{new.tp}" if new.tp != old.tp else ""),
        kind=TraceKind.RESCALED.value,
        source=trace.source,
        params=params,
    )
    _check_groups_match(out, params.get("comm_groups") or {})
    return out
