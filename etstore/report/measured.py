"""The report's measured-vs-simulated figure: bus bandwidth of nccl-tests runs beside the simulator's.

Drawn from ``v_measured_vs_sim`` (per calibration: measured points, the simulated curve
before the fit dotted and named by the start spec, after it solid and named by the
fitted spec) or, in a warehouse with measured runs but no calibration, from
``measurements`` alone. Bandwidth is GB/s with GB = 10^9,
as nccl-tests prints it, so the measured points are the logs' own busbw.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from etstore.report._data import has_table, query
from etstore.report._style import size_axis
from etstore.store.warehouse import Warehouse

__all__ = ["MEASURED_LINES", "measured_busbw_figures"]

MEASURED_LINES = 8
"""Calibrations (or measured runs) drawn at most, the most recent first."""

_COLORS = ["#4C78A8", "#E45756", "#54A24B", "#F58518", "#B279A2", "#72B7B2", "#9D755D", "#EECA3B"]
_HOVER = "%{x:,} B · busbw %{y:.2f} GB/s · %{customdata:,.1f} µs<extra>%{fullData.name}</extra>"


def measured_busbw_figures(warehouse: Warehouse) -> list[go.Figure]:
    """The measured-vs-simulated busbw figure, or the measured curves alone; empty when neither.

    Parameters
    ----------
    warehouse
        A warehouse (read-only is fine; tables absent from an older store count as empty).

    Returns
    -------
    list of plotly.graph_objects.Figure
        At most one figure: busbw (GB/s, GB = 10^9) vs size (bytes, log axis).

    Notes
    -----
    One query over at most :data:`MEASURED_LINES` calibrations or runs; O(their points).
    """
    if has_table(warehouse, "v_measured_vs_sim"):
        fig = _calibrations_figure(warehouse)
        if fig is not None:
            return [fig]
    if has_table(warehouse, "measurements"):
        fig = _measured_figure(warehouse)
        if fig is not None:
            return [fig]
    return []


def _calibrations_figure(warehouse: Warehouse) -> go.Figure | None:
    """Per calibration: measured markers, simulated on the start spec (dotted) and the fitted one (solid)."""
    t = query(
        warehouse,
        """SELECT v.*, c.start_spec FROM v_measured_vs_sim v
        JOIN (SELECT calibration_id, start_spec FROM calibrations ORDER BY calibration_id DESC LIMIT $n) c
            USING (calibration_id)
        ORDER BY calibration_id, size_bytes""",
        {"n": MEASURED_LINES},
    )
    if t.num_rows == 0:
        return None
    fig = go.Figure()
    ids = t["calibration_id"].to_numpy()
    size = t["size_bytes"].to_numpy()
    for i, cid in enumerate(dict.fromkeys(ids.tolist())):
        sel = ids == cid
        name = t["calibration"].filter(sel)[0].as_py()
        algorithm = t["algorithm"].filter(sel)[0].as_py()
        start, fitted = t["start_spec"].filter(sel)[0].as_py(), t["spec"].filter(sel)[0].as_py()
        color = _COLORS[i % len(_COLORS)]
        # each simulated curve is named by the spec it was simulated on: the start, then the fit
        for column, time_col, label, what, style in (
            ("measured_busbw_gb_per_s", "measured_time_us", name, "measured", {"mode": "markers"}),
            (
                "sim_before_busbw_gb_per_s",
                "sim_before_time_us",
                f"{name} ({algorithm} on {start or '?'})",
                "before fit",
                {"mode": "lines"},
            ),
            (
                "sim_after_busbw_gb_per_s",
                "sim_after_time_us",
                f"{name} ({algorithm} on {fitted})",
                "after fit",
                {"mode": "lines"},
            ),
        ):
            dash = "dot" if what == "before fit" else "solid"
            fig.add_trace(
                go.Scatter(
                    x=size[sel],
                    y=t[column].to_numpy()[sel],
                    customdata=t[time_col].to_numpy()[sel],
                    name=f"{label} · {what}",
                    legendgroup=str(cid),
                    line={"color": color, "dash": dash},
                    marker={"color": color, "size": 7},
                    hovertemplate=_HOVER,
                    **style,
                )
            )
    _layout(fig, "Measured vs simulated bus bandwidth per calibration (nccl-tests busbw, GB = 10^9)", size)
    return fig


def _measured_figure(warehouse: Warehouse) -> go.Figure | None:
    """Per measured run: its out-of-place busbw curve (in-place when it has nothing else)."""
    t = query(
        warehouse,
        """WITH runs AS (SELECT run_id, name FROM measured_runs ORDER BY run_id DESC LIMIT $n),
        rows AS (SELECT m.run_id, r.name, m.in_place, m.size_bytes, avg(m.busbw_gb_per_s) AS busbw,
                        avg(m.time_us) AS time_us
                 FROM measurements m JOIN runs r USING (run_id)
                 WHERE m.size_bytes > 0 AND m.busbw_gb_per_s IS NOT NULL GROUP BY ALL)
        SELECT * FROM rows
        QUALIFY in_place = min(in_place) OVER (PARTITION BY run_id)
        ORDER BY run_id, size_bytes""",
        {"n": MEASURED_LINES},
    )
    if t.num_rows == 0:
        return None
    fig = go.Figure()
    ids = t["run_id"].to_numpy()
    for i, rid in enumerate(dict.fromkeys(ids.tolist())):
        sel = ids == rid
        fig.add_trace(
            go.Scatter(
                x=t["size_bytes"].to_numpy()[sel],
                y=t["busbw"].to_numpy()[sel],
                customdata=np.asarray(t["time_us"].to_numpy())[sel],
                mode="lines+markers",
                name=f"{t['name'].filter(sel)[0].as_py()} · measured",
                line={"color": _COLORS[i % len(_COLORS)]},
                hovertemplate=_HOVER,
            )
        )
    _layout(
        fig,
        "Measured bus bandwidth (nccl-tests busbw, GB = 10^9; calibrate a run to compare)",
        t["size_bytes"].to_numpy(),
    )
    return fig


def _layout(fig: go.Figure, title: str, sizes: np.ndarray) -> None:
    fig.update_layout(
        template="plotly_white",
        title=title,
        xaxis=size_axis(sizes, "message size S"),
        yaxis={"title": "bus bandwidth (GB/s, GB = 10^9)", "rangemode": "tozero"},
        height=480,
        legend={"font": {"size": 11}},
    )
