"""The DuckDB warehouse: every table and view it holds, and the one way to talk to it.

Every SQL table etstore writes is declared here, so both backends (the embedded
store's ``warehouse.duckdb`` and the Neo4j backend's client-side copy) create the
same schema at open:

``ops``, ``deps``, ``missing_deps``, ``meta``, ``messages``, ``lineage``, ``traces``
    the stored traces: each content once in ``trace_ops`` ... keyed by ``trace_id``
    (:data:`TRACE_DDL`), ``traces`` one row per name, and views by name
    (:data:`TRACE_VIEWS`; :mod:`etstore.store._trace_rows` writes them).
``runs``, ``op_timings``, ``rank_breakdown``, ``collectives``, ``link_util``, ``sweep_points``
    the simulator's metrics (:data:`TABLES`, views :data:`VIEWS`, version
    :data:`SCHEMA_VERSION` kept in ``etstore_sim_schema``; documented in
    :mod:`etstore.sim.metrics` and ``docs/metrics.md``).
``opportunities``, ``comparisons``
    what the overlap finders and trace comparisons record (:data:`OPPORTUNITIES_DDL`,
    :data:`COMPARISONS_DDL`).
``measured_runs``, ``measurements``
    nccl-tests / rccl-tests logs, one run per log (:data:`MEASURED_DDL`).
``tuner_runs``, ``tuner_steps``, ``v_tuner_best``, ``v_tuner_vs_sim``
    tuner trajectories, one run per file (:data:`TUNER_DDL`, views :data:`TUNER_VIEWS`).
``calibrations``, ``calibration_points``, ``v_measured_vs_sim``
    network parameters fitted to measured runs (:data:`CALIBRATION_DDL`).

:class:`Warehouse` wraps one DuckDB connection behind a narrow API (``query``,
``execute``, ``append``, ``next_id``, ``transaction``, ``registered``) and turns
DuckDB's errors into :class:`~etstore.errors.QueryError` (reads) and
:class:`~etstore.errors.StoreError` (writes) carrying the engine's message.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from etstore.errors import QueryError, StoreError
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA
from etstore.store._identity import choose_name
from etstore.store.result import Result

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "CALIBRATION_DDL",
    "COMPARISONS_DDL",
    "CONTENT_TABLES",
    "DEPS_COLUMNS",
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
    "Warehouse",
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
    "params VARCHAR, content_hash VARCHAR, trace_id BIGINT NOT NULL, parent_trace_id BIGINT)",
)
"""DDL of the trace tables (idempotent). Content is stored once, keyed by its trace id
(``trace_<table>``); ``traces`` has one row per name, pointing at a content (``trace_id``)."""

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

_GIB_RATE_COLUMNS: dict[str, tuple[str, ...]] = {
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
"""DDL of the ``opportunities`` table (what :mod:`etstore.query.overlap` records; ``opportunity``
numbers a trace's rows from 1, what ``etstore rewrite --opportunity`` takes)."""

COMPARISONS_DDL = """CREATE TABLE IF NOT EXISTS comparisons (
    comparison_id BIGINT NOT NULL, trace_a VARCHAR, trace_b VARCHAR, run_a BIGINT, run_b BIGINT,
    topology VARCHAR, congestion VARCHAR, rank INTEGER, total_a_ns DOUBLE, total_b_ns DOUBLE,
    diff_ns DOUBLE, speedup DOUBLE, exposed_comm_a_ns DOUBLE, exposed_comm_b_ns DOUBLE,
    idle_a_ns DOUBLE, idle_b_ns DOUBLE, overlap_a_ns DOUBLE, overlap_b_ns DOUBLE,
    created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))"""
"""DDL of the ``comparisons`` table (what :mod:`etstore.sim.compare` records)."""

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
"""DDL of the measured-run tables (nccl-tests / rccl-tests logs; :mod:`etstore.store.measured`
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
"""DDL of the tuner-trajectory tables (:mod:`etstore.store.tuner` writes them,
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
"""DDL of the calibrations (:mod:`etstore.sim.calibrate` writes them, ``docs/measured.md``
documents them) and of the view ``v_measured_vs_sim``: per calibrated size, the measured time
beside the simulated ones before and after the fit. Its bandwidths are computed from the times
the way nccl-tests does (``size / time · busbw_factor``, bytes per ns), so they are GB/s with
GB = 10^9, the one unit of every reported rate: they compare directly with ``measurements``
and with the simulator's ``collectives`` and ``sweep_points``."""

MIRROR_STATE_DDL = (
    "CREATE TABLE IF NOT EXISTS _etstore_mirror_contents "
    "(trace_id BIGINT PRIMARY KEY, content_hash VARCHAR, lineage VARCHAR, server VARCHAR)"
)
"""DDL of the Neo4j backend's bookkeeping in its client-side copy: which server content each
local content is (created by that backend only)."""

# Appends of at least one row group go straight to the database file at commit
# instead of through the WAL and a checkpoint (a second full write). DuckDB's
# default group of 122,880 rows leaves a typical algorithm trace (10^4-10^5 ops)
# below that line; this size puts it above, at a third less DuckDB time per ingest.
# DuckDB does not persist the size, so every open attaches with it.
_ROW_GROUP_SIZE = 16384

# A read-only warehouse is the database file itself, opened read-only at the instance level
# (so no ATTACH of it can be writable), with every other file out of reach: COPY ... TO,
# EXPORT DATABASE, ATTACH, read_csv/read_parquet/glob, INSTALL/LOAD and persistent secrets
# all fail with DuckDB's PermissionException. The lock makes SET/RESET of any option fail,
# so a query cannot turn access back on.
_READ_ONLY_CONFIG: dict[str, Any] = {"enable_external_access": False, "lock_configuration": True}


def _duckdb() -> Any:
    """The duckdb module."""
    import duckdb  # imported on first use: commands that touch no warehouse start without it

    return duckdb


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


class Warehouse:
    """One DuckDB connection behind a narrow API (see the module docstring).

    Parameters
    ----------
    con
        An open DuckDB connection; the warehouse owns it from now on (:meth:`close`).
        ``Warehouse(duckdb.connect())`` is a fresh in-memory warehouse (no tables
        until :meth:`create_schema`).
    read_only
        Whether ``con`` was opened read-only (:meth:`open` says what that refuses).

    Notes
    -----
    Not thread-safe: one thread at a time may use a warehouse.
    """

    __slots__ = ("_con", "_depth", "_error", "read_only")

    def __init__(self, con: duckdb.DuckDBPyConnection, *, read_only: bool = False) -> None:
        self._con = con
        self.read_only = read_only
        self._error: type[Exception] = _duckdb().Error
        self._depth = 0  # open transaction() blocks; only the outermost one talks to DuckDB

    @classmethod
    def open(
        cls, path: str | Path, *, read_only: bool = False, legacy: pa.Table | Literal["discard"] | None = None
    ) -> Warehouse:
        """Open (or create) the warehouse file at ``path``; writable ones get the full schema.

        Parameters
        ----------
        path
            The DuckDB database file.
        read_only
            Open without write access (several readers may share the file); the schema
            is not touched. The engine then refuses every statement that writes or reads
            a file other than this one (``COPY ... TO``, ``EXPORT DATABASE``, ``ATTACH``,
            ``read_csv``, ``INSTALL``/``LOAD``, ...): DuckDB's ``enable_external_access``
            is off and ``lock_configuration`` keeps a query from turning it back on.
        legacy
            What to do with trace tables of store format 1 (keyed by name): a table
            ``name``, ``trace_id``, ``parent_trace_id``, ``content_hash`` re-keys them
            (:meth:`create_schema`); ``"discard"`` drops them (a cache that refills).

        Returns
        -------
        Warehouse

        Raises
        ------
        StoreError
            DuckDB cannot open the file (locked by another process, not a DuckDB file,
            ...) or the metrics tables are of a newer schema version.
        """
        duckdb = _duckdb()
        if read_only:
            try:
                con = duckdb.connect(str(path), read_only=True, config=dict(_READ_ONLY_CONFIG))
            except duckdb.Error as exc:
                raise StoreError(f"{path}: cannot open the DuckDB warehouse: {_first_line(exc)}") from exc
            return cls(con, read_only=True)
        try:
            con = duckdb.connect()
        except duckdb.Error as exc:  # pragma: no cover - an in-memory database always opens
            raise StoreError(f"cannot start DuckDB: {_first_line(exc)}") from exc
        try:
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS warehouse (ROW_GROUP_SIZE {_ROW_GROUP_SIZE})")
            con.execute("USE warehouse")
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"{path}: cannot open the DuckDB warehouse: {_first_line(exc)}") from exc
        except BaseException:
            con.close()
            raise
        warehouse = cls(con)
        try:
            warehouse.create_schema(legacy=legacy)
        except BaseException:
            warehouse.close()
            raise
        return warehouse

    @classmethod
    def empty_read_only(cls) -> Warehouse:
        """A read-only warehouse with the full schema and no rows: what a store that has no
        warehouse file yet (nothing was ever stored) shows its readers. The schema is built
        in a scratch file opened read-only like a real one, so queries see empty tables,
        writes are refused, and nothing lands in the store."""
        duckdb = _duckdb()
        with tempfile.TemporaryDirectory(prefix="etstore-empty-") as scratch:
            path = Path(scratch) / "warehouse.duckdb"
            cls.open(path).close()
            try:  # the open file outlives its directory entry
                con = duckdb.connect(str(path), read_only=True, config=dict(_READ_ONLY_CONFIG))
            except duckdb.Error as exc:  # pragma: no cover - a file just written opens
                raise StoreError(f"cannot open an empty DuckDB warehouse: {_first_line(exc)}") from exc
        return cls(con, read_only=True)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._con.close()

    def __enter__(self) -> Warehouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the API

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        """Run one SQL statement and return its rows.

        Parameters
        ----------
        sql
            One statement; ``$name`` placeholders take values from ``params``.
        params
            Values of the placeholders.

        Returns
        -------
        Result
            The rows (no columns for a statement that returns none).

        Raises
        ------
        QueryError
            DuckDB refuses the statement (the message is DuckDB's first line).
        """
        try:
            rel = self._con.sql(sql, params=dict(params) if params else None)
            table = rel.to_arrow_table() if rel is not None else pa.table({})
        except self._error as exc:
            raise QueryError(f"SQL error: {_first_line(exc)} (query: {sql!r})") from exc
        return Result(table, sql)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> None:
        """Run one SQL statement for its effect (DDL, INSERT, DELETE, SET, ...).

        Raises
        ------
        StoreError
            DuckDB refuses the statement (the message is DuckDB's first line).
        """
        try:
            self._con.execute(sql, dict(params) if params else None)
        except self._error as exc:
            raise StoreError(f"SQL error: {_first_line(exc)} (statement: {_short(sql)!r})") from exc

    def append(self, table: str, rows: pa.Table) -> None:
        """Insert Arrow rows into ``table``, matching columns by name.

        ``rows`` may carry a subset of the table's columns (the others get their
        defaults); an empty ``rows`` writes nothing.

        Raises
        ------
        StoreError
            DuckDB refuses the rows (unknown column, type, constraint).

        Notes
        -----
        O(rows), one vectorised INSERT ... SELECT from the Arrow table.
        """
        if rows.num_rows == 0:
            return
        cols = ", ".join(_ident(c) for c in rows.column_names)
        with self.registered(_etstore_incoming=rows):
            self.execute(f"INSERT INTO {_ident(table)} ({cols}) SELECT {cols} FROM _etstore_incoming")

    def next_id(self, table: str, column: str) -> int:
        """One more than the largest ``column`` in ``table`` (1 for an empty table).

        Raises
        ------
        QueryError
            The table or column does not exist.
        """
        return int(self.query(f"SELECT coalesce(max({_ident(column)}), 0) + 1 FROM {_ident(table)}").scalar())

    def unused_name(self, table: str, wanted: str, *, explicit: bool, clash: str) -> str:
        """A name for a new row of ``table`` (a ``name`` column): ``wanted`` when no row holds
        it, else, for a default name, the first free ``wanted-2``, ``wanted-3``, ... as for
        traces (:func:`etstore.store._identity.choose_name`).

        Raises
        ------
        StoreError
            ``clash``, when ``explicit`` and a row already holds ``wanted``.
        """
        taken = self.query(
            f"SELECT name FROM {_ident(table)} WHERE name = $n OR name LIKE $p",
            {"n": wanted, "p": f"{wanted}-%"},
        ).to_arrow()["name"]
        held = {str(n): 0 for n in taken.to_pylist()}
        try:
            return choose_name(held, wanted, explicit=explicit, seq=None)[0]
        except StoreError as exc:
            raise StoreError(clash) from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block in one DuckDB transaction: COMMIT at the end, ROLLBACK on any exception.

        A block nested in another ``transaction()`` joins the outer transaction
        (it commits or rolls back with it).

        Raises
        ------
        StoreError
            DuckDB cannot begin or commit (the changes are rolled back).
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.execute("BEGIN TRANSACTION")
        self._depth = 1
        try:
            yield
            self.execute("COMMIT")
        except BaseException:
            with suppress(self._error):  # a failed COMMIT has already ended it
                self._con.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0

    @contextmanager
    def registered(self, **tables: pa.Table) -> Iterator[None]:
        """Make Arrow tables queryable as views named by the keywords, for the block only.

        Notes
        -----
        Zero-copy: DuckDB scans the Arrow buffers in place.
        """
        done: list[str] = []
        try:
            for name, table in tables.items():
                self._con.register(name, table)
                done.append(name)
            yield
        finally:
            for name in done:
                self._con.unregister(name)

    # ------------------------------------------------------------ schema

    def create_schema(self, *, legacy: pa.Table | Literal["discard"] | None = None) -> None:
        """Create every table (if absent) and (re)create every view, in one transaction.

        Idempotent; views are replaced so a database written by an older etstore gains
        the views (and their newer columns) the first time this version writes to it.
        Trace tables of store format 1 (``ops`` ... keyed by trace name) are re-keyed
        by content in the same transaction, as ``legacy`` says (see :meth:`open`).

        Raises
        ------
        StoreError
            The database holds a newer metrics schema, trace tables of format 1 and no
            ``legacy`` instruction, or DuckDB refuses the DDL.
        """
        with self.transaction():
            if self._has_format1_tables():
                if legacy is None:
                    raise StoreError(
                        "the warehouse holds trace tables of store format 1; open the store "
                        "writable to upgrade it"
                    )
                self._upgrade_format1(legacy)
            for ddl in TRACE_DDL:
                self.execute(ddl)
            own = self._base_tables()  # a database that is not a store may have its own ops table
            for view, ddl in TRACE_VIEWS.items():
                if view not in own:
                    self.execute(ddl)
            self._create_metrics()
            self.execute(OPPORTUNITIES_DDL)
            # stores made before opportunities were numbered get the column, NULL in old rows
            self.execute("ALTER TABLE opportunities ADD COLUMN IF NOT EXISTS opportunity INTEGER")
            self.execute(COMPARISONS_DDL)
            for ddl in MEASURED_DDL:
                self.execute(ddl)
            for ddl in (*TUNER_DDL, *TUNER_VIEWS.values()):
                self.execute(ddl)
            for ddl in CALIBRATION_DDL:
                self.execute(ddl)

    def _create_metrics(self) -> None:
        self.execute("CREATE TABLE IF NOT EXISTS etstore_sim_schema (version INTEGER)")
        have = self.query("SELECT max(version) FROM etstore_sim_schema").scalar()
        if have is not None and have > SCHEMA_VERSION:
            raise StoreError(
                f"the metrics tables are schema version {have}; this etstore writes version "
                f"{SCHEMA_VERSION}: upgrade etstore"
            )
        for ddl in (*TABLES.values(), *VIEWS.values()):
            self.execute(ddl)
        if have is not None and have < 2:  # rates stored with GB = 2^30
            for table, columns in _GIB_RATE_COLUMNS.items():
                sets = ", ".join(f"{c} = {c} * $k" for c in columns)
                self.execute(f"UPDATE {table} SET {sets}", {"k": 2**30 / 1e9})
        if have is None or have < SCHEMA_VERSION:
            self.execute("INSERT INTO etstore_sim_schema VALUES ($v)", {"v": SCHEMA_VERSION})

    # ------------------------------------------------------------ store format 1

    def _base_tables(self) -> set[str]:
        rows = self.query(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
            "AND table_type = 'BASE TABLE'"
        ).to_arrow()
        return set(rows.column(0).to_pylist())

    def _has_format1_tables(self) -> bool:
        """Trace tables keyed by name: ``ops`` and a ``traces`` table without ``trace_id``."""
        if not {"ops", "traces"} <= self._base_tables():
            return False
        cols = self.query(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = 'traces' AND column_name = 'trace_id'"
        ).scalar()
        return not cols

    def _upgrade_format1(self, legacy: pa.Table | Literal["discard"]) -> None:
        """Re-key format-1 trace tables by content (inside the caller's transaction).

        Rows of names absent from ``legacy`` are dropped (they were not committed).
        O(rows): one copy of each table.
        """
        old = ("ops", "deps", "missing_deps", "meta", "messages", "lineage")
        if isinstance(legacy, str):
            for table in (*old, "traces"):
                self.execute(f"DROP TABLE IF EXISTS {table}")
            return
        with self.registered(_etstore_legacy=legacy):
            for table in old[:-1]:
                self.execute(
                    f"CREATE TABLE trace_{table} AS SELECT m.trace_id, x.* EXCLUDE (trace) "
                    f"FROM {table} x JOIN _etstore_legacy m ON m.name = x.trace"
                )
            self.execute(
                "CREATE TABLE trace_lineage AS SELECT m.trace_id, p.trace_id AS parent_trace_id, l.rank, "
                "l.id, l.parent_id, l.parent_uid, l.uid FROM lineage l "
                "JOIN _etstore_legacy m ON m.name = l.trace JOIN _etstore_legacy p ON p.name = l.parent_trace"
            )
            self.execute(TRACE_DDL[-1].replace("EXISTS traces (", "EXISTS traces_format2 ("))
            self.execute(
                "INSERT INTO traces_format2 SELECT t.name, t.kind, t.ranks, t.ops, t.deps, t.missing, "
                "t.messages, t.parent, t.source, t.params, m.content_hash, m.trace_id, m.parent_trace_id "
                "FROM traces t JOIN _etstore_legacy m ON m.name = t.name"
            )
        for table in (*old, "traces"):
            self.execute(f"DROP TABLE {table}")
        self.execute("ALTER TABLE traces_format2 RENAME TO traces")


def _short(sql: str, limit: int = 200) -> str:
    """``sql`` on one line, cut to ``limit`` characters (error messages)."""
    text = " ".join(sql.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
