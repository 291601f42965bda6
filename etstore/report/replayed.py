"""The report's recorded steps: each replayed run's steps, measured beside simulated.

``etstore replay`` of a stored trace records its run with the steps it compared
(``runs.params`` → ``user.replay``, :meth:`etstore.sim.replay.Replay.to_params`); the report
sets them side by side, with the network the replay ran on, for every such run it shows.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from etstore.report._data import query
from etstore.report._html import table
from etstore.store.warehouse import Warehouse

__all__ = ["replayed_steps", "replayed_steps_html"]


def replayed_steps(warehouse: Warehouse, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """``{run id: its replay's parameters}`` for the runs among ``run_ids`` that replayed a recording."""
    if not run_ids:
        return {}
    t = query(
        warehouse,
        "SELECT run_id, json_extract(params, '$.user.replay') AS replay FROM runs "
        "WHERE list_contains($ids, run_id)",
        {"ids": list(run_ids)},
    )
    out: dict[int, dict[str, Any]] = {}
    for run_id, text in zip(t["run_id"].to_pylist(), t["replay"].to_pylist(), strict=True):
        if text:
            out[int(run_id)] = json.loads(text)
    return out


def replayed_steps_html(warehouse: Warehouse, run_ids: Sequence[int]) -> tuple[str, list[go.Figure]] | None:
    """The section's HTML and one figure per replayed run, or None when no run replayed a recording."""
    found = replayed_steps(warehouse, run_ids)
    if not found:
        return None
    parts: list[str] = []
    figures: list[go.Figure] = []
    for run_id, rep in sorted(found.items()):
        steps = rep.get("steps") or []
        errors = [abs(s["error_pct"]) for s in steps if s.get("error_pct") is not None]
        worst = f"; worst error {max(errors):.1f}%" if errors else ""
        parts.append(
            f'<p class="sub">run {run_id}: replayed with {html.escape(str(rep.get("label", "")))}{worst}</p>'
        )
        rows = [
            [
                s["rank"],
                s["step"],
                f"{s['measured_us']:,.0f}",
                f"{s['simulated_us']:,.1f}",
                None if s["error_pct"] is None else f"{s['error_pct']:+.2f}",
            ]
            for s in steps
        ]
        parts.append(table(["rank", "step", "measured µs", "simulated µs", "error %"], rows, left=2))
        labels = [f"{s['rank']}/{s['step']}" for s in steps]
        fig = go.Figure(
            [
                go.Bar(name="measured", x=labels, y=[s["measured_us"] for s in steps]),
                go.Bar(name="simulated", x=labels, y=[s["simulated_us"] for s in steps]),
            ]
        )
        fig.update_layout(
            title=f"run {run_id}: each rank's step, measured beside simulated",
            barmode="group",
            xaxis_title="rank / step",
            yaxis_title="µs",
        )
        figures.append(fig)
    return "\n".join(parts), figures
