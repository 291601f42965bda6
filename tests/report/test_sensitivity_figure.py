"""The report's sensitivity section: any run of a knob sweep brings the whole curve, makespan vs value."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from etstore.cli import main
from etstore.report import sensitivity_figure, write_report
from etstore.report.sensitivity import sensitivity_points
from etstore.store import EmbeddedStore, open_store
from etstore.testing import two_chains


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run 1 a plain simulation; runs 2..4 the sweep slow:0 = 1, 1.5, 2 on switch:2."""
    s = tmp_path_factory.mktemp("sensitivity") / "s"
    with open_store(s, write=True) as store:
        store.ingest(two_chains())
    assert main(["--store", str(s), "sim", "chains", "--topo", "switch:2"]) == 0
    args = ["sweep", "chains", "--knob", "slow:0=1,1.5,2", "--topo", "switch:2", "--format", "csv"]
    assert main(["--store", str(s), *args]) == 0
    return s


def test_one_run_of_a_sweep_brings_the_whole_curve(swept: Path) -> None:
    with EmbeddedStore(swept, read_only=True) as store:
        points = sensitivity_points(store.warehouse, [3])
        fig = sensitivity_figure(store.warehouse, [3])
        assert sensitivity_figure(store.warehouse, [1]) is None  # a plain run: no section
    assert points["run_id"].to_pylist() == [2, 3, 4]
    assert points["first_run"].to_pylist() == [2, 2, 2]
    assert fig is not None and fig.layout.title.text == "Sensitivity: makespan vs slow:0"
    makespan = fig.data[0]
    assert list(makespan.x) == [1.0, 1.5, 2.0]
    assert list(makespan.y) == [300.0, 450.0, 600.0]  # µs: the straggler's added time, exactly
    assert list(makespan.customdata) == [2, 3, 4]


def test_the_report_draws_the_figure_and_its_table(swept: Path, tmp_path: Path) -> None:
    with EmbeddedStore(swept, read_only=True) as store:
        out = write_report(store.warehouse, [2, 4], tmp_path / "r.html")
        plain = write_report(store.warehouse, [1], tmp_path / "plain.html")
    page = out.read_text()
    assert "<h2>Sensitivity</h2>" in page and "Sensitivity: makespan vs slow:0" in page
    # plotly writes float arrays as base64 of their bytes
    for values in ([1.0, 1.5, 2.0], [300.0, 450.0, 600.0]):
        assert base64.b64encode(np.asarray(values).tobytes()).decode() in page
    # the table: each value's run, makespan and change from the first
    assert "<td>+150.00 µs</td><td>+50.00%</td>" in page.replace(' class=""', "")
    assert "<td>+300.00 µs</td><td>+100.00%</td>" in page.replace(' class=""', "")
    assert "Sensitivity" not in plain.read_text()
