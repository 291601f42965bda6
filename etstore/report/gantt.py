"""The per-rank timeline figure (a Gantt chart of compute, communication and idle) with the critical path.

Runs beyond :data:`DETAIL_OPS` ops are merged in numpy before plotting: intervals
closer than about one pixel become one span, so a 1M-op run draws as fast as a small
one. Times are shown in µs.
"""

from __future__ import annotations

from collections.abc import Callable
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
from etstore.report.critical import critical_path_steps, schedule_critical_path
from etstore.report.lanes import MAX_LANES, LaneSelection, timeline_lanes
from etstore.store.warehouse import Warehouse

__all__ = [
    "DETAIL_OPS",
    "LABEL_SPANS",
    "MAX_LANES",
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
    max_lanes: int = MAX_LANES,
    lanes: LaneSelection | None = None,
) -> go.Figure:
    """Per-rank timeline: compute above, communication below (one colour per collective type), idle between.

    Each rank has two lanes: compute at ``y − 0.22`` and communication at
    ``y + 0.22``; the thin grey line at ``y`` is idle time (neither). ``y`` is the rank
    when every rank is drawn. With ``critical_path`` the schedule's critical path (see
    :func:`~etstore.report.critical.schedule_critical_path`; pass its table to reuse
    one already computed) is drawn over it in black, each step from when the step before it
    ended (see :func:`~etstore.report.critical.critical_path_steps`), so the line only ever
    goes forward in time. Drag to zoom; double-click to reset.

    A run of more than ``max_lanes`` ranks is folded: only the ranks of
    :func:`~etstore.report.lanes.timeline_lanes` are drawn (those nearest the percentiles
    of finish time, the critical path's, and some spread over the finish times), ``y`` is
    the lane's position and its tick reads ``rank · percentile``; the title says how many
    ranks are shown and :meth:`~etstore.report.lanes.LaneSelection.describe` says which.
    Steps of the critical path on ranks not drawn leave a gap in its line.

    Runs with more than ``detail_ops`` ops (on the ranks drawn) are merged per rank and
    category to spans no closer than ``makespan / pixels`` (coarser until at most
    ``max_spans`` spans remain); hover shows how many ops a span holds.

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
    max_lanes
        Ranks drawn at most (two lanes each).
    lanes
        The ranks to draw, from :func:`~etstore.report.lanes.timeline_lanes` (default:
        chosen here with ``max_lanes``).

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
    O(ops log ops) in numpy for the merge, over the ranks drawn; O(path) for the critical path.
    """
    (run,) = run_infos(warehouse, [run_id])
    cp: pa.Table | None = None
    if isinstance(critical_path, pa.Table):
        cp = critical_path
    elif critical_path:
        cp = schedule_critical_path(warehouse, run)
    if lanes is None:
        lanes = timeline_lanes(warehouse, run, cp, max_lanes=max_lanes)
    folded = lanes.folded
    ops = timeline_ops(warehouse, run, lanes.ranks.tolist() if folded else None)
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
    if folded:
        ranks = lanes.ranks
        lane_of = _lane_of(ranks)
    else:
        ranks = np.unique(rank) if len(rank) else np.zeros(0, dtype=np.int64)
        lane_of = None
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
        y = span_rank[sel] if lane_of is None else lane_of(span_rank[sel])
        xs, ys = _segments(spans.start_ns[sel] / 1e3, spans.end_ns[sel] / 1e3, y + lane, xdtype)
        count = spans.ops[sel]
        trace_kw: dict[str, Any] = {}
        if labelled:
            first = op_names.take(pa.array(spans.first[sel])).to_pylist()
            labels = [
                f"{names[k]}: {nm}" if c == 1 else f"{names[k]}: {c} ops from {nm}"
                for nm, c in zip(first, count.tolist(), strict=True)
            ]
            if folded:
                labels = [f"rank {r} · {t}" for r, t in zip(span_rank[sel].tolist(), labels, strict=True)]
            trace_kw = {
                "text": _hover_text(labels),
                "hovertemplate": ("" if folded else "rank %{y:.0f} · ")
                + "%{text}<br>%{x:,.1f} µs<extra></extra>",
            }
        elif folded:
            pair = np.full((3 * len(count), 2), np.nan, dtype=np.float32)
            pair[0::3, 0], pair[1::3, 0] = span_rank[sel], span_rank[sel]
            pair[0::3, 1], pair[1::3, 1] = count, count
            trace_kw = {
                "customdata": pair,
                "hovertemplate": f"rank %{{customdata[0]:.0f}} · {names[k]}: %{{customdata[1]:.0f}} ops"
                "<br>%{x:,.1f} µs<extra></extra>",
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
    idle_y = idle_r if lane_of is None else lane_of(idle_r)
    xs, ys = _segments(idle_s / 1e3, idle_e / 1e3, idle_y.astype(np.float64), xdtype)
    if len(idle_s):
        idle_kw: dict[str, Any] = {"hovertemplate": "rank %{y:.0f} · idle<br>%{x:,.1f} µs<extra></extra>"}
        if folded:
            idle_cd = np.full(3 * len(idle_r), np.nan, dtype=np.float32)
            idle_cd[0::3], idle_cd[1::3] = idle_r, idle_r
            idle_kw = {
                "customdata": idle_cd,
                "hovertemplate": "rank %{customdata:.0f} · idle<br>%{x:,.1f} µs<extra></extra>",
            }
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name=IDLE,
                line={"color": COLORS[IDLE], "width": max(1.5, width / 3)},
                connectgaps=False,
                **idle_kw,
            )
        )
    if cp is not None:
        _add_critical_path(fig, cp, gap, lane_of)
    shown = f" · {nr} of {lanes.total} ranks (percentiles of finish time)" if folded else ""
    yaxis: dict[str, Any] = {"title": "rank", "autorange": "reversed", "zeroline": False}
    if folded:
        yaxis.update(
            title="rank · percentile of finish time",
            tickmode="array",
            tickvals=list(range(nr)),
            ticktext=lanes.tick_labels(),
            tickfont={"size": 10},
        )
    else:
        yaxis["tickvals"] = ranks.tolist() if nr <= 64 else None
    fig.update_layout(
        template=TEMPLATE,
        title={
            "text": f"Timeline · run {run.run_id} · makespan {run.total_ns / 1e3:,.1f} µs"
            + shown
            + ("" if detailed else f" · merged to {gap / 1e3:,.2f} µs spans"),
            "font": {"size": 14},
        },
        height=int(min(2400, max(360, nr * lane_px + 160))),
        xaxis={"title": "simulated time (µs)", "rangemode": "tozero", "showspikes": True},
        yaxis=yaxis,
        dragmode="zoom",
        hovermode="closest",
        # the legend below the axis title, placed in pixels (a fraction of the plot moves with its height)
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        margin={"l": 90 if folded else 60, "r": 20, "t": 50, "b": 110},
    )
    return fig


def _lane_of(ranks: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Rank → its lane, the position in ``ranks`` (the ranks drawn, in lane order); NaN for one not drawn."""
    by_rank = np.argsort(ranks, kind="stable")
    known = ranks[by_rank]

    def lane(r: np.ndarray) -> np.ndarray:
        r = np.asarray(r, dtype=np.int64)
        if len(known) == 0:
            return np.full(len(r), np.nan)
        pos = np.clip(np.searchsorted(known, r), 0, len(known) - 1)
        return np.where(known[pos] == r, by_rank[pos].astype(np.float64), np.nan)

    return lane


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


_NOT_COMPUTE = frozenset(
    {"COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "METADATA_NODE", "INVALID_NODE"}
)


def _add_critical_path(
    fig: go.Figure,
    cp: pa.Table,
    gap: float,
    lane_of: Callable[[np.ndarray], np.ndarray] | None,
) -> None:
    """Draw the critical path as one black polyline over the lanes it crosses (gaps over ranks not drawn)."""
    if cp.num_rows == 0:
        return
    # lane of each path op: compute unless it communicates (or takes no slot), as timeline_ops categorises
    types = cp["type"].to_pylist()
    ranks = cp["rank"].to_numpy().astype(np.int64)
    lane = np.where(np.asarray([t not in _NOT_COMPUTE for t in types], dtype=bool), -0.22, 0.22)
    s, e = critical_path_steps(cp["start_ns"].to_numpy() / 1e3, cp["end_ns"].to_numpy() / 1e3)
    y = (ranks.astype(np.float64) if lane_of is None else lane_of(ranks)) + lane
    label = [f"rank {r} · {nm}" for r, nm in zip(ranks.tolist(), cp["name"].to_pylist(), strict=True)]
    via = cp["via"].to_pylist()
    hidden = int(np.isnan(y).sum())
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
    if hidden:
        # steps on ranks not drawn: one gap (a NaN point) for each run of them
        off = np.isnan(y)
        keep = ~off | np.concatenate([[True], ~off[:-1]])
        s, e, y = s[keep], e[keep], y[keep]
        s[np.isnan(y)] = np.nan
        e[np.isnan(y)] = np.nan
        label = [x for x, k in zip(label, keep.tolist(), strict=True) if k]
        via = [x for x, k in zip(via, keep.tolist(), strict=True) if k]
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
            name=f"critical path ({cp.num_rows} ops" + (f", {hidden} on ranks not drawn)" if hidden else ")"),
            line={"color": COLORS["critical path"], "width": 2},
            text=text,
            hovertemplate="critical path · %{text}<br>%{x:,.1f} µs<extra></extra>",
        )
    )
