"""Measured runs: a parsed nccl-tests / rccl-tests log into ``measured_runs`` and ``measurements``.

One log is one run: a ``measured_runs`` row (what ran, where, the header's parameters)
and one ``measurements`` row per table row and placement, written in one transaction.
Storing the same bytes again returns the run already stored (the content hash decides),
so re-ingesting a directory of logs is harmless. The tables are declared here
(:data:`MEASURED_TABLES`) and documented in ``docs/measured.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from etstore.formats.nccl_tests import NcclTestsLog
from etstore.store.tables import TableSet
from etstore.store.warehouse import Warehouse

__all__ = ["MEASURED_TABLES", "MeasuredReport", "store_measured_run"]

log = logging.getLogger(__name__)

MEASURED_TABLES = TableSet(
    "measured",
    {
        "measured_runs": """CREATE TABLE IF NOT EXISTS measured_runs (
            run_id BIGINT PRIMARY KEY, name VARCHAR NOT NULL UNIQUE, source VARCHAR,
            content_hash VARCHAR NOT NULL,
            tool VARCHAR, tool_version VARCHAR, library_version VARCHAR, benchmark VARCHAR,
            collective VARCHAR,
            ranks INTEGER, nodes INTEGER, gpu_model VARCHAR, hosts VARCHAR, rows BIGINT, errors_kind VARCHAR,
            avg_busbw_gb_per_s DOUBLE, out_of_bounds INTEGER, header VARCHAR,
            created_at TIMESTAMP DEFAULT (now()::TIMESTAMP))""",
        "measurements": """CREATE TABLE IF NOT EXISTS measurements (
            run_id BIGINT NOT NULL, source VARCHAR, collective VARCHAR, ranks INTEGER, nodes INTEGER,
            gpu_model VARCHAR, size_bytes BIGINT, count BIGINT, dtype VARCHAR, redop VARCHAR, root INTEGER,
            in_place BOOLEAN, time_us DOUBLE, algbw_gb_per_s DOUBLE, busbw_gb_per_s DOUBLE, errors DOUBLE,
            line INTEGER)""",
    },
)
"""The measured-run tables, one ``measured_runs`` row per log and its ``measurements``
(``docs/measured.md``). Bandwidths are GB/s with GB = 10^9 bytes, as nccl-tests prints them."""


@dataclass(frozen=True)
class MeasuredReport:
    """What storing one log did: its run id and name, whether it was new, what it holds."""

    run_id: int
    name: str
    created: bool
    collective: str | None
    ranks: int | None
    nodes: int | None
    gpu_model: str | None
    rows: int
    source: str

    def as_row(self) -> dict[str, Any]:
        """JSON-able dict (the ingest summary's row)."""
        return {
            "measured_run": self.name,
            "run_id": self.run_id,
            "status": "new" if self.created else "already stored",
            "collective": self.collective,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "gpu_model": self.gpu_model,
            "rows": self.rows,
        }


def store_measured_run(
    warehouse: Warehouse, parsed: NcclTestsLog, *, name: str | None = None
) -> MeasuredReport:
    """Store one parsed log as a measured run, all or nothing; the same bytes twice store once.

    Parameters
    ----------
    warehouse
        A writable warehouse (a store's ``warehouse``).
    parsed
        What :func:`~etstore.formats.nccl_tests.read_nccl_tests` returned.
    name
        The run's name (default: ``parsed.name``, or ``parsed.name-2``, ``-3``, ... when
        another log holds it); an explicit name held by another log is an error.

    Returns
    -------
    MeasuredReport
        The stored run (``created`` is False when a log with the same content hash was
        already stored; its name is then the stored one).

    Raises
    ------
    StoreError
        ``name`` is held by a log with other content, or DuckDB refuses the rows (a
        read-only store); nothing is left behind.

    Notes
    -----
    O(rows of the log): one insert of the run row and one columnar insert of its rows.
    """
    with warehouse.transaction():
        warehouse.ensure(MEASURED_TABLES)
        found = warehouse.query(
            "SELECT run_id, name FROM measured_runs WHERE content_hash = $h ORDER BY run_id LIMIT 1",
            {"h": parsed.content_hash},
        ).to_arrow()
        if found.num_rows:
            return _report(parsed, int(found["run_id"][0].as_py()), str(found["name"][0].as_py()), False)
        wanted = name or parsed.name
        clash = f"measured run {wanted!r} already holds another log; choose another name"
        chosen = warehouse.unused_name("measured_runs", wanted, explicit=name is not None, clash=clash)
        run_id = warehouse.next_id("measured_runs", "run_id")
        row = {**parsed.run_row(), "name": chosen, "run_id": run_id}
        warehouse.append("measured_runs", pa.Table.from_pylist([row]))
        warehouse.append("measurements", _measurement_rows(parsed, run_id))
    log.debug("stored measured run %s (%d rows) from %s", chosen, parsed.measurements.num_rows, parsed.source)
    return _report(parsed, run_id, chosen, True)


def _measurement_rows(parsed: NcclTestsLog, run_id: int) -> pa.Table:
    """The log's rows with the run's columns in front (``measurements`` table order)."""
    n = parsed.measurements.num_rows
    front = {
        "run_id": pa.array([run_id] * n, pa.int64()),
        "source": pa.array([parsed.source] * n, pa.string()),
        "collective": pa.array([parsed.collective] * n, pa.string()),
        "ranks": pa.array([parsed.ranks] * n, pa.int32()),
        "nodes": pa.array([parsed.nodes] * n, pa.int32()),
        "gpu_model": pa.array([parsed.gpu_model] * n, pa.string()),
    }
    table = parsed.measurements
    for i, (key, column) in enumerate(front.items()):
        table = table.add_column(i, key, column)
    return table


def _report(parsed: NcclTestsLog, run_id: int, name: str, created: bool) -> MeasuredReport:
    return MeasuredReport(
        run_id=run_id,
        name=name,
        created=created,
        collective=parsed.collective,
        ranks=parsed.ranks,
        nodes=parsed.nodes,
        gpu_model=parsed.gpu_model,
        rows=parsed.measurements.num_rows,
        source=parsed.source,
    )
