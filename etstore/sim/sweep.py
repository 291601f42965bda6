"""Sweeps: bus-bandwidth curves of one collective, and the sensitivity of a trace to one knob.

:func:`sweep`: each point simulates a one-collective workload (one ``COMM_COLL_NODE`` per NPU of
the topology) with :func:`etstore.sim.simulate` and reports nccl-tests ``algbw``
and ``busbw`` (GB/s with GB = 10^9, as nccl-tests prints them, so a curve compares with
a measured log's directly; the topology's link bandwidths keep GB = 2^30).

:func:`sensitivity`: a stored trace simulated once per value of a what-if knob
(:class:`~etstore.sim.perturb.Knob`: a straggler's factor, link bandwidth, a degraded link...),
each point the run ``sim --slow 3=VALUE`` (or the knob's option) would make, so how much the
makespan moves per unit of the knob reads off one table (:func:`sensitivity_table`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import pyarrow as pa

from etstore.errors import SimulationError, UnsatisfiableError
from etstore.model import Trace, ops_table
from etstore.sim.config import SimConfig, collective_name
from etstore.sim.engine import simulate
from etstore.sim.perturb import Knob, Perturbation, perturb, perturb_network
from etstore.sim.result import SimResult, busbw_factor, rate_gb_per_s
from etstore.topology import Topology, parse_topology
from etstore.units import parse_size

__all__ = [
    "SENSITIVITY_SCHEMA",
    "SWEEP_SCHEMA",
    "SensitivityPlan",
    "SensitivityPoint",
    "SweepCell",
    "build_cell",
    "collective_workload",
    "parse_sizes",
    "sensitivity",
    "sensitivity_plan",
    "sensitivity_point",
    "sensitivity_table",
    "sweep",
    "sweep_cells",
    "sweep_point",
    "sweep_table",
]

log = logging.getLogger(__name__)

AlgorithmFactory = Callable[[Topology, str], Trace]
SweepAlgorithm = Union[str, Trace, AlgorithmFactory]  # noqa: UP007 - a runtime alias

SWEEP_SCHEMA = pa.schema(
    [
        ("topology", pa.string()),
        ("num_npus", pa.int32()),
        ("collective", pa.string()),
        ("algorithm", pa.string()),
        ("congestion", pa.string()),
        ("size_bytes", pa.int64()),
        ("time_ns", pa.float64()),
        ("algbw_gb_per_s", pa.float64()),
        ("busbw_gb_per_s", pa.float64()),
        ("events", pa.int64()),
        ("wall_s", pa.float64()),
    ]
)

SENSITIVITY_SCHEMA = pa.schema(
    [
        ("topology", pa.string()),
        ("knob", pa.string()),
        ("value", pa.float64()),
        ("total_ns", pa.float64()),
        ("delta_ns", pa.float64()),
        ("delta_pct", pa.float64()),
        ("last_rank", pa.int32()),
        ("mean_compute_ns", pa.float64()),
        ("mean_exposed_comm_ns", pa.float64()),
        ("max_exposed_comm_ns", pa.float64()),
    ]
)
"""One row per topology and knob value: the makespan, its change from the topology's first value,
the rank that finishes last, and the per-rank means of :attr:`SimResult.ranks`."""


def collective_workload(collective: str, num_npus: int, size_bytes: int, *, name: str | None = None) -> Trace:
    """A workload of one ``COMM_COLL_NODE`` per rank: ``collective`` of nccl-tests size ``size_bytes``.

    ``size_bytes`` is nccl-tests' S (the whole array); for all-gather the node's
    ``comm_size`` is the per-rank share ``S / num_npus``, as ASTRA-sim reads it.
    """
    coll = collective_name(collective)
    comm_size = size_bytes // num_npus if coll == "ALL_GATHER" else size_bytes
    ops = ops_table(
        {
            "rank": np.arange(num_npus, dtype=np.int32),
            "id": np.ones(num_npus, dtype=np.uint64),
            "name": [f"{coll.lower()}_{size_bytes}"] * num_npus,
            "type": ["COMM_COLL_NODE"] * num_npus,
            "comm_type": [coll] * num_npus,
            "comm_size": np.full(num_npus, comm_size, dtype=np.int64),
        }
    )
    return Trace(ops=ops, name=name or f"{coll.lower()}-{num_npus}x{size_bytes}", kind="workload")


def parse_sizes(text: str) -> list[int]:
    """Sizes from ``"1KiB,64KiB,1MiB"`` or a geometric range ``"1KiB..1GiB"`` (×2 steps) /
    ``"1KiB..1GiB:4"`` (×4 steps); items may be mixed.

    Raises
    ------
    UnsatisfiableError
        An item is not a size, or a range is empty or has a factor below 2.

    Examples
    --------
    >>> parse_sizes("1KiB..8KiB")
    [1024, 2048, 4096, 8192]
    >>> parse_sizes("1MiB, 1KiB..16KiB:4")
    [1024, 4096, 16384, 1048576]
    """
    out: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if ".." not in item:
            size = parse_size(item)
            if size <= 0:
                raise UnsatisfiableError(f"size {item!r}: a collective needs at least one byte")
            out.add(size)
            continue
        lo_text, hi_text = item.split("..", 1)
        factor = 2
        if ":" in hi_text:
            hi_text, f_text = hi_text.split(":", 1)
            if not f_text.strip().isdigit() or int(f_text) < 2:
                raise UnsatisfiableError(f"size range {item!r}: the step factor must be an integer >= 2")
            factor = int(f_text)
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo <= 0 or hi < lo:
            raise UnsatisfiableError(f"size range {item!r}: expected 0 < start <= end")
        size = lo
        while size <= hi:
            out.add(size)
            size *= factor
    if not out:
        raise UnsatisfiableError(f"no sizes in {text!r}")
    return sorted(out)


def _topology(spec: Topology | str) -> Topology:
    """A topology as given, or parsed from its spec."""
    return spec if isinstance(spec, Topology) else parse_topology(spec)


def _label(spec: SweepAlgorithm) -> str:
    """How the sweep table names an algorithm."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Trace):
        return spec.name
    return getattr(spec, "__name__", "custom")


@dataclass(frozen=True)
class SweepCell:
    """One (topology, algorithm) of a sweep: its sizes share the algorithm built for the topology."""

    topology: Topology
    label: str
    algorithm: SweepAlgorithm


def sweep_cells(
    algorithms: Sequence[SweepAlgorithm] | Mapping[str, SweepAlgorithm], topologies: Sequence[Topology | str]
) -> list[SweepCell]:
    """The (topology, algorithm) cells of a sweep, topologies outermost, in the order given.

    Raises
    ------
    TopologyError
        A topology spec cannot be parsed.
    """
    items = (
        list(algorithms.items()) if isinstance(algorithms, Mapping) else [(_label(a), a) for a in algorithms]
    )
    return [SweepCell(_topology(t), label, spec) for t in topologies for label, spec in items]


def build_cell(cell: SweepCell, collective: str) -> SweepCell:
    """``cell`` with its algorithm built: a factory (a synthesizer) run for the cell's topology."""
    if isinstance(cell.algorithm, (str, Trace)):
        return cell
    t0 = time.perf_counter()
    algo = cell.algorithm(cell.topology, collective_name(collective))
    log.debug("algorithm %s for %s built in %.3f s", cell.label, cell.topology.name, time.perf_counter() - t0)
    return SweepCell(cell.topology, cell.label, algo)


def sweep_point(cell: SweepCell, size_bytes: int, collective: str, config: SimConfig) -> dict[str, Any]:
    """One row of :data:`SWEEP_SCHEMA`: ``collective`` of ``size_bytes`` by a built cell's algorithm.

    Raises
    ------
    SimulationError
        The algorithm cannot run this collective on the cell's topology (the message names
        the point).
    """
    coll = collective_name(collective)
    topo, n = cell.topology, cell.topology.num_npus
    assert isinstance(cell.algorithm, (str, Trace)), "build_cell first"
    work = collective_workload(coll, n, int(size_bytes))
    t0 = time.perf_counter()
    try:
        res = simulate(work, topo, config=config, algorithms={coll: cell.algorithm})
    except SimulationError as exc:
        raise SimulationError(
            f"sweep point {topo.name} / {cell.label} / {size_bytes} B: {exc}", exc.stuck
        ) from exc
    wall = time.perf_counter() - t0
    algbw = rate_gb_per_s(int(size_bytes), res.total_ns)
    return {
        "topology": topo.name,
        "num_npus": n,
        "collective": coll,
        "algorithm": cell.label,
        "congestion": config.congestion,
        "size_bytes": int(size_bytes),
        "time_ns": res.total_ns,
        "algbw_gb_per_s": algbw,
        "busbw_gb_per_s": algbw * busbw_factor(coll, n),
        "events": res.events,
        "wall_s": wall,
    }


def sweep_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows of :func:`sweep_point` as one :data:`SWEEP_SCHEMA` table.

    >>> sweep_table([]).num_rows
    0
    """
    return pa.Table.from_pylist(list(rows), schema=SWEEP_SCHEMA)


def sweep(
    sizes_bytes: Sequence[int],
    algorithms: Sequence[SweepAlgorithm] | Mapping[str, SweepAlgorithm],
    topologies: Sequence[Topology | str],
    *,
    collective: str = "allreduce",
    config: SimConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """Simulate one collective for every (topology, algorithm, size) and tabulate bandwidth.

    Parameters
    ----------
    sizes_bytes
        nccl-tests sizes S (bytes).
    algorithms
        Names (``"native"``, ``"ring"``, ``"direct"``...), algorithm traces, or
        factories ``f(topology, collective) -> Trace`` (a synthesizer), optionally as
        a ``{label: algorithm}`` mapping. Factories run once per topology.
    topologies
        :class:`Topology` objects or specs (``"mesh2d:8x8,bw=50,lat=500"``).
    collective
        ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``...
    config
        Simulator parameters; ``config.congestion`` picks the network model.
    progress
        Called with (points done, points total) after each point.

    Returns
    -------
    pyarrow.Table
        :data:`SWEEP_SCHEMA`: topology, num_npus, collective, algorithm, congestion,
        size_bytes, time_ns, algbw_gb_per_s and busbw_gb_per_s (GB = 10^9, as nccl-tests),
        events, wall_s.

    Raises
    ------
    SimulationError
        An algorithm cannot run this collective on a topology.
    TopologyError
        A topology spec cannot be parsed.

    Notes
    -----
    O(T · A · S) simulations; each is O(events log events) (see :func:`simulate`). The points
    are :func:`sweep_point` of :func:`build_cell` of :func:`sweep_cells`, so a caller can run
    them anywhere (:mod:`etstore.app.sweeps` fans them out on Ray) and get these rows.
    """
    cfg = config or SimConfig()
    cells = [build_cell(c, collective) for c in sweep_cells(algorithms, topologies)]
    rows: list[dict[str, Any]] = []
    total = len(cells) * len(sizes_bytes)
    for cell in cells:
        for size in sizes_bytes:
            rows.append(sweep_point(cell, int(size), collective, cfg))
            if progress is not None:
                progress(len(rows), total)
    return sweep_table(rows)


@dataclass(frozen=True)
class SensitivityPoint:
    """One simulation of a sensitivity sweep: the knob at ``value`` on ``topology`` (as given)."""

    topology: Topology
    value: float
    perturbation: Perturbation
    result: SimResult


def sensitivity(
    trace: Trace,
    topologies: Sequence[Topology],
    knob: Knob,
    values: Sequence[float],
    *,
    config: SimConfig | None = None,
    algorithms: Mapping[str, Any] | None = None,
    dims: Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SensitivityPoint]:
    """Simulate ``trace`` on each topology with ``knob`` at each value, in the order given.

    Each point is what :func:`~etstore.sim.perturb.perturb` and
    :func:`~etstore.sim.perturb.perturb_network` make of the trace and topology with
    ``knob.at(value)``, simulated as ``etstore sim`` would: a value that changes nothing (factor 1,
    jitter 0) is the plain simulation, to the ns.

    Raises
    ------
    OptionError
        A value the knob refuses (a degrade above 1, a failure that disconnects, a rank the
        trace lacks).

    Notes
    -----
    O(topologies · values) simulations.
    """
    cfg = config or SimConfig()
    out: list[SensitivityPoint] = []
    todo = sensitivity_plan(trace, topologies, knob, values)
    for plan in todo:
        out.append(sensitivity_point(plan, trace, cfg, algorithms, dims))
        if progress is not None:
            progress(len(out), len(todo))
    return out


@dataclass(frozen=True)
class SensitivityPlan:
    """One point of a sensitivity sweep before it runs: the topology as given, the value, the
    perturbation the knob makes of it and the network it leaves."""

    topology: Topology
    value: float
    perturbation: Perturbation
    network: Topology


def sensitivity_plan(
    trace: Trace, topologies: Sequence[Topology], knob: Knob, values: Sequence[float]
) -> list[SensitivityPlan]:
    """The points of :func:`sensitivity`, topologies outermost, each checked before any runs.

    Raises
    ------
    OptionError
        A value the knob refuses (a degrade above 1, a failure that disconnects, a rank the
        trace lacks).
    """
    todo = [(t, float(v), knob.at(float(v))) for t in topologies for v in values]
    plans = [SensitivityPlan(t, v, p, perturb_network(t, p)) for t, v, p in todo]
    if knob.kind == "slow":  # a rank the trace lacks
        perturb(trace, knob.at(1.0))
    return plans


def sensitivity_point(
    plan: SensitivityPlan,
    trace: Trace,
    config: SimConfig,
    algorithms: Mapping[str, Any] | None = None,
    dims: Sequence[int] | None = None,
) -> SensitivityPoint:
    """Simulate one planned point of :func:`sensitivity` (a pure function of its arguments)."""
    p = plan.perturbation
    work = perturb(trace, p) if p.changes_compute else trace
    res = simulate(work, plan.network, config=config, algorithms=algorithms, dims=dims)
    return SensitivityPoint(plan.topology, plan.value, p, res)


def sensitivity_table(points: Sequence[SensitivityPoint], knob: Knob) -> pa.Table:
    """:data:`SENSITIVITY_SCHEMA` rows of ``points``; deltas against each topology's first point.

    >>> t = sensitivity_table([], Knob("slow", "3"))
    >>> t.num_rows, t.column_names[:4]
    (0, ['topology', 'knob', 'value', 'total_ns'])
    """
    rows: dict[str, list[Any]] = {f.name: [] for f in SENSITIVITY_SCHEMA}
    first: dict[str, float] = {}
    for pt in points:
        ranks = pt.result.ranks
        base = first.setdefault(pt.topology.name, pt.result.total_ns)
        finish = ranks["total_ns"].to_numpy()
        exposed = ranks["exposed_comm_ns"].to_numpy()
        delta = pt.result.total_ns - base
        for key, value in (
            ("topology", pt.topology.name),
            ("knob", knob.name),
            ("value", pt.value),
            ("total_ns", pt.result.total_ns),
            ("delta_ns", delta),
            ("delta_pct", round(100.0 * delta / base, 3) if base else None),
            ("last_rank", int(ranks["rank"][int(np.argmax(finish))].as_py()) if len(finish) else None),
            ("mean_compute_ns", float(ranks["compute_ns"].to_numpy().mean()) if len(finish) else None),
            ("mean_exposed_comm_ns", float(exposed.mean()) if len(finish) else None),
            ("max_exposed_comm_ns", float(exposed.max()) if len(finish) else None),
        ):
            rows[key].append(value)
    return pa.Table.from_pydict(rows, schema=SENSITIVITY_SCHEMA)
