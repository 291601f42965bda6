"""Overlap opportunities of a recorded trace, each one measured by replaying it applied.

A recorded step replays as it ran (:func:`etstore.sim.replay.replay`); where a lane (a CPU
thread, a GPU stream) sat idle while an op waited for something on another lane, the ops
behind that op that need none of it could have run in the gap (:mod:`etstore.analysis.lanes`).
A program makes that change on every rank, so the gaps at the same place of each rank's
lane (the same held op: its name and how many ops of that name its lane ran before it) are
one opportunity.

Gains are measured, not estimated. Opportunities are taken largest estimate first (the gap
time the moved ops fill, summed over ranks), and each one's ``gain_ns`` is what it takes off
the replay's makespan on top of the ones before it: opportunities 1..k applied together
realise exactly the sum of their gains, so the gains add up and never exceed the makespan.
One that adds nothing is left out. What each gains applied alone (``alone_gain_ns``) is
measured too: gaps on the critical path of several ranks shift it from one to another, so
alone a change can gain less than in company.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from etstore.analysis.lanes import Hoist, Lanes, apply_hoists, hoist_candidates, lanes_of, op_times
from etstore.errors import SimulationError
from etstore.model import Trace, op_row_map
from etstore.progress import ProgressFn
from etstore.sim.config import SimConfig
from etstore.sim.replay import Replay, replay
from etstore.topology import Topology

__all__ = [
    "HoistOpportunity",
    "apply_opportunity",
    "find_hoists",
    "hoists_from_detail",
    "measure_by_place",
    "spmd_key",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoistOpportunity:
    """One change made on every rank where it applies, and what the replay says it gains."""

    hoists: tuple[Hoist, ...]
    held: str  # the name of the op the moved ops go in front of
    gain_ns: float  # makespan taken off on top of the opportunities before it
    alone_gain_ns: float  # makespan taken off with it alone applied
    estimate_ns: float

    def detail(self, trace: Trace) -> dict[str, Any]:
        """What moves, by op id per rank, and the numbers (the ``detail`` JSON of its row)."""
        ids = trace.ops["id"].to_numpy()
        ranks = trace.ops["rank"].to_numpy()
        return {
            "held": self.held,
            "moves": [
                {
                    "rank": int(ranks[h.before]),
                    "before": int(ids[h.before]),
                    "moved": [int(ids[m]) for m in h.moved],
                    "gap_ns": h.gap_ns,
                }
                for h in self.hoists
            ],
            "estimate_ns": self.estimate_ns,
            "alone_gain_ns": self.alone_gain_ns,
            "measured": True,
        }


def spmd_key(trace: Trace, lanes: Lanes, names: Sequence[str], row: int) -> tuple[str, int, bool]:
    """Where an op sits, the same on every rank of an SPMD program: its name, how many ops of
    that name its lane ran before it, and whether the lane is a CPU thread."""
    lane = lanes.order(int(lanes.lane[row]))
    name = names[row]
    nth = sum(1 for r in lane[: lane.index(row)] if names[r] == name)
    cpu = trace.ops["is_cpu_op"][row].as_py() is not False
    return name, nth, cpu


C = TypeVar("C")


def measure_by_place(
    trace: Trace,
    base: Replay,
    lanes: Lanes,
    found: Sequence[C],
    *,
    row: Callable[[C], int],
    estimate: Callable[[C], float],
    apply: Callable[[list[C]], Trace],
    limit: int,
    topo: Topology | None,
    config: SimConfig | None,
    progress: ProgressFn | None,
) -> list[tuple[str, list[C], float, float, float]]:
    """The changes ``found`` grouped by place (:func:`spmd_key` of ``row(change)``: one change
    of an SPMD program on every rank), the ``limit`` largest estimates replayed each on top of
    the ones taken before it: ``(name at the place, changes, gain_ns, alone_gain_ns,
    estimate)`` of those that shorten the makespan, in the order taken (module docstring)."""
    names = trace.ops["name"].to_pylist()
    groups: dict[tuple[str, int, bool], list[C]] = defaultdict(list)
    for c in found:
        groups[spmd_key(trace, lanes, names, row(c))].append(c)
    ranked = sorted(groups.items(), key=lambda kv: -sum(estimate(c) for c in kv[1]))[:limit]
    out: list[tuple[str, list[C], float, float, float]] = []
    taken: list[C] = []
    now = float(base.result.total_ns)
    for i, ((label, _, _), changes) in enumerate(ranked):
        try:
            together = float(replay(apply([*taken, *changes]), topo, config=config).result.total_ns)
        except SimulationError as exc:  # acyclic by construction; never apply a doubt
            log.warning("opportunity at %s left out: %s", label, str(exc).splitlines()[0])
            together = now
        if together < now:
            alone = float(replay(apply(changes), topo, config=config).result.total_ns)
            gain, alone_gain = now - together, float(base.result.total_ns) - alone
            out.append((label, changes, gain, alone_gain, float(sum(estimate(c) for c in changes))))
            taken += changes
            now = together
        if progress is not None:
            progress("replay each opportunity", i + 1, len(ranked))
    return out


def find_hoists(
    trace: Trace,
    *,
    topo: Topology | None = None,
    config: SimConfig | None = None,
    limit: int = 32,
    progress: ProgressFn | None = None,
    base: Replay | None = None,
) -> tuple[Replay, list[HoistOpportunity]]:
    """The replay of ``trace`` and its overlap opportunities, largest measured gain first.

    Parameters
    ----------
    trace
        A recorded trace (``params["execution"] == "recorded"``).
    topo
        Replay on this network (default: as it ran, :func:`~etstore.sim.replay.replay`).
    limit
        Measure at most this many opportunities (the largest estimates); each costs two
        replays (with those before it, and alone).
    progress
        Called with (phase, done, total) after each measurement.
    base
        The replay of ``trace`` on ``topo``, when already made.

    Only opportunities with a positive measured gain are returned, in the order taken
    (module docstring).
    """
    base = base or replay(trace, topo, config=config)
    start, end = op_times(trace, base.result.ops)
    lanes = lanes_of(trace)
    found = hoist_candidates(trace, lanes, start, end, limit=4 * limit)
    measured = measure_by_place(
        trace,
        base,
        lanes,
        found,
        row=lambda h: h.before,
        estimate=lambda h: h.estimate_ns,
        apply=lambda hs: apply_hoists(trace, lanes, hs),
        limit=limit,
        topo=topo,
        config=config,
        progress=progress,
    )
    return base, [HoistOpportunity(tuple(hs), n, g, a, e) for n, hs, g, a, e in measured]


def hoists_from_detail(trace: Trace, detail: dict[str, Any]) -> list[Hoist]:
    """The hoists a recorded opportunity's ``detail`` names, as rows of ``trace``.

    Raises
    ------
    KeyError
        An op the detail names is not in ``trace``.
    """
    rows = op_row_map(trace.ops)
    return [
        Hoist(
            rows[(m["rank"], m["before"])],
            tuple(rows[(m["rank"], x)] for x in m["moved"]),
            float(m.get("gap_ns", 0.0)),
            0.0,
        )
        for m in detail["moves"]
    ]


def apply_opportunity(trace: Trace, details: Sequence[dict[str, Any]], *, name: str | None = None) -> Trace:
    """``trace`` with the hoists of each opportunity detail applied."""
    lanes = lanes_of(trace)
    hoists = [h for d in details for h in hoists_from_detail(trace, d)]
    return apply_hoists(trace, lanes, hoists, name=name)
