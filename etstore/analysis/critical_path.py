"""Critical path: the duration-weighted longest dependency chain of a trace.

:func:`path_table` is the one shape of a path, shared with the critical path of a
simulated schedule (:func:`etstore.report.schedule_critical_path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.dag import break_cycles, generations, heaviest_paths, match_messages, trace_edges, walk_back
from etstore.errors import CycleError, OptionError, UnknownTraceError
from etstore.model import Trace
from etstore.progress import ProgressFn

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


def critical_path(
    trace: Trace,
    *,
    rank: int | None = None,
    on_cycle: str = "break",
    progress: ProgressFn | None = None,
) -> CriticalPath:
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
    progress
        Called as ``progress(phase, done, total)`` every 1% or so of each phase:
        ``order`` (ops placed in topological order; ``order without cycles`` again
        after breaking cycles), ``path`` (ops weighed across ranks), ``rank paths``
        (ops weighed within their rank).

    Raises
    ------
    UnknownTraceError
        ``rank`` is not in the trace.
    EtstoreError
        ``on_cycle="raise"`` and the dependencies form a cycle (names some of its ops).

    Examples
    --------
    >>> from etstore.model import deps_table, ops_table
    >>> ops = ops_table({"rank": [0, 0, 0], "id": [1, 2, 3], "name": ["a", "b", "c"],
    ...                  "type": ["COMP_NODE"] * 3, "duration_micros": [5, 1, 7]})
    >>> cp = critical_path(Trace(ops=ops, deps=deps_table([0, 0], [1, 1], [2, 3]), name="t"))
    >>> cp.length_micros, cp.path["name"].to_pylist()
    (12.0, ['a', 'c'])

    Notes
    -----
    O(V + E log E): one topological order (:func:`~etstore.dag.generations`), then
    one pass over it for the path across ranks and one for every rank's own path at
    once (:func:`~etstore.dag.heaviest_paths`): a few numpy calls per generation and
    a Python step per op on the paths found, none per other op (6M ops, 280k
    generations deep: ≈ 10 s, ``bench/bench_critical_path.py``). Ties go to the first
    op (row order) that ends last, reached by the first edge (dependencies in table
    order, then messages) that attains it.
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
    gen = generations(n, src, dst, progress=progress)
    dropped = 0
    cyclic = bool(n) and bool((gen < 0).any())
    if cyclic:
        if on_cycle == "raise":
            bad = np.flatnonzero(gen < 0)[:5]
            where = ", ".join(f"rank {ops['rank'][int(i)]} id {ops['id'][int(i)]}" for i in bad)
            raise CycleError(f"trace {trace.name!r} has a dependency cycle ({where}, ...); no critical path")
        keep = break_cycles(n, src, dst)
        dropped = int((~keep).sum())
        src, dst = src[keep], dst[keep]
        gen = generations(n, src, dst, progress=_renamed(progress, "order without cycles"))
    weight = ops["duration_micros"].to_numpy().astype(np.float64)
    finish, pred = heaviest_paths(gen, src, dst, weight, progress=progress)
    del src, dst
    length, take = _heaviest(finish, pred)
    if rank is None:
        del finish, pred
        if cyclic:  # each rank's own cycles, broken as they would be on that rank alone
            keep = break_cycles(n, dsrc, ddst)
            dsrc, ddst = dsrc[keep], ddst[keep]
            gen = generations(n, dsrc, ddst)
        # an order of all edges orders the dependencies alone: one more pass serves every rank
        finish, pred = heaviest_paths(gen, dsrc, ddst, weight, progress=_renamed(progress, "rank paths"))
    per_rank = _per_rank(trace, finish, pred)
    msg_from = np.full(n, -1, dtype=np.int64)
    msg_from[mdst] = msrc
    via = np.where(msg_from[take[1:]] == take[:-1], "msg", "dep").tolist()
    starts = np.concatenate([[0.0], np.cumsum(weight[take])[:-1]]) if len(take) else np.zeros(0)
    path = path_table(
        ops,
        take,
        ["start", *via] if len(take) else [],
        duration_micros=ops["duration_micros"].take(pa.array(take)),
        start_micros=pa.array(starts, pa.float64()),
    )
    return CriticalPath(length, path, per_rank, dropped)


def _renamed(progress: ProgressFn | None, phase: str) -> ProgressFn | None:
    """``progress`` reporting under another phase name."""
    if progress is None:
        return None
    report = progress
    return lambda _phase, done, total: report(phase, done, total)


def _heaviest(finish: np.ndarray, pred: np.ndarray) -> tuple[float, np.ndarray]:
    """Length and rows of the heaviest path: it ends at the first row that ends last."""
    if len(finish) == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    last = int(np.argmax(finish))
    return float(finish[last]), walk_back(pred, last)


def _per_rank(trace: Trace, finish: np.ndarray, pred: np.ndarray) -> pa.Table:
    """Per rank, its heaviest path's length and ops, from the dependency-only ``finish``/``pred``."""
    ranks, lengths, counts = [], [], []
    links = np.ascontiguousarray(pred, dtype=np.int64).data  # no list of every op's link
    for r, (a, b) in trace.rank_slices().items():
        last = a + int(np.argmax(finish[a:b]))
        steps, v = 1, links[last]
        while v >= 0:  # the path's ops: O(path), summed over ranks at most O(V)
            steps, v = steps + 1, links[v]
        ranks.append(r)
        lengths.append(float(finish[last]))
        counts.append(steps)
    return pa.table(
        {
            "rank": pa.array(ranks, pa.int32()),
            "length_micros": pa.array(lengths, pa.float64()),
            "ops": pa.array(counts, pa.int64()),
        }
    )
