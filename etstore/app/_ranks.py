"""Where each rank's ops sit in a stored content, and units of whole ranks to read at a time.

Why: the analyses that stream a stored trace (:mod:`etstore.app.critical_path`,
:mod:`etstore.app.breakdown`) read it a few whole ranks at a time; every ingest writes a
content's ops as one block of uids per rank, in rank order, so a unit is one uid range.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from etstore.store.warehouse import Warehouse

__all__ = ["DEFAULT_UNIT_OPS", "RankLayout", "rank_layout", "units_of"]

DEFAULT_UNIT_OPS = 1_000_000
"""Ops per unit of whole ranks read at once (a rank larger than this is a unit of its own)."""


class RankLayout(NamedTuple):
    """Where each rank's ops sit in a stored content: one block of uids per rank, in rank order."""

    base: int
    """The content's first uid: an op's row in the loaded trace is its uid less this."""
    ranks: np.ndarray
    """Ranks, ascending (int32)."""
    starts: np.ndarray
    """Row of each rank's first op, then the op count (int64)."""

    def units(self, unit_ops: int) -> list[tuple[int, int]]:
        """Rank index ranges ``[a, z)`` of at most ``unit_ops`` ops each (at least one rank)."""
        return units_of(self.starts, unit_ops)

    def uids(self, a: int, z: int) -> tuple[int, int]:
        """The uid range ``[lo, hi)`` of the ranks at indices ``a .. z - 1``."""
        return self.base + int(self.starts[a]), self.base + int(self.starts[z])


def rank_layout(wh: Warehouse, trace_id: int) -> RankLayout | None:
    """The content's ranks and their row blocks, or None when its uids are not one block per
    rank in rank order (what every ingest writes; then only a whole load reads it right).

    Notes
    -----
    One grouped scan of the content's ``uid`` and ``rank`` columns.
    """
    got = wh.query(
        "SELECT rank, min(uid) AS lo, max(uid) AS hi, count(*) AS n FROM trace_ops "
        "WHERE trace_id = $t GROUP BY rank ORDER BY rank",
        {"t": trace_id},
    ).to_arrow()
    ranks = got["rank"].to_numpy().astype(np.int32)
    lo, hi, n = (got[c].to_numpy().astype(np.int64) for c in ("lo", "hi", "n"))
    if not len(ranks):
        return RankLayout(0, ranks, np.zeros(1, dtype=np.int64))
    if bool(np.any(hi - lo + 1 != n)) or bool(np.any(lo[1:] != hi[:-1] + 1)):
        return None
    starts = np.concatenate([lo - lo[0], [int(hi[-1] - lo[0] + 1)]]).astype(np.int64)
    return RankLayout(int(lo[0]), ranks, starts)


def units_of(starts: np.ndarray, unit_ops: int) -> list[tuple[int, int]]:
    """Rank index ranges ``[a, z)`` holding at most ``unit_ops`` ops each (at least one rank).

    >>> units_of(np.array([0, 4, 6, 9, 20]), 6)
    [(0, 2), (2, 3), (3, 4)]
    """
    out, a = [], 0
    k = len(starts) - 1
    while a < k:
        z = a + 1
        while z < k and starts[z + 1] - starts[a] <= unit_ops:
            z += 1
        out.append((a, z))
        a = z
    return out
