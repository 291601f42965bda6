"""Simulate two traces on one topology and set their per-rank times side by side.

Two recordings (PyTorch ET + Kineto: a trace and its rewrite) are replayed
(:func:`~etstore.sim.replay.replay`) as they ran, or on the topology given: what a rewrite
of a recording realises is the difference of its replays. Any other pair is simulated
(:func:`~etstore.sim.simulate`) on the topology given, default a ring over the ranks.

Typical use: a trace against its rewrite (``etstore rewrite``), both on the same network
and configuration. Nothing is stored here: :func:`etstore.app.compare.compare` loads two
stored traces, calls :func:`compare_traces` and records both runs and the table in
``comparisons`` (:data:`~etstore.app.compare.COMPARISON_TABLES`).

The table (one row per rank, ascending, plus a total row with ``rank`` null)
    ``rank``; ``total_a_ns``, ``total_b_ns`` (the rank's finish time; total row: the
    makespan), ``diff_ns`` (= b − a, negative when B is faster), ``speedup`` (= a / b),
    ``exposed_comm_a_ns``, ``exposed_comm_b_ns``, ``idle_a_ns``, ``idle_b_ns``,
    ``overlap_a_ns``, ``overlap_b_ns`` (from ``SimResult.ranks``; total row: sums over
    ranks). A rank present in only one trace has nulls on the other side. Where a side is a
    recording, ``measured_a_ns`` / ``measured_b_ns`` follow: each rank's recorded window,
    and for the total row the span of all ranks'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from etstore.errors import ConfigError
from etstore.model import Trace
from etstore.sim._algorithms import AlgorithmSpec
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED, simulate
from etstore.sim.replay import replay
from etstore.sim.result import SimResult
from etstore.topology import Topology, default_topology, parse_topology

__all__ = ["DIFFERENCES_SCHEMA", "TraceComparison", "compare_traces", "differences"]

_SIDES = ("exposed_comm", "idle", "overlap")

DIFFERENCES_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("total_a_ns", pa.float64()),
        ("total_b_ns", pa.float64()),
        ("diff_ns", pa.float64()),
        ("speedup", pa.float64()),
        *((f"{k}_{side}_ns", pa.float64()) for k in _SIDES for side in ("a", "b")),
    ]
)
"""The columns of :func:`differences` (the ``comparisons`` table's from ``rank`` on)."""


@dataclass(frozen=True, eq=False)
class TraceComparison:
    """What :func:`compare_traces` simulated: both results, where, and the per-rank table."""

    a: SimResult
    b: SimResult
    topology: str
    """The network's name; ``as recorded`` when two recordings replayed as they ran."""
    congestion: str
    table: pa.Table
    """:func:`differences` of ``a`` and ``b``, with ``measured_*_ns`` for a recorded side."""


def compare_traces(
    trace_a: Trace,
    trace_b: Trace,
    topo: Topology | str | None = None,
    *,
    config: SimConfig | None = None,
    congestion: str | None = None,
    algorithms: Mapping[str, AlgorithmSpec] | None = None,
) -> TraceComparison:
    """Simulate ``trace_a`` and ``trace_b`` on ``topo`` and set their per-rank times side by side.

    Parameters
    ----------
    trace_a, trace_b
        The traces (``trace_b`` is usually a rewrite of ``trace_a``); same ranks.
    topo
        Topology or spec/file; default a ring over the ranks (:func:`~etstore.topology.default_topology`
        of ``trace_a``). Two recordings replay as they ran unless it is given.
    config
        Simulation parameters (default :class:`SimConfig`).
    congestion
        ``"aware"`` or ``"unaware"``: overrides ``config.congestion``.
    algorithms
        Per collective type, the algorithm its collective nodes run in both traces
        (as :func:`~etstore.sim.simulate`); comparing a trace run with algorithm X
        to its expansion with X compares the same schedule under the same costs.

    Raises
    ------
    ConfigError
        The traces have different ranks, or a bad congestion model.
    TopologyError, SimulationError
        Bad topology, or a trace that cannot be replayed.

    Notes
    -----
    Two simulations, O(events log V) each, then O(ranks).
    """
    ranks_a = set(trace_a.ops["rank"].unique().to_pylist())
    ranks_b = set(trace_b.ops["rank"].unique().to_pylist())
    if ranks_a != ranks_b:
        raise ConfigError(
            f"cannot compare {trace_a.name!r} ({len(ranks_a)} ranks) with {trace_b.name!r} "
            f"({len(ranks_b)} ranks): per-rank differences need the same ranks"
        )
    cfg = config or SimConfig()
    if congestion is not None:
        if congestion not in ("aware", "unaware"):
            raise ConfigError(f"congestion {congestion!r}: expected 'aware' or 'unaware'")
        cfg = cfg.replace(congestion=congestion)
    recorded = all(t.params.get("execution") == RECORDED for t in (trace_a, trace_b)) and not algorithms
    if recorded:  # recordings replay as they ran (or on the given network): what a rewrite realises
        given = None if topo is None else topo if isinstance(topo, Topology) else parse_topology(topo)
        rep_a, rep_b = replay(trace_a, given, config=cfg), replay(trace_b, given, config=cfg)
        res_a, res_b = rep_a.result, rep_b.result
        topo_name = rep_a.topology.name if given is not None else "as recorded"
    else:
        topology = topo if isinstance(topo, Topology) else parse_topology(topo or default_topology(trace_a))
        res_a = simulate(trace_a, topology, config=cfg, algorithms=algorithms)
        res_b = simulate(trace_b, topology, config=cfg, algorithms=algorithms)
        topo_name = topology.name
    table = differences(res_a, res_b)
    for side, trace in (("a", trace_a), ("b", trace_b)):
        measured = _measured_ns(trace, table["rank"].to_pylist())
        if measured is not None:  # a recording: what it measured, beside what was simulated
            table = table.append_column(f"measured_{side}_ns", pa.array(measured, pa.float64()))
    return TraceComparison(res_a, res_b, topo_name, cfg.congestion, table)


def differences(a: SimResult, b: SimResult) -> pa.Table:
    """Per rank (ascending), then a total row (``rank`` null): the two runs' times and their
    difference (:data:`DIFFERENCES_SCHEMA`).

    >>> from etstore.testing import p2p_trace
    >>> ring = Topology.from_spec("ring:2")
    >>> t = differences(simulate(p2p_trace(1 << 20), ring), simulate(p2p_trace(1 << 10), ring))
    >>> [(r["rank"], r["diff_ns"]) for r in t.select(["rank", "diff_ns"]).to_pylist()]
    [(0, -19512.0), (1, -19512.0), (None, -19512.0)]
    """
    by_a = {int(r["rank"]): r for r in a.ranks.to_pylist()}
    by_b = {int(r["rank"]): r for r in b.ranks.to_pylist()}
    rows = [_row(rank, by_a.get(rank), by_b.get(rank)) for rank in sorted(by_a.keys() | by_b.keys())]
    total = _row(None, {"total_ns": a.total_ns}, {"total_ns": b.total_ns})
    for name in DIFFERENCES_SCHEMA.names[5:]:
        values = [r[name] for r in rows if r[name] is not None]
        total[name] = sum(values) if values else None
    return pa.Table.from_pylist([*rows, total], schema=DIFFERENCES_SCHEMA)


def _row(rank: int | None, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any]:
    """One row of :func:`differences` from the two sides' ``ranks`` rows (None: absent)."""
    ta = None if a is None else a["total_ns"]
    tb = None if b is None else b["total_ns"]
    row: dict[str, Any] = {
        "rank": rank,
        "total_a_ns": ta,
        "total_b_ns": tb,
        "diff_ns": None if ta is None or tb is None else tb - ta,
        "speedup": None if ta is None or not tb else ta / tb,
    }
    for k in _SIDES:
        row[f"{k}_a_ns"] = None if a is None else a.get(f"{k}_ns")
        row[f"{k}_b_ns"] = None if b is None else b.get(f"{k}_ns")
    return row


def _measured_ns(trace: Trace, ranks: list[int | None]) -> list[float | None] | None:
    """Each rank's recorded window (first start to last end, ns) of a recording, the longest
    for the total row (rank None); None for a trace that was not recorded."""
    windows = (trace.params or {}).get("windows")
    if trace.params.get("execution") != RECORDED or not windows:
        return None
    per = {int(r): (float(w[1]) - float(w[0])) * 1e3 for r, w in windows.items()}
    span = (max(w[1] for w in windows.values()) - min(w[0] for w in windows.values())) * 1e3
    return [per.get(r) if r is not None else float(span) for r in ranks]
