"""Every table and view the DuckDB warehouse holds: the one place etstore's SQL schema is written.

Both the embedded store's ``warehouse.duckdb`` and the client-side copy of what was published
to a Neo4j server (:mod:`etstore.store._mirror`) create this schema at open
(:class:`~etstore.store.warehouse.Warehouse`):

``ops``, ``deps``, ``missing_deps``, ``meta``, ``messages``, ``lineage``, ``traces``
    the stored traces: each content once in ``trace_ops`` ... keyed by ``trace_id``
    (:data:`TRACE_DDL`), ``traces`` one row per name, and views by name
    (:data:`TRACE_VIEWS`; :mod:`etstore.store._trace_rows` writes them).
``runs``, ``op_timings``, ``rank_breakdown``, ``collectives``, ``link_util``, ``sweep_points``
    the simulator's metrics (:data:`TABLES`, views :data:`VIEWS`, version
    :data:`SCHEMA_VERSION` kept in ``etstore_sim_schema``; documented in
    :mod:`etstore.app.runs` and ``docs/metrics.md``).
``opportunities``, ``comparisons``
    what the overlap finders and trace comparisons record (:data:`OPPORTUNITIES_DDL`,
    :data:`COMPARISONS_DDL`).
``measured_runs``, ``measurements``
    nccl-tests / rccl-tests logs, one run per log (:data:`MEASURED_DDL`).
``tuner_runs``, ``tuner_steps``, ``v_tuner_best``, ``v_tuner_vs_sim``
    tuner trajectories, one run per file (:data:`TUNER_DDL`, views :data:`TUNER_VIEWS`).
``calibrations``, ``calibration_points``, ``v_measured_vs_sim``
    network parameters fitted to measured runs (:data:`CALIBRATION_DDL`).
"""

from __future__ import annotations

import pyarrow as pa

from etstore.model import DEPS_SCHEMA, OPS_SCHEMA

__all__ = [
    "CALIBRATION_DDL",
    "CATALOG_DDL",
    "COMPARISONS_DDL",
    "CONTENT_TABLES",
    "DEPS_COLUMNS",
    "GIB_RATE_COLUMNS",
    "MEASURED_DDL",
    "MIRROR_STATE_DDL",
    "OPPORTUNITIES_DDL",
    "OPS_COLUMNS",
    "SCHEMA_VERSION",
    "TABLES",
    "TRACE_DDL",
    "TRACE_TABLES",
    "TRACE_VIEWS",
    "TUNER_DDL",
    "TUNER_VIEWS",
    "VIEWS",
]

# ------------------------------------------------------------------ trace tables

_DUCK_TYPES = {
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.uint64(): "UBIGINT",
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
    pa.binary(): "BLOB",
}


def _columns_sql(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {_DUCK_TYPES[f.type]}" for f in schema)


OPS_COLUMNS = ", ".join(f.name for f in OPS_SCHEMA)
"""The ``ops`` table's trace columns, in :data:`~etstore.model.OPS_SCHEMA` order."""
DEPS_COLUMNS = ", ".join(f.name for f in DEPS_SCHEMA)
"""The ``deps``/``missing_deps`` tables' trace columns, in :data:`~etstore.model.DEPS_SCHEMA` order."""

TRACE_DDL: tuple[str, ...] = (
    f"CREATE TABLE IF NOT EXISTS trace_ops (trace_id BIGINT NOT NULL, uid BIGINT NOT NULL, "
    f"{_columns_sql(OPS_SCHEMA)})",
    f"CREATE TABLE IF NOT EXISTS trace_deps (trace_id BIGINT NOT NULL, edge BIGINT NOT NULL, "
    f"{_columns_sql(DEPS_SCHEMA)}, src_uid BIGINT, dst_uid BIGINT)",
    f"CREATE TABLE IF NOT EXISTS trace_missing_deps (trace_id BIGINT NOT NULL, edge BIGINT NOT NULL, "
    f"{_columns_sql(DEPS_SCHEMA)})",
    "CREATE TABLE IF NOT EXISTS trace_meta (trace_id BIGINT NOT NULL, rank INTEGER, metadata BLOB)",
    "CREATE TABLE IF NOT EXISTS trace_messages (trace_id BIGINT NOT NULL, send_uid BIGINT, recv_uid BIGINT, "
    "tag INTEGER, comm_size BIGINT)",
    "CREATE TABLE IF NOT EXISTS trace_lineage (trace_id BIGINT NOT NULL, parent_trace_id BIGINT NOT NULL, "
    "rank INTEGER, id UBIGINT, parent_id UBIGINT, parent_uid BIGINT, uid BIGINT)",
    "CREATE TABLE IF NOT EXISTS traces (name VARCHAR PRIMARY KEY, kind VARCHAR, ranks INTEGER, "
    "ops BIGINT, deps BIGINT, missing BIGINT, messages BIGINT, parent VARCHAR, source VARCHAR, "
    "params VARCHAR, content_hash VARCHAR, trace_id BIGINT NOT NULL, parent_trace_id BIGINT, "
    "created TIMESTAMP)",
)
"""DDL of the trace tables (idempotent). Content is stored once, keyed by its trace id
(``trace_<table>``); ``traces`` has one row per name, pointing at a content (``trace_id``)."""

CATALOG_DDL: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS contents (trace_id BIGINT NOT NULL, content_hash VARCHAR NOT NULL, "
    "kind VARCHAR NOT NULL, ranks INTEGER NOT NULL, ops BIGINT NOT NULL, deps BIGINT NOT NULL, "
    "missing BIGINT NOT NULL, messages BIGINT NOT NULL, status VARCHAR NOT NULL, created TIMESTAMP NOT NULL)",
    "CREATE TABLE IF NOT EXISTS store_format (version INTEGER NOT NULL, last_trace_id BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS graph_index (trace_id BIGINT NOT NULL, content_hash VARCHAR NOT NULL, "
    "ops BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS graph_state (dirty BOOLEAN NOT NULL, graph_schema VARCHAR NOT NULL, "
    "names VARCHAR NOT NULL, lineage VARCHAR NOT NULL, tuner VARCHAR NOT NULL)",
)
"""DDL of the embedded store's catalog (:mod:`etstore.store.catalog`): ``contents`` (one row per
stored content, by trace id), ``store_format`` (the format version and the last trace id given
out, so none is reused), and the graph index's watermark (:mod:`etstore.store._graph_index`):
``graph_index`` (the contents the graph holds, with their op counts) and ``graph_state``
(whether a build is under way, and stamps of the names, lineage and tuner steps it holds)."""

CONTENT_TABLES = ("trace_ops", "trace_deps", "trace_missing_deps", "trace_meta", "trace_messages")
"""Tables holding one content's rows under its ``trace_id`` (``trace_lineage`` is keyed by
``trace_id`` and ``parent_trace_id``)."""


def _by_name(view: str, table: str) -> str:
    return (
        f"CREATE OR REPLACE VIEW {view} AS SELECT t.name AS trace, x.* EXCLUDE (trace_id) "
        f"FROM {table} x JOIN traces t ON t.trace_id = x.trace_id"
    )


TRACE_VIEWS: dict[str, str] = {
    **{view: _by_name(view, f"trace_{view}") for view in ("ops", "deps", "missing_deps", "meta", "messages")},
    "lineage": "CREATE OR REPLACE VIEW lineage AS SELECT t.name AS trace, l.rank, l.id, "
    "t.parent AS parent_trace, l.parent_id, l.parent_uid, l.uid FROM trace_lineage l "
    "JOIN traces t ON t.trace_id = l.trace_id AND t.parent_trace_id = l.parent_trace_id",
}
"""The trace tables as SQL users query them: each content's rows once per name that points
at it, under that name in column ``trace`` (a join with ``traces``, so filtering by name
reads one content)."""

TRACE_TABLES = tuple(TRACE_VIEWS)
"""Views holding each trace's rows under its name in column ``trace`` (``traces`` is keyed by ``name``)."""

# ------------------------------------------------------------------ simulator metrics

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
"""DDL of the simulator's metrics tables, by table name (idempotent)."""

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
            CASE WHEN r.total_ns > 0 THEN l.bytes / 2^30 / (r.total_ns / 1e9) END AS gib_per_s,
            CASE WHEN r.total_ns > 0 THEN l.bytes / r.total_ns END AS gb_per_s
        FROM link_util l JOIN runs r USING (run_id)""",
    "v_sweep_busbw": """CREATE OR REPLACE VIEW v_sweep_busbw AS
        SELECT sweep_id, topology, num_npus, collective, algorithm, congestion, size_bytes,
            size_bytes / 2^20 AS size_mib, time_ns, time_ns / 1e3 AS time_us, algbw_gb_per_s, busbw_gb_per_s
        FROM sweep_points""",
}
"""DDL of the dashboard views over the metrics tables, by view name (re-created at every open)."""

# ------------------------------------------------------------------ analyses

OPPORTUNITIES_DDL = (
    "CREATE TABLE IF NOT EXISTS opportunities (trace VARCHAR, kind VARCHAR, rank INTEGER, "
    "op_id UBIGINT, other_id UBIGINT, gain_ns DOUBLE, detail VARCHAR, opportunity INTEGER)"
)
"""DDL of the ``opportunities`` table (what :mod:`etstore.app.opportunities` records; ``opportunity``
numbers a trace's rows from 1, what ``etstore rewrite --opportunity`` takes)."""

COMPARISONS_DDL = """CREATE TABLE IF NOT EXISTS comparisons (
    comparison_id BIGINT NOT NULL, trace_a VARCHAR, trace_b VARCHAR, run_a BIGINT, run_b BIGINT,
    topology VARCHAR, congestion VARCHAR, rank INTEGER, total_a_ns DOUBLE, total_b_ns DOUBLE,
    diff_ns DOUBLE, speedup DOUBLE, exposed_comm_a_ns DOUBLE, exposed_comm_b_ns DOUBLE,
    idle_a_ns DOUBLE, idle_b_ns DOUBLE, overlap_a_ns DOUBLE, overlap_b_ns DOUBLE,
    created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))"""
"""DDL of the ``comparisons`` table (what :mod:`etstore.app.compare` records)."""

MEASURED_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS measured_runs (
        run_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, source VARCHAR,
        content_hash VARCHAR NOT NULL,
        tool VARCHAR, tool_version VARCHAR, library_version VARCHAR, benchmark VARCHAR, collective VARCHAR,
        ranks INTEGER, nodes INTEGER, gpu_model VARCHAR, hosts VARCHAR, rows BIGINT, errors_kind VARCHAR,
        avg_busbw_gb_per_s DOUBLE, out_of_bounds INTEGER, header VARCHAR,
        created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
    """CREATE TABLE IF NOT EXISTS measurements (
        run_id BIGINT NOT NULL, source VARCHAR, collective VARCHAR, ranks INTEGER, nodes INTEGER,
        gpu_model VARCHAR, size_bytes BIGINT, count BIGINT, dtype VARCHAR, redop VARCHAR, root INTEGER,
        in_place BOOLEAN, time_us DOUBLE, algbw_gb_per_s DOUBLE, busbw_gb_per_s DOUBLE, errors DOUBLE,
        line INTEGER)""",
)
"""DDL of the measured-run tables (nccl-tests / rccl-tests logs; :mod:`etstore.app.measured`
writes them, ``docs/measured.md`` documents them). Bandwidths are GB/s with GB = 10^9 bytes,
as nccl-tests prints them."""

TUNER_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS tuner_runs (
        run_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, source VARCHAR,
        content_hash VARCHAR NOT NULL, format VARCHAR, fields VARCHAR, rows BIGINT, linked BIGINT,
        created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
    """CREATE TABLE IF NOT EXISTS tuner_steps (
        run_id BIGINT NOT NULL, step BIGINT NOT NULL, line INTEGER, collective VARCHAR, size_bytes BIGINT,
        ranks INTEGER, nodes INTEGER, topology VARCHAR, gpu_model VARCHAR, algorithm VARCHAR,
        protocol VARCHAR, channels INTEGER, chunk_bytes BIGINT, algorithm_trace VARCHAR, trace VARCHAR,
        trace_rule VARCHAR, time_us DOUBLE, busbw_gb_per_s DOUBLE, reward DOUBLE, extra VARCHAR)""",
)
"""DDL of the tuner-trajectory tables (:mod:`etstore.app.tuner` writes them,
``docs/measured.md`` documents them)."""

# A step's size bucket is the power of two at or below its size (0 for empty messages).
_SIZE_BUCKET = "CASE WHEN s.size_bytes > 0 THEN 1::BIGINT << floor(log2(s.size_bytes))::INTEGER ELSE 0 END"

TUNER_VIEWS: dict[str, str] = {
    "v_tuner_best": f"""CREATE OR REPLACE VIEW v_tuner_best AS
        WITH per_action AS (
            SELECT s.run_id, r.name AS run, s.topology, s.collective, {_SIZE_BUCKET} AS size_bucket_bytes,
                s.algorithm, s.protocol, s.channels, s.chunk_bytes, s.trace, count(*) AS steps,
                median(s.time_us) AS median_time_us, median(s.busbw_gb_per_s) AS median_busbw_gb_per_s
            FROM tuner_steps s JOIN tuner_runs r USING (run_id) GROUP BY ALL)
        SELECT *, count(*) OVER bucket AS actions_tried, sum(steps) OVER bucket AS bucket_steps
        FROM per_action
        WINDOW bucket AS (PARTITION BY run_id, topology, collective, size_bucket_bytes)
        QUALIFY row_number() OVER (PARTITION BY run_id, topology, collective, size_bucket_bytes
            ORDER BY median_time_us, algorithm, protocol, channels, chunk_bytes, trace) = 1""",
    "v_tuner_vs_sim": """CREATE OR REPLACE VIEW v_tuner_vs_sim AS
        WITH per_algorithm AS (
            SELECT sweep_id, topology, congestion, collective, num_npus, size_bytes, algorithm,
                min(time_ns) AS time_ns
            FROM sweep_points GROUP BY ALL),
        fastest AS (
            SELECT sweep_id, topology, congestion, collective, num_npus, size_bytes,
                arg_min(algorithm, time_ns) AS sim_fastest, min(time_ns) / 1e3 AS sim_fastest_us,
                count(*) AS sim_algorithms
            FROM per_algorithm GROUP BY ALL),
        joined AS (
            SELECT s.run_id, r.name AS run, s.step, s.collective, s.size_bytes, s.ranks, s.topology,
                coalesce(s.algorithm, s.trace) AS picked, s.algorithm, s.trace, s.time_us,
                f.sweep_id, f.topology AS sim_topology, f.congestion, f.sim_algorithms, f.sim_fastest,
                f.sim_fastest_us,
                (SELECT min(p.time_ns) FROM per_algorithm p
                 WHERE p.sweep_id = f.sweep_id AND p.topology IS NOT DISTINCT FROM f.topology
                    AND p.congestion IS NOT DISTINCT FROM f.congestion AND p.collective = f.collective
                    AND p.num_npus = f.num_npus AND p.size_bytes = f.size_bytes
                    AND (lower(p.algorithm) = lower(s.algorithm) OR p.algorithm = s.trace)
                ) / 1e3 AS sim_picked_us
            FROM tuner_steps s JOIN tuner_runs r USING (run_id)
            JOIN fastest f
                ON f.collective = s.collective AND f.num_npus = s.ranks AND f.size_bytes = s.size_bytes)
        SELECT *,
            CASE WHEN sim_picked_us IS NOT NULL
                THEN coalesce(lower(sim_fastest) = lower(algorithm), false)
                    OR coalesce(sim_fastest = trace, false) END AS picked_is_fastest
        FROM joined""",
}
"""The tuner views, by name (re-created at every open): the best action per size bucket
(``v_tuner_best``) and each step beside the simulator's sweeps of the same collective, ranks
and size (``v_tuner_vs_sim``); ``docs/measured.md`` documents their columns."""

CALIBRATION_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS calibrations (
        calibration_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, measured_run_id BIGINT,
        measured_run VARCHAR, collective VARCHAR, ranks INTEGER, algorithm VARCHAR, congestion VARCHAR,
        start_spec VARCHAR, spec VARCHAR, local_mem_bw_gb_per_s DOUBLE, params VARCHAR, busbw_factor DOUBLE,
        min_size_bytes BIGINT, max_size_bytes BIGINT, points INTEGER, rms_error_before_pct DOUBLE,
        rms_error_after_pct DOUBLE, max_error_before_pct DOUBLE, max_error_after_pct DOUBLE, rounds INTEGER,
        simulations INTEGER, created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
    """CREATE TABLE IF NOT EXISTS calibration_points (
        calibration_id BIGINT NOT NULL, size_bytes BIGINT, fitted BOOLEAN, measured_time_us DOUBLE,
        sim_before_time_us DOUBLE, sim_after_time_us DOUBLE)""",
    """CREATE OR REPLACE VIEW v_measured_vs_sim AS
        SELECT c.measured_run_id, c.measured_run, c.calibration_id, c.name AS calibration, c.collective,
            c.ranks, c.algorithm, c.spec, c.local_mem_bw_gb_per_s, p.size_bytes, p.fitted,
            p.measured_time_us, p.size_bytes / p.measured_time_us / 1e3 * c.busbw_factor
                AS measured_busbw_gb_per_s,
            p.sim_before_time_us, p.size_bytes / p.sim_before_time_us / 1e3 * c.busbw_factor
                AS sim_before_busbw_gb_per_s,
            p.sim_after_time_us, p.size_bytes / p.sim_after_time_us / 1e3 * c.busbw_factor
                AS sim_after_busbw_gb_per_s,
            100 * (p.sim_before_time_us / p.measured_time_us - 1) AS error_before_pct,
            100 * (p.sim_after_time_us / p.measured_time_us - 1) AS error_after_pct
        FROM calibration_points p JOIN calibrations c USING (calibration_id)""",
)
"""DDL of the calibrations (:mod:`etstore.app.calibrate` writes them, ``docs/measured.md``
documents them) and of the view ``v_measured_vs_sim``: per calibrated size, the measured time
beside the simulated ones before and after the fit. Its bandwidths are computed from the times
the way nccl-tests does (``size / time · busbw_factor``, bytes per ns), so they are GB/s with
GB = 10^9, the one unit of every reported rate: they compare directly with ``measurements``
and with the simulator's ``collectives`` and ``sweep_points``."""

MIRROR_STATE_DDL: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS _etstore_mirror_contents "
    "(trace_id BIGINT PRIMARY KEY, content_hash VARCHAR, lineage VARCHAR, server VARCHAR)",
    "CREATE TABLE IF NOT EXISTS _etstore_mirror_records (fingerprint VARCHAR, server VARCHAR)",
)
"""DDL of the bookkeeping in a Neo4j server's client-side copy (:mod:`etstore.store._mirror`):
which server content each local content is, and which published records its run tables hold."""

# Appends of at least one row group go straight to the database file at commit
# instead of through the WAL and a checkpoint (a second full write). DuckDB's
