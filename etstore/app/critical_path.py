"""The critical path of a stored trace, read from the warehouse a unit of whole ranks at a time.

Why: :func:`etstore.analysis.critical_path` needs the whole trace in memory (``Store.load``,
≈ 230 bytes per op, then ≈ 440 with the pass), so 10M ops take ≈ 4.4 GB and 100M cannot be
held. Here only what the path needs is read, a unit of whole ranks (:mod:`etstore.app._ranks`)
at a time: each op's duration, each dependency's rows (``src_uid``, ``dst_uid``, in edge
order) and the stored message pairs (``trace_messages``, the pairing
:func:`~etstore.dag.match_messages` makes). The units are solved by
:func:`etstore.analysis._batched_path.batched_heaviest_path`; the path's own ops are read
back by uid at the end. The result is the in-memory function's, op for op and table for table.
"""

from __future__ import annotations

import logging
from itertools import pairwise

import numpy as np
import pyarrow as pa

from etstore.analysis._batched_path import PathBatch, batched_heaviest_path
from etstore.analysis.critical_path import CriticalPath, critical_path, path_table
from etstore.app._ranks import DEFAULT_UNIT_OPS, RankLayout, rank_layout
from etstore.errors import UnknownTraceError
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, Trace
from etstore.progress import ProgressFn
from etstore.store.base import Store
from etstore.store.warehouse import Warehouse
from etstore.units import memory_budget

__all__ = ["BYTES_PER_OP", "stored_critical_path"]

log = logging.getLogger(__name__)

BYTES_PER_OP = 400
"""What solving a group of units holds per op (its ops, edges, the solve and DuckDB's results):
units that wait on each other are grouped up to the memory budget over this."""

_PATH_OPS = ("rank", "id", "name", "type", "duration_micros")


class _Reader:
    """One content's units, read from the warehouse with only the columns the path needs."""

    def __init__(self, wh: Warehouse, trace_id: int, layout: RankLayout, unit_ops: int) -> None:
        self.wh, self.t, self.layout = wh, trace_id, layout
        self.rank_ranges = layout.units(unit_ops)
        self.bounds = [(int(layout.starts[a]), int(layout.starts[z])) for a, z in self.rank_ranges]

    def _uids(self, b: int) -> dict[str, int]:
        lo, hi = self.bounds[b]
        return {"t": self.t, "lo": self.layout.base + lo, "hi": self.layout.base + hi}

    def load(self, b: int) -> PathBatch:
        """Unit ``b``: durations, dependencies in edge order, the messages inside it."""
        p = self._uids(b)
        weight = self.wh.query(
            "SELECT duration_micros FROM trace_ops WHERE trace_id = $t AND uid >= $lo AND uid < $hi "
            "ORDER BY uid",
            p,
        ).to_arrow()["duration_micros"]
        deps = self.wh.query(
            "SELECT src_uid - $lo AS s, dst_uid - $lo AS d FROM trace_deps "
            "WHERE trace_id = $t AND dst_uid >= $lo AND dst_uid < $hi ORDER BY edge",
            p,
        ).to_arrow()
        msgs = self.wh.query(
            "SELECT send_uid - $lo AS s, recv_uid - $lo AS r FROM trace_messages WHERE trace_id = $t "
            "AND send_uid >= $lo AND send_uid < $hi AND recv_uid >= $lo AND recv_uid < $hi ORDER BY send_uid",
            p,
        ).to_arrow()
        a, z = self.rank_ranges[b]
        return PathBatch(
            weight=weight.to_numpy().astype(np.float64),
            dep_src=deps["s"].to_numpy().astype(np.int64),
            dep_dst=deps["d"].to_numpy().astype(np.int64),
            msg_send=msgs["s"].to_numpy().astype(np.int64),
            msg_recv=msgs["r"].to_numpy().astype(np.int64),
            ranks=self.layout.ranks[a:z],
            rank_starts=self.layout.starts[a : z + 1] - self.layout.starts[a],
        )

    def cross(self) -> tuple[np.ndarray, np.ndarray]:
        """Global rows of the messages between units, by ascending send."""
        if len(self.bounds) <= 1:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        sends, recvs = [], []
        for b in range(len(self.bounds)):
            got = self.wh.query(
                "SELECT send_uid, recv_uid FROM trace_messages WHERE trace_id = $t AND send_uid >= $lo "
                "AND send_uid < $hi AND (recv_uid < $lo OR recv_uid >= $hi) ORDER BY send_uid",
                self._uids(b),
            ).to_arrow()
            sends.append(got["send_uid"].to_numpy().astype(np.int64) - self.layout.base)
            recvs.append(got["recv_uid"].to_numpy().astype(np.int64) - self.layout.base)
        return np.concatenate(sends), np.concatenate(recvs)

    def where(self, rows: np.ndarray) -> str:
        """``rank R id I, ...`` of global rows (in the order given)."""
        uids = pa.table({"k": np.arange(len(rows)), "uid": rows + self.layout.base})
        with self.wh.registered(_etstore_rows=uids):
            got = self.wh.query(
                "SELECT o.rank, o.id FROM _etstore_rows r JOIN trace_ops o ON o.uid = r.uid "
                "WHERE o.trace_id = $t ORDER BY r.k",
                {"t": self.t},
            ).to_pylist()
        return ", ".join(f"rank {r['rank']} id {r['id']}" for r in got)

    def path_ops(self, rows: np.ndarray) -> tuple[pa.Table, list[str]]:
        """The path's ops (rank, id, name, type, duration) in path order, and how each is reached."""
        uids = rows + self.layout.base
        steps = pa.table({"k": np.arange(len(rows), dtype=np.int64), "uid": uids})
        with self.wh.registered(_etstore_path=steps):
            ops = self.wh.query(
                f"SELECT {', '.join('o.' + c for c in _PATH_OPS)} FROM _etstore_path p "
                "JOIN trace_ops o ON o.uid = p.uid WHERE o.trace_id = $t ORDER BY p.k",
                {"t": self.t},
            ).to_arrow()
            msgs = self.wh.query(
                "SELECT m.send_uid, m.recv_uid FROM _etstore_path p JOIN trace_messages m "
                "ON m.recv_uid = p.uid WHERE m.trace_id = $t",
                {"t": self.t},
            ).to_arrow()
        ops = ops.cast(pa.schema([OPS_SCHEMA.field(c) for c in _PATH_OPS]))
        msg_from = dict(zip(msgs["recv_uid"].to_pylist(), msgs["send_uid"].to_pylist(), strict=True))
        u = uids.tolist()
        via = ["msg" if msg_from.get(b) == a else "dep" for a, b in pairwise(u)]
        return ops, (["start", *via] if len(u) else [])

    def one_rank(self, name: str, rank: int) -> Trace:
        """Rank ``rank`` alone as a trace: its ops' path columns and its dependencies."""
        p = {"t": self.t, "r": rank}
        ops = self.wh.query(
            f"SELECT {', '.join(_PATH_OPS)} FROM trace_ops WHERE trace_id = $t AND rank = $r ORDER BY uid", p
        ).to_arrow()
        deps = self.wh.query(
            "SELECT rank, src, dst FROM trace_deps WHERE trace_id = $t AND rank = $r ORDER BY edge", p
        ).to_arrow()
        ops = ops.cast(pa.schema([OPS_SCHEMA.field(c) for c in _PATH_OPS]))
        deps = deps.cast(pa.schema([DEPS_SCHEMA.field(c) for c in ("rank", "src", "dst")]))
        return Trace(ops=ops, deps=deps, name=name)


def stored_critical_path(
    store: Store,
    name: str,
    *,
    rank: int | None = None,
    on_cycle: str = "break",
    unit_ops: int = DEFAULT_UNIT_OPS,
    max_group_ops: int | None = None,
    progress: ProgressFn | None = None,
) -> CriticalPath:
    """:func:`etstore.analysis.critical_path` of a stored trace, in memory bounded by a unit.

    Parameters
    ----------
    store
        Any store (an embedded one, or a Neo4j server's client-side copy).
    name
        The stored trace.
    rank
        One rank alone (its dependencies only: only that rank is read); ``None`` for the
        path across ranks through message edges.
    on_cycle
        As :func:`~etstore.analysis.critical_path` (``"break"`` or ``"raise"``).
    unit_ops
        Ops per unit of whole ranks read at once (a larger rank is a unit of its own).
    max_group_ops
        Most ops solved at once where units wait on each other's messages (default: the
        memory budget over :data:`BYTES_PER_OP`; ``unit_ops`` or less: never grouped).
    progress
        ``progress(phase, done, total)``: ``ranks`` (the layout read), ``path`` (ops placed;
        ``path without cycles`` after breaking cycles), ``path ops`` (the path's ops read).

    Returns
    -------
    CriticalPath
        The in-memory function's result for the loaded trace, table for table.

    Raises
    ------
    UnknownTraceError
        No trace ``name``, or it has no rank ``rank``.
    CycleError
        ``on_cycle="raise"`` and the trace has a dependency cycle.

    Notes
    -----
    Memory: one unit's solve (≈ :data:`BYTES_PER_OP` per op of ``unit_ops``), the messages
    between units, each rank's result, and 4 bytes per op in a temporary file (the page cache,
    not this process); units whose messages go back and forth are solved together up to
    ``max_group_ops``. Time O(V + E log E) per sweep; one sweep unless messages go back to
    earlier units (:func:`~etstore.analysis._batched_path.batched_heaviest_path`). DuckDB keeps
    the blocks it read cached up to its memory limit (``ETSTORE_MEMORY_BUDGET`` sets it). A
    content not laid out one uid block per rank is loaded whole.
    """
    info = store.info(name)
    wh = store.warehouse
    trace_id = int(info.trace_id) if info.trace_id is not None else _trace_id(wh, name)
    _step(progress, "ranks", 0)
    layout = rank_layout(wh, trace_id)
    _step(progress, "ranks", 1)
    if layout is None:
        log.warning("trace %r: ops not one uid block per rank; loading it whole", name)
        return critical_path(store.load(name), rank=rank, on_cycle=on_cycle, progress=progress)
    reader = _Reader(wh, trace_id, layout, max(1, unit_ops))
    if rank is not None:
        known = layout.ranks.tolist()
        if rank not in known:
            raise UnknownTraceError(f"trace {name!r} has no rank {rank} (ranks: {known})")
        return critical_path(reader.one_rank(name, rank), rank=rank, on_cycle=on_cycle, progress=progress)
    send, recv = reader.cross()
    found = batched_heaviest_path(
        reader.bounds,
        reader.load,
        send,
        recv,
        max_group_ops=memory_budget() // BYTES_PER_OP if max_group_ops is None else max_group_ops,
        name=name,
        on_cycle=on_cycle,
        where=reader.where,
        progress=progress,
    )
    log.debug(
        "critical path of %r: %d units, %d sweeps, %d solves, at most %d ops at once",
        name,
        len(reader.bounds),
        found.sweeps,
        found.solves,
        found.largest_group_ops,
    )
    _step(progress, "path ops", 0)
    ops, via = reader.path_ops(found.rows)
    _step(progress, "path ops", 1)
    weight = ops["duration_micros"].to_numpy().astype(np.float64)
    starts = np.concatenate([[0.0], np.cumsum(weight)[:-1]]) if len(weight) else np.zeros(0)
    path = path_table(
        ops,
        np.arange(ops.num_rows),
        via,
        duration_micros=ops["duration_micros"],
        start_micros=pa.array(starts, pa.float64()),
    )
    per_rank = pa.table(
        {
            "rank": pa.array(found.ranks, pa.int32()),
            "length_micros": pa.array(found.rank_length_micros, pa.float64()),
            "ops": pa.array(found.rank_ops, pa.int64()),
        }
    )
    return CriticalPath(found.length_micros, path, per_rank, found.dropped_edges)


def _trace_id(wh: Warehouse, name: str) -> int:
    return int(wh.query("SELECT trace_id FROM traces WHERE name = $n", {"n": name}).scalar())


def _step(progress: ProgressFn | None, phase: str, done: int) -> None:
    """A phase counted 0 or 1 (a query): the bar says what runs."""
    if progress is not None:
        progress(phase, done, 1)
