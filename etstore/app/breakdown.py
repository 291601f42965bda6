"""The measured breakdowns of a stored trace, read from the warehouse a unit of ranks at a time.

Why: :func:`etstore.analysis.breakdown.breakdown` reads the whole trace into memory and
walks it in Python. Its ``ranks`` and ``kernels`` tables are per rank: here each unit of
whole ranks is read alone (the columns device activities need, and its dependencies' rows in
edge order) and added to them (:class:`~etstore.analysis.breakdown.RankBreakdowns`). The
``collectives`` table pairs each collective with its instance on every member (the k-th of a
process group on each rank): DuckDB numbers each unit's collectives and aggregates them by
instance (latest and earliest start, members), the units' parts are merged, then each unit's
rows are joined to their instances and come out as one Arrow table per unit, in the row order
of the whole table. Nothing here needs a simulation run: the breakdowns are of the times recorded
in the trace (Kineto's), as the in-memory function's are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from etstore.analysis.breakdown import (
    Breakdown,
    RankBreakdowns,
    breakdown,
    busbw_transfer,
    collective_table,
    device_activities,
    no_device_activity,
)
from etstore.app._ranks import DEFAULT_UNIT_OPS, RankLayout, rank_layout
from etstore.errors import OptionError
from etstore.model import OPS_SCHEMA, Trace
from etstore.progress import ProgressFn
from etstore.sim._holds import recorded_blocks
from etstore.sim.replay import collective_transfers
from etstore.store.base import Store
from etstore.store.warehouse import Warehouse

__all__ = ["StoredBreakdown", "stored_breakdown"]

_DEVICE_COLUMNS = ("rank", "id", "name", "type", "is_cpu_op", "start_time_micros", "duration_micros")

# each rank's collectives numbered per process group (by id, then row: the replaced nodes an
# expansion recorded come after the ops), as collective_transfers numbers them
_NUMBERED = """
WITH c AS (
    SELECT uid AS k, rank, id, coalesce(pg_name, '') AS pg, comm_type, comm_size,
           start_time_micros::BIGINT AS s, duration_micros::BIGINT AS d
    FROM trace_ops WHERE trace_id = $t AND type = 'COMM_COLL_NODE' AND uid >= $lo AND uid < $hi
    UNION ALL
    SELECT k, rank, id, pg, comm_type, comm_size, s, d FROM _etstore_replaced
    WHERE rank >= $ra AND rank <= $rz
)
SELECT *, row_number() OVER (PARTITION BY rank, pg ORDER BY id, k) - 1 AS seq FROM c
"""


class StoredBreakdown:
    """:func:`stored_breakdown`'s result: ``ranks`` and ``kernels`` as tables, ``collectives``
    read a unit of ranks at a time (:meth:`collective_batches`) while the store is open."""

    def __init__(
        self, ranks: pa.Table, kernels: pa.Table, parts: Callable[[ProgressFn | None], Iterator[pa.Table]]
    ) -> None:
        self.ranks, self.kernels, self._parts = ranks, kernels, parts

    def collective_batches(self, progress: ProgressFn | None = None) -> Iterator[pa.Table]:
        """The ``collectives`` table in parts, in its row order (at least one part; the columns
        of :class:`~etstore.analysis.breakdown.Breakdown`'s); ``progress("collectives", units
        done, units)``."""
        return self._parts(progress)

    def to_breakdown(self) -> Breakdown:
        """All three tables in memory (the collectives table whole)."""
        return Breakdown(self.ranks, self.kernels, pa.concat_tables(self.collective_batches()))


class _Collectives:
    """The ``collectives`` table of a stored content, a unit of ranks at a time."""

    def __init__(self, wh: Warehouse, trace_id: int, layout: RankLayout, unit_ops: int, params: Any) -> None:
        self._wh, self._t, self._layout, self._unit_ops = wh, trace_id, layout, unit_ops
        self._replaced = _replaced_rows(params, layout)

    def parts(self, progress: ProgressFn | None = None) -> Iterator[pa.Table]:
        """The ``collectives`` table in parts, in its row order: each unit's collectives, then
        the nodes an expansion replaced (at least one part).

        Notes
        -----
        Two queries per unit: its collectives numbered and aggregated by instance (the partial
        instances of every unit held at once, ≈ 40 bytes each, then merged), then its rows
        joined to the instances; each part holds that unit's collectives only.
        """
        units = self._layout.units(self._unit_ops)
        with self._wh.registered(_etstore_replaced=self._replaced):
            instances = self._instances(units)
            if not instances.num_rows:
                yield collective_transfers(Trace(ops=OPS_SCHEMA.empty_table()))
                return
            cut = self._layout.base + int(self._layout.starts[-1])  # replaced nodes numbered from here
            later: list[pa.Table] = []
            with self._wh.registered(_etstore_instances=instances):
                for i, unit in enumerate(units):
                    rows = self._wh.query(
                        f"SELECT q.*, i.latest, i.earliest, i.members FROM ({_NUMBERED}) q "
                        "JOIN _etstore_instances i ON i.pg = q.pg AND i.seq = q.seq ORDER BY q.k",
                        self._params(units, unit),
                    ).to_arrow()
                    own = rows["k"].to_numpy() < cut
                    if not own.all():
                        later.append(rows.filter(pa.array(~own)))
                    yield _waits(rows.filter(pa.array(own)))
                    if progress is not None:
                        progress("collectives", i + 1, len(units))
            if later:
                yield _waits(pa.concat_tables(later).sort_by("k"))

    def _params(self, units: list[tuple[int, int]], unit: tuple[int, int]) -> dict[str, int]:
        """A unit's uids, and the ranks whose replaced nodes it numbers: from its first rank to
        the next unit's (every rank falls in one unit, held or not)."""
        a, z = unit
        lo, hi = self._layout.uids(a, z)
        ranks = self._layout.ranks
        first = int(ranks[a]) if a else int(np.iinfo(np.int32).min)
        last = int(ranks[z]) - 1 if z < len(ranks) else int(np.iinfo(np.int32).max)
        return {"t": self._t, "lo": lo, "hi": hi, "ra": first, "rz": last}

    def _instances(self, units: list[tuple[int, int]]) -> pa.Table:
        """Every collective instance: process group, number, latest and earliest start, members
        (each unit's part of them, merged)."""
        partial = [
            self._wh.query(
                "SELECT pg, seq, max(s) AS latest, min(s) AS earliest, count(*) AS members "
                f"FROM ({_NUMBERED}) GROUP BY pg, seq",
                self._params(units, unit),
            ).to_arrow()
            for unit in units
        ]
        if not partial:
            return pa.table({"pg": pa.array([], pa.string()), "seq": pa.array([], pa.int64())})
        merged = pa.concat_tables(partial).group_by(["pg", "seq"])
        got = merged.aggregate([("latest", "max"), ("earliest", "min"), ("members", "sum")])
        names = {"latest_max": "latest", "earliest_min": "earliest", "members_sum": "members"}
        return got.rename_columns([names.get(c, c) for c in got.column_names])


def _replaced_rows(params: Any, layout: RankLayout) -> pa.Table:
    """The recorded collective nodes an expansion replaced (``params["collective_blocks"]``), as
    rows after every op (``k``), in the columns :data:`_NUMBERED` reads."""
    found = recorded_blocks(params or {})[0] or {}
    need = ("rank", "parent_id", "pg_name", "comm_type", "comm_size", "start_time_micros", "duration_micros")
    ok = all(isinstance(found.get(k), list) for k in need) and bool(found.get("rank"))
    n = len(found["rank"]) if ok else 0
    cut = layout.base + int(layout.starts[-1])
    return pa.table(
        {
            "k": pa.array(np.arange(cut, cut + n, dtype=np.int64)),
            "rank": pa.array(found["rank"] if ok else [], pa.int32()),
            "id": pa.array(found["parent_id"] if ok else [], pa.uint64()),
            "pg": pa.array([p or "" for p in found["pg_name"]] if ok else [], pa.string()),
            "comm_type": pa.array(list(found["comm_type"]) if ok else [], pa.string()),
            "comm_size": pa.array(list(found["comm_size"]) if ok else [], pa.int64()),
            "s": pa.array([x or 0 for x in found["start_time_micros"]] if ok else [], pa.int64()),
            "d": pa.array([x or 0 for x in found["duration_micros"]] if ok else [], pa.int64()),
        }
    )


def _waits(rows: pa.Table) -> pa.Table:
    """Collective rows with their instance's latest and earliest start and members: the
    ``collectives`` table's rows (each wait, skew, transfer and bus bandwidth)."""
    s, d = rows["s"].to_numpy(zero_copy_only=False), rows["d"].to_numpy(zero_copy_only=False)
    latest, earliest = (
        rows["latest"].to_numpy(zero_copy_only=False),
        rows["earliest"].to_numpy(zero_copy_only=False),
    )
    members = rows["members"].to_numpy(zero_copy_only=False).astype(np.int64)
    own = np.maximum((s + d) - latest.astype(np.float64), 0.0)  # its end less the last arrival
    t = pa.table(
        {
            "rank": rows["rank"].cast(pa.int32()),
            "pg_name": rows["pg"].cast(pa.string()),
            "seq": rows["seq"].cast(pa.int64()),
            "comm_type": rows["comm_type"].cast(pa.string()),
            "size_bytes": rows["comm_size"].cast(pa.int64()),
            "measured_us": pa.array(d.astype(np.float64)),
        }
    )
    busbw = busbw_transfer(rows["comm_type"].to_pylist(), rows["comm_size"].to_pylist(), members, own)
    return collective_table(
        t, (latest - earliest).astype(np.float64), (latest - s).astype(np.float64), own, busbw
    )


def stored_breakdown(
    store: Store,
    name: str,
    *,
    unit_ops: int = DEFAULT_UNIT_OPS,
    progress: ProgressFn | None = None,
) -> StoredBreakdown:
    """:func:`etstore.analysis.breakdown.breakdown` of a stored trace, a unit of ranks at a time.

    Parameters
    ----------
    store
        Any store (an embedded one, or a Neo4j server's client-side copy); it must stay open
        while :meth:`StoredBreakdown.collective_batches` is read.
    name
        The stored trace (a recording: PyTorch ET with Kineto times).
    unit_ops
        Ops per unit of whole ranks read at once (a larger rank is a unit of its own).
    progress
        ``progress("ranks", ops read, ops)`` after each unit.

    Returns
    -------
    StoredBreakdown
        ``ranks`` and ``kernels`` as the in-memory function's; ``collective_batches()`` its
        ``collectives`` in parts (``to_breakdown()`` joins them).

    Raises
    ------
    UnknownTraceError
        No trace ``name``.
    OptionError
        The trace has no recorded device activity.

    Notes
    -----
    Memory: one unit's ops (seven columns) and dependencies, and the rank and kernel rows.
    """
    info = store.info(name)
    wh = store.warehouse
    trace_id = (
        int(info.trace_id)
        if info.trace_id is not None
        else int(wh.query("SELECT trace_id FROM traces WHERE name = $n", {"n": name}).scalar())
    )
    layout = rank_layout(wh, trace_id)
    if layout is None:  # not one uid block per rank: the whole trace, as the in-memory function reads it
        whole = breakdown(store.load(name))
        return StoredBreakdown(whole.ranks, whole.kernels, lambda _progress: iter([whole.collectives]))
    tables = RankBreakdowns(info.params)
    units = layout.units(unit_ops)
    total = int(layout.starts[-1])
    for a, z in units:
        lo, hi = layout.uids(a, z)
        p = {"t": trace_id, "lo": lo, "hi": hi}
        ops = wh.query(
            f"SELECT {', '.join(_DEVICE_COLUMNS)} FROM trace_ops WHERE trace_id = $t AND uid >= $lo "
            "AND uid < $hi ORDER BY uid",
            p,
        ).to_arrow()
        deps = wh.query(
            "SELECT src_uid - $lo AS s, dst_uid - $lo AS d FROM trace_deps WHERE trace_id = $t "
            "AND dst_uid >= $lo AND dst_uid < $hi ORDER BY edge",
            p,
        ).to_arrow()
        tables.add(device_activities(ops, deps["s"].to_numpy(), deps["d"].to_numpy()))
        del ops, deps
        if progress is not None:
            progress("ranks", int(layout.starts[z]), total)
    if not tables.activities:
        raise OptionError(no_device_activity(name))
    ranks, kernels = tables.tables()
    return StoredBreakdown(ranks, kernels, _Collectives(wh, trace_id, layout, unit_ops, info.params).parts)
