"""Gains measured by simulation: each opportunity applied on top of the ones before it.

A finder's estimate is a bound from one simulated schedule; what a change gains is what the
simulator says with it applied. A program makes a change on every rank, so the finders' rows
for the same op on each rank (same name, same place among the rank's ops of that name) are
one candidate. Per kind, candidates are taken largest estimate first (at most ``limit``);
each is applied with the ones kept before it (:func:`~etstore.analysis.rewrite.rewrite` with
``only``) and kept when the makespan drops. Its ``gain_ns`` is that drop, so the gains of
one kind add up to what applying them together realises and never exceed the makespan; a
candidate that adds nothing (the other sends of an all-to-all whose slack the first one
took) is left out. What each gains alone is measured too (``alone_gain_ns``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from etstore.analysis.rewrite import REWRITE_OF, rewrite
from etstore.analysis.split import SplitCost
from etstore.errors import RewriteError, SimulationError
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.sim import SimConfig, simulate
from etstore.topology import Topology

__all__ = ["REWRITE_OF", "measure_gains"]

log = logging.getLogger(__name__)

Row = dict[str, Any]


def measure_gains(
    trace: Trace,
    rows: Sequence[Row],
    *,
    topology: Topology,
    config: SimConfig | None,
    base_ns: float | None = None,
    expansions: pa.Table | None = None,
    max_pieces: int = 8,
    limit: int = 32,
    progress: ProgressFn | None = None,
    split: SplitCost | None = None,
) -> list[Row]:
    """``rows`` (finder rows with estimated ``gain_ns``) measured: one row per candidate kept,
    in the order taken, ``gain_ns`` the makespan it takes off on top of those before it.

    A kept row is its candidate's first (lowest rank); its ``detail`` gains ``applies`` (every
    rank's row: ``rank``, ``op_id``, ``other_id``), ``estimate_ns`` (their estimates summed),
    ``alone_gain_ns``, ``makespan_ns`` and ``measured``. ``chunk`` rows need ``expansions``;
    ``base_ns``, the makespan of ``trace`` on ``topology`` when the caller has simulated it.
    """
    base = float(base_ns if base_ns is not None else simulate(trace, topology, config=config).total_ns)
    chosen = {
        k: _candidates(trace, [r for r in rows if r["kind"] == k], c)[:limit]
        for k, (_, c) in REWRITE_OF.items()
    }
    total = sum(len(v) for v in chosen.values())
    done = 0
    out: list[Row] = []
    for kind, candidates in chosen.items():
        rewrite_kind, column = REWRITE_OF[kind]
        order = {
            (int(r["rank"]), int(r["other_id"])): [int(s) for s, _ in r["detail"]["chunks"]]
            for group in candidates
            for r in group
            if kind == "chunk"
        }

        def makespan(only: Mapping[int, set[int]], rk: str = rewrite_kind, co: Any = order) -> float | None:
            return _makespan(trace, rk, only, co, expansions, max_pieces, topology, config, split)

        kept: dict[int, set[int]] = {}
        now = base
        for group in candidates:
            applies = {int(g["rank"]): {int(g[column])} for g in group}
            trial = {k: set(v) for k, v in kept.items()}
            for rank, keys in applies.items():
                trial.setdefault(rank, set()).update(keys)
            together = makespan(trial)
            if together is not None and together < now:
                alone = makespan(applies)
                detail = dict(group[0]["detail"])
                detail.update(
                    applies=[
                        {"rank": g["rank"], "op_id": g["op_id"], "other_id": g["other_id"]} for g in group
                    ],
                    estimate_ns=float(max(g["gain_ns"] for g in group)),
                    alone_gain_ns=base - alone if alone is not None else None,
                    makespan_ns=base,
                    measured=True,
                )
                out.append({**group[0], "gain_ns": now - together, "detail": detail})
                kept, now = trial, together
            done += 1
            if progress is not None:
                progress("simulate each opportunity", done, total)
    return out


def _candidates(trace: Trace, rows: Sequence[Row], column: str) -> list[list[Row]]:
    """Rows grouped by the op they are keyed by, the same on every rank (its name and how many
    ops of that name its rank has before it), largest estimate first."""
    wanted = {(int(r["rank"]), int(r[column])) for r in rows}
    where: dict[tuple[int, int], tuple[str, int]] = {}
    seen: dict[tuple[int, str], int] = {}
    names = trace.ops["name"].to_pylist()
    for rank, i, name in zip(trace.ops["rank"].to_pylist(), trace.ops["id"].to_pylist(), names, strict=True):
        nth = seen.get((rank, name), 0)
        seen[(rank, name)] = nth + 1
        if (rank, i) in wanted:
            where[(rank, i)] = (name, nth)
    groups: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        groups.setdefault(where[(int(r["rank"]), int(r[column]))], []).append(r)
    for g in groups.values():
        g.sort(key=lambda r: int(r["rank"]))
    return sorted(groups.values(), key=lambda g: -max(r["gain_ns"] for r in g))


def _makespan(
    trace: Trace,
    kind: str,
    only: Mapping[int, set[int]],
    order: Mapping[tuple[int, int], Sequence[int]],
    expansions: pa.Table | None,
    max_pieces: int,
    topology: Topology,
    config: SimConfig | None,
    split: SplitCost | None,
) -> float | None:
    """The simulated makespan of ``trace`` with the ``only`` opportunities of ``kind`` applied;
    None where the rewrite is refused or does not run (that candidate is left out)."""
    try:
        new = rewrite(
            trace,
            kind,
            expansions=expansions,
            chunk_order=order,
            max_pieces=max_pieces,
            only=only,
            split=split,
        )
        return float(simulate(new, topology, config=config).total_ns)
    except (RewriteError, SimulationError) as exc:
        log.info("a %s opportunity left out: %s", kind, str(exc).splitlines()[0])
        return None
