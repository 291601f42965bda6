"""``list_runs``: one list of a store's simulations, measured runs and tuner runs (as every backend
reads them: on a server, the runs published there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from etstore.app.ingest_files import ingest_paths
from etstore.app.runs import record_run
from etstore.errors import OptionError
from etstore.formats.nccl_tests import read_nccl_tests
from etstore.formats.tuner import read_tuner_log
from etstore.sim import collective_workload, simulate
from etstore.store.runs import RUN_KINDS, list_runs
from etstore.testing import Backend
from etstore.topology import Topology

ROOT = Path(__file__).resolve().parents[3]
LOG = ROOT / "tests" / "data" / "nccl_tests" / "superbench_nccl_allreduce.log"
TUNER = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"


def test_runs_of_every_kind_in_one_list(backend: Backend) -> None:
    assert list_runs(backend.read()).num_rows == 0  # a new store: the tables exist, empty
    res = simulate(collective_workload("allreduce", 8, 1 << 20), Topology.ring(8))
    run_id = record_run(backend.store.warehouse, res, trace_name="ar8")
    ingest_paths(backend.store, [str(LOG), str(TUNER)])
    backend_store = backend.read()
    runs = list_runs(backend_store).to_pylist()
    assert [(r["kind"], r["name"]) for r in runs] == [
        ("sim", "ar8"),
        ("measured", "superbench_nccl_allreduce"),
        ("tuner", "nccl_tuner_4r"),
    ]
    sim, measured, tuner = runs
    assert sim["id"] == run_id
    assert sim["summary"] == f"{res.topology}, unaware, {res.total_ns / 1e6:.3f} ms, {res.sim_ops} sim ops"
    log = read_nccl_tests(LOG)
    assert f"{log.measurements.num_rows} rows" in measured["summary"]
    assert "ALL_REDUCE, 8 ranks" in measured["summary"]
    steps = read_tuner_log(TUNER).steps.num_rows
    assert tuner["summary"] == f"csv, {steps} steps, 0 linked to traces"
    only = list_runs(backend_store, ("tuner", "sim"))
    assert only["kind"].to_pylist() == ["sim", "tuner"]  # still oldest first
    with pytest.raises(OptionError, match=r"unknown run kind 'bogus': expected one of sim, measured"):
        list_runs(backend_store, ("bogus",))
    assert RUN_KINDS == ("sim", "measured", "tuner", "calibration")
