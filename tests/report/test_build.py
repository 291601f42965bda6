"""write_report and the figures on a real store: contents, comparison, opportunities, errors, downsampling."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import pytest

from etstore.app.runs import record_run
from etstore.errors import EtstoreError, UnknownTraceError
from etstore.model import Trace, deps_table, ops_table
from etstore.report import (
    ReportError,
    breakdown_figure,
    collective_busbw_figure,
    compare_figure,
    critical_path_steps,
    latest_run,
    link_heatmap_figure,
    schedule_critical_path,
    sweep_busbw_figure,
    timeline_figure,
    write_report,
)
from etstore.report._data import merge_spans, run_infos
from etstore.sim import simulate
from etstore.store import EmbeddedStore
from etstore.store.warehouse import Warehouse
from etstore.testing import RecordedStore as Recorded
from etstore.topology import Topology


def _figure_divs(text: str) -> list[str]:
    return re.findall(r'<div id="(etstore-fig-\d+)" class="plotly-graph-div"', text)


def test_single_run_report_is_self_contained(
    recorded: Recorded, store: EmbeddedStore, tmp_path: Path
) -> None:
    out = write_report(store.warehouse, [recorded.runs[0]], tmp_path / "r.html", sweep_ids=[recorded.sweep])
    text = out.read_text()
    assert text.count("Plotly.newPlot(") == 5  # timeline, breakdown, sweep curves, run collectives, links
    assert len(_figure_divs(text)) == 5
    assert text.count('<script type="text/javascript">/**\n* plotly.js') == 1  # plotly.js inlined once
    assert "cdn" not in re.sub(r"<script type=\"text/javascript\">.*?</script>", "", text, flags=re.S).lower()
    assert "start grad_allreduce_L2 before bwd_mlp_L1" in text  # the trace's opportunities
    assert "not this trace" not in text
    assert "2 opportunities" in text


def test_timeline_has_lanes_per_category_and_the_critical_path(
    recorded: Recorded, store: EmbeddedStore
) -> None:
    fig = timeline_figure(store.warehouse, recorded.runs[0])
    names = [t.name for t in fig.data]
    assert names[:5] == ["compute", "ALL_GATHER", "ALL_REDUCE", "REDUCE_SCATTER", "send/recv"]
    assert names[-1].startswith("critical path (")
    compute = fig.data[0]
    # small runs draw every op: one segment (3 points: start, end, gap) per compute op of the run
    n_compute = (
        store.sql(
            "SELECT count(*) AS n FROM op_timings "
            "WHERE run_id = $r AND type = 'COMP_NODE' AND end_ns > start_ns",
            {"r": recorded.runs[0]},
        )
        .to_arrow()["n"][0]
        .as_py()
    )
    assert len(compute.x) == 3 * n_compute
    ys = np.asarray(compute.y, dtype=float)
    assert set(np.round(ys[~np.isnan(ys)] % 1, 2)) == {0.78}  # rank - 0.22: the compute lane


def test_critical_path_of_a_hand_checked_schedule(tmp_path: Path) -> None:
    # rank 0: A (5 µs) -> send 1 MiB to rank 1; rank 1: recv -> B (3 µs); rank 1: C (1 µs) independent
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1, 1],
            "id": [1, 2, 1, 2, 3],
            "name": ["A", "S", "R", "B", "C"],
            "type": ["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMP_NODE"],
            "duration_micros": [5, 0, 0, 3, 1],
            "comm_dst": [None, 1, None, None, None],
            "comm_src": [None, None, 0, None, None],
            "comm_tag": [None, 7, 7, None, None],
            "comm_size": [None, 1 << 20, 1 << 20, None, None],
        }
    )
    tr = Trace(ops, deps=deps_table([0, 1], [1, 1], [2, 2]), name="handmade")
    with EmbeddedStore(tmp_path / "s") as store:
        store.ingest(tr)
        rid = record_run(store.warehouse, simulate(tr, Topology.fully_connected(2)), trace_name="handmade")
        (run,) = run_infos(store.warehouse, [rid])
        cp = schedule_critical_path(store.warehouse, run)
        fig = timeline_figure(store.warehouse, rid)
    assert cp["name"].to_pylist() == ["A", "S", "R", "B"]
    assert cp["rank"].to_pylist() == [0, 0, 1, 1]
    assert cp["via"].to_pylist() == ["start", "dep", "msg", "dep"]
    assert cp["end_ns"][3].as_py() == pytest.approx(run.total_ns)
    assert cp["start_ns"][0].as_py() == 0
    # the receive was posted at 0 and waited for the message: on the timeline the path stays on
    # the send until it ends, then drops to the receive (not back to 0, where R started)
    start, end = (cp[c].to_numpy() / 1e3 for c in ("start_ns", "end_ns"))
    assert start[2] == 0 and end[1] > 5
    line = fig.data[-1]
    assert line.name == "critical path (4 ops)"
    assert list(line.x) == pytest.approx([0, 5, 5, end[1], end[1], end[2], end[2], end[3]])
    assert list(line.y) == [-0.22, -0.22, 0.22, 0.22, 1.22, 1.22, 0.78, 0.78]  # rank ± lane


def test_critical_path_steps_only_go_forward() -> None:
    # a step that began before the one ahead of it ended (a receive posted early, a collective
    # member that waited for a late peer) holds the path from that end; one ending before it
    # (out of order) is a point there
    seg_start, seg_end = critical_path_steps(
        np.array([0.0, 10.0, 2.0, 40.0, 35.0, 50.0]), np.array([10.0, 30.0, 38.0, 45.0, 44.0, 60.0])
    )
    assert seg_start.tolist() == [0.0, 10.0, 30.0, 40.0, 45.0, 50.0]
    assert seg_end.tolist() == [10.0, 30.0, 38.0, 45.0, 45.0, 60.0]
    empty = critical_path_steps(np.zeros(0), np.zeros(0))
    assert [len(a) for a in empty] == [0, 0]


def test_critical_path_lines_run_forward_in_time(recorded: Recorded, store: EmbeddedStore) -> None:
    for run in recorded.runs:
        (info,) = run_infos(store.warehouse, [run])
        cp = schedule_critical_path(store.warehouse, info)
        via = cp["via"].to_pylist()
        # the 8-rank transformer's path crosses ranks through a message and collective peers,
        # whose ops started before the step ahead of them ended
        assert "msg" in via and "peer" in via
        assert (cp["start_ns"].to_numpy()[1:] < cp["end_ns"].to_numpy()[:-1]).any()
        fig = timeline_figure(store.warehouse, run)
        (line,) = [t for t in fig.data if t.name.startswith("critical path")]
        x = np.asarray(line.x, dtype=float)
        assert len(x) == 2 * cp.num_rows
        assert (np.diff(x) >= 0).all()
        assert x[-1] == pytest.approx(cp["end_ns"][cp.num_rows - 1].as_py() / 1e3)


def test_compare_report_shows_differences_side_by_side(
    recorded: Recorded, store: EmbeddedStore, tmp_path: Path
) -> None:
    a, b = recorded.runs
    out = write_report(store.warehouse, [a, b], tmp_path / "cmp.html", sweep_ids=[recorded.sweep])
    text = out.read_text()
    # differences bars, two timelines side by side, breakdown, sweep, run collectives, links
    assert len(_figure_divs(text)) == 7
    assert '<div class="row cols2">' in text
    assert "<h2>Differences</h2>" in text and f"run {b}</th><th" in text
    diff = compare_figure(store.warehouse, [a, b])
    assert diff is not None and len(diff.data) == 4
    totals = store.sql("SELECT run_id, total_ns FROM runs ORDER BY run_id").to_arrow().to_pylist()
    by = {r["run_id"]: r["total_ns"] for r in totals}
    d_total = np.asarray(diff.data[0].y, dtype=float)
    # the rank that finishes last moves by exactly the makespan change
    ranks = store.sql(
        "SELECT rank, total_ns FROM rank_breakdown WHERE run_id = $r ORDER BY rank", {"r": b}
    ).to_arrow()
    last = int(np.argmax(ranks["total_ns"].to_numpy()))
    base_last = (
        store.sql("SELECT total_ns FROM rank_breakdown WHERE run_id = $r AND rank = $k", {"r": a, "k": last})
        .to_arrow()["total_ns"][0]
        .as_py()
    )
    assert d_total[last] == pytest.approx((by[b] - base_last) / 1e3)
    assert len(breakdown_figure(store.warehouse, [a, b]).data) == 8  # 4 traces per run panel
    heat = link_heatmap_figure(store.warehouse, [a, b])
    assert heat is not None and len(heat.data) == 2


def test_bandwidth_figures(recorded: Recorded, store: EmbeddedStore) -> None:
    fig = sweep_busbw_figure(store.warehouse, [recorded.sweep])
    assert fig is not None
    assert [t.name for t in fig.data] == [
        f"{topo} · {alg}"
        for topo in ("mesh:4+mesh:2,bw=50,lat=500", "ring:8,bw=50,lat=500")
        for alg in ("native", "ring")
    ]
    assert all(len(t.x) == 3 for t in fig.data)
    coll = collective_busbw_figure(store.warehouse, [recorded.runs[0]])
    assert coll is not None
    assert {t.name.split(" · ")[1] for t in coll.data} == {"ALL_GATHER", "ALL_REDUCE", "REDUCE_SCATTER"}
    assert sweep_busbw_figure(store.warehouse, []) is None


def test_no_opportunities_panel_says_so(tmp_path: Path) -> None:
    tr = Trace(
        ops_table({"rank": [0], "id": [1], "name": ["k"], "type": ["COMP_NODE"], "duration_micros": [4]}),
        name="solo",
    )
    with Warehouse.open(tmp_path / "m.duckdb") as warehouse:
        rid = record_run(warehouse, simulate(tr, Topology.ring(2)), trace_name="solo")
        assert latest_run(warehouse) == rid
    # a metrics file by path: opened read-only for the report
    text = write_report(tmp_path / "m.duckdb", [rid], tmp_path / "solo.html").read_text()
    assert "No overlap, chunk or reorder opportunities are recorded for trace solo" in text
    assert "No collectives in these runs and no sweep given" in text


def test_merge_spans_merges_within_the_gap_only() -> None:
    g = np.array([0, 0, 0, 1, 1])
    s = np.array([0.0, 10.0, 30.0, 0.0, 2.0])
    e = np.array([10.0, 12.0, 31.0, 1.0, 3.0])
    m = merge_spans(g, s, e, 5.0)
    assert m.group.tolist() == [0, 0, 1]
    assert m.start_ns.tolist() == [0.0, 30.0, 0.0]
    assert m.end_ns.tolist() == [12.0, 31.0, 3.0]
    assert m.ops.tolist() == [2, 1, 2]
    assert len(merge_spans(g, s, e, -1.0)) == 5


def test_large_runs_are_downsampled(recorded: Recorded, store: EmbeddedStore) -> None:
    full = timeline_figure(store.warehouse, recorded.runs[0], critical_path=False)
    coarse = timeline_figure(store.warehouse, recorded.runs[0], critical_path=False, detail_ops=10, pixels=50)
    assert "merged to" in coarse.layout.title.text
    assert len(coarse.data[0].x) < len(full.data[0].x)
    assert all(len(t.x) <= 3 * 8 * 51 for t in coarse.data)


@pytest.mark.parametrize(
    ("runs", "out", "error", "match"),
    [
        ([], "r.html", ReportError, "no runs given"),
        ([99], "r.html", UnknownTraceError, "no run 99 in the metrics"),
        ([1], "missing-dir/r.html", ReportError, "does not exist"),
        ([1], "file.txt/r.html", ReportError, "cannot write the report"),
        ([1], ".", ReportError, "is a directory"),
    ],
)
def test_bad_input_is_one_clear_error(
    store: EmbeddedStore, tmp_path: Path, runs: list[int], out: str, error: type[EtstoreError], match: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(error, match=match):
        write_report(store.warehouse, runs, tmp_path / out)
    assert not (tmp_path / "r.html").exists()


def test_unknown_sweep_and_empty_database(store: EmbeddedStore, tmp_path: Path) -> None:
    with pytest.raises(UnknownTraceError, match="no sweep 42"):
        write_report(store.warehouse, [1], tmp_path / "r.html", sweep_ids=[42])
    empty = Warehouse(duckdb.connect())
    with pytest.raises(ReportError, match="no simulation metrics"):
        write_report(empty, [1], tmp_path / "r.html")
    with pytest.raises(ReportError, match="no runs are recorded"):
        latest_run(empty)
    with pytest.raises(ReportError, match="cannot read the metrics"):
        write_report(tmp_path / "missing.duckdb", [1], tmp_path / "r.html")


def test_wide_tables_scroll_instead_of_being_cut_off(
    big: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    # the summary of a 256-rank run is wider than a 1000 px window: its table sits in a container
    # that scrolls sideways (the page's CSS), and a long topology spec may wrap at its commas
    with EmbeddedStore(big[0], read_only=True) as store:
        text = write_report(store.warehouse, [big[1]["mesh"]], tmp_path / "r.html").read_text()
    css = re.search(r"<style>(.*?)</style>", text, re.S)
    assert css and re.search(r"\.tbl\{[^}]*overflow-x:auto", css.group(1))
    summary = text.split("<h2>", 1)[0]
    assert '<div class="tbl"><table><thead><tr><th class="l">run</th>' in summary
    assert "mesh2d:16x16,<wbr>bw=50,<wbr>lat=500" in summary
    assert not re.search(r"table\{[^}]*\bwidth:\s*\d", css.group(1))  # no fixed table width
    # every table of the page is in such a container
    assert text.count("<table") == text.count('<div class="tbl"><table')
