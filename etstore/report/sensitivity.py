"""The report's sensitivity section: how the makespan moves with one what-if knob.

``etstore sweep TRACE --knob KNOB=V1,V2,...`` records one run per knob value, each with
``runs.params`` → ``user.sensitivity`` = ``{knob, value, values, first_run}``
(:func:`etstore.sim.sweep.sensitivity`). A run the report shows that belongs to such a sweep
brings the whole sweep in, so ``etstore report`` of any of its runs draws the curve: the makespan
against the knob value (a line per sweep and topology), beside the exposed communication per
rank (mean and worst), and the same points as a table with each one's change from the first.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
from plotly.subplots import make_subplots

from etstore.report._data import has_table, query
from etstore.report._html import fmt_ns, table
from etstore.report._style import FALLBACK, TEMPLATE
from etstore.store.warehouse import Warehouse

__all__ = ["sensitivity_figure", "sensitivity_html", "sensitivity_points"]

_POINTS = """
WITH s AS (
    SELECT run_id, topology, congestion, total_ns,
        CAST(json_extract(params, '$.user.sensitivity.first_run') AS BIGINT) AS first_run,
        json_extract_string(params, '$.user.sensitivity.knob') AS knob,
        CAST(json_extract(params, '$.user.sensitivity.value') AS DOUBLE) AS value
    FROM runs WHERE json_extract(params, '$.user.sensitivity') IS NOT NULL),
chosen AS (SELECT * FROM s WHERE first_run IN (SELECT first_run FROM s WHERE list_contains($ids, run_id))),
b AS (SELECT run_id, avg(exposed_comm_ns) AS mean_exposed_ns, max(exposed_comm_ns) AS max_exposed_ns
    FROM rank_breakdown WHERE run_id IN (SELECT run_id FROM chosen) GROUP BY run_id)
SELECT c.first_run, c.knob, c.topology, c.congestion, c.value, c.run_id, c.total_ns,
    b.mean_exposed_ns, b.max_exposed_ns
FROM chosen c LEFT JOIN b USING (run_id) ORDER BY c.first_run, c.topology, c.run_id
"""


def sensitivity_points(warehouse: Warehouse, run_ids: Sequence[int]) -> pa.Table:
    """Every run of the sensitivity sweeps that ``run_ids`` belong to, in the order they ran.

    Columns: ``first_run`` (the sweep), ``knob``, ``topology``, ``congestion``, ``value``,
    ``run_id``, ``total_ns``, ``mean_exposed_ns`` and ``max_exposed_ns`` (per rank). Empty
    where none of the runs is a sweep's.
    """
    if not run_ids or not has_table(warehouse, "runs"):
        return pa.table({"first_run": pa.array([], pa.int64())})
    return query(warehouse, _POINTS, {"ids": [int(r) for r in run_ids]})


def _curves(t: pa.Table) -> list[tuple[int, str, np.ndarray]]:
    """``(sweep, topology, row indices)`` of each curve, in the table's order."""
    keys = list(zip(t["first_run"].to_pylist(), t["topology"].to_pylist(), strict=True))
    out: dict[tuple[int, str], list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return [(k[0], k[1], np.asarray(v)) for k, v in out.items()]


def sensitivity_figure(warehouse: Warehouse, run_ids: Sequence[int]) -> go.Figure | None:
    """Makespan vs knob value, beside exposed communication per rank vs knob value; None without a sweep."""
    t = sensitivity_points(warehouse, run_ids)
    if t.num_rows == 0:
        return None
    knobs = list(dict.fromkeys(t["knob"].to_pylist()))
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("makespan", "exposed communication per rank (mean, and worst dotted)"),
        horizontal_spacing=0.08,
    )
    value = t["value"].to_numpy()
    total = t["total_ns"].to_numpy() / 1e3
    mean = t["mean_exposed_ns"].to_numpy(zero_copy_only=False).astype(float) / 1e3
    worst = t["max_exposed_ns"].to_numpy(zero_copy_only=False).astype(float) / 1e3
    runs = t["run_id"].to_numpy()
    curves = _curves(t)
    for k, (sweep, topo, rows) in enumerate(curves):
        knob = t["knob"][int(rows[0])].as_py()
        name = f"{knob} · {topo}" + (f" (sweep {sweep})" if len(curves) > 1 else "")
        color = FALLBACK[k % len(FALLBACK)]
        for col, y, dash, shown in (
            (1, total, "solid", True),
            (2, mean, "solid", False),
            (2, worst, "dot", False),
        ):
            fig.add_trace(
                go.Scatter(
                    x=value[rows],
                    y=y[rows],
                    customdata=runs[rows],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=shown,
                    line={"color": color, "dash": dash},
                    hovertemplate=f"{html.escape(knob)} = %{{x:g}} · %{{y:,.1f}} µs"
                    "<extra>run %{customdata}</extra>",
                ),
                row=1,
                col=col,
            )
    label = knobs[0] if len(knobs) == 1 else "knob"
    for col in (1, 2):
        fig.update_xaxes(title_text=f"{label} value", row=1, col=col)
        fig.update_yaxes(title_text="µs", rangemode="tozero", row=1, col=col)
    fig.update_layout(
        template=TEMPLATE,
        title=f"Sensitivity: makespan vs {label}",
        height=420,
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def sensitivity_html(warehouse: Warehouse, run_ids: Sequence[int]) -> str | None:
    """The sweeps' points as a table (value, run, makespan, change from the sweep's first point), or None."""
    t = sensitivity_points(warehouse, run_ids)
    if t.num_rows == 0:
        return None
    rows = []
    for _, _, idx in _curves(t):
        base = t["total_ns"][int(idx[0])].as_py()
        for i in idx.tolist():
            r = {c: t[c][i].as_py() for c in t.column_names}
            d = r["total_ns"] - base
            rows.append(
                [
                    r["knob"],
                    r["topology"],
                    f"{r['value']:g}",
                    r["run_id"],
                    fmt_ns(r["total_ns"]),
                    ("+" if d > 0 else "") + fmt_ns(d),
                    f"{d / base * 100:+,.2f}%" if base else "–",
                    fmt_ns(r["mean_exposed_ns"]),
                    fmt_ns(r["max_exposed_ns"]),
                ]
            )
    header = [
        "knob",
        "topology",
        "value",
        "run",
        "makespan",
        "Δ",
        "Δ%",
        "mean exposed comm",
        "max exposed comm",
    ]
    return table(header, rows, left=2)
