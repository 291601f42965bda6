"""Reports: the simulator's DuckDB metrics as one self-contained HTML file, and the figures in it.

Entry points::

    from etstore.report import write_report
    write_report(store.duck, [run_id], "report.html", sweep_ids=[sweep_id])

Each figure is also a function of its own (``timeline_figure(con, run_id)``, ...)
returning a plotly figure, for notebooks and dashboards.
"""

from __future__ import annotations

from etstore.errors import ReportError
from etstore.report.build import latest_run, opportunities, write_report
from etstore.report.critical import schedule_critical_path
from etstore.report.figures import (
    breakdown_figure,
    collective_busbw_figure,
    compare_figure,
    link_heatmap_figure,
    sweep_busbw_figure,
    timeline_figure,
)

__all__ = [
    "ReportError",
    "breakdown_figure",
    "collective_busbw_figure",
    "compare_figure",
    "latest_run",
    "link_heatmap_figure",
    "opportunities",
    "schedule_critical_path",
    "sweep_busbw_figure",
    "timeline_figure",
    "write_report",
]
