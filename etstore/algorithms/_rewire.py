"""Dependencies of an expanded trace: workload edges rewired around expanded nodes, plus the parts' own.

An edge into an expanded node becomes one edge into each entry op of its part; an
edge out of one becomes one edge out of each exit op; both ends expanded gives the
cross product. A lane's order (``thread``, ``stream``) stays a chain: of those edges only
the one into the first entry and out of the last exit keep the lane's kind, the others
order as ``ctrl``. The parts' internal edges are stamped with the blocks' ids.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.algorithms._columns import gather_bytes, ragged
from etstore.algorithms._parts import Parts
from etstore.algorithms._placement import Placed
from etstore.model import DEPS_SCHEMA, LANE_KINDS, Trace, dep_kind_codes, deps_table, op_rows

__all__ = ["rewire"]


def rewire(workload: Trace, placed: Placed, parts: Parts) -> tuple[pa.Table, pa.Table]:
    """(deps, missing deps) of the expanded trace, deps ordered by rank.

    Notes
    -----
    O(E log E + E') for E workload deps and E' new ones.
    """
    n0 = workload.ops.num_rows
    xof = np.full(n0, -1, dtype=np.int64)
    xof[placed.xrows] = np.arange(len(placed.xrows))
    deps, missing = _external_deps(workload, xof, placed.xpart, placed.xbase, parts)
    xpart, xbase = placed.xpart, placed.xbase
    iowner, iq = ragged(parts.edge_start[xpart], parts.edge_start[xpart + 1] - parts.edge_start[xpart])
    internal = pa.Table.from_arrays(
        [
            pa.array(placed.xrank[iowner].astype(np.int32)),
            pa.array(xbase[iowner] + parts.esrc[iq].astype(np.uint64)),
            pa.array(xbase[iowner] + parts.edst[iq].astype(np.uint64)),
            gather_bytes(parts.ekind, iq),
            pa.array(parts.epos[iq].astype(np.int32)),
        ],
        schema=DEPS_SCHEMA,
    )
    all_deps = pa.concat_tables([deps, internal])
    dorder = np.argsort(all_deps["rank"].to_numpy(), kind="stable")
    return all_deps.take(pa.array(dorder)), missing


def _external_deps(
    workload: Trace, xof: np.ndarray, xpart: np.ndarray, xbase: np.ndarray, parts: Parts
) -> tuple[pa.Table, pa.Table]:
    """The workload's deps (and missing deps) rewired around the expanded nodes.

    Positions are recomputed per (rank, dst, kind) over present and missing deps
    together, keeping their original order.
    """
    ops = workload.ops
    tables = []
    for flag, d in ((0, workload.deps), (1, workload.missing)):
        if d.num_rows:
            tables.append(d.append_column("_missing", pa.array(np.full(d.num_rows, flag, dtype=np.int8))))
    if not tables:
        empty = DEPS_SCHEMA.empty_table()
        return empty, empty
    d = pa.concat_tables(tables)
    d = d.take(
        pa.array(
            np.lexsort(
                (d["pos"].to_numpy(), _kind_code(d["kind"]), d["dst"].to_numpy(), d["rank"].to_numpy())
            )
        )
    )
    rank = d["rank"].to_numpy().astype(np.int64)
    src = d["src"].to_numpy()
    dst = d["dst"].to_numpy()
    is_missing = d["_missing"].to_numpy().astype(bool)
    drow = op_rows(ops, rank, dst)
    dx = xof[drow]
    sx = np.full(len(src), -1, dtype=np.int64)
    present = np.flatnonzero(~is_missing)
    if len(present):
        sx[present] = xof[op_rows(ops, rank[present], src[present])]
    sp = xpart[np.clip(sx, 0, None)] if len(xpart) else np.zeros(len(sx), np.int64)
    dp = xpart[np.clip(dx, 0, None)] if len(xpart) else np.zeros(len(dx), np.int64)
    ns = np.where(sx >= 0, parts.exit_start[sp + 1] - parts.exit_start[sp], 1)
    nd = np.where(dx >= 0, parts.entry_start[dp + 1] - parts.entry_start[dp], 1)
    owner, k = ragged(np.zeros(len(ns), dtype=np.int64), ns * nd)
    si, di = k // nd[owner], k % nd[owner]
    so, do = sx[owner], dx[owner]
    exit_local = parts.exit[np.clip(parts.exit_start[sp[owner]] + si, 0, max(len(parts.exit) - 1, 0))]
    entry_local = parts.entry[np.clip(parts.entry_start[dp[owner]] + di, 0, max(len(parts.entry) - 1, 0))]
    base = np.concatenate([xbase, np.zeros(1, dtype=np.uint64)])
    new_src = np.where(so >= 0, base[so] + exit_local.astype(np.uint64), src[owner])
    new_dst = np.where(do >= 0, base[do] + entry_local.astype(np.uint64), dst[owner])
    kinds = d["kind"].take(pa.array(owner))
    # a lane (thread, stream) stays a chain through an expanded node: it enters the part at its
    # first entry and leaves from its last exit; its other entries and exits keep the order as ctrl
    lane = pc.is_in(kinds, value_set=pa.array(sorted(LANE_KINDS))).to_numpy(zero_copy_only=False)
    side = lane & ((si != ns[owner] - 1) | (di != 0))
    if side.any():
        kinds = pc.if_else(pa.array(side), "ctrl", kinds)
    table = deps_table(rank[owner], new_src, new_dst, kinds)
    miss = is_missing[owner]
    return table.filter(pa.array(~miss)), table.filter(pa.array(miss))


def _kind_code(kinds: pa.ChunkedArray) -> np.ndarray:
    return dep_kind_codes(kinds)
