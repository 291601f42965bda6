"""A real store with two runs of one workload, a bandwidth sweep and recorded opportunities."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from etstore.sim import SimConfig, record_run, record_sweep, simulate, sweep
from etstore.store import EmbeddedStore
from etstore.testing import RecordedStore as Recorded
from etstore.topology import Topology
from etstore.workloads import transformer


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    path = tmp_path_factory.mktemp("report") / "store"
    tr = transformer(ranks=8, layers=3, tp=2)
    topo = Topology.mesh([4, 2])
    with EmbeddedStore(path) as store:
        store.ingest(tr)
        groups = tr.params["comm_groups"]
        a = record_run(store.warehouse, simulate(tr, topo, groups=groups), trace_name=tr.name)
        b = record_run(
            store.warehouse,
            simulate(tr, topo, config=SimConfig(congestion="aware"), groups=groups),
            trace_name=tr.name,
        )
        points = sweep(
            [1 << 16, 1 << 20, 1 << 22], ["native", "ring"], [Topology.mesh([4, 2]), Topology.ring(8)]
        )
        sid = record_sweep(store.warehouse, points)
        store.warehouse.execute(
            "INSERT INTO opportunities VALUES "
            "($t, 'overlap', 0, 9, 10, 2500.0, 'start grad_allreduce_L2 before bwd_mlp_L1'), "
            "($t, 'reorder', 1, 12, 11, 900.0, 'swap'), "
            "('another-trace', 'chunk', 0, 1, NULL, 7.0, 'not this trace')",
            {"t": tr.name},
        )
    return Recorded(path, (a, b), sid, tr.name)


@pytest.fixture
def store(recorded: Recorded) -> Iterator[EmbeddedStore]:
    with EmbeddedStore(recorded.path, read_only=True) as s:
        yield s
