"""The report's opportunities section: the recorded overlap / chunk / reorder findings as a readable table.

``etstore overlap`` (:func:`etstore.app.opportunities.find_and_record`) records each
finding with a JSON ``detail`` (timings in ns and op ids); the report states it in a
sentence instead, lists the largest gains first (simulated, or marked as estimates) and says
how many more there are.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from etstore.report._data import has_table, query
from etstore.report._html import fmt_ns, table
from etstore.store.warehouse import Warehouse

__all__ = ["OPPORTUNITY_ROWS", "describe_opportunity", "opportunities", "opportunities_html"]

OPPORTUNITY_ROWS = 20
"""Opportunities listed per trace in the report (the largest estimated gains); the rest are counted."""

# a detail that is neither a finder's JSON nor short text is cut to this many characters
_DETAIL_CHARS = 160


def opportunities(
    warehouse: Warehouse, trace: str, *, limit: int = OPPORTUNITY_ROWS
) -> tuple[pa.Table, pa.Table] | None:
    """The trace's recorded overlap/chunk/reorder opportunities: (top rows, totals per kind), or None.

    Parameters
    ----------
    warehouse
        The metrics (the ``opportunities`` table, and ``ops`` for op names when stored).
    trace
        The trace's name.
    limit
        Rows returned at most.

    Returns
    -------
    (pyarrow.Table, pyarrow.Table) or None
        Rows, largest ``gain_ns`` first (then kind, rank, op): ``kind``, ``rank``, ``op_id``,
        ``op`` (name, when the trace is stored), ``other_id``, ``other``, ``gain_ns``,
        ``detail``. Totals, largest first: ``kind``, ``n``, ``gain_ns`` (sum). None when the
        ``opportunities`` table is absent or holds nothing for the trace.

    Raises
    ------
    ReportError
        The metrics cannot be read.

    Notes
    -----
    Two DuckDB queries; O(n log n) in the trace's opportunities for the sort.
    """
    if not has_table(warehouse, "opportunities"):
        return None
    totals = query(
        warehouse,
        "SELECT kind, count(*) AS n, sum(gain_ns) AS gain_ns FROM opportunities WHERE trace = $t "
        "GROUP BY kind ORDER BY gain_ns DESC, kind",
        {"t": trace},
    )
    if totals.num_rows == 0:
        return None
    if has_table(warehouse, "ops"):
        sql = """SELECT p.kind, p.rank, p.op_id, a.name AS op, p.other_id, b.name AS other, p.gain_ns,
                p.detail
            FROM opportunities p
            LEFT JOIN ops a ON a.trace = p.trace AND a.rank = p.rank AND a.id = p.op_id
            LEFT JOIN ops b ON b.trace = p.trace AND b.rank = p.rank AND b.id = p.other_id
            WHERE p.trace = $t ORDER BY p.gain_ns DESC NULLS LAST, p.kind, p.rank, p.op_id LIMIT $n"""
    else:
        sql = """SELECT kind, rank, op_id, NULL AS op, other_id, NULL AS other, gain_ns, detail
            FROM opportunities
            WHERE trace = $t ORDER BY gain_ns DESC NULLS LAST, kind, rank, op_id LIMIT $n"""
    return query(warehouse, sql, {"t": trace, "n": int(limit)}), totals


def _ops(n: int, what: str) -> str:
    return f"{n} {what} op" + ("" if n == 1 else "s")


def _ids(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def _generic(d: dict[str, Any]) -> str:
    """Any other JSON object: its scalar fields, lists as their length."""
    parts = []
    for k, v in d.items():
        if isinstance(v, list | dict):
            parts.append(f"{k}: {len(v)} items")
        elif isinstance(v, float) and k.endswith("_ns"):
            parts.append(f"{k[:-3]}: {fmt_ns(v)}")
        else:
            parts.append(f"{k}: {v}")
    return ", ".join(parts)


def describe_opportunity(kind: str, detail: str | None) -> str:
    """One sentence for a recorded opportunity's ``detail``; plain text passes through (shortened).

    Parameters
    ----------
    kind
        ``overlap``, ``chunk``, ``reorder`` (any other kind gets the generic wording).
    detail
        The row's ``detail``: the finder's JSON, or free text.

    Returns
    -------
    str
        Times in ns/µs/ms, op counts; never the JSON itself.
    """
    if not detail:
        return ""
    try:
        d = json.loads(detail)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        if isinstance(d, list):
            return f"{len(d)} items"
        text = " ".join(detail.split())
        return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"
    try:
        if "moves" in d:  # a recording: ops moved earlier in their lane, where it waited
            moved = sum(_ids(m["moved"]) for m in d["moves"])
            ranks = len(d["moves"])
            return (
                f"{moved:,} ops on {ranks} rank{'s' if ranks != 1 else ''} moved in front of "
                f"{d['held']}, where their thread or stream waited (alone: {fmt_ns(d['alone_gain_ns'])})"
            )
        if kind == "overlap":
            n = _ids(d["compute_ids"])
            waits, they = ("waits", "it") if n == 1 else ("wait", "they")
            return (
                f"{_ops(n, 'compute')} ({fmt_ns(d['compute_ns'])}) {waits} for the collective "
                f"({fmt_ns(d['collective_ns'])}) without using its data: {they} could run under it"
            )
        if kind == "reorder":
            return (
                f"could be issued at {fmt_ns(d['ready_ns'])} instead of {fmt_ns(d['issued_ns'])}: "
                f"{_ops(_ids(d['compute_ids']), 'compute')} ahead of it "
                + ("does" if _ids(d["compute_ids"]) == 1 else "do")
                + " not feed it"
            )
        if kind == "chunk":
            return (
                f"split into {_ids(d['pieces'])} pieces as its {_ids(d['chunks'])} chunks arrive: starts "
                f"{fmt_ns(d['start_gain_ns'])} earlier and ends at {fmt_ns(d['chunked_end_ns'])} "
                f"instead of {fmt_ns(d['end_ns'])}"
            )
    except (KeyError, TypeError):
        pass
    text = _generic(d)
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def _measured(detail: str | None) -> bool:
    """Whether a row's gain was simulated (``etstore overlap`` without ``--estimates``)."""
    try:
        d = json.loads(detail or "")
    except ValueError:
        return False
    return isinstance(d, dict) and bool(d.get("measured"))


def _op(op_id: int | None, name: str | None) -> str:
    if op_id is None:
        return "–"
    return f"{op_id} {name}" if name else str(op_id)


def opportunities_html(warehouse: Warehouse, traces: Iterable[str], *, limit: int = OPPORTUNITY_ROWS) -> str:
    """Per trace, a line of totals per kind and a table of the ``limit`` largest gains.

    Columns: kind, rank, op, other op (the compute op it frees, passes or splits),
    what (:func:`describe_opportunity`), gain (simulated, or marked as an estimate). Beyond
    ``limit`` rows a note
    says how many more the ``opportunities`` table holds. A trace without any gets a note
    naming ``etstore overlap``.

    Raises
    ------
    ReportError
        The metrics cannot be read.
    """
    parts = []
    for trace in dict.fromkeys(traces):
        found = opportunities(warehouse, trace, limit=limit)
        name = html.escape(trace)
        if found is None:
            parts.append(
                f'<p class="note">No overlap, chunk or reorder opportunities are recorded for trace '
                f"{name} (run <code>etstore overlap</code> to find them).</p>"
            )
            continue
        rows, totals = found
        total_n = sum(totals["n"].to_pylist())
        kinds = ", ".join(
            f"{k}: {n:,} worth {fmt_ns(g)}"
            for k, n, g in zip(
                totals["kind"].to_pylist(),
                totals["n"].to_pylist(),
                totals["gain_ns"].to_pylist(),
                strict=True,
            )
        )
        shown = f"the {rows.num_rows} largest gains below" if total_n > rows.num_rows else "all listed below"
        parts.append(
            f"<p>Trace <b>{name}</b>: {total_n:,} opportunit{'y' if total_n == 1 else 'ies'} "
            f"({kinds}), {shown}.</p>"
        )
        body = [
            [
                r["kind"],
                r["rank"],
                _op(r["op_id"], r["op"]),
                _op(r["other_id"], r["other"]),
                describe_opportunity(str(r["kind"]), r["detail"]),
                fmt_ns(r["gain_ns"]) + ("" if _measured(r["detail"]) else " (estimate)"),
            ]
            for r in rows.to_pylist()
        ]
        parts.append(table(["kind", "rank", "op", "other op", "what", "gain"], body, text=(0, 2, 3, 4)))
        if any(_measured(r["detail"]) for r in rows.to_pylist()):
            parts.append(
                '<p class="note">Gains are simulated: each is what the opportunity takes off the '
                "makespan on top of the ones of its kind found before it, so they add up to what "
                "applying them realises (<code>etstore rewrite</code>, then <code>compare</code>).</p>"
            )
        if total_n > rows.num_rows:
            sql_name = html.escape(trace.replace("'", "''"))
            parts.append(
                f'<p class="note">… and {total_n - rows.num_rows:,} more: <code>SELECT * FROM opportunities '
                f"WHERE trace = '{sql_name}' ORDER BY gain_ns DESC</code></p>"
            )
    return "\n".join(parts)
