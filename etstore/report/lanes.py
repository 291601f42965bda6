"""Which ranks a timeline draws: every rank up to :data:`MAX_LANES`, else a few chosen by finish time.

A 256-rank timeline of two lanes per rank is a solid wall. Past :data:`MAX_LANES` ranks
the report draws the ranks nearest the percentiles of finish time (min, p10, p25,
median, p75, p90, max), the ranks the critical path holds longest, and ranks spread
evenly over the finish times for the lanes left, and it says which and why
(:meth:`LaneSelection.describe`). The breakdown figure still has every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etstore.report._data import RunInfo, has_table, query
from etstore.report._html import fmt_ns
from etstore.report.critical import critical_path_steps
from etstore.store.warehouse import Warehouse

__all__ = ["MAX_LANES", "PERCENTILES", "LaneSelection", "select_lanes", "timeline_lanes"]

MAX_LANES = 32
"""Ranks a timeline draws at most (two lanes each)."""

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("min", 0.0),
    ("p10", 10.0),
    ("p25", 25.0),
    ("median", 50.0),
    ("p75", 75.0),
    ("p90", 90.0),
    ("max", 100.0),
)
"""The percentiles of finish time whose nearest rank a folded timeline always shows."""

CRITICAL = "critical path"


@dataclass(frozen=True)
class LaneSelection:
    """The ranks a timeline shows, in lane order, with why each was chosen."""

    ranks: np.ndarray
    """Shown ranks in lane order (int64): ascending, or when folded by finish time (first to finish first)."""
    total: int
    """Ranks in the run."""
    finish_ns: np.ndarray
    """Each shown rank's finish time (ns)."""
    percentile: np.ndarray
    """Each shown rank's place among the run's finish times, 0 (first to finish) to 100 (last)."""
    reasons: tuple[tuple[str, ...], ...]
    """Per shown rank, why: percentile names (``min``, ``p10``, ...) and/or ``critical path``;
    empty for a rank that fills a lane (spread over the finish times) or when nothing is folded."""

    @property
    def folded(self) -> bool:
        """Whether some ranks are left out."""
        return len(self.ranks) < self.total

    def tick_labels(self) -> list[str]:
        """Lane labels: the rank, and when folded its percentile of finish time (``17 · p10``)."""
        if not self.folded:
            return [str(r) for r in self.ranks.tolist()]
        return [f"{r} · p{p:.0f}" for r, p in zip(self.ranks.tolist(), self.percentile.tolist(), strict=True)]

    def describe(self) -> str:
        """One paragraph for people: which ranks are shown and why (empty when nothing is folded)."""
        if not self.folded:
            return ""
        by_reason: dict[str, list[int]] = {}
        for r, why in zip(self.ranks.tolist(), self.reasons, strict=True):
            for w in why:
                by_reason.setdefault(w, []).append(r)
        finish = dict(zip(self.ranks.tolist(), self.finish_ns.tolist(), strict=True))
        anchors = [
            f"{name} rank {by_reason[name][0]} ({fmt_ns(finish[by_reason[name][0]])})"
            for name, _ in PERCENTILES
            if name in by_reason
        ]
        text = (
            f"{len(self.ranks)} of {self.total} ranks shown: the ranks nearest the percentiles of finish "
            f"time ({', '.join(anchors)})"
        )
        cp = by_reason.get(CRITICAL, [])
        if cp:
            text += f"; the critical path's ranks {_ranks(cp)}"
        fill = [r for r, why in zip(self.ranks.tolist(), self.reasons, strict=True) if not why]
        if fill:
            text += f"; and {len(fill)} more spread evenly over the finish times ({_ranks(fill)})"
        return (
            text + ". Lanes are labelled rank · percentile of its finish time; the per-rank breakdown "
            "has every rank."
        )


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def select_lanes(
    ranks: np.ndarray,
    finish_ns: np.ndarray,
    *,
    critical_ranks: Sequence[int] = (),
    max_lanes: int = MAX_LANES,
) -> LaneSelection:
    """Choose at most ``max_lanes`` ranks to draw: percentiles of finish time, critical path, spread.

    Parameters
    ----------
    ranks, finish_ns
        Every rank of the run and its finish time (ns), one entry per rank.
    critical_ranks
        Ranks on the critical path, most important first (the report orders them by the
        time the path spends on each); as many as fit after the percentiles are shown.
    max_lanes
        Ranks shown at most (at least 1).

    Returns
    -------
    LaneSelection
        Every rank, ascending, when there are at most ``max_lanes``; else, in finish
        order (ties by rank), first per name of
        :data:`PERCENTILES`, the rank whose finish time is nearest that percentile (ties
        to the lower rank), then the critical path's ranks, then ranks at evenly spaced
        each time the rank farthest in finish order from those chosen, until ``max_lanes``
        are chosen.

    Examples
    --------
    >>> sel = select_lanes(np.arange(100), np.arange(100) * 10.0, critical_ranks=[42], max_lanes=10)
    >>> sel.ranks.tolist()
    [0, 10, 25, 33, 42, 49, 61, 74, 89, 99]
    >>> sel.reasons[:5]
    (('min',), ('p10',), ('p25',), (), ('critical path',))
    >>> sel.tick_labels()[:2]
    ['0 · p0', '10 · p10']

    Notes
    -----
    O(R log R) for R ranks.
    """
    r = np.asarray(ranks, dtype=np.int64)
    f = np.asarray(finish_ns, dtype=np.float64)
    n = len(r)
    order = np.lexsort((r, f))  # finish order, ties by rank
    place = np.empty(n, dtype=np.float64)
    place[order] = np.arange(n) * (100.0 / max(n - 1, 1))
    if n <= max_lanes:
        by_rank = np.argsort(r, kind="stable")
        return LaneSelection(r[by_rank], n, f[by_rank], place[by_rank], tuple(() for _ in range(n)))
    limit = max(int(max_lanes), 1)
    chosen: dict[int, list[str]] = {}  # row -> reasons, in the order chosen
    for name, q in PERCENTILES:
        if len(chosen) >= limit:
            break
        target = float(np.percentile(f, q))
        row = int(np.lexsort((r, np.abs(f - target)))[0])
        chosen.setdefault(row, []).append(name)
    row_of = {int(k): i for i, k in enumerate(r.tolist())}
    for k in dict.fromkeys(int(x) for x in critical_ranks):
        if k not in row_of:
            continue
        row = row_of[k]
        if row in chosen:
            chosen[row].append(CRITICAL)
        elif len(chosen) < limit:
            chosen[row] = [CRITICAL]
    # fill the lanes left, each time with the rank farthest (in finish order) from every rank chosen
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    taken = np.asarray([where[i] for i in chosen], dtype=np.int64)
    dist = np.min(np.abs(np.arange(n)[:, None] - taken[None, :]), axis=1)
    for _ in range(limit - len(chosen)):
        p = int(np.argmax(dist))
        if dist[p] == 0:
            break
        chosen[int(order[p])] = []
        dist = np.minimum(dist, np.abs(np.arange(n) - p))
    rows = np.asarray(sorted(chosen, key=lambda i: where[i]), dtype=np.int64)
    return LaneSelection(r[rows], n, f[rows], place[rows], tuple(tuple(chosen[i]) for i in rows.tolist()))


def timeline_lanes(
    warehouse: Warehouse,
    run: RunInfo,
    critical_path: pa.Table | None = None,
    *,
    max_lanes: int = MAX_LANES,
) -> LaneSelection:
    """The lanes of a run's timeline: :func:`select_lanes` over its ranks' finish times.

    Finish times come from ``rank_breakdown.total_ns`` (else the last ``op_timings.end_ns``
    of each rank); the critical path's ranks are ordered by the time the path holds each
    (its segments as :func:`~etstore.report.critical.critical_path_steps` draws them).

    Notes
    -----
    One grouped query over the run's ranks; O(path) for the critical path.
    """
    if has_table(warehouse, "rank_breakdown"):
        t = query(
            warehouse,
            "SELECT rank, total_ns AS finish_ns FROM rank_breakdown WHERE run_id = $r ORDER BY rank",
            {"r": run.run_id},
        )
    else:
        t = pa.table({"rank": pa.array([], pa.int64())})
    if t.num_rows == 0:
        t = query(
            warehouse,
            "SELECT rank, max(end_ns) AS finish_ns FROM op_timings WHERE run_id = $r "
            "GROUP BY rank ORDER BY rank",
            {"r": run.run_id},
        )
    ranks = t["rank"].to_numpy().astype(np.int64)
    finish = np.nan_to_num(t["finish_ns"].to_numpy(zero_copy_only=False).astype(np.float64))
    cp_ranks: list[int] = []
    if critical_path is not None and critical_path.num_rows and len(ranks) > max_lanes:
        s, e = critical_path_steps(critical_path["start_ns"].to_numpy(), critical_path["end_ns"].to_numpy())
        cr = critical_path["rank"].to_numpy().astype(np.int64)
        held = np.bincount(cr - cr.min(), weights=e - s)
        present = np.flatnonzero(np.bincount(cr - cr.min()))
        cp_ranks = [int(k) + int(cr.min()) for k in present[np.lexsort((present, -held[present]))]]
    return select_lanes(ranks, finish, critical_ranks=cp_ranks, max_lanes=max_lanes)
