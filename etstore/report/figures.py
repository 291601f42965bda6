"""One plotly figure per question, each built from DuckDB for given run (or sweep) ids.

Every function takes a :class:`~etstore.store.warehouse.Warehouse` holding the
metrics tables of :mod:`etstore.app.runs` and returns a :class:`plotly.graph_objects.Figure`, or
``None`` when the runs hold nothing to draw (no collectives, no links, ...).
Times are shown in µs, sizes in bytes (log axes labelled at powers of two), bus bandwidth
in GB/s with GB = 10^9 as nccl-tests prints it (link bandwidths, topology inputs, keep
GB = 2^30). The per-rank timeline is :mod:`etstore.report.gantt`, the link section
:mod:`etstore.report.links`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from etstore.errors import UnknownTraceError
from etstore.report._data import COMPUTE, IDLE, has_table, query, run_infos
from etstore.report._style import (
    COLORS,
    FALLBACK,
    TEMPLATE,
    category_color,
    integer_ticks,
    label_panels,
    panel_titles,
    size_axis,
)
from etstore.store.warehouse import Warehouse

__all__ = [
    "breakdown_figure",
    "collective_busbw_figure",
    "compare_figure",
    "sweep_busbw_figure",
]


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
        subplot_titles=panel_titles(runs),
        horizontal_spacing=0.04,
    )
    label_panels(fig, runs)
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
        fig.update_xaxes(title_text="rank", row=1, col=col, **integer_ticks(int(rank.max(initial=0)) + 1))
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
                marker={
                    "symbol": symbols[run_pos % len(symbols)],
                    "size": 9,
                    "color": category_color(str(c), i),
                },
                hovertemplate="%{x:,} B · busbw %{y:.2f} GB/s<br>%{customdata[0]} instances, "
                "median %{customdata[1]:,.1f} µs<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        template=TEMPLATE,
        title="Collectives in the run(s): bus bandwidth vs size (nccl-tests busbw, GB = 10^9)",
        xaxis=size_axis(t["size_bytes"].to_numpy(), "collective size (bytes)"),
        yaxis={"title": "busbw (GB/s, GB = 10^9)", "rangemode": "tozero"},
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
                    "color": FALLBACK[algorithms.index(k[3]) % len(FALLBACK)]
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
        title="Bus bandwidth vs message size per algorithm and topology (nccl-tests busbw, GB = 10^9)",
        xaxis=size_axis(size, "message size S (bytes)"),
        yaxis={"title": "busbw (GB/s, GB = 10^9)", "rangemode": "tozero"},
        height=460,
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
        xaxis={"title": "rank", **integer_ticks(int(t["rank"].to_numpy().max(initial=0)) + 1)},
        yaxis_title="Δ µs",
        height=420,
    )
    return fig
