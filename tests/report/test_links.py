"""The link section: the axis of a link (hand-checked), the hottest-links table and a heatmap that
can be read at 256 NPUs, its colour scale from 0 to the data's maximum in percent."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from etstore.report import hottest_links, link_heatmap_figure, write_report
from etstore.report.links import HOT_LINKS, link_axes
from etstore.store import EmbeddedStore
from etstore.testing import RecordedStore as Recorded


@pytest.fixture(scope="module")
def big_store(big: tuple[Path, dict[str, int]]) -> Iterator[EmbeddedStore]:
    store = EmbeddedStore(big[0], read_only=True)
    yield store
    store.close()


def test_link_axes_of_composed_topologies() -> None:
    # ring:4+switch:2: NPU u at (u % 4, u // 4); 0 -> 1 along the ring, 0 -> 4 across the switch,
    # 1 -> 6 changes both coordinates (no one axis)
    assert link_axes("ring:4+switch:2", np.array([0, 0, 1]), np.array([1, 4, 6])) == [
        "0 · ring:4",
        "1 · switch:2",
        "–",
    ]
    # mesh2d:4x4,bw=50: 5 = (1, 1) -> 9 = (1, 2) along axis 1
    assert link_axes("mesh2d:4x4,bw=50", np.array([5, 5]), np.array([9, 6])) == ["1 · mesh:4", "0 · mesh:4"]
    # a topology file, and one that lost an NPU (renumbered): no axes
    assert link_axes("topo.yaml", np.array([0]), np.array([1])) == ["–"]
    assert link_axes("ring:8,fail=3", np.array([0]), np.array([1])) == ["–"]


def _hot_tables(text: str) -> list[list[list[str]]]:
    tables = re.findall(r'<table class="hot-links">(.*?)</table>', text, re.S)
    return [
        [
            [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
            if "<td" in row
        ]
        for body in tables
    ]


def test_the_report_lists_the_hottest_links(
    big: tuple[Path, dict[str, int]], big_store: EmbeddedStore, tmp_path: Path
) -> None:
    run = big[1]["mesh"]
    text = write_report(big_store.warehouse, [run], tmp_path / "big.html").read_text()
    (rows,) = _hot_tables(text)
    assert len(rows) == HOT_LINKS == 15
    header = re.search(r'<table class="hot-links"><thead><tr>(.*?)</tr>', text, re.S)
    assert header
    assert re.findall(r"<th[^>]*>(.*?)</th>", header.group(1)) == [
        "source NPU",
        "destination NPU",
        "axis",
        "MiB",
        "messages",
        "busy time",
        "utilization",
    ]
    util = [float(r[6].rstrip("%").replace(",", "")) for r in rows]
    assert util == sorted(util, reverse=True)
    # the same links as the warehouse's hottest, in the same order
    want = big_store.warehouse.query(
        "SELECT src, dst, utilization FROM link_util WHERE run_id = $r "
        "ORDER BY utilization DESC, bytes DESC, src, dst LIMIT 15",
        {"r": run},
    ).to_arrow()
    assert [(int(r[0]), int(r[1])) for r in rows] == list(
        zip(want["src"].to_pylist(), want["dst"].to_pylist(), strict=True)
    )
    assert util[0] == pytest.approx(want["utilization"][0].as_py() * 100, abs=0.05)
    # on a 16 × 16 mesh every link runs along one axis
    assert {r[2] for r in rows} <= {"0 · mesh:16", "1 · mesh:16"}
    assert re.search(r"Run \d+: 960 links, \d+ of them carried traffic; hottest", text)


def test_hottest_links_table(big: tuple[Path, dict[str, int]], big_store: EmbeddedStore) -> None:
    ring, mesh = big[1]["ring"], big[1]["mesh"]
    t = hottest_links(big_store.warehouse, [mesh, ring], limit=4)
    assert t.column_names == [
        "run_id",
        "src",
        "dst",
        "axis",
        "bytes",
        "messages",
        "busy_ns",
        "utilization",
        "bandwidth_gb_per_s",
    ]
    assert t["run_id"].to_pylist() == [mesh] * 4 + [ring] * 4
    assert set(t["axis"].to_pylist()[4:]) == {"0 · ring:256"}
    for run in (mesh, ring):
        u = [r["utilization"] for r in t.to_pylist() if r["run_id"] == run]
        top = big_store.warehouse.query(
            "SELECT max(utilization) AS u FROM link_util WHERE run_id = $r", {"r": run}
        ).to_arrow()["u"][0]
        assert u == sorted(u, reverse=True) and u[0] == top.as_py()


def test_a_256_npu_heatmap_is_drawn_by_group_on_a_scale_from_zero_to_the_data_max(
    big: tuple[Path, dict[str, int]], big_store: EmbeddedStore
) -> None:
    wh = big_store.warehouse
    for kind, groups, size in (("mesh", 16, 16), ("ring", 32, 8)):
        run = big[1][kind]
        fig = link_heatmap_figure(wh, [run])
        assert fig is not None
        (heat,) = fig.data
        z = np.asarray(heat.z, dtype=float)
        assert z.shape == (groups, groups)
        assert list(heat.x) == list(range(0, 256, size))
        title = fig.layout.title.text
        assert f"{groups} groups of {size}" in title
        if kind == "mesh":  # a group is one row of the mesh: the NPUs along axis 0
            assert "along mesh:16" in title
        # each cell is the hottest link between its two groups
        links = wh.query(
            "SELECT src, dst, utilization FROM link_util WHERE run_id = $r", {"r": run}
        ).to_arrow()
        src, dst, util = (links[c].to_numpy() for c in ("src", "dst", "utilization"))
        i, j = int(src[0]) // size, int(dst[0]) // size
        same = (src // size == i) & (dst // size == j)
        assert z[i, j] == pytest.approx(util[same].max() * 100)
        # the colour scale: 0 to 100% (or to the largest value drawn past it), labelled in percent
        axis = fig.layout.coloraxis
        assert axis.cmin == 0
        assert axis.cmax == pytest.approx(max(100.0, np.nanmax(z))) and axis.cmax == pytest.approx(
            max(100.0, util.max() * 100)
        )
        assert axis.colorbar.ticksuffix == "%"
        assert f"max {util.max() * 100:,.3g}%" in axis.colorbar.title.text


def test_a_small_heatmap_keeps_a_cell_per_link(recorded: Recorded) -> None:
    with EmbeddedStore(recorded.path, read_only=True) as store:
        fig = link_heatmap_figure(store.warehouse, list(recorded.runs))
        top = store.warehouse.query(
            "SELECT max(utilization) AS u FROM link_util WHERE list_contains($ids, run_id)",
            {"ids": list(recorded.runs)},
        ).to_arrow()["u"][0]
    assert fig is not None and len(fig.data) == 2
    assert all(np.asarray(t.z, dtype=float).shape == (8, 8) for t in fig.data)
    assert fig.layout.title.text.startswith("Link utilization over the topology")
    # one scale for both panels: 0 to 100%, or to the hottest link of either run past it; a
    # lightly used link is pale, not the scale's darkest colour
    assert fig.layout.coloraxis.cmin == 0
    assert fig.layout.coloraxis.cmax == pytest.approx(max(100.0, top.as_py() * 100))
    drawn = max(np.nanmax(np.asarray(t.z, dtype=float)) for t in fig.data)
    assert fig.layout.coloraxis.cmax == pytest.approx(max(100.0, drawn))
