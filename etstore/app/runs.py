"""Simulation runs recorded in DuckDB: a documented, stable schema that dashboards can read.

The simulator (:mod:`etstore.sim`) computes a :class:`~etstore.sim.SimResult` and stores
nothing; this module writes results into a store's warehouse: one run
(:func:`record_run`), the runs of several jobs sharing a fabric (:func:`record_jobs`), a
sensitivity sweep's runs (:func:`record_sensitivity`) and a bus-bandwidth sweep
(:func:`record_sweep`).

Tables (declared here, :data:`RUN_TABLES`: created with the store, applied again by this
module's first write on a connection; every time is ns, every size bytes; reported
rates ``algbw_gb_per_s`` / ``busbw_gb_per_s`` are GB/s with GB = 10^9 as nccl-tests prints
them, so they join ``measurements`` like with like; ``link_util.bandwidth_gb_per_s`` is the
topology's input, GB = 2^30 as ASTRA-sim):

``runs``
    one row per simulation: ``run_id`` (primary key), ``trace``, ``topology``,
    ``num_npus``, ``congestion`` (``aware``/``unaware``), ``scheduling_policy``,
    ``params`` (JSON: every :class:`~etstore.sim.SimConfig` field, algorithms,
    caller parameters, and ``overloaded_links`` — ``SimResult.overloaded`` as rows —
    when a congestion-unaware run offered a link more than its bandwidth),
    ``total_ns`` (simulated makespan), ``wall_s`` (wall time of the simulation),
    ``loop_s`` (CPU time of its event loop), ``events``,
    ``events_per_s``, ``num_ops``, ``sim_ops`` (ops incl. collective sub-ops),
    ``created_at`` (UTC).
``op_timings``
    per run and trace op: ``run_id``, ``trace``, ``rank``, ``id``, ``name``, ``type``,
    ``ready_ns``, ``start_ns``, ``end_ns``, ``duration_ns`` (= end − start),
    ``wait_ns`` (= start − ready). ``(trace, rank, id)`` joins the store's ``ops``.
``rank_breakdown``
    per run and rank: ``total_ns`` (the rank's finish time) = ``compute_ns`` +
    ``exposed_comm_ns`` + ``idle_ns``; ``comm_ns`` (time with a send, receive or
    collective in flight), ``overlap_ns`` (communication hidden under compute).
``collectives``
    per run and collective instance: ``coll_seq`` (k-th collective of its group),
    ``pg_name``, ``comm_type``, ``algorithm``, ``group_size``, ``size_bytes``,
    ``start_ns``, ``end_ns``, ``time_ns``, ``algbw_gb_per_s``, ``busbw_gb_per_s``
    (GB = 10^9), ``busbw_factor`` (nccl-tests).
``link_util``
    per run and directed link: ``link``, ``src``, ``dst``, ``latency_ns``,
    ``bandwidth_gb_per_s`` (the link's, GB = 2^30), ``bytes``, ``messages``, ``busy_ns``,
    ``utilization`` (busy / makespan).
``sweep_points``
    per sweep and point: ``sweep_id``, ``topology``, ``num_npus``, ``collective``,
    ``algorithm``, ``congestion``, ``size_bytes``, ``time_ns``, ``algbw_gb_per_s``,
    ``busbw_gb_per_s`` (GB = 10^9), ``events``, ``wall_s``, ``params`` (JSON).

Views (re-created with the tables; stable names and columns for dashboards):

``v_collective_busbw``
    ``collectives`` joined with the run's ``topology``, ``num_npus`` and
    ``congestion``, plus ``time_us`` and ``size_mib``: one row per collective instance.
``v_rank_exposed_comm``
    ``rank_breakdown`` plus ``exposed_share`` (exposed / total), ``idle_share`` and
    ``hidden_share`` (overlap / comm, the part of communication hidden under compute).
``v_link_utilization``
    ``link_util`` joined with the run's ``topology`` and ``total_ns``, plus ``mib``
    ``gb_per_s`` (bytes moved per simulated second, GB = 10^9) and ``gib_per_s`` (the same
    in GiB = 2^30, kept for dashboards written before ``gb_per_s``).
``v_sweep_busbw``
    ``sweep_points`` with ``size_mib`` and ``time_us``: one row per curve point.

``docs/metrics.md`` documents keys, units and example SQL for dashboard tools.
The schema version is kept in ``etstore_sim_schema``; columns are only ever added. Rates
that version 1 stored in GB = 2^30 are rescaled to GB = 10^9 in the transaction that applies
the tables (the first writable open of such a store).

Examples
--------
>>> import duckdb
>>> from etstore.sim import simulate
>>> from etstore.store.warehouse import Warehouse
>>> from etstore.testing import p2p_trace
>>> from etstore.topology import Topology
>>> wh = Warehouse(duckdb.connect())  # an in-memory warehouse; a store's is store.warehouse
>>> record_run(wh, simulate(p2p_trace(1 << 20), Topology.from_spec("ring:2")), params={"note": "x"})
1
>>> wh.query("SELECT trace, num_npus, total_ns FROM runs").to_pylist()
[{'trace': 'p2p', 'num_npus': 2, 'total_ns': 20031.0}]
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import QueryError, StoreError
from etstore.sim.jobs import JobRuns, JobsResult
from etstore.sim.result import SimResult
from etstore.sim.sweep import SensitivityPoint
from etstore.store.tables import TableSet
from etstore.store.warehouse import Warehouse

__all__ = [
    "GIB_RATE_COLUMNS",
    "RUN_TABLES",
    "SCHEMA_VERSION",
    "create_schema",
    "record_jobs",
    "record_run",
    "record_sensitivity",
    "record_sweep",
]

log = logging.getLogger(__name__)

_SWEEP_COLUMNS = (
    "topology",
    "num_npus",
    "collective",
    "algorithm",
    "congestion",
    "size_bytes",
    "time_ns",
    "algbw_gb_per_s",
    "busbw_gb_per_s",
    "events",
    "wall_s",
)


SCHEMA_VERSION = 2
"""Version of the metrics tables; columns are only ever added.

Version 2: ``algbw_gb_per_s`` and ``busbw_gb_per_s`` of ``collectives`` and ``sweep_points``
are GB/s with GB = 10^9 (nccl-tests, like ``measurements``); version 1 stored them with
GB = 2^30, and the first writable open rescales such rows."""

GIB_RATE_COLUMNS: dict[str, tuple[str, ...]] = {
    "collectives": ("algbw_gb_per_s", "busbw_gb_per_s"),
    "sweep_points": ("algbw_gb_per_s", "busbw_gb_per_s"),
}
"""The rate columns metrics schema 1 stored in GB = 2^30, by table (now GB = 10^9)."""

_TABLES: dict[str, str] = {
    "etstore_sim_schema": "CREATE TABLE IF NOT EXISTS etstore_sim_schema (version INTEGER)",
    "runs": """CREATE TABLE IF NOT EXISTS runs (
        run_id BIGINT PRIMARY KEY, trace VARCHAR NOT NULL, topology VARCHAR, num_npus INTEGER,
        congestion VARCHAR, scheduling_policy VARCHAR, params VARCHAR, total_ns DOUBLE, wall_s DOUBLE,
        loop_s DOUBLE, events BIGINT, events_per_s DOUBLE, num_ops BIGINT, sim_ops BIGINT,
        created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
    "op_timings": """CREATE TABLE IF NOT EXISTS op_timings (
        run_id BIGINT NOT NULL, trace VARCHAR NOT NULL, rank INTEGER, id UBIGINT, name VARCHAR,
        type VARCHAR, ready_ns DOUBLE, start_ns DOUBLE, end_ns DOUBLE, duration_ns DOUBLE, wait_ns DOUBLE)""",
    "rank_breakdown": """CREATE TABLE IF NOT EXISTS rank_breakdown (
        run_id BIGINT NOT NULL, trace VARCHAR NOT NULL, rank INTEGER, total_ns DOUBLE, compute_ns DOUBLE,
        comm_ns DOUBLE, exposed_comm_ns DOUBLE, overlap_ns DOUBLE, idle_ns DOUBLE)""",
    "collectives": """CREATE TABLE IF NOT EXISTS collectives (
        run_id BIGINT NOT NULL, trace VARCHAR NOT NULL, coll_seq BIGINT, pg_name VARCHAR, comm_type VARCHAR,
        algorithm VARCHAR, group_size INTEGER, size_bytes BIGINT, start_ns DOUBLE, end_ns DOUBLE,
        time_ns DOUBLE, algbw_gb_per_s DOUBLE, busbw_gb_per_s DOUBLE, busbw_factor DOUBLE)""",
    "link_util": """CREATE TABLE IF NOT EXISTS link_util (
        run_id BIGINT NOT NULL, link INTEGER, src INTEGER, dst INTEGER, latency_ns DOUBLE,
        bandwidth_gb_per_s DOUBLE, bytes DOUBLE, messages BIGINT, busy_ns DOUBLE, utilization DOUBLE)""",
    "sweep_points": """CREATE TABLE IF NOT EXISTS sweep_points (
        sweep_id BIGINT NOT NULL, topology VARCHAR, num_npus INTEGER, collective VARCHAR, algorithm VARCHAR,
        congestion VARCHAR, size_bytes BIGINT, time_ns DOUBLE, algbw_gb_per_s DOUBLE, busbw_gb_per_s DOUBLE,
        events BIGINT, wall_s DOUBLE, params VARCHAR)""",
}

# Views answer the common dashboard questions; their columns, like the tables', are only ever added.
_VIEWS: dict[str, str] = {
    "v_collective_busbw": """CREATE OR REPLACE VIEW v_collective_busbw AS
        SELECT c.run_id, c.trace, r.topology, r.num_npus, r.congestion, c.coll_seq, c.pg_name,
            c.comm_type, c.algorithm, c.group_size, c.size_bytes, c.size_bytes / 2^20 AS size_mib,
            c.start_ns, c.end_ns, c.time_ns, c.time_ns / 1e3 AS time_us, c.algbw_gb_per_s,
            c.busbw_gb_per_s, c.busbw_factor
        FROM collectives c JOIN runs r USING (run_id)""",
    "v_rank_exposed_comm": """CREATE OR REPLACE VIEW v_rank_exposed_comm AS
        SELECT run_id, trace, rank, total_ns, compute_ns, comm_ns, exposed_comm_ns, overlap_ns, idle_ns,
            CASE WHEN total_ns > 0 THEN exposed_comm_ns / total_ns END AS exposed_share,
            CASE WHEN total_ns > 0 THEN idle_ns / total_ns END AS idle_share,
            CASE WHEN comm_ns > 0 THEN overlap_ns / comm_ns END AS hidden_share
        FROM rank_breakdown""",
    "v_link_utilization": """CREATE OR REPLACE VIEW v_link_utilization AS
        SELECT l.run_id, r.trace, r.topology, l.link, l.src, l.dst, l.latency_ns, l.bandwidth_gb_per_s,
            l.bytes, l.bytes / 2^20 AS mib, l.messages, l.busy_ns, l.utilization, r.total_ns,
            CASE WHEN r.total_ns > 0 THEN l.bytes / 2^30 / (r.total_ns / 1e9) END AS gib_per_s,
            CASE WHEN r.total_ns > 0 THEN l.bytes / r.total_ns END AS gb_per_s
        FROM link_util l JOIN runs r USING (run_id)""",
    "v_sweep_busbw": """CREATE OR REPLACE VIEW v_sweep_busbw AS
        SELECT sweep_id, topology, num_npus, collective, algorithm, congestion, size_bytes,
            size_bytes / 2^20 AS size_mib, time_ns, time_ns / 1e3 AS time_us, algbw_gb_per_s, busbw_gb_per_s
        FROM sweep_points""",
}


def _upgrade(warehouse: Warehouse) -> None:
    """Refuse metrics of a newer schema; rescale the rates of version 1 (GB = 2^30); record
    :data:`SCHEMA_VERSION` (inside the transaction that applies :data:`RUN_TABLES`)."""
    have = warehouse.query("SELECT max(version) FROM etstore_sim_schema").scalar()
    if have is not None and have > SCHEMA_VERSION:
        raise StoreError(
            f"the metrics tables are schema version {have}; this etstore writes version "
            f"{SCHEMA_VERSION}: upgrade etstore"
        )
    if have is not None and have < 2:  # rates stored with GB = 2^30
        for table, columns in GIB_RATE_COLUMNS.items():
            sets = ", ".join(f"{c} = {c} * $k" for c in columns)
            warehouse.execute(f"UPDATE {table} SET {sets}", {"k": 2**30 / 1e9})
    if have is None or have < SCHEMA_VERSION:
        warehouse.execute("INSERT INTO etstore_sim_schema VALUES ($v)", {"v": SCHEMA_VERSION})


RUN_TABLES = TableSet("runs", _TABLES, _VIEWS, upgrade=_upgrade)
"""The simulator's metrics tables and dashboard views (the module docstring lists them), with
their version in ``etstore_sim_schema`` (:data:`SCHEMA_VERSION`, :func:`_upgrade`)."""


def create_schema(warehouse: Warehouse) -> None:
    """Create every warehouse table (if absent) and (re)create the views: the store's own and
    every feature's (:meth:`~etstore.store.warehouse.Warehouse.create_schema`).

    A writable store's warehouse already has them; this is for a warehouse over
    another DuckDB database (``Warehouse(duckdb.connect(path))``). Idempotent.

    Raises
    ------
    StoreError
        The database holds a newer metrics schema, or DuckDB refuses the DDL.
    """
    try:
        warehouse.create_schema()
    except StoreError as exc:
        raise StoreError(f"cannot create the simulator metrics tables: {exc}") from exc


def _ensure(warehouse: Warehouse) -> None:
    """Apply :data:`RUN_TABLES` before a recording writes (once per connection)."""
    try:
        warehouse.ensure(RUN_TABLES)
    except StoreError as exc:
        raise StoreError(f"cannot create the simulator metrics tables: {exc}") from exc


def _tagged(table: pa.Table, run_id: int, trace: str | None) -> pa.Table:
    """``table`` with a leading ``run_id`` column, then ``trace`` unless None."""
    out = table.add_column(0, "run_id", pa.array([run_id] * table.num_rows, pa.int64()))
    if trace is not None:
        out = out.add_column(1, "trace", pa.array([trace] * table.num_rows, pa.string()))
    return out


def _run_row(result: SimResult, run_id: int, name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``runs`` row of one simulation."""
    all_params = result.params()
    if params:
        all_params["user"] = dict(params)
    return {
        "rid": run_id,
        "trace": name,
        "topo": result.topology,
        "npus": result.num_npus,
        "cong": result.config.congestion,
        "sched": result.config.scheduling_policy,
        "params": json.dumps(all_params, sort_keys=True, default=str),
        "total": result.total_ns,
        "wall": result.wall_s,
        "loop": result.loop_s,
        "events": result.events,
        "eps": result.events_per_s if result.loop_s > 0 else None,
        "ops": result.ops.num_rows,
        "sim_ops": result.sim_ops,
    }


_INSERT_RUN = (
    "INSERT INTO runs (run_id, trace, topology, num_npus, congestion, scheduling_policy, params, "
    "total_ns, wall_s, loop_s, events, events_per_s, num_ops, sim_ops) VALUES ($rid, $trace, $topo, "
    "$npus, $cong, $sched, $params, $total, $wall, $loop, $events, $eps, $ops, $sim_ops)"
)


def record_run(
    warehouse: Warehouse,
    result: SimResult,
    *,
    trace_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    run_id: int | None = None,
) -> int:
    """Store one :class:`~etstore.sim.SimResult` in every metrics table, atomically.

    Parameters
    ----------
    warehouse
        Where to write: a store's ``warehouse``, or a :class:`~etstore.store.warehouse.Warehouse`
        over any DuckDB database (its tables are created if absent).
    result
        What :func:`~etstore.sim.simulate` returned.
    trace_name
        The trace's name in the store (``op_timings.trace``), default ``result.trace_name``.
    params
        Extra JSON-able parameters kept in ``runs.params`` under ``"user"``.
    run_id
        Use this id; default: one more than the largest.

    Returns
    -------
    int
        The run id.

    Raises
    ------
    StoreError
        DuckDB refuses the insert (the run id is taken, ...); nothing is written.

    Notes
    -----
    O(ops + ranks + collectives + links) rows, inserted from Arrow in one transaction.
    """
    _ensure(warehouse)
    name = trace_name or result.trace_name
    ops = result.ops
    ops = ops.append_column("duration_ns", pc.subtract(ops["end_ns"], ops["start_ns"]))
    ops = ops.append_column("wait_ns", pc.subtract(ops["start_ns"], ops["ready_ns"]))
    try:
        with warehouse.transaction():
            rid = int(run_id) if run_id is not None else warehouse.next_id("runs", "run_id")
            warehouse.execute(_INSERT_RUN, _run_row(result, rid, name, params))
            warehouse.append("op_timings", _tagged(ops, rid, name))
            warehouse.append("rank_breakdown", _tagged(result.ranks, rid, name))
            warehouse.append("collectives", _tagged(result.collectives, rid, name))
            warehouse.append("link_util", _tagged(result.links, rid, None))
    except (StoreError, QueryError) as exc:
        raise StoreError(f"cannot record simulation run of {name!r}: {exc}") from exc
    log.debug("recorded run %d of %s: %d op timings", rid, name, ops.num_rows)
    return rid


def record_jobs(
    warehouse: Warehouse, result: JobsResult, *, params: Mapping[str, Any] | None = None
) -> JobRuns:
    """Record the joint run and one run per job (:func:`~etstore.sim.jobs.simulate_jobs`), in one
    transaction.

    The joint run is the combined trace's (named ``A+B``; its ``link_util`` holds the shared
    links); each job's run carries the job's own trace name, so ``(trace, rank, id)`` of its
    ``op_timings`` joins the store's ``ops``, and ``params.user.job`` =
    ``{"job": "J0", "joint_run": <id>, "placement": {"J0-0": NPU, ...}}``. The joint run's
    ``params.user.jobs`` lists the traces and the whole placement.

    Raises
    ------
    StoreError
        DuckDB refuses an insert; nothing is written.
    """
    base = dict(params or {})
    _ensure(warehouse)
    combined = result.combined
    with warehouse.transaction():
        joint = record_run(
            warehouse,
            result.joint,
            trace_name=combined.trace.name,
            params={**base, "jobs": dict(combined.trace.params["jobs"])},
        )
        ids = []
        for job, res in zip(combined.jobs, result.jobs, strict=True):
            mine = {"job": job.label, "joint_run": joint, "placement": job.placement()}
            ids.append(record_run(warehouse, res, trace_name=job.trace_name, params={**base, "job": mine}))
    return JobRuns(joint, tuple(ids))


def record_sensitivity(
    warehouse: Warehouse,
    trace_name: str,
    points: Sequence[SensitivityPoint],
    *,
    knob: str,
    values: Sequence[float],
    params: Mapping[str, Any] | None = None,
) -> list[int]:
    """Record each point of a sensitivity sweep (:func:`~etstore.sim.sweep.sensitivity`) as a run,
    in one transaction; the run ids follow one another from the first.

    Each run's ``params.user`` holds ``params``, the point's ``perturbation`` and
    ``sensitivity`` = ``{"knob", "value", "values", "first_run"}``, so the report finds the
    sweep's runs from any one of them.

    Raises
    ------
    StoreError
        DuckDB refuses an insert; nothing is written.
    """
    _ensure(warehouse)
    ids: list[int] = []
    with warehouse.transaction():
        first = warehouse.next_id("runs", "run_id")
        for i, pt in enumerate(points):
            where = {"knob": knob, "value": pt.value, "values": list(values), "first_run": first}
            user = {**(params or {}), "perturbation": pt.perturbation.to_dict(), "sensitivity": where}
            ids.append(
                record_run(
                    warehouse, pt.result, trace_name=trace_name, params=user, run_id=first if i == 0 else None
                )
            )
    return ids


def record_sweep(warehouse: Warehouse, points: pa.Table, *, params: Mapping[str, Any] | None = None) -> int:
    """Store a :func:`~etstore.sim.sweep` result in ``sweep_points``, atomically.

    Parameters
    ----------
    warehouse
        Where to write (see :func:`record_run`).
    points
        The sweep's points; columns absent from ``sweep_points`` are ignored.
    params
        JSON-able parameters kept in every row's ``params``.

    Returns
    -------
    int
        The sweep id (one more than the largest).

    Raises
    ------
    StoreError
        DuckDB refuses the insert; nothing is written.

    Notes
    -----
    O(points), one columnar insert.
    """
    _ensure(warehouse)
    data = points.select([c for c in _SWEEP_COLUMNS if c in points.column_names])
    encoded = json.dumps(dict(params or {}), sort_keys=True, default=str)
    data = data.append_column("params", pa.array([encoded] * data.num_rows, pa.string()))
    try:
        with warehouse.transaction():
            sid = warehouse.next_id("sweep_points", "sweep_id")
            data = data.add_column(0, "sweep_id", pa.array([sid] * data.num_rows, pa.int64()))
            warehouse.append("sweep_points", data)
    except (StoreError, QueryError) as exc:
        raise StoreError(f"cannot record sweep: {exc}") from exc
    return sid
