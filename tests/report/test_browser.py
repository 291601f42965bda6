"""The report in headless Chromium: every figure drawn, no script errors, a screenshot kept.

Skips only when no ``chromium`` is installed (``scripts/ensure-chromium.sh`` installs it).
Screenshots go to ``tests/artifacts/`` (git-ignored); their paths are printed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

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
# ...and, once loaded, write what each plot holds and drew into the DOM for --dump-dom.
_PROBE = """<script>window.addEventListener('load',function(){setTimeout(function(){
var plots=[];document.querySelectorAll('.plotly-graph-div').forEach(function(gd){plots.push({
id:gd.id,rendered:gd.classList.contains('js-plotly-plot'),traces:(gd._fullData||[]).length,
drawn:gd.querySelectorAll('g.trace').length+gd.querySelectorAll('g.hm image').length,
paths:gd.querySelectorAll('g.trace path').length})});
var pre=document.createElement('pre');pre.id='etstore-probe';
pre.textContent=JSON.stringify({errors:window.__etErrors,plots:plots});document.body.appendChild(pre)},0)});</script>"""


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


def _render(report: Path, tmp: Path) -> dict[str, object]:
    text = report.read_text()
    probed = tmp / f"probed-{report.name}"
    probed.write_text(text.replace("<head>", "<head>" + _CATCH, 1).replace("</body>", _PROBE + "</body>", 1))
    done = _run("--dump-dom", probed.as_uri())
    m = re.search(r'<pre id="etstore-probe">(.*?)</pre>', done.stdout, re.S)
    assert m, f"the page never finished loading; chromium said:\n{done.stderr[-2000:]}"
    uncaught = [line for line in done.stderr.splitlines() if "Uncaught" in line]
    assert not uncaught, uncaught
    return json.loads(
        m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    )


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
    _screenshot(report, "report-single.png")


def test_compare_report_draws_both_runs(recorded: Recorded, store: EmbeddedStore, tmp_path: Path) -> None:
    a, b = recorded.runs
    report = write_report(store.warehouse, [a, b], tmp_path / "compare.html", sweep_ids=[recorded.sweep])
    probe = _render(report, tmp_path)
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
    _screenshot(report, "report-compare.png")
