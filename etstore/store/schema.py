"""The store's own tables and views in the DuckDB warehouse: traces, names, contents, bookkeeping.

Both the embedded store's ``warehouse.duckdb`` and the client-side copy of what was published
to a Neo4j server (:mod:`etstore.store._mirror`) create this schema at open
(:class:`~etstore.store.warehouse.Warehouse`):

``ops``, ``deps``, ``missing_deps``, ``meta``, ``messages``, ``lineage``, ``traces``
    the stored traces: each content once in ``trace_ops`` ... keyed by ``trace_id``
    (:data:`TRACE_DDL`), ``traces`` one row per name, and views by name
    (:data:`TRACE_VIEWS`; :mod:`etstore.store._trace_rows` writes them).
``contents``, ``store_format``, ``graph_index``, ``graph_state``
    the embedded store's catalog and graph watermark (:data:`CATALOG_DDL`).
``etstore_table_sets``
    which features' table sets the database holds (:data:`TABLE_SETS_DDL`).

Every other table is a feature's, declared beside the module of ``app/`` that writes it as a
:class:`~etstore.store.tables.TableSet` (simulation runs and sweeps: ``etstore.app.runs``;
measured runs: ``etstore.app.measured``; tuner runs: ``etstore.app.tuner``; calibrations:
``etstore.app.calibrate``; comparisons: ``etstore.app.compare``; opportunities:
``etstore.app.opportunities``) and created with the store (:mod:`etstore.store.tables`).
"""

from __future__ import annotations

import pyarrow as pa

from etstore.model import DEPS_SCHEMA, OPS_SCHEMA

__all__ = [
    "CATALOG_DDL",
    "CONTENT_TABLES",
    "DEPS_COLUMNS",
    "MIRROR_STATE_DDL",
    "OPS_COLUMNS",
    "TABLE_SETS_DDL",
    "TRACE_DDL",
    "TRACE_TABLES",
    "TRACE_VIEWS",
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

TABLE_SETS_DDL = "CREATE TABLE IF NOT EXISTS etstore_table_sets (name VARCHAR PRIMARY KEY)"
"""DDL of the record of which features' table sets (:class:`~etstore.store.tables.TableSet`)
the database holds: a writable open creates the declared sets it does not name."""

MIRROR_STATE_DDL: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS _etstore_mirror_contents "
    "(trace_id BIGINT PRIMARY KEY, content_hash VARCHAR, lineage VARCHAR, server VARCHAR)",
    "CREATE TABLE IF NOT EXISTS _etstore_mirror_records (fingerprint VARCHAR, server VARCHAR)",
)
"""DDL of the bookkeeping in a Neo4j server's client-side copy (:mod:`etstore.store._mirror`):
which server content each local content is, and which published records its run tables hold."""
