"""Critical path: the duration-weighted longest dependency chain of a trace.

:func:`path_table` is the one shape of a path, shared with the critical path of a
simulated schedule (:func:`etstore.report.schedule_critical_path`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import break_cycles, generations, longest_path, match_messages, trace_edges
from etstore.errors import CycleError, OptionError, UnknownTraceError
from etstore.model import Trace

__all__ = ["PATH_COLUMNS", "PATH_VIA", "CriticalPath", "critical_path", "path_table"]

# the columns every path table starts with; timing columns follow, then ``via``
PATH_COLUMNS = ("step", "rank", "id", "name", "type")
# how a step is reached from the one before: first step; a dependency (or the rank's slot);
# a message (the send a receive waited for); the collective member that joined last
PATH_VIA = ("start", "dep", "msg", "peer")


def path_table(
    ops: pa.Table,
    rows: np.ndarray,
    via: Sequence[str],
    **timing: pa.Array | pa.ChunkedArray | np.ndarray,
) -> pa.Table:
    """A path through ``ops`` as a table, one row per step in path order.

    Parameters
    ----------
    ops
        Table with at least ``rank``, ``id``, ``name`` and ``type``.
    rows
        Row of ``ops`` of each step (int), first step first.
    via
        Per step, how it is reached from the step before (one of :data:`PATH_VIA`).
    **timing
        Further columns, one value per step, in the order given (their names carry the unit).

    Returns
    -------
    pyarrow.Table
        :data:`PATH_COLUMNS` (``step`` counts from 0; the others are taken from ``ops``),
        the ``timing`` columns, then ``via``.

    Raises
    ------
    OptionError
        ``via`` does not have one entry per step.

    Notes
    -----
    O(path) takes; the column types follow ``ops`` even when the path is empty.
    """
    take = pa.array(np.asarray(rows, dtype=np.int64))
    if len(via) != len(take):
        raise OptionError(f"a path of {len(take)} steps needs {len(take)} via entries, not {len(via)}")
    cols: dict[str, pa.Array | pa.ChunkedArray | np.ndarray] = {
        "step": pa.array(np.arange(len(take), dtype=np.int64))
    }
    cols.update({c: ops[c].take(take) for c in PATH_COLUMNS[1:]})
    cols.update(timing)
    cols["via"] = pa.array(list(via), pa.string())
    return pa.table(cols)


@dataclass(frozen=True)
class CriticalPath:
    """The longest path and, per rank, the longest path within that rank.

    ``path`` columns (a :func:`path_table`): ``step``, ``rank``, ``id``, ``name``, ``type``,
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
            raise CycleError(f"trace {trace.name!r} has a dependency cycle ({where}, ...); no critical path")
        keep = break_cycles(n, src, dst)
        dropped = int((~keep).sum())
        src, dst = src[keep], dst[keep]
    weight = ops["duration_micros"].to_numpy().astype(np.float64)
    length, rows, _ = longest_path(n, src, dst, weight)
    msg_pairs = set(zip(msrc.tolist(), mdst.tolist(), strict=True))
    via = ["msg" if (int(a), int(b)) in msg_pairs else "dep" for a, b in itertools.pairwise(rows)]
    take = np.asarray(rows, dtype=np.int64)
    starts = np.concatenate([[0.0], np.cumsum(weight[take])[:-1]]) if len(take) else np.zeros(0)
    path = path_table(
        ops,
        take,
        ["start", *via] if len(take) else [],
        duration_micros=ops["duration_micros"].take(pa.array(take)),
        start_micros=pa.array(starts, pa.float64()),
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
