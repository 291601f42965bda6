"""Critical path: the duration-weighted longest dependency chain of a trace."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import break_cycles, generations, longest_path, match_messages, trace_edges
from etstore.errors import EtstoreError, UnknownTraceError
from etstore.model import Trace

__all__ = ["CriticalPath", "critical_path"]


@dataclass(frozen=True)
class CriticalPath:
    """The longest path and, per rank, the longest path within that rank.

    ``path`` columns: ``step``, ``rank``, ``id``, ``name``, ``type``,
    ``duration_micros``, ``start_micros`` (path-relative start, µs), ``via``
    (``start``, ``dep`` or ``msg``: how the step is reached from the previous one).
    ``per_rank`` columns: ``rank``, ``length_micros``, ``ops``.
    """

    length_micros: float
    path: pa.Table
    per_rank: pa.Table
    dropped_edges: int = 0


def critical_path(trace: Trace, *, rank: int | None = None, on_cycle: str = "break") -> CriticalPath:
    """Duration-weighted longest path per rank and across ranks (via message edges).

    Parameters
    ----------
    trace
        Any stored or in-memory trace.
    rank
        Restrict to one rank (dependency edges only); ``None`` walks all ranks and
        follows each COMM_SEND to its matching COMM_RECV.
    on_cycle
        ``"break"`` (default): drop the backward edges inside each dependency cycle
        (see :func:`~etstore.dag.break_cycles`) and count them in
        ``dropped_edges``; ``"raise"``: refuse cyclic traces.

    Raises
    ------
    UnknownTraceError
        ``rank`` is not in the trace.
    EtstoreError
        ``on_cycle="raise"`` and the dependencies form a cycle (names some of its ops).

    Notes
    -----
    O(V + E log E) with numpy, one round per topological generation.
    """
    if rank is not None:
        if rank not in trace.ranks:
            raise UnknownTraceError(f"trace {trace.name!r} has no rank {rank} (ranks: {trace.ranks})")
        mask = pc.equal(trace.ops["rank"], rank)
        trace = trace.replace(
            ops=trace.ops.filter(mask), deps=trace.deps.filter(pc.equal(trace.deps["rank"], rank))
        )
    ops = trace.ops
    n = ops.num_rows
    dsrc, ddst = trace_edges(trace)
    if rank is None:
        matched = match_messages(trace)
        msrc, mdst = matched.send_row, matched.recv_row
    else:
        msrc = mdst = np.zeros(0, dtype=np.int64)
    src, dst = np.concatenate([dsrc, msrc]), np.concatenate([ddst, mdst])
    gen = generations(n, src, dst)
    dropped = 0
    if n and (gen < 0).any():
        if on_cycle == "raise":
            bad = np.flatnonzero(gen < 0)[:5]
            where = ", ".join(f"rank {ops['rank'][int(i)]} id {ops['id'][int(i)]}" for i in bad)
            raise EtstoreError(
                f"trace {trace.name!r} has a dependency cycle ({where}, ...); no critical path"
            )
        keep = break_cycles(n, src, dst)
        dropped = int((~keep).sum())
        src, dst = src[keep], dst[keep]
    weight = ops["duration_micros"].to_numpy().astype(np.float64)
    length, rows, _ = longest_path(n, src, dst, weight)
    msg_pairs = set(zip(msrc.tolist(), mdst.tolist(), strict=True))
    via = ["start"] + ["msg" if (int(a), int(b)) in msg_pairs else "dep" for a, b in itertools.pairwise(rows)]
    take = pa.array(rows)
    durations = weight[rows]
    path = pa.table(
        {
            "step": pa.array(np.arange(len(rows), dtype=np.int64)),
            "rank": ops["rank"].take(take),
            "id": ops["id"].take(take),
            "name": ops["name"].take(take),
            "type": ops["type"].take(take),
            "duration_micros": ops["duration_micros"].take(take),
            "start_micros": pa.array(np.concatenate([[0.0], np.cumsum(durations)[:-1]]) if len(rows) else []),
            "via": pa.array(via if len(rows) else [], pa.string()),
        }
    )
    per_rank = _per_rank(trace)
    return CriticalPath(length, path, per_rank, dropped)


def _per_rank(trace: Trace) -> pa.Table:
    ranks, lengths, counts = [], [], []
    for r, (a, b) in trace.rank_slices().items():
        sub = trace.replace(
            ops=trace.ops.slice(a, b - a), deps=trace.deps.filter(pc.equal(trace.deps["rank"], r))
        )
        src, dst = trace_edges(sub)
        keep = break_cycles(sub.num_ops, src, dst)
        src, dst = src[keep], dst[keep]
        w = sub.ops["duration_micros"].to_numpy().astype(np.float64)
        length, rows, _ = longest_path(sub.num_ops, src, dst, w)
        ranks.append(r)
        lengths.append(length)
        counts.append(len(rows))
    return pa.table(
        {
            "rank": pa.array(ranks, pa.int32()),
            "length_micros": pa.array(lengths),
            "ops": pa.array(counts, pa.int64()),
        }
    )
