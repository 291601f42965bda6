"""Bulk-loading the graph index's tables from Parquet files, one table per opening of Ladybug.

The index is built from files DuckDB writes (:mod:`etstore.store._graph_index`), each table
loaded once, as Ladybug's bulk loader wants it: appending to a table piece by piece costs
time and memory that grow with the table (measured: each further ``COPY`` of 8M edges into a
table of 33.5M nodes peaked 3 GB above the first).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etstore.errors import StoreError
from etstore.store._ladybug import LadybugGraph, first_line, max_pool_bytes

__all__ = ["discard_spool", "load_spool"]

log = logging.getLogger(__name__)

_NODE_TABLES = ("Op", "Trace", "TunerStep")
_SMALL_POOL = 1 << 30

# Ladybug buffer pool per row for bulk-loading each graph table, measured here on a 4,096-NPU
# all-gather (33.5M ops, 50.3M DEP and 16.8M MSG edges, each table loaded into a freshly
# opened database): with less, a COPY fails ("the buffer pool is full") or spills to disk
# until it runs several times slower (MSG at 64 bytes per edge: 133 s instead of 56 s).
_POOL_PER_ROW = {"Op": 32, "DEP": 48, "MSG": 96, "BECOMES": 32, "Trace": 64, "TunerStep": 128}


def _pool_for(table: str, files: list[Path]) -> int:
    """A first buffer pool for loading ``table`` from ``files``: at least 1 GiB (mapped, not
    touched, so free for small loads)."""
    import pyarrow.parquet as pq  # loaded by a graph build only

    rows = sum(pq.read_metadata(f).num_rows for f in files)
    return max(_SMALL_POOL, _POOL_PER_ROW[table] * rows)


def _literal(path: Path) -> str:
    """``path`` as a Cypher string literal naming that one file: Ladybug expands glob characters
    in the paths it copies from, so the store's own path is escaped as a glob as well."""
    glob = "".join(f"[{c}]" if c in "[]*?" else c for c in path.as_posix())
    return "'" + glob.replace("\\", "\\\\").replace("'", "\\'") + "'"


def load_spool(graph: LadybugGraph, spool: Path, tables: Sequence[str]) -> None:
    """Bulk-load each of ``tables`` from its files ``<table>-*.parquet`` in ``spool``: a large
    table in an opening of the database of its own, checkpointed; small ones in the opening at
    hand, checkpointed by the caller once.

    Each large table gets a pool sized for its own rows (:func:`_pool_for`), doubled up to
    Ladybug's own default each time Ladybug reports it full (a failed ``COPY`` leaves its
    table as it was). Closing the database between tables hands back the pool and what the
    load kept outside it (:func:`~etstore.store._ladybug.trim_heap`), and the checkpoint
    before it makes the table durable: a table's load starts from the process's
    baseline instead of stacking on the last one (measured on 33.5M ops and 67M edges:
    2.9 GB peak instead of 3.8 GB, loaded alone).
    """
    ceiling = max_pool_bytes() or 1 << 62
    for table in tables:
        files = sorted(spool.glob(f"{table}-*.parquet"))
        if not files:
            continue
        pool = min(_pool_for(table, files), ceiling)
        alone = pool > _SMALL_POOL  # opening the database costs ~0.1 s: small tables share one
        if alone:
            graph.release()
        _load_table(graph, table, files, pool, ceiling, checkpoint=alone)  # else one at the end
        if alone:
            graph.release()


def _load_table(
    graph: LadybugGraph, table: str, files: list[Path], pool: int, ceiling: int, *, checkpoint: bool
) -> None:
    """``COPY`` one table from its spooled files and (``checkpoint``) ``CHECKPOINT`` it, both
    again in a pool twice as large (up to ``ceiling``) each time Ladybug reports the pool full.

    Why both: a failed ``COPY`` leaves its table as it was, and so does a failed
    ``CHECKPOINT`` once the database is reopened (the rows its ``COPY`` had committed are
    gone; the reopening may itself need the larger pool), so the table's row count is
    checked back at its value before the load and the load is made again whole. A count
    anywhere else (which no Ladybug failure has left) stops the load with an error instead
    of loading rows twice.
    """
    where = graph.path.parent
    copy = f"COPY `{table}` FROM [{', '.join(_literal(f) for f in files)}]"
    before: int | None = None  # the table's rows before this load
    refused = ""  # what Ladybug said when it last refused
    while True:
        try:
            conn = graph.open(pool=pool)
            now = _rows(conn, table)
            if before is None:
                before = now
            elif now != before:
                raise StoreError(
                    f"{where}: the graph could not load {table} ({refused}), and {now - before:,} "
                    "of its rows remain"
                )
            conn.execute(copy)
            if checkpoint:
                conn.execute("CHECKPOINT")
            return
        except (RuntimeError, StoreError) as exc:
            if not _pool_full(exc) or pool >= ceiling:
                if isinstance(exc, StoreError):
                    raise
                raise StoreError(f"{where}: the graph could not load {table}: {first_line(exc)}") from exc
            refused = first_line(exc)
            graph.release()
            pool = min(2 * pool, ceiling)
            log.info("Ladybug's pool was too small to load %s; loading it again in %d MiB", table, pool >> 20)


def _pool_full(exc: BaseException) -> bool:
    """Whether Ladybug refused for want of pool: a statement, or the opening of the database
    (replaying what a refused ``CHECKPOINT`` left in its log needs pool too), which
    :meth:`LadybugGraph.open` reports as a StoreError caused by Ladybug's error."""
    cause = exc if isinstance(exc, RuntimeError) else exc.__cause__
    return isinstance(cause, RuntimeError) and "buffer pool is full" in str(cause)


def _rows(conn: Any, table: str) -> int:
    """How many rows graph table ``table`` holds (nodes for ``Op``, else edges)."""
    pattern = f"(n:{table})" if table in _NODE_TABLES else f"()-[n:{table}]->()"
    return int(conn.execute(f"MATCH {pattern} RETURN count(n)").get_next()[0])


def discard_spool(spool: Path) -> None:
    """Remove a spool directory (none is fine)."""
    shutil.rmtree(spool, ignore_errors=True)
