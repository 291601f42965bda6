"""One self-contained HTML report from the warehouse's metrics (plotly.js inlined once, opens offline)."""

from __future__ import annotations

import html
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pyarrow as pa
from plotly.offline import get_plotlyjs

from etstore import __version__
from etstore.errors import ReportError
from etstore.report._data import RunInfo, has_table, metrics_warehouse, query, run_infos
from etstore.report._html import Raw, fmt_ns, table
from etstore.report.critical import schedule_critical_path
from etstore.report.figures import (
    breakdown_figure,
    collective_busbw_figure,
    compare_figure,
    sweep_busbw_figure,
)
from etstore.report.gantt import timeline_figure
from etstore.report.lanes import timeline_lanes
from etstore.report.links import hottest_links_html, link_heatmap_figure
from etstore.report.measured import measured_busbw_figures
from etstore.report.opportunity_table import opportunities_html
from etstore.report.replayed import replayed_steps_html
from etstore.report.sensitivity import sensitivity_figure, sensitivity_html
from etstore.store.warehouse import Warehouse

__all__ = ["ReportError", "latest_run", "write_report"]

log = logging.getLogger(__name__)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1800px;
padding:0 24px 48px;color:#222}
h1{font-size:1.5em;margin:20px 0 4px}h2{font-size:1.2em;margin:32px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666;margin:0 0 12px}.row{display:grid;gap:16px}.cols1{grid-template-columns:1fr}
.cols2{grid-template-columns:1fr 1fr}.fig{min-width:0}
.tbl{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:.9em;margin:8px 0}
th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6}td.l,th.l{text-align:left}.note{color:#666;font-style:italic}
.better{color:#1a7f37}.worse{color:#c62828}
"""


class _Page:
    """Collects sections and figures; every figure becomes a div plus one ``Plotly.newPlot`` call."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.figures = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def figure(self, fig: go.Figure) -> str:
        self.figures += 1
        return pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=f"etstore-fig-{self.figures}",
            config={"displaylogo": False, "scrollZoom": True, "responsive": True},
            default_width="100%",
            default_height=f"{int(fig.layout.height or 450)}px",
        )

    def figures_row(self, figs: Sequence[go.Figure]) -> None:
        cols = "cols2" if len(figs) == 2 else "cols1"
        self.add(
            f'<div class="row {cols}">'
            + "".join(f'<div class="fig">{self.figure(f)}</div>' for f in figs)
            + "</div>"
        )


def latest_run(warehouse: Warehouse) -> int:
    """The largest run id (the most recent run).

    Raises
    ------
    ReportError
        No run is recorded.
    """
    if not has_table(warehouse, "runs"):
        raise ReportError("no runs are recorded: simulate a trace and record it first")
    v = query(warehouse, "SELECT max(run_id) AS r FROM runs")["r"][0].as_py()
    if v is None:
        raise ReportError("no runs are recorded: simulate a trace and record it first")
    return int(v)


def _summary(page: _Page, runs: Sequence[RunInfo], warehouse: Warehouse) -> None:
    stats = query(
        warehouse,
        """SELECT run_id, avg(exposed_comm_ns) AS exposed, max(exposed_comm_ns) AS max_exposed,
            avg(idle_ns) AS idle,
            avg(compute_ns) AS compute, avg(overlap_ns) AS overlap FROM rank_breakdown
        WHERE list_contains($ids, run_id) GROUP BY run_id""",
        {"ids": [r.run_id for r in runs]},
    ).to_pylist()
    by = {s["run_id"]: s for s in stats}
    rows = []
    for r in runs:
        s = by.get(r.run_id, {})
        rows.append(
            [
                r.run_id,
                r.trace,
                Raw(html.escape(r.topology).replace(",", ",<wbr>")),  # a long spec wraps at its commas
                r.congestion,
                r.scheduling_policy,
                r.num_npus,
                f"{r.num_ops:,}",
                f"{r.events:,}",
                fmt_ns(r.total_ns),
                fmt_ns(s.get("compute")),
                fmt_ns(s.get("exposed")),
                fmt_ns(s.get("idle")),
            ]
        )
    page.add(
        table(
            [
                "run",
                "trace",
                "topology",
                "congestion",
                "policy",
                "NPUs",
                "ops",
                "events",
                "makespan",
                "mean compute",
                "mean exposed comm",
                "mean idle",
            ],
            rows,
            left=5,
        )
    )


def _differences(page: _Page, runs: Sequence[RunInfo], warehouse: Warehouse) -> None:
    """Headline metrics of each run against the first, with Δ and Δ%."""
    ids = [r.run_id for r in runs]
    t = query(
        warehouse,
        """WITH b AS (SELECT run_id, avg(exposed_comm_ns) AS exposed, max(exposed_comm_ns) AS max_exposed,
                avg(idle_ns) AS idle, avg(overlap_ns) AS hidden FROM rank_breakdown GROUP BY run_id),
            c AS (SELECT run_id, avg(busbw_gb_per_s) AS busbw, sum(time_ns) AS coll_time FROM collectives
                GROUP BY run_id),
            l AS (SELECT run_id, max(utilization) AS max_util, sum(bytes) AS bytes FROM link_util
                GROUP BY run_id)
        SELECT r.run_id, r.total_ns, b.exposed, b.max_exposed, b.idle, b.hidden, c.busbw, c.coll_time,
            l.max_util, l.bytes, r.events
        FROM runs r LEFT JOIN b USING (run_id) LEFT JOIN c USING (run_id) LEFT JOIN l USING (run_id)
        WHERE list_contains($ids, r.run_id)""",
        {"ids": ids},
    ).to_pylist()
    by = {row["run_id"]: row for row in t}
    metrics = [
        ("makespan", "total_ns", fmt_ns, False),
        ("mean exposed communication per rank", "exposed", fmt_ns, False),
        ("max exposed communication of a rank", "max_exposed", fmt_ns, False),
        ("mean idle per rank", "idle", fmt_ns, False),
        ("mean communication hidden under compute", "hidden", fmt_ns, True),
        ("mean collective busbw (GB/s)", "busbw", lambda v: "–" if v is None else f"{v:,.2f}", True),
        ("max link utilization", "max_util", lambda v: "–" if v is None else f"{v * 100:,.1f}%", False),
        ("bytes over links (MiB)", "bytes", lambda v: "–" if v is None else f"{v / 2**20:,.1f}", False),
        ("events", "events", lambda v: "–" if v is None else f"{v:,}", False),
    ]
    base = by[ids[0]]
    header = ["metric", f"run {ids[0]}"]
    for r in ids[1:]:
        header += [f"run {r}", "Δ", "Δ%"]
    rows = []
    for label, key, fmt, higher_is_better in metrics:
        row: list[Any] = [label, fmt(base.get(key))]
        a = base.get(key)
        for r in ids[1:]:
            b = by[r].get(key)
            row.append(fmt(b))
            if a is None or b is None:
                row += ["–", "–"]
                continue
            d = b - a
            better = (d > 0) == higher_is_better if d != 0 else None
            cls = "" if better is None or key == "events" else ("better" if better else "worse")
            delta = fmt(d) if fmt is not fmt_ns else fmt_ns(d)
            if key == "max_util":
                delta = f"{d * 100:+,.1f} pt"
            elif key in ("busbw", "bytes", "events") or fmt is fmt_ns:
                delta = ("+" if d > 0 else "") + delta
            pct = f"{d / a * 100:+,.1f}%" if a else "–"
            row += [
                Raw(f'<span class="{cls}">{html.escape(delta)}</span>'),
                Raw(f'<span class="{cls}">{pct}</span>'),
            ]
        rows.append(row)
    page.add(table(header, rows))


def _critical_section(page: _Page, runs: Sequence[RunInfo], paths: dict[int, pa.Table]) -> None:
    rows = []
    for r in runs:
        cp = paths[r.run_id]
        if cp.num_rows == 0:
            rows.append([r.run_id, 0, "–", "–", "–", "–", "–"])
            continue
        dur = cp["end_ns"].to_numpy() - cp["start_ns"].to_numpy()
        comm = np.asarray([str(t).startswith("COMM_") for t in cp["type"].to_pylist()], dtype=bool)
        via = cp["via"].to_pylist()
        end = float(cp["end_ns"][cp.num_rows - 1].as_py())
        compute = float(dur[~comm].sum())
        rows.append(
            [
                r.run_id,
                f"{cp.num_rows:,}",
                len(set(cp["rank"].to_pylist())),
                fmt_ns(end),
                f"{int((~comm).sum()):,} ({fmt_ns(compute)}, {compute / end * 100 if end else 0:.0f}%)",
                f"{int(comm.sum()):,}",
                f"{via.count('msg')} messages, {via.count('peer')} collective peers",
            ]
        )
    page.add(
        '<p class="sub">The chain of constraints that set the makespan, walked back from the op that ends '
        "last (black on the timelines): a receive that waited for its message continues at the send, a "
        "collective that waited for a late member continues at that member, otherwise at the dependency "
        "or slot that released the op last. Compute on the path is what faster kernels shorten; the rest "
        "is communication and waiting.</p>"
    )
    page.add(
        table(
            [
                "run",
                "ops on path",
                "ranks",
                "ends at",
                "compute ops (time, share)",
                "communication ops",
                "cross-rank steps",
            ],
            rows,
            left=1,
        )
    )


def write_report(
    source: Warehouse | str | os.PathLike[str],
    run_ids: Sequence[int],
    out: str | os.PathLike[str],
    *,
    sweep_ids: Sequence[int] = (),
    title: str | None = None,
    critical_path: bool = True,
) -> Path:
    """Write one self-contained HTML report (opens offline, no server) for runs and sweeps.

    Sections: a summary of the runs; for runs of a sensitivity sweep, the makespan
    against the knob's values; with two or more runs, their differences
    against the first; per-rank timelines side by side (compute / communication /
    idle, collectives by type, the critical path in black, zoomable); per-rank
    breakdown bars; bus bandwidth vs size of the runs' collectives and of the
    sweeps' curves; the hottest links and the link-utilization heatmap; the critical
    path; the recorded overlap/reorder opportunities. A run of more than
    :data:`~etstore.report.lanes.MAX_LANES` ranks has a timeline of that many ranks
    (nearest the percentiles of finish time, the critical path's, spread), named above
    it; beyond :data:`~etstore.report.links.HEATMAP_NPUS` NPUs the heatmap is of groups
    of NPUs. Tables wider than the page scroll sideways.

    Parameters
    ----------
    source
        The warehouse holding the metrics (``store.warehouse``), or the path of a
        DuckDB metrics file (opened read-only for the call).
    run_ids
        Runs to show (``runs.run_id``), compared against the first.
    out
        Output file; its directory must exist.
    sweep_ids
        Sweeps (``sweep_points.sweep_id``) for the bandwidth-curve figure.
    title
        Page title (default: names the runs).
    critical_path
        Draw the schedule's critical path on the timelines.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ReportError
        No run ids, no metrics in the database, a metrics file that cannot be opened,
        or ``out`` cannot be written.
    UnknownTraceError
        A run or sweep id is not recorded.

    Notes
    -----
    O(ops) per run in DuckDB and numpy; timelines of runs beyond
    :data:`~etstore.report.gantt.DETAIL_OPS` ops are merged to about one span per
    pixel, so a 64-rank, 1M-op run stays well under 10 s and 20 MB.
    """
    started = time.perf_counter()
    out_path = Path(out)
    if out_path.is_dir():
        raise ReportError(f"{out_path}: is a directory; give a file name such as {out_path / 'report.html'}")
    if not out_path.parent.exists():
        raise ReportError(f"{out_path}: directory {out_path.parent} does not exist")
    with metrics_warehouse(source) as warehouse:
        if not run_ids and sweep_ids:  # bandwidth curves alone
            page, heading = _sweep_page(warehouse, list(sweep_ids), title=title)
        else:
            page, heading = _runs_page(
                warehouse, run_ids, sweep_ids=sweep_ids, title=title, critical_path=critical_path
            )
    return _write(page, heading, out_path, started)


def _runs_page(
    warehouse: Warehouse,
    run_ids: Sequence[int],
    *,
    sweep_ids: Sequence[int],
    title: str | None,
    critical_path: bool,
) -> tuple[_Page, str]:
    """The report of runs (and sweeps): the page and its heading."""
    runs = run_infos(warehouse, run_ids)
    page = _Page()
    heading = title or (
        f"etstore report: {runs[0].label}"
        if len(runs) == 1
        else "etstore report: " + " vs ".join(f"run {r.run_id}" for r in runs)
    )
    page.add(f"<h1>{html.escape(heading)}</h1>")
    page.add(
        f'<p class="sub">etstore {html.escape(__version__)} · times in simulated ns/µs/ms · bandwidth '
        "GB/s with GB = 10^9 (nccl-tests busbw) · drag to zoom, double-click to reset</p>"
    )
    _summary(page, runs, warehouse)
    replayed = replayed_steps_html(warehouse, [r.run_id for r in runs])
    if replayed is not None:  # runs of recorded steps: measured beside simulated
        page.add("<h2>Recorded steps: measured beside simulated</h2>")
        page.add(replayed[0])
        for fig in replayed[1]:
            page.figures_row([fig])
    _sensitivity_section(page, runs, warehouse)
    if len(runs) >= 2:
        page.add("<h2>Differences</h2>")
        _differences(page, runs, warehouse)
        diff = compare_figure(warehouse, [r.run_id for r in runs])
        if diff is not None:
            page.figures_row([diff])
    page.add("<h2>Timeline</h2>")
    page.add(
        '<p class="sub">Each rank has two lanes: compute above, communication below (a colour per '
        "collective type), idle time as the thin grey line between; the critical path in black.</p>"
    )
    paths = {r.run_id: schedule_critical_path(warehouse, r) for r in runs}
    lanes = {r.run_id: timeline_lanes(warehouse, r, paths[r.run_id]) for r in runs}
    for r in runs:
        if lanes[r.run_id].folded:
            page.add(f'<p class="sub lanes">Run {r.run_id}: {html.escape(lanes[r.run_id].describe())}</p>')
    timelines = [
        timeline_figure(
            warehouse,
            r.run_id,
            critical_path=paths[r.run_id] if critical_path else False,
            lanes=lanes[r.run_id],
        )
        for r in runs
    ]
    for k in range(0, len(timelines), 2):
        page.figures_row(timelines[k : k + 2])
    page.add("<h2>Per-rank breakdown</h2>")
    page.figures_row([breakdown_figure(warehouse, [r.run_id for r in runs])])
    page.add("<h2>Bus bandwidth</h2>")
    _bandwidth_section(page, runs, sweep_ids, warehouse)
    for fig in measured_busbw_figures(warehouse):  # nccl-tests runs and calibrations, when stored
        page.figures_row([fig])
    page.add("<h2>Link utilization</h2>")
    hot = hottest_links_html(warehouse, runs)
    links = link_heatmap_figure(warehouse, [r.run_id for r in runs])
    if links is not None:
        page.add(hot)
        page.figures_row([links])
    else:
        page.add('<p class="note">No link traffic was recorded for these runs.</p>')
    page.add("<h2>Critical path</h2>")
    _critical_section(page, runs, paths)
    page.add('<section id="opportunities"><h2>Overlap and reorder opportunities</h2>')
    page.add(opportunities_html(warehouse, [r.trace for r in runs]))
    page.add("</section>")
    return page, heading


def _sensitivity_section(page: _Page, runs: Sequence[RunInfo], warehouse: Warehouse) -> None:
    """The makespan against a what-if knob, for the runs of a sensitivity sweep (``sweep TRACE --knob``)."""
    fig = sensitivity_figure(warehouse, [r.run_id for r in runs])
    if fig is None:
        return
    page.add("<h2>Sensitivity</h2>")
    page.add(
        '<p class="sub">One run per value of a what-if knob (etstore sweep TRACE --knob): how far the '
        "makespan moves with it, and how much of each rank's communication it leaves exposed.</p>"
    )
    page.add(sensitivity_html(warehouse, [r.run_id for r in runs]) or "")
    page.figures_row([fig])


def _bandwidth_section(
    page: _Page, runs: Sequence[RunInfo], sweep_ids: Sequence[int], warehouse: Warehouse
) -> None:
    """The sweeps' bandwidth curves and the runs' collectives, or a note when there are neither."""
    sweep_fig = sweep_busbw_figure(warehouse, list(sweep_ids))
    coll_fig = collective_busbw_figure(warehouse, [r.run_id for r in runs])
    if sweep_fig is not None:
        page.figures_row([sweep_fig])
    if coll_fig is not None:
        page.figures_row([coll_fig])
    if sweep_fig is None and coll_fig is None:
        page.add('<p class="note">No collectives in these runs and no sweep given.</p>')


def _sweep_page(warehouse: Warehouse, sweep_ids: list[int], *, title: str | None) -> tuple[_Page, str]:
    """The report of sweeps only (bus-bandwidth curves, a line per topology × algorithm) and its heading."""
    page = _Page()
    heading = title or "etstore report: sweep " + ", ".join(str(i) for i in sweep_ids)
    page.add(f"<h1>{html.escape(heading)}</h1>")
    page.add(
        f'<p class="sub">etstore {html.escape(__version__)} · bandwidth GB/s with GB = 10^9 '
        "(nccl-tests busbw) · drag to zoom, double-click to reset</p>"
    )
    page.add("<h2>Bus bandwidth</h2>")
    fig = sweep_busbw_figure(warehouse, sweep_ids)
    if fig is None:
        page.add('<p class="note">These sweeps recorded no points.</p>')
    else:
        page.figures_row([fig])
    return page, heading


def _write(page: _Page, heading: str, out_path: Path, started: float) -> Path:
    """Inline plotly.js once and write the page (one self-contained file)."""
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(heading)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        + "\n".join(page.parts)
        + "</body></html>\n"
    )
    try:
        out_path.write_text(doc, encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"{out_path}: cannot write the report: {exc.strerror or exc}") from exc
    log.info(
        "report %s: %d figures, %.1f MB in %.2f s",
        out_path,
        page.figures,
        len(doc) / 1e6,
        time.perf_counter() - started,
    )
    return out_path
