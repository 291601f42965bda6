"""Reports: the simulator's metrics in the warehouse as one self-contained HTML file, and its figures.

Entry points::

    from etstore.report import write_report
    write_report(store.warehouse, [run_id], "report.html", sweep_ids=[sweep_id])
    write_report("warehouse.duckdb", [run_id], "report.html")  # a metrics file, read-only

Each figure is also a function of its own (``timeline_figure(warehouse, run_id)``, ...)
returning a plotly figure, for notebooks and dashboards.
"""

from __future__ import annotations

from etstore.errors import ReportError
from etstore.report.build import latest_run, write_report
from etstore.report.critical import schedule_critical_path
from etstore.report.figures import (
    breakdown_figure,
    collective_busbw_figure,
    compare_figure,
    sweep_busbw_figure,
)
from etstore.report.gantt import critical_path_steps, timeline_figure
from etstore.report.lanes import LaneSelection, select_lanes, timeline_lanes
from etstore.report.links import hottest_links, link_heatmap_figure
from etstore.report.opportunity_table import opportunities
from etstore.report.sensitivity import sensitivity_figure

__all__ = [
    "LaneSelection",
    "ReportError",
    "breakdown_figure",
    "collective_busbw_figure",
    "compare_figure",
    "critical_path_steps",
    "hottest_links",
    "latest_run",
    "link_heatmap_figure",
    "opportunities",
    "schedule_critical_path",
    "select_lanes",
    "sensitivity_figure",
    "sweep_busbw_figure",
    "timeline_figure",
    "timeline_lanes",
    "write_report",
]
