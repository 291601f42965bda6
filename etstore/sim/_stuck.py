"""Why a replay stopped with ops unfinished: unmatched receives, dependency cycles, held slots.

The loop never hangs: when no event is left and some op has not ended, the
engine raises the :class:`~etstore.errors.SimulationError` built here, whose
message names the causes and whose ``.stuck`` table lists every op that never
finished (:data:`~etstore.sim.result.STUCK_SCHEMA`). When the clock itself cannot
move (an event time that is not a number), the loop stops at once and
:func:`no_progress_error` names the op in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from etstore.dag import find_cycle
from etstore.errors import SimulationError
from etstore.model import Trace
from etstore.sim._build import Built, LoopInputs
from etstore.sim._kinds import K_JOIN, K_RECV, K_SEND, SUB_TAG_BASE
from etstore.sim._loop import LoopOutput, NoProgress
from etstore.sim.result import STUCK_SCHEMA

__all__ = ["no_progress_error", "stuck_error"]

_MAX_CAUSES = 3  # causes named in the one-line message; .stuck has every op


def _cycle_among(never: np.ndarray, succ: np.ndarray, ptr: np.ndarray) -> list[int]:
    """One dependency cycle among the ``never``-ready ops (in dependency order), or [] if none."""
    nodes = np.flatnonzero(never)
    if len(nodes) == 0:
        return []
    src = np.repeat(np.arange(len(never), dtype=np.int64), np.diff(ptr))
    inner = never[src] & never[succ]
    index = np.cumsum(never) - 1  # op -> position among the never-ready ops (keeps their order)
    cycle = find_cycle(len(nodes), index[src[inner]], index[succ[inner]])
    return [int(i) for i in nodes[cycle]]


class _Describe:
    """Names ops in messages: the trace node, and for sub-ops which step of its collective."""

    def __init__(self, built: Built, inp: LoopInputs, names: list[str]) -> None:
        self.built, self.inp, self.names = built, inp, names

    def top(self, i: int) -> int:
        """The trace op row that op ``i`` is (or belongs to)."""
        return int(self.inp.owner[i]) if i >= self.built.n0 else i

    def __call__(self, i: int) -> str:
        o = self.top(i)
        node = f"{self.built.types[o]} {self.names[o]!r}"
        base = f"rank {int(self.inp.rank[i])} id {int(self.built.ids[o])} ({node})"
        if i >= self.built.n0:
            what = {K_SEND: "send", K_RECV: "recv", K_JOIN: "end"}.get(int(self.inp.kind[i]), "step")
            base += f" {what} step {int(self.inp.local[i])}" if what != "end" else " completion"
        return base


def _reasons(
    built: Built, inp: LoopInputs, out: LoopOutput, describe: _Describe
) -> tuple[dict[int, tuple[str, str]], list[str]]:
    """(state and reason per unfinished op, the causes for the message: cycle first, then posted
    receives)."""
    end = np.asarray(out.end)
    blocked = np.asarray(out.indeg) > 0  # some dependency never finished
    unfinished = np.flatnonzero(end < 0)
    reasons: dict[int, tuple[str, str]] = {}
    lines: list[str] = []
    for q in out.recv_q.values():
        for r in q:
            r = int(r)
            tg = int(inp.tag[r])
            tag_s = f"tag {tg}" if tg < SUB_TAG_BASE else "its collective's messages"
            reasons[r] = (
                "posted",
                f"waits for a message from rank {int(inp.peer[r])} ({tag_s}, {int(inp.size[r])} "
                "bytes): no matching send",
            )
    # dependency cycles among ops that never became ready
    never = np.zeros(len(end), dtype=bool)
    never[unfinished] = blocked[unfinished]
    cyc = _cycle_among(never, inp.succ, inp.ptr)
    if cyc:
        rank = inp.rank
        same = all(int(rank[i]) == int(rank[cyc[0]]) for i in cyc)
        path = " -> ".join(f"id {int(built.ids[describe.top(i)])}" for i in cyc + cyc[:1])
        where = (
            f"rank {int(rank[cyc[0]])}"
            if same
            else "ranks " + ",".join(sorted({str(int(rank[i])) for i in cyc}))
        )
        lines.append(f"dependency cycle on {where}: {path}")
        for i in cyc:
            reasons.setdefault(i, ("blocked", "on a dependency cycle"))
    for wq in out.waitq:
        for j in wq:
            reasons.setdefault(
                int(j), ("waiting", "ready but its NPU slot is held by an op that never finished")
            )
    for i in unfinished.tolist():
        if i not in reasons:
            if blocked[i]:
                reasons[i] = ("blocked", "a dependency never finished")
            else:
                reasons[i] = ("started", "in flight when the replay stopped")
    for i, (state, why) in reasons.items():
        if state == "posted":
            lines.append(f"{describe(i)} {why}")
    return reasons, lines


def stuck_error(trace: Trace, built: Built, inp: LoopInputs, out: LoopOutput) -> SimulationError:
    """Explain why ops never finished: unmatched receives, cycles, slots held forever.

    Returns
    -------
    SimulationError
        Its message, one line, names the stuck time, how many trace ops never finished and
        up to three causes; ``.stuck`` (:data:`~etstore.sim.result.STUCK_SCHEMA`) has one
        row per unfinished op with its state (``posted``, ``blocked``, ``waiting``,
        ``started``) and reason.

    Notes
    -----
    O(V + E log E) over the simulated ops, for the cycle search.
    """
    n0 = built.n0
    names = trace.ops["name"].to_pylist()
    describe = _Describe(built, inp, names)
    reasons, lines = _reasons(built, inp, out, describe)
    unfinished = np.flatnonzero(np.asarray(out.end) < 0)
    top_rows = sorted({describe.top(int(i)) for i in unfinished})
    rows: dict[str, list[Any]] = {f.name: [] for f in STUCK_SCHEMA}
    for i in sorted(reasons):
        o = describe.top(i)
        state, why = reasons[i]
        rows["rank"].append(int(inp.rank[i]))
        rows["id"].append(int(built.ids[o]))
        rows["name"].append(names[o])
        rows["type"].append(str(built.types[o]))
        rows["state"].append(state)
        rows["reason"].append(why if i < n0 else f"{describe(i)}: {why}")
    stuck = pa.Table.from_pydict(rows, schema=STUCK_SCHEMA)
    causes = "; ".join(lines[:_MAX_CAUSES]) if lines else "no unmatched receive or cycle found"
    more = f"; and {len(lines) - _MAX_CAUSES} more" if len(lines) > _MAX_CAUSES else ""
    msg = (
        f"simulation of {trace.name!r} stuck at t={out.t:.0f} ns: {len(top_rows)} of {n0} ops never "
        f"finished: {causes}{more} (.stuck lists every op that never finished)"
    )
    return SimulationError(msg, stuck)


def no_progress_error(trace: Trace, built: Built, inp: LoopInputs, exc: NoProgress) -> SimulationError:
    """The one-line error for a replay whose next event has a time that is not a number.

    Such a time compares equal to nothing, so no event could ever be ordered after it;
    the loop stops instead of spinning, and this names the op it stopped at (``.stuck``
    holds that op's row).
    """
    what = "an event no trace op names (a link's, or a step of a collective expanded as it started)"
    rows: dict[str, list[Any]] = {f.name: [] for f in STUCK_SCHEMA}
    if exc.op >= 0:
        names = trace.ops["name"].to_pylist()
        describe = _Describe(built, inp, names)
        what = describe(exc.op)
        o = describe.top(exc.op)
        for key, value in (
            ("rank", int(inp.rank[exc.op])),
            ("id", int(built.ids[o])),
            ("name", names[o]),
            ("type", str(built.types[o])),
            ("state", "started"),
            ("reason", "its end time is not a number"),
        ):
            rows[key].append(value)
    msg = (
        f"simulation of {trace.name!r} cannot go on: the next event, {what}, has a time that is not a "
        "number (a duration or a message time that is NaN)"
    )
    return SimulationError(msg, pa.Table.from_pydict(rows, schema=STUCK_SCHEMA))
