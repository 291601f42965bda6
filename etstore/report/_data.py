"""Reading a run's metrics out of the warehouse as Arrow/numpy, and downsampling op intervals to spans."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import QueryError, ReportError, StoreError, UnknownTraceError
from etstore.store.warehouse import Warehouse

__all__ = [
    "COMPUTE",
    "IDLE",
    "ReportError",
    "RunInfo",
    "Spans",
    "categories",
    "has_table",
    "merge_spans",
    "metrics_warehouse",
    "query",
    "run_infos",
    "timeline_ops",
]

COMPUTE = "compute"
IDLE = "idle"
SEND_RECV = "send/recv"


@dataclass(frozen=True)
class RunInfo:
    """One row of ``runs``: what the report titles and compares by."""

    run_id: int
    trace: str
    topology: str
    num_npus: int
    congestion: str
    scheduling_policy: str
    total_ns: float
    num_ops: int
    sim_ops: int
    events: int

    @property
    def label(self) -> str:
        """A short name for legends and headings."""
        return f"run {self.run_id} ({self.trace}, {self.topology}, {self.congestion})"


@contextmanager
def metrics_warehouse(source: Warehouse | str | os.PathLike[str]) -> Iterator[Warehouse]:
    """``source`` itself when it is a warehouse, else its metrics file opened read-only for the block.

    Raises
    ------
    ReportError
        The file cannot be opened as a DuckDB database (missing, locked, not DuckDB).
    """
    if isinstance(source, Warehouse):
        yield source
        return
    try:
        warehouse = Warehouse.open(os.fspath(source), read_only=True)
    except StoreError as exc:
        raise ReportError(f"cannot read the metrics: {exc}") from exc
    with warehouse:
        yield warehouse


def query(warehouse: Warehouse, sql: str, params: Mapping[str, Any] | None = None) -> pa.Table:
    """Run SQL and return Arrow; the engine's errors become :class:`ReportError` naming the query."""
    try:
        return warehouse.query(sql, params).to_arrow()
    except QueryError as exc:
        cause = str(exc.__cause__ or exc).strip()
        first = cause.splitlines()[0] if cause else type(exc).__name__
        raise ReportError(f"cannot read metrics: {first} (query: {' '.join(sql.split())[:200]!r})") from exc


def has_table(warehouse: Warehouse, name: str) -> bool:
    """Whether a table or view of that name exists (in any schema of the main database)."""
    t = query(
        warehouse,
        "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = $n",
        {"n": name},
    )
    return bool(t["n"][0].as_py())


def run_infos(warehouse: Warehouse, run_ids: Sequence[int]) -> list[RunInfo]:
    """The ``runs`` rows of ``run_ids``, in the order given.

    Raises
    ------
    ReportError
        No run ids, or the database holds no metrics tables.
    UnknownTraceError
        A run id is not in ``runs`` (the message lists the stored ones).
    """
    if not run_ids:
        raise ReportError("no runs given: name at least one run id (see the runs table)")
    if not has_table(warehouse, "runs"):
        raise ReportError(
            "the database holds no simulation metrics (no runs table): simulate and record first"
        )
    ids = [int(r) for r in run_ids]
    t = query(
        warehouse,
        "SELECT run_id, trace, topology, num_npus, congestion, scheduling_policy, total_ns, num_ops, "
        "sim_ops, events FROM runs WHERE list_contains($ids, run_id)",
        {"ids": ids},
    )
    found = {row["run_id"]: row for row in t.to_pylist()}
    missing = [r for r in ids if r not in found]
    if missing:
        latest = query(warehouse, "SELECT run_id FROM runs ORDER BY run_id DESC LIMIT 10")
        known = latest["run_id"].to_pylist()
        hint = f"latest runs: {', '.join(map(str, known))}" if known else "no runs are recorded"
        raise UnknownTraceError(f"no run {missing[0]} in the metrics ({hint})")
    out = []
    for r in ids:
        row = found[r]
        out.append(
            RunInfo(
                run_id=int(row["run_id"]),
                trace=str(row["trace"]),
                topology=str(row["topology"] or "?"),
                num_npus=int(row["num_npus"] or 0),
                congestion=str(row["congestion"] or "?"),
                scheduling_policy=str(row["scheduling_policy"] or "?"),
                total_ns=float(row["total_ns"] or 0.0),
                num_ops=int(row["num_ops"] or 0),
                sim_ops=int(row["sim_ops"] or 0),
                events=int(row["events"] or 0),
            )
        )
    return out


def timeline_ops(warehouse: Warehouse, run: RunInfo, ranks: Sequence[int] | None = None) -> pa.Table:
    """The run's op intervals with a display category, ordered by ``(rank, id)``.

    Columns: ``rank`` (int32), ``id``, ``name``, ``start_ns``, ``end_ns``, ``category``
    (``compute``, the collective's ``comm_type``, ``send/recv``; null for ops that take
    no time or slot). The category of a collective comes from the store's ``ops`` when
    the trace is there, else it is ``collective``. With ``ranks``, only those ranks' ops.
    """
    with_ops = has_table(warehouse, "ops")
    coll = "coalesce(o.comm_type, 'collective')" if with_ops else "'collective'"
    join = "LEFT JOIN ops o ON o.trace = t.trace AND o.rank = t.rank AND o.id = t.id" if with_ops else ""
    params: dict[str, Any] = {"run": run.run_id}
    only = ""
    if ranks is not None:
        only = "AND list_contains($ranks, t.rank)"
        params["ranks"] = [int(r) for r in ranks]
    return query(
        warehouse,
        f"""SELECT t.rank, t.id, t.name, t.start_ns, t.end_ns,
            CASE WHEN t.type = 'COMM_COLL_NODE' THEN {coll}
                 WHEN t.type IN ('COMM_SEND_NODE', 'COMM_RECV_NODE') THEN '{SEND_RECV}'
                 WHEN t.type IN ('METADATA_NODE', 'INVALID_NODE') THEN NULL
                 ELSE '{COMPUTE}' END AS category
        FROM op_timings t {join}
        WHERE t.run_id = $run {only} ORDER BY t.rank, t.id""",
        params,
    )


@dataclass(frozen=True)
class Spans:
    """Merged busy intervals: ``group`` (caller's key), ``start_ns``, ``end_ns``, ``ops``, ``first`` row."""

    group: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    ops: np.ndarray
    first: np.ndarray

    def __len__(self) -> int:
        return len(self.group)


def merge_spans(group: np.ndarray, start: np.ndarray, end: np.ndarray, gap_ns: float) -> Spans:
    """Per group, merge intervals that overlap or lie closer than ``gap_ns`` (vectorised sweep).

    With ``gap_ns < 0`` nothing is merged (every interval is its own span).
    O(n log n) for the sort; no Python loop over intervals.
    """
    n = len(group)
    if n == 0:
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        return Spans(zi, z, z, zi, zi)
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    if gap_ns < 0:
        return Spans(g, s, e, np.ones(n, dtype=np.int64), order)
    new_group = np.concatenate([[True], g[1:] != g[:-1]])
    # running max of end within each group: offset groups apart so one accumulate does all
    span = float(max(np.max(e) - min(np.min(s), 0.0), 1.0)) * 2.0 + gap_ns + 1.0
    gid = np.cumsum(new_group) - 1
    cover = np.maximum.accumulate(e + gid * span) - gid * span
    prev = np.concatenate([[-np.inf], cover[:-1]])
    starts = new_group | (s > prev + gap_ns)
    idx = np.flatnonzero(starts)
    ends = np.maximum.reduceat(e, idx)
    counts = np.diff(np.concatenate([idx, [n]]))
    return Spans(g[idx], s[idx], ends, counts, order[idx])


def categories(table: pa.Table) -> tuple[list[str], np.ndarray]:
    """Dictionary-encode ``category``: (names, code per row, -1 for null)."""
    enc = pc.dictionary_encode(table["category"]).combine_chunks()
    names = [str(x) for x in enc.dictionary.to_pylist()]
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return names, codes
