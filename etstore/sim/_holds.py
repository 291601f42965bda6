"""Expanded collectives hold their rank's communication slot, as their node did.

A ``COMM_COLL_NODE`` takes its rank's communication slot when it starts and gives
it back when its algorithm part ends (ASTRA-sim: one communication op in flight per
NPU). ``expand`` removes the node, so nothing would hold the slot and two
collectives that the workload lets overlap would overlap after expansion but not
before. ``expand`` records where each node's block of ops went
(``params["collective_blocks"]``: rank, the node's id, the block's first id and op
count; a block's ids are contiguous); for every block the replay adds an *acquire*
op (takes the slot, issued in the removed node's id order) in front of the block
and a *release* op behind it, so the block runs exactly as the node's algorithm
part ran inside the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from etstore.model import Trace

__all__ = ["Holds", "collective_holds", "recorded_blocks", "rewire_holds"]


@dataclass(frozen=True, eq=False)
class Holds:
    """Blocks of an expanded trace found among its ops (rows are trace-op rows)."""

    member: np.ndarray  # per trace op: its block, -1 outside every block
    rank: np.ndarray  # per block
    first_row: np.ndarray  # per block: one of its ops (the one with the lowest id)
    parent_key: np.ndarray  # per block: (rank << 40) | id of the removed collective node, uint64

    @property
    def count(self) -> int:
        return len(self.rank)


def recorded_blocks(params: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
    """(the ``collective_blocks`` a trace records, inherited): its own, else its parent's.

    A rewrite keeps its parent's params under ``parent_params`` (and ids of the ops it
    keeps), so a rewritten expansion still knows its blocks; ``inherited`` says so.
    """
    inherited = False
    for _ in range(64):  # a chain of rewrites, each nesting its parent's params
        found = params.get("collective_blocks")
        if isinstance(found, Mapping):
            return found, inherited
        parent = params.get("parent_params")
        if not isinstance(parent, Mapping):
            break
        params, inherited = parent, True
    return None, inherited


def _blocks(found: Mapping[str, Any] | None) -> tuple[np.ndarray, ...] | None:
    """(rank, parent id, first id, ops) per recorded block, or None when there are none."""
    if found is None:
        return None
    try:
        cols = tuple(np.asarray(found[k], dtype=np.int64) for k in ("rank", "parent_id", "first_id", "ops"))
    except (KeyError, TypeError, ValueError):
        return None
    if len({len(c) for c in cols}) != 1 or not len(cols[0]):
        return None
    return cols


def collective_holds(trace: Trace, rank: np.ndarray, ids: np.ndarray) -> Holds | None:
    """The recorded blocks of an expanded trace that still exist in it, or None.

    A block is kept when at least one op of its id range is on its rank (a later
    rewrite may have removed some); ops outside every recorded range are ordinary.

    Notes
    -----
    O(V log V + B log V) for V ops and B blocks.
    """
    cols = _blocks(recorded_blocks(trace.params or {})[0])
    if cols is None:
        return None
    brank, parent, first, count = cols
    key = (rank.astype(np.uint64) << np.uint64(40)) | ids
    order = np.argsort(key, kind="stable")
    skey = key[order]
    lo_key = (brank.astype(np.uint64) << np.uint64(40)) | first.astype(np.uint64)
    hi_key = lo_key + np.maximum(count, 0).astype(np.uint64)
    lo = np.searchsorted(skey, lo_key, side="left")
    hi = np.searchsorted(skey, hi_key, side="left")
    keep = hi > lo
    if not keep.any():
        return None
    lo, hi = lo[keep], hi[keep]
    member = np.full(len(rank), -1, dtype=np.int64)
    nb = len(lo)
    sizes = hi - lo
    block_of = np.repeat(np.arange(nb), sizes)
    pos = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes) + np.repeat(lo, sizes)
    member[order[pos]] = block_of
    pkey = (brank[keep].astype(np.uint64) << np.uint64(40)) | parent[keep].astype(np.uint64)
    return Holds(member, brank[keep], order[lo].astype(np.int64), pkey)


def rewire_holds(
    holds: Holds, es: np.ndarray, ed: np.ndarray, acq_row: np.ndarray, rel_row: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Trace edges with every block entered through its acquire op and left into its release op.

    The block's entries are its ops without a predecessor inside it; an edge from
    outside block ``b`` into an entry now ends at ``b``'s acquire op (once per source),
    and the acquire op feeds every entry. Every op of ``b`` without a successor inside
    ``b`` (its exits) also feeds ``b``'s release op. Other edges stay.

    Notes
    -----
    O(E log E) for E edges.
    """
    mem = holds.member
    n = len(mem)
    internal = (mem[ed] >= 0) & (mem[es] == mem[ed])
    # entries: members without an in-edge from their own block
    has_inner_pred = np.zeros(n, dtype=bool)
    has_inner_pred[ed[internal]] = True
    has_inner_succ = np.zeros(n, dtype=bool)
    has_inner_succ[es[internal]] = True
    rows = np.flatnonzero(mem >= 0)
    entries = rows[~has_inner_pred[rows]]
    exits = rows[~has_inner_succ[rows]]
    inward = (mem[ed] >= 0) & ~internal & ~has_inner_pred[ed]
    ext_src = es[inward]
    ext_dst = acq_row[mem[ed[inward]]]
    if len(ext_src):
        pairs = np.unique(np.stack([ext_src, ext_dst], axis=1), axis=0)
        ext_src, ext_dst = pairs[:, 0], pairs[:, 1]
    src = np.concatenate([es[~inward], ext_src, acq_row[mem[entries]], exits])
    dst = np.concatenate([ed[~inward], ext_dst, entries, rel_row[mem[exits]]])
    return src.astype(np.int64), dst.astype(np.int64)
