"""Simulate two stored traces on one topology and record their per-rank differences.

Two recordings (PyTorch ET + Kineto: a trace and its rewrite) are replayed
(:func:`~etstore.sim.replay.replay`) as they ran, or on the topology given: what a rewrite
of a recording realises is the difference of its replays.

Typical use: a trace against its rewrite (``etstore rewrite``), both on the same
network and configuration. Both runs land in the metrics tables through
:func:`~etstore.sim.metrics.record_run`; the differences land in ``comparisons``
(:data:`~etstore.store.schema.COMPARISONS_DDL`):

``comparisons`` (one row per rank, plus a total row with ``rank`` NULL)
    ``comparison_id``, ``trace_a``, ``trace_b``, ``run_a``, ``run_b`` (ids in
    ``runs``), ``topology``, ``congestion``, ``rank``; ``total_a_ns``, ``total_b_ns``
    (the rank's finish time; total row: the makespan), ``diff_ns`` (= b − a, negative
    when B is faster), ``speedup`` (= a / b), ``exposed_comm_a_ns``,
    ``exposed_comm_b_ns``, ``idle_a_ns``, ``idle_b_ns``, ``overlap_a_ns``,
    ``overlap_b_ns`` (from ``rank_breakdown``; total row: sums over ranks),
    ``created_at`` (UTC). A rank present in only one trace has NULLs on the other side.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from etstore.errors import ConfigError, QueryError, StoreError
from etstore.model import Trace
from etstore.sim._algorithms import AlgorithmSpec
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED, simulate
from etstore.sim.metrics import record_run
from etstore.sim.replay import replay
from etstore.store.base import Store
from etstore.store.schema import TABLES
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology, default_topology, parse_topology

__all__ = ["Comparison", "compare", "default_topology"]

log = logging.getLogger(__name__)

_INSERT_SQL = """\
INSERT INTO comparisons (comparison_id, trace_a, trace_b, run_a, run_b, topology, congestion, rank,
    total_a_ns, total_b_ns, diff_ns, speedup, exposed_comm_a_ns, exposed_comm_b_ns, idle_a_ns, idle_b_ns,
    overlap_a_ns, overlap_b_ns)
WITH a AS (SELECT * FROM rank_breakdown WHERE run_id = $ra),
     b AS (SELECT * FROM rank_breakdown WHERE run_id = $rb),
     per_rank AS (
       SELECT rank, a.total_ns AS ta, b.total_ns AS tb, a.exposed_comm_ns AS ea, b.exposed_comm_ns AS eb,
              a.idle_ns AS ia, b.idle_ns AS ib, a.overlap_ns AS oa, b.overlap_ns AS ob
       FROM a FULL OUTER JOIN b USING (rank)),
     total AS (
       SELECT NULL::INTEGER AS rank,
              (SELECT total_ns FROM runs WHERE run_id = $ra) AS ta,
              (SELECT total_ns FROM runs WHERE run_id = $rb) AS tb,
              sum(ea) AS ea, sum(eb) AS eb, sum(ia) AS ia, sum(ib) AS ib, sum(oa) AS oa, sum(ob) AS ob
       FROM per_rank)
SELECT $cid, $ta, $tb, $ra, $rb, $topo, $cong, rank, ta, tb, tb - ta, ta / nullif(tb, 0),
       ea, eb, ia, ib, oa, ob
FROM (SELECT * FROM per_rank UNION ALL SELECT * FROM total)"""

_SELECT_SQL = """\
SELECT rank, total_a_ns, total_b_ns, diff_ns, speedup, exposed_comm_a_ns, exposed_comm_b_ns,
       idle_a_ns, idle_b_ns, overlap_a_ns, overlap_b_ns
FROM comparisons WHERE comparison_id = $cid ORDER BY rank NULLS LAST"""


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` recorded.

    ``table`` has the ``comparisons`` columns from ``rank`` on (per rank ascending,
    the total row last with ``rank`` NULL); ``total_a_ns``/``total_b_ns`` are the
    makespans. Where a side is a recording (PyTorch ET + Kineto), ``measured_a_ns`` /
    ``measured_b_ns`` give what it measured: each rank's recorded window, and for the total
    row the span of all ranks'.
    """

    comparison_id: int
    trace_a: str
    trace_b: str
    run_a: int
    run_b: int
    topology: str
    total_a_ns: float
    total_b_ns: float
    table: pa.Table

    @property
    def diff_ns(self) -> float:
        """Makespan of B minus makespan of A (negative: B is faster)."""
        return self.total_b_ns - self.total_a_ns


def compare(
    store: Store,
    a: str,
    b: str,
    topo: Topology | str | None = None,
    *,
    config: SimConfig | None = None,
    congestion: str | None = None,
    algorithms: Mapping[str, AlgorithmSpec] | None = None,
) -> Comparison:
    """Simulate stored traces ``a`` and ``b`` on ``topo`` and record the differences.

    Parameters
    ----------
    store
        An open, writable store (its DuckDB holds runs and ``comparisons``).
    a, b
        Names of stored traces (``b`` is usually a rewrite of ``a``).
    topo
        Topology or spec/file; default a ring over the ranks
        (:func:`default_topology` of ``a``).
    config
        Simulation parameters (default :class:`SimConfig`).
    congestion
        ``"aware"`` or ``"unaware"``: overrides ``config.congestion``.
    algorithms
        Per collective type, the algorithm its collective nodes run in both traces
        (as :func:`~etstore.sim.simulate`); comparing a trace run with algorithm X
        to its expansion with X compares the same schedule under the same costs.

    Returns
    -------
    Comparison
        Ids of both runs and of the comparison, makespans, and the per-rank table.

    Raises
    ------
    UnknownTraceError
        ``a`` or ``b`` is not stored.
    TopologyError, SimulationError, ConfigError
        Bad topology, a trace that cannot be replayed, a bad congestion model. Both
        simulations run before anything is written.
    StoreError
        DuckDB refuses the writes; runs recorded by this call are removed again.

    Notes
    -----
    Two simulations, O(events log V) each, then O(ranks) rows.
    """
    trace_a, trace_b = store.load(a), store.load(b)
    ranks_a = set(trace_a.ops["rank"].unique().to_pylist())
    ranks_b = set(trace_b.ops["rank"].unique().to_pylist())
    if ranks_a != ranks_b:
        raise ConfigError(
            f"cannot compare {a!r} ({len(ranks_a)} ranks) with {b!r} ({len(ranks_b)} ranks): "
            "per-rank differences need the same ranks"
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
        topology = rep_a.topology
        topo_name = topology.name if given is not None else "as recorded"
    else:
        topology = topo if isinstance(topo, Topology) else parse_topology(topo or default_topology(trace_a))
        res_a = simulate(trace_a, topology, config=cfg, algorithms=algorithms)
        res_b = simulate(trace_b, topology, config=cfg, algorithms=algorithms)
        topo_name = topology.name
    warehouse = store.warehouse
    ra = record_run(warehouse, res_a, trace_name=a, params={"compare": [a, b]})
    try:
        rb = record_run(warehouse, res_b, trace_name=b, params={"compare": [a, b]})
    except BaseException:
        _drop_runs(warehouse, [ra])
        raise
    try:
        with warehouse.transaction():
            cid = warehouse.next_id("comparisons", "comparison_id")
            warehouse.execute(
                _INSERT_SQL,
                {
                    "cid": cid,
                    "ta": a,
                    "tb": b,
                    "ra": ra,
                    "rb": rb,
                    "topo": topo_name,
                    "cong": cfg.congestion,
                },
            )
        table = warehouse.query(_SELECT_SQL, {"cid": cid}).to_arrow()
    except (StoreError, QueryError) as exc:
        _drop_runs(warehouse, [ra, rb])
        raise StoreError(f"cannot record the comparison of {a!r} and {b!r}: {exc}") from exc
    except BaseException:
        _drop_runs(warehouse, [ra, rb])
        raise
    log.debug("compared %s (run %d) and %s (run %d): comparison %d", a, ra, b, rb, cid)
    for side, trace in (("a", trace_a), ("b", trace_b)):
        measured = _measured_ns(trace, table["rank"].to_pylist())
        if measured is not None:  # a recording: what it measured, beside what was simulated
            table = table.append_column(f"measured_{side}_ns", pa.array(measured, pa.float64()))
    return Comparison(cid, a, b, ra, rb, topo_name, res_a.total_ns, res_b.total_ns, table)


def _measured_ns(trace: Trace, ranks: list[int | None]) -> list[float | None] | None:
    """Each rank's recorded window (first start to last end, ns) of a recording, the longest
    for the total row (rank None); None for a trace that was not recorded."""
    windows = (trace.params or {}).get("windows")
    if trace.params.get("execution") != RECORDED or not windows:
        return None
    per = {int(r): (float(w[1]) - float(w[0])) * 1e3 for r, w in windows.items()}
    span = (max(w[1] for w in windows.values()) - min(w[0] for w in windows.values())) * 1e3
    return [per.get(r) if r is not None else float(span) for r in ranks]


def _drop_runs(warehouse: Warehouse, run_ids: list[int]) -> None:
    """Remove runs (and their rows in every metrics table) written by a failed compare."""
    for table in TABLES:
        if table == "sweep_points":
            continue
        try:
            warehouse.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT unnest($ids))", {"ids": run_ids})
        except StoreError:  # best-effort cleanup while another error propagates
            log.warning("could not remove run(s) %s from %s", run_ids, table)
