"""Compare two stored traces: load them, simulate both, record both runs and their differences.

The simulation and the per-rank table are :func:`etstore.sim.compare.compare_traces` (pure);
this module loads the traces from a store and records what it returned: both runs in the
metrics tables (:func:`~etstore.app.runs.record_run`) and the table in ``comparisons``
(declared here, :data:`COMPARISON_TABLES`), all in one transaction:

``comparisons`` (one row per rank, plus a total row with ``rank`` NULL)
    ``comparison_id``, ``trace_a``, ``trace_b``, ``run_a``, ``run_b`` (ids in
    ``runs``), ``topology``, ``congestion``, then the columns of
    :data:`~etstore.sim.compare.DIFFERENCES_SCHEMA` (``rank``, ``total_a_ns``, ...,
    ``overlap_b_ns``), ``created_at`` (UTC).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from etstore.app.runs import record_run
from etstore.errors import QueryError, StoreError
from etstore.sim._algorithms import AlgorithmSpec
from etstore.sim.compare import DIFFERENCES_SCHEMA, TraceComparison, compare_traces
from etstore.sim.config import SimConfig
from etstore.store.base import Store
from etstore.store.tables import TableSet
from etstore.topology import Topology

__all__ = ["COMPARISON_TABLES", "Comparison", "compare"]

log = logging.getLogger(__name__)

COMPARISON_TABLES = TableSet(
    "comparisons",
    {
        "comparisons": """CREATE TABLE IF NOT EXISTS comparisons (
    comparison_id BIGINT NOT NULL, trace_a VARCHAR, trace_b VARCHAR, run_a BIGINT, run_b BIGINT,
    topology VARCHAR, congestion VARCHAR, rank INTEGER, total_a_ns DOUBLE, total_b_ns DOUBLE,
    diff_ns DOUBLE, speedup DOUBLE, exposed_comm_a_ns DOUBLE, exposed_comm_b_ns DOUBLE,
    idle_a_ns DOUBLE, idle_b_ns DOUBLE, overlap_a_ns DOUBLE, overlap_b_ns DOUBLE,
    created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))"""
    },
)
"""The ``comparisons`` table (the module docstring lists its columns)."""


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
    topo, config, congestion, algorithms
        As :func:`~etstore.sim.compare.compare_traces`.

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
        DuckDB refuses the writes; nothing is written.

    Notes
    -----
    Two simulations, O(events log V) each, then O(ops + ranks) rows.
    """
    found = compare_traces(
        store.load(a), store.load(b), topo, config=config, congestion=congestion, algorithms=algorithms
    )
    warehouse = store.warehouse
    with warehouse.transaction():  # both runs and the comparison, or nothing
        warehouse.ensure(COMPARISON_TABLES)
        ra = record_run(warehouse, found.a, trace_name=a, params={"compare": [a, b]})
        rb = record_run(warehouse, found.b, trace_name=b, params={"compare": [a, b]})
        try:
            cid = warehouse.next_id("comparisons", "comparison_id")
            warehouse.append("comparisons", _rows(found, cid, a, b, ra, rb))
        except (StoreError, QueryError) as exc:
            raise StoreError(f"cannot record the comparison of {a!r} and {b!r}: {exc}") from exc
    log.debug("compared %s (run %d) and %s (run %d): comparison %d", a, ra, b, rb, cid)
    return Comparison(cid, a, b, ra, rb, found.topology, found.a.total_ns, found.b.total_ns, found.table)


def _rows(found: TraceComparison, cid: int, a: str, b: str, ra: int, rb: int) -> pa.Table:
    """The ``comparisons`` rows of one comparison: its ids and names, then the differences."""
    rows = found.table.select(DIFFERENCES_SCHEMA.names)
    head = {"comparison_id": cid, "trace_a": a, "trace_b": b, "run_a": ra, "run_b": rb}
    head |= {"topology": found.topology, "congestion": found.congestion}
    for i, (column, value) in enumerate(head.items()):
        rows = rows.add_column(i, column, pa.array([value] * rows.num_rows))
    return rows
