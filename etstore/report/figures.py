"""One plotly figure per question, each built from DuckDB for given run (or sweep) ids.

Every function takes a :class:`~etstore.store.warehouse.Warehouse` holding the
metrics tables of :mod:`etstore.sim.metrics` and returns a :class:`plotly.graph_objects.Figure`, or
``None`` when the runs hold nothing to draw (no collectives, no links, ...).
Times are shown in µs, sizes in bytes (log axes), bandwidth in GB/s with GB = 2^30.
Large runs are downsampled in numpy before plotting: intervals closer than about
one pixel merge into one span, so a 1M-op run draws as fast as a small one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
from plotly.subplots import make_subplots

from etstore.errors import UnknownTraceError
from etstore.report._data import (
    COMPUTE,
    IDLE,
    Spans,
    categories,
    has_table,
    merge_spans,
    query,
    run_infos,
    timeline_ops,
)
from etstore.report.critical import schedule_critical_path
from etstore.store.warehouse import Warehouse

__all__ = [
    "breakdown_figure",
    "collective_busbw_figure",
    "compare_figure",
    "link_heatmap_figure",
    "sweep_busbw_figure",
    "timeline_figure",
]

TEMPLATE = "plotly_white"
COLORS = {
    COMPUTE: "#4C78A8",
    "ALL_REDUCE": "#E45756",
    "ALL_GATHER": "#F58518",
    "REDUCE_SCATTER": "#B279A2",
    "ALL_TO_ALL": "#9D755D",
    "send/recv": "#54A24B",
    IDLE: "#D0D0D0",
    "critical path": "#000000",
}
_FALLBACK = ["#72B7B2", "#EECA3B", "#FF9DA6", "#BAB0AC", "#439894"]
# ops in a run up to which every op is drawn on its own (beyond: merged to ~pixel spans)
DETAIL_OPS = 20_000
# horizontal resolution the timeline is merged to, in "pixels" over the makespan
TIMELINE_PX = 2000
# at most this many spans per timeline (resolution coarsens until it fits): ~50 bytes of HTML each
MAX_SPANS = 60_000
# spans (and critical-path steps) up to which each gets a hover label with its op's name
LABEL_SPANS = 5_000


def _color(name: str, k: int) -> str:
    return COLORS.get(name, _FALLBACK[k % len(_FALLBACK)])


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
    one already computed) is drawn over it in black.
    Drag to zoom; double-click to reset.

    Runs with more than ``detail_ops`` ops are merged per rank and category to
    spans no closer than ``makespan / pixels`` (coarser until at most ``max_spans``
    spans remain); hover shows how many ops a span holds.

    Raises
    ------
    UnknownTraceError
        No such run.
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
                line={"color": _color(names[k], k), "width": width},
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
            "title": "rank (compute ▲ / communication ▼)",
            "autorange": "reversed",
            "tickvals": ranks.tolist() if nr <= 64 else None,
            "zeroline": False,
        },
        dragmode="zoom",
        hovermode="closest",
        legend={"orientation": "h", "y": -0.08, "yanchor": "top", "x": 0},
        margin={"l": 60, "r": 20, "t": 50, "b": 90},
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


def _add_critical_path(fig: go.Figure, cp: pa.Table, ops: pa.Table, gap: float) -> None:
    """Draw the critical path as one black polyline over the lanes it crosses."""
    if cp.num_rows == 0:
        return
    # lane of each path op: compute unless its category is communication (both in (rank, id) order)
    cat = ops["category"].take(cp["row"]).to_pylist()
    r = cp["rank"].to_numpy().astype(np.float64)
    lane = np.where(np.asarray([c == COMPUTE for c in cat], dtype=bool), -0.22, 0.22)
    s = cp["start_ns"].to_numpy() / 1e3
    e = cp["end_ns"].to_numpy() / 1e3
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
            f"{label[i]} (+{c - 1} more)"
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


def breakdown_figure(warehouse: Warehouse, run_ids: Sequence[int]) -> go.Figure:
    """Per rank, stacked compute / exposed communication / idle (= the rank's finish time), one panel per run.

    Diamonds mark communication hidden under compute (``overlap_ns``). Panels share
    the y axis so runs compare at a glance.
    """
    runs = run_infos(warehouse, run_ids)
    t = query(
        warehouse,
        "SELECT run_id, rank, compute_ns, exposed_comm_ns, idle_ns, overlap_ns, total_ns FROM rank_breakdown "
        "WHERE list_contains($ids, run_id) ORDER BY run_id, rank",
        {"ids": [r.run_id for r in runs]},
    )
    fig = make_subplots(
        rows=1,
        cols=len(runs),
        shared_yaxes=True,
        subplot_titles=[r.label for r in runs],
        horizontal_spacing=0.04,
    )
    rid = t["run_id"].to_numpy()
    for col, run in enumerate(runs, start=1):
        sel = rid == run.run_id
        rank = t["rank"].to_numpy()[sel]
        for key, name, color in (
            ("compute_ns", COMPUTE, COLORS[COMPUTE]),
            ("exposed_comm_ns", "exposed communication", COLORS["ALL_REDUCE"]),
            ("idle_ns", IDLE, "#A0A0A0"),
        ):
            fig.add_trace(
                go.Bar(
                    x=rank,
                    y=t[key].to_numpy()[sel] / 1e3,
                    name=name,
                    marker_color=color,
                    legendgroup=name,
                    showlegend=col == 1,
                    hovertemplate=f"rank %{{x}} · {name}: %{{y:,.1f}} µs<extra>run {run.run_id}</extra>",
                ),
                row=1,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=rank,
                y=t["overlap_ns"].to_numpy()[sel] / 1e3,
                mode="markers",
                name="communication hidden under compute",
                marker={"symbol": "diamond", "color": "#222222", "size": 7},
                legendgroup="overlap",
                showlegend=col == 1,
                hovertemplate="rank %{x} · hidden comm: %{y:,.1f} µs<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="rank", row=1, col=col)
    fig.update_layout(
        template=TEMPLATE,
        barmode="stack",
        title="Per-rank breakdown (compute + exposed communication + idle = finish time)",
        yaxis_title="µs",
        height=420,
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def collective_busbw_figure(warehouse: Warehouse, run_ids: Sequence[int]) -> go.Figure | None:
    """Bus bandwidth of the runs' collective instances vs message size, per type and algorithm.

    Points are the median over instances of one size, bars span min to max.
    """
    runs = run_infos(warehouse, run_ids)
    t = query(
        warehouse,
        """SELECT run_id, comm_type, algorithm, size_bytes, median(busbw_gb_per_s) AS busbw,
            min(busbw_gb_per_s) AS lo, max(busbw_gb_per_s) AS hi, count(*) AS n, median(time_ns) AS time_ns
        FROM collectives WHERE list_contains($ids, run_id) AND busbw_gb_per_s IS NOT NULL AND size_bytes > 0
        GROUP BY ALL ORDER BY run_id, comm_type, algorithm, size_bytes""",
        {"ids": [r.run_id for r in runs]},
    )
    if t.num_rows == 0:
        return None
    fig = go.Figure()
    symbols = ["circle", "square", "diamond", "triangle-up", "x"]
    keys = t.select(["run_id", "comm_type", "algorithm"]).to_pylist()
    seen: list[tuple[Any, ...]] = []
    for key in keys:
        k = (key["run_id"], key["comm_type"], key["algorithm"])
        if k not in seen:
            seen.append(k)
    rid = t["run_id"].to_numpy()
    ct = np.asarray(t["comm_type"].to_pylist(), dtype=object)
    alg = np.asarray(t["algorithm"].to_pylist(), dtype=object)
    for i, (r, c, a) in enumerate(seen):
        sel = (rid == r) & (ct == c) & (alg == a)
        y = t["busbw"].to_numpy()[sel]
        run_pos = [x.run_id for x in runs].index(r)
        fig.add_trace(
            go.Scatter(
                x=t["size_bytes"].to_numpy()[sel],
                y=y,
                customdata=np.stack([t["n"].to_numpy()[sel], t["time_ns"].to_numpy()[sel] / 1e3], axis=1),
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": t["hi"].to_numpy()[sel] - y,
                    "arrayminus": y - t["lo"].to_numpy()[sel],
                },
                mode="lines+markers",
                name=f"run {r} · {c} · {a}",
                marker={"symbol": symbols[run_pos % len(symbols)], "size": 9, "color": _color(str(c), i)},
                hovertemplate="%{x:,} B · busbw %{y:.2f} GB/s<br>%{customdata[0]} instances, "
                "median %{customdata[1]:,.1f} µs<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        template=TEMPLATE,
        title="Collectives in the run(s): bus bandwidth vs size (nccl-tests busbw, GB = 2^30)",
        xaxis={"title": "collective size (bytes)", "type": "log"},
        yaxis={"title": "busbw (GB/s)", "rangemode": "tozero"},
        height=420,
    )
    return fig


def sweep_busbw_figure(warehouse: Warehouse, sweep_ids: Sequence[int]) -> go.Figure | None:
    """Bus-bandwidth curves of sweeps: busbw vs size, a line per topology × algorithm (× collective...).

    Raises
    ------
    UnknownTraceError
        A sweep id has no points.
    """
    if not sweep_ids:
        return None
    if not has_table(warehouse, "sweep_points"):
        raise UnknownTraceError(f"no sweep {sweep_ids[0]}: no sweeps are recorded")
    ids = [int(s) for s in sweep_ids]
    t = query(
        warehouse,
        """SELECT sweep_id, topology, collective, algorithm, congestion, size_bytes, busbw_gb_per_s, time_ns
        FROM sweep_points WHERE list_contains($ids, sweep_id)
        ORDER BY sweep_id, topology, collective, algorithm, congestion, size_bytes""",
        {"ids": ids},
    )
    have = set(t["sweep_id"].to_pylist())
    for s in ids:
        if s not in have:
            raise UnknownTraceError(f"no sweep {s} in sweep_points")
    fig = go.Figure()
    cols = ["sweep_id", "topology", "collective", "algorithm", "congestion"]
    key_rows = t.select(cols).to_pylist()
    keys = list(dict.fromkeys(tuple(r[c] for c in cols) for r in key_rows))
    topologies = list(dict.fromkeys(k[1] for k in keys))
    algorithms = list(dict.fromkeys(k[3] for k in keys))
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    row_keys = [tuple(r[c] for c in cols) for r in key_rows]
    size = t["size_bytes"].to_numpy()
    bw = t["busbw_gb_per_s"].to_numpy()
    tns = t["time_ns"].to_numpy()
    for k in keys:
        sel = np.array([rk == k for rk in row_keys])
        name = f"{k[1]} · {k[3]}" + (f" · {k[2]}" if len({x[2] for x in keys}) > 1 else "")
        name += f" · {k[4]}" if len({x[4] for x in keys}) > 1 else ""
        name += f" (sweep {k[0]})" if len(ids) > 1 else ""
        fig.add_trace(
            go.Scatter(
                x=size[sel],
                y=bw[sel],
                customdata=tns[sel] / 1e3,
                mode="lines+markers",
                name=name,
                line={
                    "color": _FALLBACK[algorithms.index(k[3]) % len(_FALLBACK)]
                    if len(algorithms) > 1
                    else None,
                    "dash": dashes[topologies.index(k[1]) % len(dashes)],
                },
                hovertemplate="%{x:,} B · busbw %{y:.2f} GB/s · %{customdata:,.1f} µs"
                "<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        template=TEMPLATE,
        title="Bus bandwidth vs message size per algorithm and topology (nccl-tests busbw, GB = 2^30)",
        xaxis={"title": "message size S (bytes)", "type": "log"},
        yaxis={"title": "busbw (GB/s)", "rangemode": "tozero"},
        height=460,
    )
    return fig


def link_heatmap_figure(warehouse: Warehouse, run_ids: Sequence[int]) -> go.Figure | None:
    """Link utilization (busy / makespan) as an NPU × NPU heatmap, source rows, destination columns, per run.

    Congestion-unaware runs show the load offered, which may exceed 100%. Cells
    without a link are blank; one colour scale spans all panels.
    """
    runs = run_infos(warehouse, run_ids)
    t = query(
        warehouse,
        "SELECT run_id, src, dst, utilization, bytes, busy_ns FROM link_util "
        "WHERE list_contains($ids, run_id)",
        {"ids": [r.run_id for r in runs]},
    )
    if t.num_rows == 0:
        return None
    rid = t["run_id"].to_numpy()
    src = t["src"].to_numpy().astype(np.int64)
    dst = t["dst"].to_numpy().astype(np.int64)
    util = t["utilization"].to_numpy()
    mib = t["bytes"].to_numpy() / 2**20
    n = int(max(src.max(), dst.max()) + 1)
    zmax = float(np.nanmax(util)) if len(util) else 1.0
    fig = make_subplots(
        rows=1, cols=len(runs), subplot_titles=[r.label for r in runs], horizontal_spacing=0.06
    )
    for col, run in enumerate(runs, start=1):
        sel = rid == run.run_id
        z = np.full((n, n), np.nan)
        z[src[sel], dst[sel]] = util[sel] * 100
        m = np.full((n, n), np.nan)
        m[src[sel], dst[sel]] = mib[sel]
        fig.add_trace(
            go.Heatmap(
                z=z,
                customdata=m,
                coloraxis="coloraxis",
                hovertemplate="link %{y} → %{x}<br>utilization %{z:.1f}%<br>%{customdata:,.2f} MiB"
                "<extra></extra>",
                xgap=1,
                ygap=1,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="destination NPU", row=1, col=col, constrain="domain")
        fig.update_yaxes(
            title_text="source NPU",
            autorange="reversed",
            row=1,
            col=col,
            scaleanchor=f"x{col if col > 1 else ''}",
        )
    fig.update_layout(
        template=TEMPLATE,
        title="Link utilization over the topology (busy time / makespan, %)",
        coloraxis={
            "colorscale": "YlOrRd",
            "cmin": 0,
            "cmax": max(zmax * 100, 1e-9),
            "colorbar": {"title": "%"},
        },
        height=520 if len(runs) == 1 else 480,
    )
    return fig


def compare_figure(warehouse: Warehouse, run_ids: Sequence[int]) -> go.Figure | None:
    """Per-rank differences against the first run: Δ finish time, Δ exposed communication, Δ idle (µs)."""
    runs = run_infos(warehouse, run_ids)
    if len(runs) < 2:
        return None
    base = runs[0]
    t = query(
        warehouse,
        """SELECT b.run_id, b.rank, b.total_ns - a.total_ns AS d_total,
            b.exposed_comm_ns - a.exposed_comm_ns AS d_exposed,
            b.idle_ns - a.idle_ns AS d_idle, b.compute_ns - a.compute_ns AS d_compute
        FROM rank_breakdown b JOIN rank_breakdown a ON a.rank = b.rank AND a.run_id = $base
        WHERE list_contains($ids, b.run_id) ORDER BY b.run_id, b.rank""",
        {"base": base.run_id, "ids": [r.run_id for r in runs[1:]]},
    )
    fig = go.Figure()
    rid = t["run_id"].to_numpy()
    for run in runs[1:]:
        sel = rid == run.run_id
        for key, name, color in (
            ("d_total", "Δ finish time", "#333333"),
            ("d_exposed", "Δ exposed communication", COLORS["ALL_REDUCE"]),
            ("d_idle", "Δ idle", "#A0A0A0"),
            ("d_compute", "Δ compute", COLORS[COMPUTE]),
        ):
            fig.add_trace(
                go.Bar(
                    x=t["rank"].to_numpy()[sel],
                    y=t[key].to_numpy()[sel] / 1e3,
                    name=f"{name} (run {run.run_id} − run {base.run_id})",
                    marker_color=color,
                    hovertemplate="rank %{x} · %{y:+,.1f} µs<extra>%{fullData.name}</extra>",
                )
            )
    fig.update_layout(
        template=TEMPLATE,
        barmode="group",
        title=f"Per-rank differences against run {base.run_id} (negative = faster)",
        xaxis_title="rank",
        yaxis_title="Δ µs",
        height=420,
    )
    return fig
