"""The phases of a synthesized collective: which engine runs make it, and the bound it is judged by.

:func:`plans` runs the greedy engine (:mod:`etstore.algorithms._synth_engine`) for each
phase of a collective and returns one or two candidate plans, each a list of phases
``(flow, phase code, start offset in ns)``: a flood for All-Gather and Broadcast, the
time reversal of a flood on the transposed topology for the reductions (Reduce-Scatter,
Reduce), both for All-Reduce, and shortest-path routing for All-to-All.

The search plans with the simulator's message time of each link
(:attr:`~etstore.algorithms._synth_cost.Prices.plan_ns`). A reduction also holds its
link's receiving end for ``r`` ns after each arrival (``step``): where that changes the
links' relative speeds (links of unequal times, some faster than ``r``), a second
reduction plan is searched with every link at ``max(t, r)``, its pace under reductions,
and :func:`etstore.algorithms.synth.synthesize` keeps whichever the simulator's rules
time faster.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from etstore.algorithms._synth_bounds import allreduce_bound, alltoall_bound, flood_bound, flood_holders
from etstore.algorithms._synth_cost import Prices, copies_ns, transfer_distances
from etstore.algorithms._synth_engine import Engine, Raw
from etstore.algorithms._synth_schedule import Flow, flow, reverse, reverse_links
from etstore.progress import ProgressFn
from etstore.topology import Topology

__all__ = ["Bounds", "Plan", "plans"]

Plan = list[tuple[Flow, int, float]]
"""Phases of one candidate: (flow, phase code 0 reduction / 1 copy / 2 routed, start offset ns)."""


class Bounds(NamedTuple):
    """Lower bounds (ns) of a synthesized collective under the simulator's rules."""

    lower: float
    """No schedule in the model is faster (what ``ratio`` divides by)."""
    phases: float | None = None
    """All-Reduce only: Reduce-Scatter's bound plus All-Gather's (TACOS's), which holds for a
    schedule that starts its All-Gather after the whole Reduce-Scatter, as synthesis plans it."""


def _counted(
    run: Callable[[random.Random, str], Raw], trials: int, progress: ProgressFn | None
) -> Callable[[random.Random, str], Raw]:
    """``run``, reporting ``("trials", done, trials)`` after each call (a trial is long enough
    for one callback each to cost nothing)."""
    if progress is None:
        return run
    progress("trials", 0, trials)
    done = [0]

    def counted(rng: random.Random, policy: str) -> Raw:
        raw = run(rng, policy)
        done[0] += 1
        progress("trials", done[0], trials)
        return raw

    return counted


def _trials_done(trials: int, progress: ProgressFn | None) -> None:
    """The trials' count at its total: a run that met the bound ended the search early."""
    if progress is not None:
        progress("trials", trials, trials)


def _reversed_flood(
    topo: Topology,
    times: np.ndarray,
    holders: list[list[int]],
    bound: float,
    trials: int,
    seed: int,
    progress: ProgressFn | None,
) -> tuple[Flow, int, int]:
    """A reduction: a flood on the transposed topology over link times ``times``, played backwards."""
    tengine = Engine(topo.transpose(), times)
    raw, used, best = tengine.best_of(
        trials, seed, bound, _counted(lambda rng, pol: tengine.flood(holders, rng, pol), trials, progress)
    )
    _trials_done(trials, progress)
    return reverse(flow(raw), np.arange(topo.num_links, dtype=np.int32), times), used, best


def plans(
    topo: Topology,
    coll: str,
    k: int,
    root: int,
    cost: Prices,
    trials: int,
    seed: int,
    progress: ProgressFn | None = None,
) -> tuple[list[Plan], Bounds, int, int]:
    """Candidate plans of ``coll``, the bounds of its stored algorithm, trials run, best trial.

    Each run stops at the link model's bound over its own link times. The bound returned
    is the stored algorithm's under the simulator's rules: the link model's over
    ``cost.plan_ns``, with each reduction holding its link's receiving end for
    ``cost.step_ns`` (:func:`~etstore.algorithms._synth_bounds.effective_times`),
    All-to-All's chained local copies, and for All-Reduce the overlap of its phases
    (:func:`~etstore.algorithms._synth_bounds.allreduce_bound`).
    """
    times = cost.plan_ns
    if coll == "alltoall":  # shortest-path routing needs every pair's distance
        dist = transfer_distances(topo, times)
        engine = Engine(topo, times, dist)
        lb = alltoall_bound(topo, times, dist, k)
        a2a = _counted(lambda rng, pol: engine.alltoall(k, rng, pol), trials, progress)
        raw, used, best = engine.best_of(trials, seed, lb, a2a)
        _trials_done(trials, progress)
        lb = max(lb, copies_ns(cost, coll, topo.num_npus, k))
        return [[(flow(raw), 2, 0.0)]], Bounds(lb), used, best
    base = "allgather" if coll in ("allgather", "reducescatter", "allreduce") else "broadcast"
    holders = flood_holders(topo.num_npus, base, k, root)
    engine = Engine(topo, times)
    lb_ag = flood_bound(topo, times, base, k, root, transpose=False)

    def gather(rng: random.Random, policy: str) -> Raw:
        return engine.flood(holders, rng, policy)

    if coll in ("allgather", "broadcast"):
        raw, used, best = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
        _trials_done(trials, progress)
        return [[(flow(raw), 1, 0.0)]], Bounds(lb_ag), used, best
    # reducescatter, reduce, allreduce: reverse a flood on the transposed topology
    rev = reverse_links(topo)
    ag: Flow | None = None
    if rev is not None:  # symmetric: a flood on the transpose is this flood on reversed links
        raw, used, best = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
        _trials_done(trials, progress)
        ag = flow(raw)
        reductions = [reverse(ag, rev, times)]
    else:
        lb_plan = flood_bound(topo, times, base, k, root, transpose=True)
        rs, used, best = _reversed_flood(topo, times, holders, lb_plan, trials, seed, progress)
        reductions = [rs]
        if coll == "allreduce":
            raw, used2, _ = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
            _trials_done(trials, progress)
            ag = flow(raw)
            used += used2
    step = cost.step_ns
    paced = np.maximum(times, step)
    if np.ptp(paced / times) > 1e-12:  # reductions change which links are fast
        lb_paced = flood_bound(topo, paced, base, k, root, transpose=True)
        rs, used2, _ = _reversed_flood(topo, paced, holders, lb_paced, trials, seed, progress)
        reductions.append(rs)
        used += used2
    # the stored algorithm's bound: each reduction holds its link's receiving end for ``step``
    lb_rs = flood_bound(topo, times, base, k, root, transpose=True, step=step)
    if coll == "allreduce":
        assert ag is not None  # both branches above build the All-Gather for allreduce
        lb = allreduce_bound(topo, times, k, step, lb_rs, lb_ag)
        plans_ar = [[(rs, 0, 0.0), (ag, 1, rs.makespan)] for rs in reductions]
        return plans_ar, Bounds(lb, lb_rs + lb_ag), used, best
    return [[(rs, 0, 0.0)] for rs in reductions], Bounds(lb_rs), used, best
