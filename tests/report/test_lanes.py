"""Which ranks a timeline draws: every rank up to 32, else percentiles of finish time, the critical
path and a spread (hand-checked), and a 256-rank run's timeline and report."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from etstore.report import schedule_critical_path, select_lanes, timeline_figure, timeline_lanes, write_report
from etstore.report._data import run_infos
from etstore.store import EmbeddedStore

# rank i finishes at FINISH[i] (ns): in finish order ranks 11, 1, 5, 3, 7, 0, 8, 4, 6, 2, 9, 10
FINISH = np.array([50, 10, 90, 30, 70, 20, 80, 40, 60, 100, 110, 0], dtype=float)


def test_percentiles_then_the_critical_path_in_finish_order() -> None:
    # percentiles over the 12 finish times (linear): p10 = 11 -> 10 (rank 1), p25 = 27.5 -> 30
    # (rank 3), median = 55 -> 50 or 60, the lower rank (0), p75 = 82.5 -> 80 (rank 6), p90 = 99 ->
    # 100 (rank 9); then the critical path's rank 4 fills the eighth lane, rank 10 is already there
    sel = select_lanes(np.arange(12), FINISH, critical_ranks=[4, 10, 2], max_lanes=8)
    assert sel.folded and sel.total == 12
    assert sel.ranks.tolist() == [11, 1, 3, 0, 4, 6, 9, 10]
    assert sel.reasons == (
        ("min",),
        ("p10",),
        ("p25",),
        ("median",),
        ("critical path",),
        ("p75",),
        ("p90",),
        ("max", "critical path"),
    )  # rank 2 is on the path too, but no lane is left for it
    assert sel.finish_ns.tolist() == [0, 10, 30, 50, 70, 80, 100, 110]
    assert sel.tick_labels() == [
        *("11 · p0", "1 · p9", "3 · p27", "0 · p45"),
        *("4 · p64", "6 · p73", "9 · p91", "10 · p100"),
    ]
    text = sel.describe()
    assert text.startswith("8 of 12 ranks shown: the ranks nearest the percentiles of finish time (min rank")
    assert "median rank 0 (50 ns)" in text and "the critical path's ranks 4, 10" in text


def test_lanes_left_go_to_the_widest_gaps_in_finish_order() -> None:
    # anchors sit at finish positions 0, 1, 3, 5, 8, 10, 11: the gaps of one are at positions
    # 2 (rank 5) and 4 (rank 7), the first two found
    sel = select_lanes(np.arange(12), FINISH, max_lanes=9)
    assert sel.ranks.tolist() == [11, 1, 5, 3, 7, 0, 6, 9, 10]
    assert [r for r, why in zip(sel.ranks.tolist(), sel.reasons, strict=True) if not why] == [5, 7]
    assert "and 2 more spread evenly over the finish times (5, 7)" in sel.describe()


def test_up_to_the_limit_every_rank_is_drawn_in_rank_order() -> None:
    sel = select_lanes(
        np.array([3, 1, 2, 0]), np.array([4.0, 3.0, 2.0, 1.0]), critical_ranks=[2], max_lanes=4
    )
    assert not sel.folded
    assert sel.ranks.tolist() == [0, 1, 2, 3]
    assert sel.tick_labels() == ["0", "1", "2", "3"]
    assert sel.describe() == ""


@pytest.fixture(scope="module")
def big_store(big: tuple[Path, dict[str, int]]) -> Iterator[EmbeddedStore]:
    store = EmbeddedStore(big[0], read_only=True)
    yield store
    store.close()


def test_a_256_rank_timeline_draws_32_ranks_nearest_the_percentiles(
    big: tuple[Path, dict[str, int]], big_store: EmbeddedStore
) -> None:
    run = big[1]["ring"]
    wh = big_store.warehouse
    fig = timeline_figure(wh, run)
    # lanes: every point of every trace sits on a lane (y = lane, lane ± 0.22)
    ys = np.concatenate([np.asarray(t.y, dtype=float) for t in fig.data])
    lanes = np.unique(np.round(ys[~np.isnan(ys)]))
    assert len(lanes) <= 32
    ticks = list(fig.layout.yaxis.ticktext)
    assert len(ticks) == 32 == len(fig.layout.yaxis.tickvals)
    assert "32 of 256 ranks" in fig.layout.title.text
    shown = [int(t.split(" · ")[0]) for t in ticks]
    # the ranks nearest each percentile of finish time are among them
    finish = wh.query(
        "SELECT rank, total_ns FROM rank_breakdown WHERE run_id = $r ORDER BY rank", {"r": run}
    ).to_arrow()
    ranks, f = finish["rank"].to_numpy(), finish["total_ns"].to_numpy()
    for q in (0, 10, 25, 50, 75, 90, 100):
        d = np.abs(f - np.percentile(f, q))
        assert int(ranks[np.flatnonzero(d == d.min())[0]]) in shown, q
    # and so is every rank the critical path crosses (it crosses few)
    (info,) = run_infos(wh, [run])
    cp = schedule_critical_path(wh, info)
    assert set(cp["rank"].to_pylist()) <= set(shown)
    # lane k is rank shown[k]: its compute segments are that rank's compute ops
    compute = fig.data[0]
    assert compute.name == "compute"
    y = np.asarray(compute.y, dtype=float)
    n_compute = wh.query(
        "SELECT rank, count(*) AS n FROM op_timings WHERE run_id = $r AND type = 'COMP_NODE' "
        "AND end_ns > start_ns GROUP BY rank",
        {"r": run},
    ).to_arrow()
    by_rank = dict(zip(n_compute["rank"].to_pylist(), n_compute["n"].to_pylist(), strict=True))
    for k, r in enumerate(shown):
        assert int(np.sum(np.isclose(y, k - 0.22))) == 2 * by_rank[r]  # two points per segment
    # lanes run in finish order; the critical path still goes forward in time
    assert np.all(np.diff(f[np.searchsorted(ranks, shown)]) >= 0)
    (line,) = [t for t in fig.data if t.name.startswith("critical path")]
    x = np.asarray(line.x, dtype=float)
    assert (np.diff(x[~np.isnan(x)]) >= 0).all()


def test_the_report_says_which_ranks_its_timeline_shows_and_why(
    big: tuple[Path, dict[str, int]], big_store: EmbeddedStore, tmp_path: Path
) -> None:
    run = big[1]["ring"]
    text = write_report(big_store.warehouse, [run], tmp_path / "big.html").read_text()
    m = re.search(r'<p class="sub lanes">(.*?)</p>', text, re.S)
    assert m, "no note on the ranks shown"
    note = html.unescape(m.group(1))
    assert note.startswith(f"Run {run}: 32 of 256 ranks shown: the ranks nearest the percentiles of finish")
    (info,) = run_infos(big_store.warehouse, [run])
    sel = timeline_lanes(big_store.warehouse, info, schedule_critical_path(big_store.warehouse, info))
    for r in sel.ranks.tolist():
        assert re.search(rf"\b{r}\b", note), r
    for word in ("min rank", "p10 rank", "p25 rank", "median rank", "p75 rank", "p90 rank", "max rank"):
        assert word in note
    assert "critical path" in note
