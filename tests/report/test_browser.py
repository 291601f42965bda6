"""The report in headless Chromium: every figure drawn, no script errors, a screenshot kept.

What a reader sees is measured in the rendered page: no two titles (figure, subplot,
axis titles, legend) overlap, every critical-path line runs forward in time, the
bus-bandwidth axes are labelled at the expected powers of two only, and the
opportunities section is prose and a table, not the finders' JSON.

Skips only when no ``chromium`` is installed (``scripts/ensure-chromium.sh`` installs it).
Screenshots go to ``tests/artifacts/`` (git-ignored); their paths are printed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etstore.report import breakdown_figure, compare_figure, timeline_figure, write_report
from etstore.store import EmbeddedStore
from etstore.testing import RecordedStore as Recorded

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (run scripts/ensure-chromium.sh)"
)

# Injected into a copy of the report: collect errors before any other script runs...
_CATCH = """<script>window.__etErrors=[];
window.addEventListener('error',function(e){window.__etErrors.push(String(e.message||e))});
window.addEventListener('unhandledrejection',function(e){window.__etErrors.push(String(e.reason))});
var __ce=console.error;console.error=function(){window.__etErrors.push([].join.call(arguments,' '));
__ce.apply(console,arguments)};</script>"""
# ...and, once loaded, write what each plot holds and drew into the DOM for --dump-dom: its
# traces, the boxes of its titles (figure, subplot = annotation, axis titles, legend), its
# x tick labels and the x values of its critical-path line; each table's container (how wide it
# scrolls, how wide it is, where it ends), the page's width; and the opportunities section's text.
_PROBE = """<script>window.addEventListener('load',function(){setTimeout(function(){
var TITLES='text.gtitle, text.annotation-text, g[class^="g-x"][class$="title"] text, '+
'g[class^="g-y"][class$="title"] text, g.legend rect.bg';
var plots=[];document.querySelectorAll('.plotly-graph-div').forEach(function(gd){
var boxes=[];gd.querySelectorAll(TITLES).forEach(function(el){var r=el.getBoundingClientRect();
if(r.width>0&&r.height>0)boxes.push({what:el.getAttribute('class')||el.parentNode.getAttribute('class'),
text:(el.textContent||'').slice(0,80),box:[r.left,r.top,r.right,r.bottom]})});
var critical=[];(gd._fullData||[]).forEach(function(t){if(String(t.name||'').indexOf('critical path')===0)
critical.push(Array.from(t.x||[],Number))});
plots.push({id:gd.id,rendered:gd.classList.contains('js-plotly-plot'),traces:(gd._fullData||[]).length,
drawn:gd.querySelectorAll('g.trace').length+gd.querySelectorAll('g.hm image').length,
paths:gd.querySelectorAll('g.trace path').length,
title:((gd._fullLayout||{}).title||{}).text||'',boxes:boxes,critical:critical,
xticks:Array.from(gd.querySelectorAll('g.xtick text'),function(t){return t.textContent})})});
var opp=document.getElementById('opportunities');
var tables=Array.from(document.querySelectorAll('table'),function(t){var c=t.parentNode;
return {scroll:c.scrollWidth,client:c.clientWidth,right:c.getBoundingClientRect().right,
overflow:getComputedStyle(c).overflowX}});
var pre=document.createElement('pre');pre.id='etstore-probe';
pre.textContent=JSON.stringify({errors:window.__etErrors,plots:plots,tables:tables,
page:{width:document.documentElement.scrollWidth,window:window.innerWidth},
opportunities:opp?opp.innerText:null});document.body.appendChild(pre)},0)});</script>"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--mute-audio",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=30000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _render(report: Path, tmp: Path, *, width: int = 1400) -> dict[str, Any]:
    """Load a copy of the report with the probes at ``width`` px and return what they recorded."""
    text = report.read_text()
    probed = tmp / f"probed-{width}-{report.name}"
    probed.write_text(text.replace("<head>", "<head>" + _CATCH, 1).replace("</body>", _PROBE + "</body>", 1))
    done = _run(f"--window-size={width},4200", "--dump-dom", probed.as_uri())
    m = re.search(r'<pre id="etstore-probe">(.*?)</pre>', done.stdout, re.S)
    assert m, f"the page never finished loading; chromium said:\n{done.stderr[-2000:]}"
    uncaught = [line for line in done.stderr.splitlines() if "Uncaught" in line]
    assert not uncaught, uncaught
    return json.loads(
        m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    )


def _overlapping_titles(plot: dict[str, Any]) -> list[tuple[str, str]]:
    """Pairs of title boxes of one plot that share more than a pixel each way."""
    hits = []
    for a, b in combinations(plot["boxes"], 2):
        (l1, t1, r1, b1), (l2, t2, r2, b2) = a["box"], b["box"]
        if min(r1, r2) - max(l1, l2) > 1 and min(b1, b2) - max(t1, t2) > 1:
            hits.append((f"{a['what']} {a['text']!r}", f"{b['what']} {b['text']!r}"))
    return hits


def _check_layout(probe: dict[str, Any]) -> None:
    """No overlapping titles in any plot; every critical-path line goes forward in time."""
    assert probe["errors"] == []
    for plot in probe["plots"]:
        assert len(plot["boxes"]) >= 2, plot["title"]  # the probe found the titles it measures
        assert _overlapping_titles(plot) == [], plot["title"]
    lines = [x for plot in probe["plots"] for x in plot["critical"]]
    assert lines, "no critical path drawn"
    for x in lines:
        steps = np.diff(np.asarray(x, dtype=float))
        assert len(x) >= 2, "the probe read no critical-path points"
        assert (steps >= 0).all(), f"critical path goes back in time by {-steps.min():,.1f} µs"


def _plot(probe: dict[str, Any], title: str) -> dict[str, Any]:
    (plot,) = [p for p in probe["plots"] if p["title"].startswith(title)]
    return plot


def _screenshot(report: Path, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / name
    shot.unlink(missing_ok=True)
    _run("--window-size=1400,4200", f"--screenshot={shot}", report.as_uri())
    assert shot.exists() and shot.stat().st_size > 20_000, "no screenshot written"
    print(f"screenshot: {shot}")
    return shot


def test_single_run_report_draws_every_figure(
    recorded: Recorded, store: EmbeddedStore, tmp_path: Path
) -> None:
    run = recorded.runs[0]
    report = write_report(store.warehouse, [run], tmp_path / "report.html", sweep_ids=[recorded.sweep])
    probe = _render(report, tmp_path)
    assert probe["errors"] == []
    plots = probe["plots"]
    assert isinstance(plots, list)
    # timeline, breakdown, sweep curves, run collectives, link heatmap
    expected = [
        len(timeline_figure(store.warehouse, run).data),
        len(breakdown_figure(store.warehouse, [run]).data),
        4,  # 2 topologies x 2 algorithms
        3,  # ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
        1,  # one heatmap
    ]
    assert [p["traces"] for p in plots] == expected
    assert all(p["rendered"] for p in plots)
    assert [p["drawn"] for p in plots] == expected  # every trace has its SVG group (heatmap: its image)
    assert plots[0]["paths"] > 100  # the timeline's op segments are real paths
    _check_layout(probe)
    # conftest's sweep has sizes 2^16, 2^20 and 2^22 B: labels at each power of two between
    sweep = _plot(probe, "Bus bandwidth vs message size")
    assert sweep["xticks"] == ["64 KiB", "128 KiB", "256 KiB", "512 KiB", "1 MiB", "2 MiB", "4 MiB"]
    # the run's all-gathers and reduce-scatters move 16 MiB, its all-reduces 192 MiB (between 128 and 256)
    sizes = store.sql(
        "SELECT DISTINCT size_bytes FROM collectives WHERE run_id = $r ORDER BY 1", {"r": run}
    ).to_arrow()
    assert sizes["size_bytes"].to_pylist() == [16 * 2**20, 192 * 2**20]
    colls = _plot(probe, "Collectives in the run(s)")
    assert colls["xticks"] == ["16 MiB", "32 MiB", "64 MiB", "128 MiB", "256 MiB"]
    _screenshot(report, "report-single.png")


def test_compare_report_draws_both_runs(recorded: Recorded, store: EmbeddedStore, tmp_path: Path) -> None:
    a, b = recorded.runs
    report = write_report(store.warehouse, [a, b], tmp_path / "compare.html", sweep_ids=[recorded.sweep])
    # a narrower window than the screenshot's: two panels still keep their titles apart
    probe = _render(report, tmp_path, width=1000)
    assert probe["errors"] == []
    plots = probe["plots"]
    assert isinstance(plots, list)
    diff = compare_figure(store.warehouse, [a, b])
    assert diff is not None
    expected = [
        len(diff.data),
        len(timeline_figure(store.warehouse, a).data),
        len(timeline_figure(store.warehouse, b).data),
        len(breakdown_figure(store.warehouse, [a, b]).data),
        4,
        6,  # 3 collective types x 2 runs
        2,  # one heatmap per run
    ]
    assert [p["traces"] for p in plots] == expected
    assert [p["drawn"] for p in plots] == expected
    _check_layout(probe)
    _screenshot(report, "report-compare.png")


@pytest.mark.parametrize("width", [1400, 1000])
def test_three_runs_with_opportunities_read_cleanly(
    hand_runs: tuple[Path, list[int]], tmp_path: Path, width: int
) -> None:
    path, runs = hand_runs
    with EmbeddedStore(path, read_only=True) as store:
        report = write_report(store.warehouse, runs, tmp_path / "three.html")
    probe = _render(report, tmp_path, width=width)
    _check_layout(probe)
    # three panels side by side: titles short enough to stay apart at this width
    for title in ("Per-rank breakdown", "Link utilization"):
        panels = [b["text"] for b in _plot(probe, title)["boxes"] if b["what"] == "annotation-text"]
        assert panels == ["run 1 · hand · unaware", "run 2 · hand · aware", "run 3 · expanded · unaware"]
    # the single size of the hand workload's all-reduce, 1 MiB, between its neighbours
    assert _plot(probe, "Collectives in the run(s)")["xticks"] == ["512 KiB", "1 MiB", "2 MiB"]
    text = probe["opportunities"]
    assert text is not None
    assert not re.search(r"[{}\[\]]|\w\":", text), text  # none of the finders' JSON
    rows = [
        " ".join(line.split())
        for line in text.splitlines()
        if line.startswith(("reorder", "overlap", "chunk"))
    ]
    # tests/app/test_overlap.py works these out by hand; largest estimated gain first
    reorder = (
        "5 send_act 4 stats could be issued at 65.10 µs instead of 120.10 µs: 3 compute ops ahead of it "
        "do not feed it 55.00 µs (estimate)"
    )
    overlap = (
        "1 grad_allreduce 2 indep 1 compute op (20.00 µs) waits for the collective (55.10 µs) without "
        "using its data: it could run under it 20.00 µs (estimate)"
    )
    chunk = (
        "1 3 apply split into 2 pieces as its 2 chunks arrive: starts 10.27 µs earlier and ends at "
        "35.53 µs instead of 38.53 µs 3.00 µs (estimate)"
    )
    assert rows == [
        f"reorder 0 {reorder}",
        f"reorder 1 {reorder}",
        f"overlap 0 {overlap}",
        f"overlap 1 {overlap}",
        f"chunk 0 {chunk}",
        f"chunk 1 {chunk}",
    ]
    if width == 1400:
        _screenshot(report, "report-three.png")


def test_a_256_rank_report_reads_at_1000_px(big: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    with EmbeddedStore(big[0], read_only=True) as store:
        report = write_report(store.warehouse, [big[1]["mesh"]], tmp_path / "big.html")
    probe = _render(report, tmp_path, width=1000)
    _check_layout(probe)
    assert all(p["rendered"] for p in probe["plots"])
    assert [p["drawn"] for p in probe["plots"]] == [p["traces"] for p in probe["plots"]]
    # no table runs off the page: each ends inside the window, the wide ones scroll in their box
    page = probe["page"]
    assert page["width"] <= page["window"]
    for t in probe["tables"]:
        assert t["right"] <= page["window"] and t["overflow"] == "auto"
    # the heatmap of 256 NPUs is one of 16 x 16 groups
    assert "16 groups of 16 NPUs" in _plot(probe, "Hottest link between groups")["title"]
    _screenshot(report, "report-256.png")
