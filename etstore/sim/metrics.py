"""Simulation metrics in DuckDB: a documented, stable schema that dashboards can read.

Tables (created by :func:`create_schema`; every time is ns, every size bytes,
bandwidth GB/s with GB = 2^30):

``runs``
    one row per simulation: ``run_id`` (primary key), ``trace``, ``topology``,
    ``num_npus``, ``congestion`` (``aware``/``unaware``), ``scheduling_policy``,
    ``params`` (JSON: every :class:`~etstore.sim.SimConfig` field, algorithms,
    caller parameters), ``total_ns`` (simulated makespan), ``wall_s`` (wall time of
    the simulation), ``loop_s`` (CPU time of its event loop), ``events``,
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
    ``start_ns``, ``end_ns``, ``time_ns``, ``algbw_gb_per_s``, ``busbw_gb_per_s``,
    ``busbw_factor`` (nccl-tests).
``link_util``
    per run and directed link: ``link``, ``src``, ``dst``, ``latency_ns``,
    ``bandwidth_gb_per_s``, ``bytes``, ``messages``, ``busy_ns``, ``utilization``
    (busy / makespan).
``sweep_points``
    per sweep and point: ``sweep_id``, ``topology``, ``num_npus``, ``collective``,
    ``algorithm``, ``congestion``, ``size_bytes``, ``time_ns``, ``algbw_gb_per_s``,
    ``busbw_gb_per_s``, ``events``, ``wall_s``, ``params`` (JSON).

Views (re-created by :func:`create_schema`; stable names and columns for dashboards):

``v_collective_busbw``
    ``collectives`` joined with the run's ``topology``, ``num_npus`` and
    ``congestion``, plus ``time_us`` and ``size_mib``: one row per collective instance.
``v_rank_exposed_comm``
    ``rank_breakdown`` plus ``exposed_share`` (exposed / total), ``idle_share`` and
    ``hidden_share`` (overlap / comm, the part of communication hidden under compute).
``v_link_utilization``
    ``link_util`` joined with the run's ``topology`` and ``total_ns``, plus ``mib``
    and ``gib_per_s`` (bytes moved per simulated second, GB = 2^30).
``v_sweep_busbw``
    ``sweep_points`` with ``size_mib`` and ``time_us``: one row per curve point.

``docs/metrics.md`` documents keys, units and example SQL for dashboard tools.
The schema version is kept in ``etstore_sim_schema``; columns are only ever added.

Examples
--------
>>> import duckdb  # doctest: +SKIP
>>> con = duckdb.connect("warehouse.duckdb")  # doctest: +SKIP
>>> create_schema(con)  # doctest: +SKIP
>>> run = record_run(con, result, trace_name="allreduce", params={"note": "baseline"})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from etstore.errors import StoreError
from etstore.sim.engine import SimResult

__all__ = ["SCHEMA_VERSION", "TABLES", "VIEWS", "create_schema", "record_run", "record_sweep"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

TABLES: dict[str, str] = {
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
VIEWS: dict[str, str] = {
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
            CASE WHEN r.total_ns > 0 THEN l.bytes / 2^30 / (r.total_ns / 1e9) END AS gib_per_s
        FROM link_util l JOIN runs r USING (run_id)""",
    "v_sweep_busbw": """CREATE OR REPLACE VIEW v_sweep_busbw AS
        SELECT sweep_id, topology, num_npus, collective, algorithm, congestion, size_bytes,
            size_bytes / 2^20 AS size_mib, time_ns, time_ns / 1e3 AS time_us, algbw_gb_per_s, busbw_gb_per_s
        FROM sweep_points""",
}


def _duck_error() -> type[Exception]:
    import duckdb

    return duckdb.Error  # type: ignore[no-any-return]


def create_schema(con: Any) -> None:
    """Create the metrics tables (if absent) and (re)create the views on a DuckDB connection.

    Idempotent; views are replaced so a database written by an older etstore gains
    the views (and their newer columns) the first time this version writes to it.

    Raises
    ------
    StoreError
        The database holds a newer metrics schema, or DuckDB refuses the DDL.
    """
    err = _duck_error()
    try:
        con.execute("CREATE TABLE IF NOT EXISTS etstore_sim_schema (version INTEGER)")
        row = con.execute("SELECT max(version) FROM etstore_sim_schema").fetchall()[0]
        have = row[0] if row else None
        if have is not None and have > SCHEMA_VERSION:
            raise StoreError(
                f"the metrics tables are schema version {have}; this etstore writes version "
                f"{SCHEMA_VERSION}: "
                "upgrade etstore"
            )
        for ddl in TABLES.values():
            con.execute(ddl)
        for ddl in VIEWS.values():
            con.execute(ddl)
        if have is None:
            con.execute("INSERT INTO etstore_sim_schema VALUES ($v)", {"v": SCHEMA_VERSION})
    except err as exc:
        raise StoreError(f"cannot create the simulator metrics tables: {exc}") from exc


def _next_id(con: Any, table: str, column: str) -> int:
    row = con.execute(f"SELECT coalesce(max({column}), 0) + 1 FROM {table}").fetchall()[0]
    return int(row[0])


def _insert(con: Any, table: str, data: pa.Table) -> None:
    """Append an Arrow table whose columns are a subset of the table's, by name."""
    if data.num_rows == 0:
        return
    con.register("_etstore_incoming", data)
    try:
        cols = ", ".join(data.column_names)
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _etstore_incoming")
    finally:
        con.unregister("_etstore_incoming")


def record_run(
    con: Any,
    result: SimResult,
    *,
    trace_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    run_id: int | None = None,
) -> int:
    """Store one :class:`~etstore.sim.SimResult` in every metrics table, atomically.

    Parameters
    ----------
    con
        A DuckDB connection (the store's warehouse, or any database).
    result
        What :func:`~etstore.sim.simulate` returned.
    trace_name
        The trace's name in the store (``op_timings.trace``), default ``result.trace_name``.
    params
        Extra JSON-able parameters kept in ``runs.params`` under ``"user"``.
    run_id
        Use this id (e.g. the catalog's run id); default: one more than the largest.

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
    create_schema(con)
    err = _duck_error()
    name = trace_name or result.trace_name
    all_params = result.params()
    if params:
        all_params["user"] = dict(params)
    try:
        con.execute("BEGIN TRANSACTION")
        rid = int(run_id) if run_id is not None else _next_id(con, "runs", "run_id")
        con.execute(
            "INSERT INTO runs (run_id, trace, topology, num_npus, congestion, scheduling_policy, params, "
            "total_ns, wall_s, loop_s, events, events_per_s, num_ops, sim_ops) VALUES ($rid, $trace, $topo, "
            "$npus, $cong, $sched, $params, $total, $wall, $loop, $events, $eps, $ops, $sim_ops)",
            {
                "rid": rid,
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
            },
        )
        n = result.ops.num_rows

        def tagged(t: pa.Table, with_trace: bool = True) -> pa.Table:
            t = t.add_column(0, "run_id", pa.array([rid] * t.num_rows, pa.int64()))
            if with_trace:
                t = t.add_column(1, "trace", pa.array([name] * t.num_rows, pa.string()))
            return t

        ops = result.ops
        import pyarrow.compute as pc

        ops = ops.append_column("duration_ns", pc.subtract(ops["end_ns"], ops["start_ns"]))
        ops = ops.append_column("wait_ns", pc.subtract(ops["start_ns"], ops["ready_ns"]))
        _insert(con, "op_timings", tagged(ops))
        _insert(con, "rank_breakdown", tagged(result.ranks))
        _insert(con, "collectives", tagged(result.collectives))
        _insert(con, "link_util", tagged(result.links, with_trace=False))
        con.execute("COMMIT")
    except err as exc:
        con.execute("ROLLBACK")
        raise StoreError(f"cannot record simulation run of {name!r}: {exc}") from exc
    log.debug("recorded run %d of %s: %d op timings", rid, name, n)
    return rid


def record_sweep(con: Any, points: pa.Table, *, params: Mapping[str, Any] | None = None) -> int:
    """Store a :func:`~etstore.sim.sweep` result in ``sweep_points``; returns the sweep id.

    Raises
    ------
    StoreError
        DuckDB refuses the insert; nothing is written.
    """
    create_schema(con)
    err = _duck_error()
    try:
        con.execute("BEGIN TRANSACTION")
        sid = _next_id(con, "sweep_points", "sweep_id")
        cols = [
            c
            for c in (
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
            if c in points.column_names
        ]
        data = points.select(cols)
        data = data.add_column(0, "sweep_id", pa.array([sid] * data.num_rows, pa.int64()))
        data = data.append_column(
            "params", pa.array([json.dumps(dict(params or {}), sort_keys=True, default=str)] * data.num_rows)
        )
        _insert(con, "sweep_points", data)
        con.execute("COMMIT")
    except err as exc:
        con.execute("ROLLBACK")
        raise StoreError(f"cannot record sweep: {exc}") from exc
    return sid
