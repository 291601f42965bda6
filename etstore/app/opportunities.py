"""Opportunities found and recorded: what ``etstore overlap`` runs.

:func:`etstore.app.overlap.find_opportunities` finds a stored trace's overlap, chunk and
reorder opportunities and measures their gains; it reads the store and writes nothing. This
module replaces the trace's rows of DuckDB table ``opportunities``
(declared here, :data:`OPPORTUNITY_TABLES`) with what was found, numbered from 1:
the numbers ``etstore rewrite --opportunity N`` reads back (:mod:`etstore.app.rewrite`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from etstore.analysis.split import SplitCost
from etstore.app import overlap
from etstore.app.overlap import OPPORTUNITY_KINDS, find_opportunities
from etstore.errors import StoreError
from etstore.progress import ProgressFn
from etstore.sim.config import SimConfig
from etstore.store.base import Store
from etstore.store.tables import TableSet
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology

__all__ = ["OPPORTUNITY_TABLES", "RECORD_SQL", "explain", "find_and_record", "record_opportunities"]


def _number_older_rows(warehouse: Warehouse) -> None:
    """Give a store made before opportunities were numbered the column ``id`` (NULL in its old
    rows); one that numbered them as ``opportunity`` has it renamed."""
    cols = {
        str(r["column_name"])
        for r in warehouse.query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'opportunities'"
        ).to_pylist()
    }
    if "opportunity" in cols and "id" not in cols:
        warehouse.execute("ALTER TABLE opportunities RENAME COLUMN opportunity TO id")
    warehouse.execute("ALTER TABLE opportunities ADD COLUMN IF NOT EXISTS id INTEGER")


OPPORTUNITY_TABLES = TableSet(
    "opportunities",
    {
        "opportunities": "CREATE TABLE IF NOT EXISTS opportunities (trace VARCHAR, kind VARCHAR, "
        "rank INTEGER, op_id UBIGINT, other_id UBIGINT, gain_ns DOUBLE, detail VARCHAR, id INTEGER)"
    },
    upgrade=_number_older_rows,
)
"""The ``opportunities`` table (``id`` numbers a trace's rows from 1, what
``etstore rewrite --opportunity`` takes)."""

RECORD_SQL = (
    "INSERT INTO opportunities (trace, kind, rank, op_id, other_id, gain_ns, detail, id) "
    "SELECT trace, kind, rank, op_id, other_id, gain_ns, detail, id FROM _etstore_found"
)
"""The insert of :func:`record_opportunities` (``_etstore_found``: the finders' table)."""


def explain() -> list[tuple[str, str, str]]:
    """Every query ``etstore overlap`` runs, ``(finder, engine, text)``: the finders'
    (:func:`etstore.app.overlap.explain`), then the recording's."""
    return [
        *overlap.explain(),
        *(("record", "sql", ddl) for ddl in OPPORTUNITY_TABLES.statements()),
        ("record", "sql", "DELETE FROM opportunities WHERE trace = $trace; " + RECORD_SQL),
    ]


def record_opportunities(warehouse: Warehouse, trace: str, table: pa.Table) -> None:
    """Replace ``trace``'s rows of ``opportunities`` with ``table``, in one transaction.

    Raises
    ------
    StoreError
        DuckDB refuses the rows; the earlier ones stay.
    """
    try:
        with warehouse.transaction():
            warehouse.ensure(OPPORTUNITY_TABLES)
            warehouse.execute("DELETE FROM opportunities WHERE trace = $trace", {"trace": trace})
            with warehouse.registered(_etstore_found=table):
                warehouse.execute(RECORD_SQL)
    except StoreError as exc:
        raise StoreError(f"cannot record opportunities of {trace!r}: {exc}") from exc


def find_and_record(
    store: Store,
    trace: str,
    *,
    topo: Topology | str | None = None,
    config: SimConfig | None = None,
    run_id: int | None = None,
    kinds: Sequence[str] = OPPORTUNITY_KINDS,
    max_pieces: int = 8,
    limit: int = 32,
    progress: ProgressFn | None = None,
    measure: bool = True,
    split: SplitCost | None = None,
) -> pa.Table:
    """:func:`~etstore.app.overlap.find_opportunities` (the parameters are its), then
    :func:`record_opportunities`: the table found, now also the trace's rows in DuckDB.

    Raises
    ------
    UnknownTraceError, EtstoreError
        As :func:`~etstore.app.overlap.find_opportunities`; nothing is written.
    StoreError
        The store is read-only, or DuckDB refuses the rows.
    """
    table = find_opportunities(
        store,
        trace,
        topo=topo,
        config=config,
        run_id=run_id,
        kinds=kinds,
        max_pieces=max_pieces,
        limit=limit,
        progress=progress,
        measure=measure,
        split=split,
    )
    record_opportunities(store.warehouse, trace, table)
    return table
