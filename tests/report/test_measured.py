"""The measured-vs-simulated figure of a calibration: each simulated curve is named by the spec it
was simulated on (the start spec before the fit, the fitted spec after it)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from etstore.app.calibrate import calibrate
from etstore.app.measured import store_measured_run
from etstore.formats.nccl_tests import read_nccl_tests
from etstore.report.measured import measured_busbw_figures
from etstore.store.warehouse import Warehouse

ALLREDUCE = Path(__file__).resolve().parents[1] / "data" / "nccl_tests" / "superbench_nccl_allreduce.log"


def test_before_and_after_fit_are_named_by_their_specs() -> None:
    warehouse = Warehouse(duckdb.connect())
    warehouse.create_schema()
    run = store_measured_run(warehouse, read_nccl_tests(ALLREDUCE)).name
    cal = calibrate(warehouse, run, "ring:8", min_size_bytes=2 << 20)
    start, fitted = cal.start_spec, cal.spec
    assert start != fitted and start.startswith("ring:8,") and fitted.startswith("ring:8,")
    (fig,) = measured_busbw_figures(warehouse)
    measured, before, after = fig.data
    assert measured.name == f"{cal.name} · measured"
    assert before.name == f"{cal.name} (native on {start}) · before fit"
    assert after.name == f"{cal.name} (native on {fitted}) · after fit"
    assert fitted not in before.name and start not in after.name
    # and they are the curves simulated on those specs: the view's before and after columns
    assert before.line.dash == "dot" and after.line.dash == "solid"
    view = warehouse.query(
        "SELECT sim_before_busbw_gb_per_s AS b, sim_after_busbw_gb_per_s AS a FROM v_measured_vs_sim "
        "ORDER BY size_bytes"
    ).to_arrow()
    assert list(before.y) == pytest.approx(view["b"].to_pylist())
    assert list(after.y) == pytest.approx(view["a"].to_pylist())
