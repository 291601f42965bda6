"""The per-rank timeline figure (a Gantt chart of compute, communication and idle) with the critical path.

Runs beyond :data:`DETAIL_OPS` ops are merged in numpy before plotting: intervals
closer than about one pixel become one span, so a 1M-op run draws as fast as a small
one. Times are shown in µs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa

from etstore.report._data import (
    COMPUTE,
    IDLE,
    Spans,
    categories,
    merge_spans,
    run_infos,
    timeline_ops,
)
from etstore.report._style import COLORS, TEMPLATE, category_color
from etstore.report.critical import schedule_critical_path
from etstore.store.warehouse import Warehouse

__all__ = [
    "DETAIL_OPS",
    "LABEL_SPANS",
    "MAX_SPANS",
    "TIMELINE_PX",
    "critical_path_steps",
    "timeline_figure",
]

# ops in a run up to which every op is drawn on its own (beyond: merged to ~pixel spans)
DETAIL_OPS = 20_000
# horizontal resolution the timeline is merged to, in "pixels" over the makespan
TIMELINE_PX = 2000
# at most this many spans per timeline (resolution coarsens until it fits): ~50 bytes of HTML each
MAX_SPANS = 60_000
# spans (and critical-path steps) up to which each gets a hover label with its op's name
LABEL_SPANS = 5_000


def _segments(
    x0: np.ndarray, x1: np.ndarray, y: np.ndarray, dtype: Any = np.float64
) -> tuple[np.ndarray, np.ndarray]:
    """Line segments (x0,y)-(x1,y) as one NaN-separated polyline; float32 halves the HTML of merged spans."""
    n = len(x0)
    xs = np.full(3 * n, np.nan, dtype=dtype)
    ys = np.full(3 * n, np.nan, dtype=np.float32)
    xs[0::3], xs[1::3] = x0, x1
    ys[0::3], ys[1::3] = y, y
    return xs, ys


def _hover_text(labels: list[str]) -> np.ndarray:
    out = np.empty(3 * len(labels), dtype=object)
    out[0::3] = labels
    out[1::3] = labels
    out[2::3] = ""
    return out


def timeline_figure(
    warehouse: Warehouse,
    run_id: int,
    *,
    critical_path: bool | pa.Table = True,
    detail_ops: int = DETAIL_OPS,
    pixels: int = TIMELINE_PX,
    max_spans: int = MAX_SPANS,
) -> go.Figure:
    """Per-rank timeline: compute above, communication below (one colour per collective type), idle between.

    Each rank has two lanes: compute at ``rank − 0.22`` and communication at
    ``rank + 0.22``; the thin grey line at ``rank`` is idle time (neither). With
    ``critical_path`` the schedule's critical path (see
    :func:`~etstore.report.critical.schedule_critical_path`; pass its table to reuse
    one already computed) is drawn over it in black, each step from when the step before it
    ended (see :func:`critical_path_steps`), so the line only ever goes forward in time.
    Drag to zoom; double-click to reset.

    Runs with more than ``detail_ops`` ops are merged per rank and category to
    spans no closer than ``makespan / pixels`` (coarser until at most ``max_spans``
    spans remain); hover shows how many ops a span holds.

    Parameters
    ----------
    warehouse
        The metrics (``runs``, ``op_timings``; ``ops`` for collective types when stored).
    run_id
        The run (``runs.run_id``).
    critical_path
        Draw the critical path: ``True`` computes it, a table from
        :func:`~etstore.report.critical.schedule_critical_path` is drawn as given, ``False``
        leaves it out.
    detail_ops
        Ops up to which every op is drawn on its own.
    pixels
        Horizontal resolution that larger runs are merged to (spans per makespan).
    max_spans
        Spans drawn at most; the resolution coarsens until they fit.

    Returns
    -------
    plotly.graph_objects.Figure
        One line trace per category (x in µs, y the lane), ``idle``, and the critical path last.

    Raises
    ------
    UnknownTraceError
        No such run.

    Notes
    -----
    O(ops log ops) in numpy for the merge; O(path) for the critical path.
    """
    (run,) = run_infos(warehouse, [run_id])
    ops = timeline_ops(warehouse, run)
    names, codes = categories(ops)
    keep = codes >= 0
    rank = ops["rank"].to_numpy().astype(np.int64)[keep]
    start = ops["start_ns"].to_numpy()[keep]
    end = ops["end_ns"].to_numpy()[keep]
    code = codes[keep]
    op_names = ops["name"].filter(pa.array(keep))
    makespan = max(run.total_ns, float(end.max()) if len(end) else 0.0, 1.0)
    detailed = len(rank) <= detail_ops
    gap = -1.0 if detailed else makespan / pixels
    ncat = max(len(names), 1)
    while True:
        spans = merge_spans(rank * ncat + code, start, end, gap)
        busy = merge_spans(rank, start, end, max(gap, 0.0))
        if len(spans) + len(busy) <= max_spans or gap >= makespan:
            break
        gap = makespan / pixels if gap <= 0 else gap * 2
    labelled = len(spans) <= LABEL_SPANS
    ranks = np.unique(rank) if len(rank) else np.zeros(0, dtype=np.int64)
    nr = len(ranks)
    lane_px = 44 if nr <= 16 else 24 if nr <= 32 else 14
    width = max(2.0, lane_px * 0.32)
    # merged spans are a pixel wide at least: float32 µs is exact enough for them
    xdtype = np.float64 if detailed else np.float32
    fig = go.Figure()
    order = sorted(range(len(names)), key=lambda k: (names[k] != COMPUTE, names[k]))
    span_rank = spans.group // ncat
    span_cat = spans.group % ncat
    for k in order:
        sel = span_cat == k
        if not sel.any():
            continue
        lane = -0.22 if names[k] == COMPUTE else 0.22
        xs, ys = _segments(spans.start_ns[sel] / 1e3, spans.end_ns[sel] / 1e3, span_rank[sel] + lane, xdtype)
        count = spans.ops[sel]
        trace_kw: dict[str, Any] = {}
        if labelled:
            first = op_names.take(pa.array(spans.first[sel])).to_pylist()
            labels = [
                f"{names[k]}: {nm}" if c == 1 else f"{names[k]}: {c} ops from {nm}"
                for nm, c in zip(first, count.tolist(), strict=True)
            ]
            trace_kw = {
                "text": _hover_text(labels),
                "hovertemplate": "rank %{y:.0f} · %{text}<br>%{x:,.1f} µs<extra></extra>",
            }
        else:
            cd = np.full(3 * len(count), np.nan, dtype=np.float32)
            cd[0::3], cd[1::3] = count, count
            trace_kw = {
                "customdata": cd,
                "hovertemplate": f"rank %{{y:.0f}} · {names[k]}: %{{customdata:.0f}} ops<br>%{{x:,.1f}} µs"
                "<extra></extra>",
            }
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name=names[k],
                line={"color": category_color(names[k], k), "width": width},
                connectgaps=False,
                **trace_kw,
            )
        )
    # idle: the gaps between a rank's busy spans, from 0 to its last end
    idle_s, idle_e, idle_r = _gaps(busy)
    xs, ys = _segments(idle_s / 1e3, idle_e / 1e3, idle_r.astype(np.float64), xdtype)
    if len(idle_s):
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name=IDLE,
                line={"color": COLORS[IDLE], "width": max(1.5, width / 3)},
                connectgaps=False,
                hovertemplate="rank %{y:.0f} · idle<br>%{x:,.1f} µs<extra></extra>",
            )
        )
    if critical_path is not False:
        cp = critical_path if isinstance(critical_path, pa.Table) else schedule_critical_path(warehouse, run)
        _add_critical_path(fig, cp, ops, gap)
    fig.update_layout(
        template=TEMPLATE,
        title={
            "text": f"Timeline · run {run.run_id} · makespan {run.total_ns / 1e3:,.1f} µs"
            + ("" if detailed else f" · merged to {gap / 1e3:,.2f} µs spans"),
            "font": {"size": 14},
        },
        height=int(min(2400, max(360, nr * lane_px + 160))),
        xaxis={"title": "simulated time (µs)", "rangemode": "tozero", "showspikes": True},
        yaxis={
            "title": "rank",
            "autorange": "reversed",
            "tickvals": ranks.tolist() if nr <= 64 else None,
            "zeroline": False,
        },
        dragmode="zoom",
        hovermode="closest",
        # the legend below the axis title, placed in pixels (a fraction of the plot moves with its height)
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        margin={"l": 60, "r": 20, "t": 50, "b": 110},
    )
    return fig


def _gaps(busy: Spans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Idle intervals: before each rank's first busy span and between consecutive spans."""
    if len(busy) == 0:
        z = np.zeros(0)
        return z, z, np.zeros(0, dtype=np.int64)
    g, s, e = busy.group, busy.start_ns, busy.end_ns
    first = np.concatenate([[True], g[1:] != g[:-1]])
    prev_end = np.concatenate([[0.0], e[:-1]])
    prev_end[first] = 0.0
    ok = s > prev_end
    return prev_end[ok], s[ok], g[ok]


def critical_path_steps(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """When each step of a critical path holds the path: its segment on the timeline, forward in time.

    A step holds the path from the later of its own start and the end of the step before
    it, to its end. A receive that started early and waited for its message holds it from
    the send's end; a collective member that waited for the last one to join holds it
    from that member's end (both ran the collective until then). So the segments follow
    one another: each starts where the one before ended or later, never earlier.

    Parameters
    ----------
    start_ns, end_ns
        Each step's start and end, in path order (ns, or any one time unit).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Per step, the segment's start and end: ``seg_end[i] >= seg_start[i] >= seg_end[i - 1]``.

    Notes
    -----
    O(path): one running maximum.
    """
    s = np.asarray(start_ns, dtype=np.float64)
    e = np.asarray(end_ns, dtype=np.float64)
    seg_end = np.maximum.accumulate(np.maximum(s, e)) if len(s) else np.zeros(0)
    seg_start = np.maximum(s, np.concatenate([[-np.inf], seg_end[:-1]]))
    return seg_start, seg_end


def _add_critical_path(fig: go.Figure, cp: pa.Table, ops: pa.Table, gap: float) -> None:
    """Draw the critical path as one black polyline over the lanes it crosses."""
    if cp.num_rows == 0:
        return
    # lane of each path op: compute unless its category is communication (both in (rank, id) order)
    cat = ops["category"].take(cp["row"]).to_pylist()
    r = cp["rank"].to_numpy().astype(np.float64)
    lane = np.where(np.asarray([c == COMPUTE for c in cat], dtype=bool), -0.22, 0.22)
    s, e = critical_path_steps(cp["start_ns"].to_numpy() / 1e3, cp["end_ns"].to_numpy() / 1e3)
    y = r + lane
    label = cp["name"].to_pylist()
    via = cp["via"].to_pylist()
    if gap > 0 and len(s) > LABEL_SPANS:
        # merge consecutive steps on one lane closer than the resolution (what a pixel shows)
        brk = np.concatenate([[True], (y[1:] != y[:-1]) | (s[1:] - e[:-1] > gap / 1e3)])
        idx = np.flatnonzero(brk)
        e = np.maximum.reduceat(e, idx)
        s, y = s[idx], y[idx]
        label = [
            label[i] + (f" (+{c - 1} more)" if c > 1 else "")
            for i, c in zip(idx.tolist(), np.diff(np.r_[idx, len(brk)]).tolist(), strict=True)
        ]
        via = [via[i] for i in idx.tolist()]
    xs = np.empty(2 * len(s))
    ys = np.empty(2 * len(s))
    xs[0::2], xs[1::2] = s, e
    ys[0::2], ys[1::2] = y, y
    text = np.empty(2 * len(s), dtype=object)
    text[0::2] = [f"{nm} (via {v})" for nm, v in zip(label, via, strict=True)]
    text[1::2] = label
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="lines",
            name=f"critical path ({cp.num_rows} ops)",
            line={"color": COLORS["critical path"], "width": 2},
            text=text,
            hovertemplate="critical path · rank %{y:.0f} · %{text}<br>%{x:,.1f} µs<extra></extra>",
        )
    )
