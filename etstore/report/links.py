"""The report's link section: the hottest links as a table, and a heatmap only where it can be read.

A 256 × 256 NPU heatmap is 65,536 cells of about two pixels, of which a ring uses 512:
it shows a few dots. So the section leads with a table of each run's hottest links
(:func:`hottest_links`: source, destination, the topology axis the link runs along,
bytes, busy time, utilization), and :func:`link_heatmap_figure` draws NPU × NPU only up
to :data:`HEATMAP_NPUS` NPUs; beyond, it draws groups of NPUs (a node: the NPUs along
the first axes of the topology, else runs of consecutive NPUs), each cell the hottest
link between two groups. The colour scale runs from 0 to the hottest value drawn, in
percent, so a run whose links are barely used is not painted hot: its colour bar says
how small its maximum is.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
from plotly.subplots import make_subplots

from etstore.errors import EtstoreError
from etstore.report._data import RunInfo, query, run_infos
from etstore.report._html import fmt_ns, table
from etstore.report._style import TEMPLATE, integer_ticks, label_panels, panel_titles
from etstore.store.warehouse import Warehouse
from etstore.topology import DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS
from etstore.topology.axes import coordinates, dim_spec
from etstore.topology.spec import parse_spec

__all__ = [
    "HEATMAP_NPUS",
    "HOT_LINKS",
    "MAX_CELLS",
    "hottest_links",
    "hottest_links_html",
    "link_axes",
    "link_heatmap_figure",
]

HOT_LINKS = 15
"""Rows of each run's hottest-links table."""
HEATMAP_NPUS = 64
"""NPUs up to which the heatmap has a row and a column per NPU; beyond, per group of NPUs."""
MAX_CELLS = 32
"""Groups per side of the grouped heatmap at most."""

_KIND = {"line": "mesh"}


def _axes_of(topology: str) -> tuple[list[int], list[str]] | None:
    """Axis sizes and names (``ring:4``) of a built-in spec with its NPU numbering kept, else None."""
    try:
        parsed = parse_spec(topology, DEFAULT_BANDWIDTH_GB_PER_S, DEFAULT_LATENCY_NS)
    except EtstoreError:  # a topology file, or a name that is not a spec
        return None
    if parsed.fail_npus:  # the rest were renumbered: coordinates no longer follow from the ids
        return None
    dims = [d._replace(kind=_KIND.get(d.kind, d.kind)) for d in parsed.dims]
    return [d.size for d in dims], [dim_spec(d) for d in dims]


def link_axes(topology: str, src: np.ndarray, dst: np.ndarray) -> list[str]:
    """Per link, the topology axis it runs along: ``"0 · ring:4"``, ``"1 · switch:8"``.

    NPU ids are read as coordinates of the spec's axes (axis 0 fastest, as
    :meth:`~etstore.topology.Topology.compose` numbers them). A link that changes
    several coordinates, or none, and every link of a topology that is not a built-in
    spec (a file) or that lost NPUs (``fail=``), gets ``–``.

    Examples
    --------
    >>> link_axes("ring:4+switch:2", np.array([0, 0, 1]), np.array([1, 4, 6]))
    ['0 · ring:4', '1 · switch:2', '–']

    Notes
    -----
    O(links · axes).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    axes = _axes_of(topology)
    if axes is None:
        return ["–"] * len(src)
    sizes, names = axes
    n = math.prod(sizes)
    ok = (src >= 0) & (dst >= 0) & (src < n) & (dst < n)
    out = ["–"] * len(src)
    if not ok.any():
        return out
    c = coordinates(n, sizes)
    diff = c[src[ok]] != c[dst[ok]]
    axis = np.where(diff.sum(axis=1) == 1, np.argmax(diff, axis=1), -1)
    for i, a in zip(np.flatnonzero(ok).tolist(), axis.tolist(), strict=True):
        if a >= 0:
            out[i] = f"{a} · {names[a]}"
    return out


def hottest_links(warehouse: Warehouse, run_ids: Sequence[int], *, limit: int = HOT_LINKS) -> pa.Table:
    """Each run's ``limit`` most utilized links, hottest first.

    Parameters
    ----------
    warehouse
        The metrics (``runs``, ``link_util``).
    run_ids
        The runs, in the order the rows should come.
    limit
        Links per run.

    Returns
    -------
    pyarrow.Table
        ``run_id``, ``src``, ``dst``, ``axis`` (see :func:`link_axes`), ``bytes``,
        ``messages``, ``busy_ns``, ``utilization`` (busy / makespan, a fraction; above 1
        is load offered beyond what the link carries, congestion-unaware),
        ``bandwidth_gb_per_s`` (the link's, GB = 2^30 as topologies give it); per run
        ordered by ``utilization``, then ``bytes``, descending, then ``src``, ``dst``.

    Raises
    ------
    UnknownTraceError
        A run id is not recorded.

    Notes
    -----
    One windowed query; O(links) in DuckDB.
    """
    runs = run_infos(warehouse, run_ids)
    t = query(
        warehouse,
        """SELECT run_id, src, dst, bytes, messages, busy_ns, utilization, bandwidth_gb_per_s FROM link_util
        WHERE list_contains($ids, run_id)
        QUALIFY row_number() OVER (PARTITION BY run_id
            ORDER BY utilization DESC NULLS LAST, bytes DESC NULLS LAST, src, dst) <= $n""",
        {"ids": [r.run_id for r in runs], "n": int(limit)},
    )
    parts = []
    rid = t["run_id"].to_numpy()
    for run in runs:
        part = t.filter(pa.array(rid == run.run_id))
        order = np.lexsort(
            (
                part["dst"].to_numpy(),
                part["src"].to_numpy(),
                -np.nan_to_num(part["bytes"].to_numpy(zero_copy_only=False), nan=-1.0),
                -np.nan_to_num(part["utilization"].to_numpy(zero_copy_only=False), nan=-1.0),
            )
        )
        part = part.take(pa.array(order))
        axis = link_axes(run.topology, part["src"].to_numpy(), part["dst"].to_numpy())
        parts.append(part.add_column(3, "axis", pa.array(axis, pa.string())))
    return pa.concat_tables(parts) if parts else t


def hottest_links_html(warehouse: Warehouse, runs: Sequence[RunInfo], *, limit: int = HOT_LINKS) -> str:
    """Per run, a line on its links (how many carried traffic, hottest, median) and its hottest-links table.

    Empty when the runs have no links.
    """
    ids = [r.run_id for r in runs]
    stats = query(
        warehouse,
        """SELECT run_id, count(*) AS links, count(*) FILTER (WHERE bytes > 0) AS used,
            max(utilization) AS hottest, median(utilization) AS median FROM link_util
        WHERE list_contains($ids, run_id) GROUP BY run_id""",
        {"ids": ids},
    ).to_pylist()
    by = {s["run_id"]: s for s in stats}
    if not by:
        return ""
    hot = hottest_links(warehouse, ids, limit=limit)
    rid = hot["run_id"].to_numpy()
    parts = []
    for run in runs:
        s = by.get(run.run_id)
        if s is None:
            continue
        rows = hot.filter(pa.array(rid == run.run_id)).to_pylist()
        parts.append(
            f'<p class="sub">Run {run.run_id}: {s["links"]:,} links, {s["used"]:,} of them carried traffic; '
            f"hottest {_pct(s['hottest'])}, median {_pct(s['median'])}. The {len(rows)} most utilized "
            f"(busy time / makespan; all of them: <code>SELECT * FROM v_link_utilization WHERE run_id = "
            f"{run.run_id} ORDER BY utilization DESC</code>):</p>"
        )
        parts.append(
            table(
                ["source NPU", "destination NPU", "axis", "MiB", "messages", "busy time", "utilization"],
                [
                    [
                        r["src"],
                        r["dst"],
                        r["axis"],
                        "–" if r["bytes"] is None else f"{r['bytes'] / 2**20:,.1f}",
                        "–" if r["messages"] is None else f"{r['messages']:,}",
                        fmt_ns(r["busy_ns"]),
                        _pct(r["utilization"]),
                    ]
                    for r in rows
                ],
                left=0,
                text=(2,),
                css_class="hot-links",
            )
        )
    return "\n".join(parts)


def _pct(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v * 100:,.1f}%" if v * 100 >= 0.1 or v == 0 else f"{v * 100:,.3f}%"


def _group_size(topology: str, n: int, max_npus: int, max_cells: int) -> tuple[int, str]:
    """NPUs per heatmap cell and how they were grouped (empty when one per NPU)."""
    if n <= max_npus:
        return 1, ""
    axes = _axes_of(topology)
    if axes is not None and math.prod(axes[0]) == n:
        sizes, names = axes
        for k in range(1, len(sizes)):
            b = math.prod(sizes[:k])
            if n // b <= max_cells:
                along = " × ".join(names[:k])
                return b, f"{n // b} groups of {b} NPUs (a group: the NPUs along {along})"
    b = math.ceil(n / max_cells)
    return b, f"{math.ceil(n / b)} groups of {b} consecutive NPUs"


def link_heatmap_figure(
    warehouse: Warehouse,
    run_ids: Sequence[int],
    *,
    max_npus: int = HEATMAP_NPUS,
    max_cells: int = MAX_CELLS,
) -> go.Figure | None:
    """Link utilization (busy / makespan) as a source × destination heatmap, one panel per run.

    Up to ``max_npus`` NPUs a cell is one link (NPU rows, NPU columns); beyond, NPUs
    are grouped (see the module) into at most ``max_cells`` per side and a cell is the
    hottest link from one group to the other (hover: how many links, their mean, their
    MiB). Congestion-unaware runs show the load offered, which may exceed 100%. Cells
    without a link are blank. One colour scale spans all panels, from 0 to 100% (a busy
    link), or to the largest value drawn where offered load exceeds it (``coloraxis.cmin``,
    ``cmax``, in %).

    Returns
    -------
    plotly.graph_objects.Figure or None
        ``None`` when the runs have no links.

    Notes
    -----
    O(links) in numpy; the figure has at most ``max(max_npus, max_cells)²`` cells per run.
    """
    runs = run_infos(warehouse, run_ids)
    t = query(
        warehouse,
        "SELECT run_id, src, dst, utilization, bytes FROM link_util WHERE list_contains($ids, run_id)",
        {"ids": [r.run_id for r in runs]},
    )
    if t.num_rows == 0:
        return None
    rid = t["run_id"].to_numpy()
    src = t["src"].to_numpy().astype(np.int64)
    dst = t["dst"].to_numpy().astype(np.int64)
    util = np.nan_to_num(t["utilization"].to_numpy(zero_copy_only=False).astype(np.float64)) * 100
    mib = np.nan_to_num(t["bytes"].to_numpy(zero_copy_only=False).astype(np.float64)) / 2**20
    n = max(int(max(src.max(), dst.max()) + 1), max(r.num_npus for r in runs))
    size, how = _group_size(runs[0].topology, n, max_npus, max_cells)
    if size > 1 and len({r.topology for r in runs}) > 1:  # groups must mean the same in every panel
        size = math.ceil(n / max_cells)
        how = f"{math.ceil(n / size)} groups of {size} consecutive NPUs"
    g = math.ceil(n / size)
    fig = make_subplots(rows=1, cols=len(runs), subplot_titles=panel_titles(runs), horizontal_spacing=0.06)
    label_panels(fig, runs)
    top = 0.0
    starts = np.arange(g) * size  # a cell's axis value: the first NPU of its group
    for col, run in enumerate(runs, start=1):
        sel = rid == run.run_id
        cell = (src[sel] // size) * g + dst[sel] // size
        z = np.full(g * g, np.nan)
        np.fmax.at(z, cell, util[sel])
        links = np.bincount(cell, minlength=g * g)
        mean = np.bincount(cell, weights=util[sel], minlength=g * g) / np.maximum(links, 1)
        total = np.bincount(cell, weights=mib[sel], minlength=g * g)
        top = max(top, float(np.nanmax(z)) if np.isfinite(z).any() else 0.0)
        fig.add_trace(
            go.Heatmap(
                x=starts,
                y=starts,
                z=z.reshape(g, g),
                text=_cell_text(g, size, n, z, links, mean, total).reshape(g, g),
                coloraxis="coloraxis",
                hovertemplate="%{text}<extra></extra>",
                xgap=1 if g <= 48 else 0,
                ygap=1 if g <= 48 else 0,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(
            title_text="destination NPU" + (" group" if size > 1 else ""),
            row=1,
            col=col,
            constrain="domain",
            **integer_ticks(n),
        )
        fig.update_yaxes(
            **integer_ticks(n),
            title_text="source NPU" + (" group" if size > 1 else ""),
            autorange="reversed",
            row=1,
            col=col,
            scaleanchor=f"x{col if col > 1 else ''}",
        )
    title = "Link utilization over the topology (busy time / makespan, %)"
    if size > 1:
        title = f"Hottest link between groups of NPUs (busy time / makespan, %): {how}"
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title, "font": {"size": 14}},
        coloraxis={
            "colorscale": "YlOrRd",
            "cmin": 0.0,
            "cmax": max(100.0, top),  # a full link is 100%: 0.3% stays pale; offered overload goes past
            "colorbar": {"title": {"text": f"utilization<br>(max {top:,.3g}%)"}, "ticksuffix": "%"},
        },
        height=520 if len(runs) == 1 else 480,
    )
    return fig


def _cell_text(
    g: int, size: int, n: int, z: np.ndarray, links: np.ndarray, mean: np.ndarray, mib: np.ndarray
) -> np.ndarray:
    """Hover text per cell (flat, row-major): the link, or the groups and what their links carried."""
    out = np.full(g * g, "", dtype=object)
    for c in np.flatnonzero(links).tolist():
        i, j = divmod(c, g)
        if size == 1:
            out[c] = f"link {i} → {j}<br>utilization {z[c]:,.1f}%<br>{mib[c]:,.2f} MiB"
        else:
            a = f"{i * size}–{min((i + 1) * size, n) - 1}"
            b = f"{j * size}–{min((j + 1) * size, n) - 1}"
            out[c] = (
                f"NPUs {html.escape(a)} → {html.escape(b)}: {links[c]} links<br>hottest {z[c]:,.1f}%, "
                f"mean {mean[c]:,.1f}%<br>{mib[c]:,.2f} MiB"
            )
    return out
