"""What ``etstore show`` reports: counts per type and rank, collectives by type and size."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from etstore.store.base import Store

__all__ = ["TraceSummary", "summarize"]


@dataclass(frozen=True)
class TraceSummary:
    """``by_type_rank`` (rank, type, ops, duration_micros), ``collectives`` (comm_type,
    comm_size, pg_name, count), ``missing`` (rank, kind, count) tables."""

    by_type_rank: pa.Table
    collectives: pa.Table
    missing: pa.Table


def summarize(store: Store, name: str) -> TraceSummary:
    """Summaries of one stored trace, computed in SQL on the warehouse.

    Raises UnknownTraceError if the trace is absent. O(V) scans in DuckDB.
    """
    store.info(name)
    p = {"t": name}
    by = store.sql(
        "SELECT rank, type, count(*) AS ops, sum(duration_micros)::BIGINT AS duration_micros "
        "FROM ops WHERE trace = $t GROUP BY rank, type ORDER BY rank, type",
        p,
    ).to_arrow()
    coll = store.sql(
        "SELECT comm_type, comm_size, coalesce(pg_name, '') AS pg_name, count(*) AS count FROM ops "
        "WHERE trace = $t AND type = 'COMM_COLL_NODE' GROUP BY ALL ORDER BY comm_type, comm_size, pg_name",
        p,
    ).to_arrow()
    missing = store.sql(
        "SELECT rank, kind, count(*) AS count FROM missing_deps WHERE trace = $t "
        "GROUP BY ALL ORDER BY rank, kind",
        p,
    ).to_arrow()
    return TraceSummary(by, coll, missing)
