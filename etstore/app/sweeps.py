"""Sweeps and what-if grids run point by point on an executor: this process or a Ray cluster.

The points are the simulator's own pieces (:func:`~etstore.sim.sweep.sweep_point`,
:func:`~etstore.sim.sweep.sensitivity_point`): pure functions of their inputs, so a point gives
the same numbers wherever it runs, and :func:`run_sweep` on Ray equals
:func:`~etstore.sim.sweep.sweep` here, bit for bit (``wall_s``, each point's own time, aside).
A point that fails is reported and the others are kept; the caller records what came back,
once, from the driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from etstore.app.fanout import Failed, Fanout
from etstore.model import Trace
from etstore.progress import ProgressFn, in_phase
from etstore.sim.config import SimConfig
from etstore.sim.perturb import Knob
from etstore.sim.sweep import (
    SensitivityPlan,
    SensitivityPoint,
    SweepAlgorithm,
    SweepCell,
    build_cell,
    sensitivity_plan,
    sensitivity_point,
    sweep_cells,
    sweep_point,
    sweep_table,
)
from etstore.topology import Topology

__all__ = ["PointFailure", "SensitivityOutcome", "SweepOutcome", "run_sensitivity", "run_sweep"]


@dataclass(frozen=True)
class PointFailure:
    """A point that did not run: which one, in words, and why, in one line."""

    point: str
    message: str


def _failure(point: str, message: str) -> PointFailure:
    """A failure, its message without the point's name where the simulator already led with it."""
    lead = f"sweep point {point}: "
    return PointFailure(point, message[len(lead) :] if message.startswith(lead) else message)


@dataclass(frozen=True)
class SweepOutcome:
    """A bus-bandwidth sweep: the points that ran (``SWEEP_SCHEMA``, in the serial order) and the
    ones that failed."""

    points: pa.Table
    failed: tuple[PointFailure, ...]


@dataclass(frozen=True)
class SensitivityOutcome:
    """A sensitivity sweep: the points that ran, in the serial order, and the ones that failed."""

    points: tuple[SensitivityPoint, ...]
    failed: tuple[PointFailure, ...]


def _point_piece(item: tuple[int, int], shared: tuple[list[SweepCell], str, SimConfig]) -> dict[str, Any]:
    cells, collective, config = shared
    cell, size = item
    return sweep_point(cells[cell], size, collective, config)


def _sensitivity_piece(
    plan: SensitivityPlan,
    shared: tuple[Trace, SimConfig, Mapping[str, Any] | None, Sequence[int] | None],
) -> SensitivityPoint:
    trace, config, algorithms, dims = shared
    return sensitivity_point(plan, trace, config, algorithms, dims)


def run_sweep(
    fan: Fanout,
    sizes_bytes: Sequence[int],
    algorithms: Sequence[SweepAlgorithm] | Mapping[str, SweepAlgorithm],
    topologies: Sequence[Topology | str],
    *,
    collective: str = "allreduce",
    config: SimConfig | None = None,
    progress: ProgressFn | None = None,
) -> SweepOutcome:
    """:func:`~etstore.sim.sweep.sweep` with its points on ``fan``: first each (topology,
    algorithm) cell's algorithm is built (a synthesizer runs once per cell), then every size.

    Returns
    -------
    SweepOutcome
        The rows of the points that ran, in the order the serial sweep gives them, and one
        :class:`PointFailure` per point (or cell) that failed.

    Raises
    ------
    TopologyError
        A topology spec cannot be parsed (nothing runs).

    Notes
    -----
    O(T · A · S) simulations over ``fan.workers`` workers.
    """
    cfg = config or SimConfig()
    cells = sweep_cells(algorithms, topologies)
    built = fan.map(
        build_cell,
        cells,
        shared=collective,
        progress=in_phase(progress, "algorithms")
        if any(not isinstance(c.algorithm, str) for c in cells)
        else None,
    )
    failed = [
        _failure(f"{c.topology.name} / {c.label}", str(b))
        for c, b in zip(cells, built, strict=True)
        if isinstance(b, Failed)
    ]
    ok = [b for b in built if not isinstance(b, Failed)]
    items = [(i, int(size)) for i in range(len(ok)) for size in sizes_bytes]
    rows = fan.map(_point_piece, items, shared=(ok, collective, cfg), progress=in_phase(progress, "points"))
    for (cell, size), row in zip(items, rows, strict=True):
        if isinstance(row, Failed):
            failed.append(_failure(f"{ok[cell].topology.name} / {ok[cell].label} / {size} B", row.message))
    return SweepOutcome(sweep_table([r for r in rows if not isinstance(r, Failed)]), tuple(failed))


def run_sensitivity(
    fan: Fanout,
    trace: Trace,
    topologies: Sequence[Topology],
    knob: Knob,
    values: Sequence[float],
    *,
    config: SimConfig | None = None,
    algorithms: Mapping[str, Any] | None = None,
    dims: Sequence[int] | None = None,
    progress: ProgressFn | None = None,
) -> SensitivityOutcome:
    """:func:`~etstore.sim.sweep.sensitivity` with its points on ``fan``; the trace is sent once.

    Raises
    ------
    OptionError
        A value the knob refuses, before any point runs.

    Notes
    -----
    O(topologies · values) simulations over ``fan.workers`` workers.
    """
    plans = sensitivity_plan(trace, topologies, knob, values)
    shared = (trace, config or SimConfig(), algorithms, dims)
    results = fan.map(_sensitivity_piece, plans, shared=shared, progress=in_phase(progress, "points"))
    failed = tuple(
        _failure(f"{p.topology.name} / {knob.name}={p.value:g}", r.message)
        for p, r in zip(plans, results, strict=True)
        if isinstance(r, Failed)
    )
    return SensitivityOutcome(tuple(r for r in results if not isinstance(r, Failed)), failed)
