"""Real stores for the report: two runs of one workload with a bandwidth sweep; the hand-checked
overlap workload with the opportunities the finders record for it; a 256-rank workload on a ring
and on a 16 × 16 mesh (what ``etstore workload --ranks 256 --tp 8 --layers 2`` stores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.analysis.split import SplitCost
from etstore.app.opportunities import find_and_record
from etstore.app.runs import record_run, record_sweep
from etstore.sim import SimConfig, simulate, sweep
from etstore.store import EmbeddedStore
from etstore.testing import RecordedStore as Recorded
from etstore.testing import hand_workload, ingest_hand_expanded
from etstore.topology import Topology, parse_topology
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
            "($t, 'overlap', 0, 9, 10, 2500.0, 'start grad_allreduce_L2 before bwd_mlp_L1', 1), "
            "($t, 'reorder', 1, 12, 11, 900.0, 'swap', 2), "
            "('another-trace', 'chunk', 0, 1, NULL, 7.0, 'not this trace', 1)",
            {"t": tr.name},
        )
    return Recorded(path, (a, b), sid, tr.name)


@pytest.fixture
def store(recorded: Recorded) -> Iterator[EmbeddedStore]:
    with EmbeddedStore(recorded.path, read_only=True) as s:
        yield s


@pytest.fixture(scope="module")
def hand_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """tests/app/test_overlap.py's 2-rank workloads ("hand" and "expanded") with three runs
    (hand on ring:2 unaware and aware, expanded on ring:2) and the finders' opportunities recorded:
    per rank of "hand" an overlap (20 µs) and a reorder (55 µs), per rank of "expanded" a chunk (3 µs)."""
    path = tmp_path_factory.mktemp("hand") / "store"
    ring = parse_topology("ring:2")
    with EmbeddedStore(path) as store:
        trace = hand_workload()
        store.ingest(trace, name="hand")
        expanded = ingest_hand_expanded(store)
        runs = [
            record_run(store.warehouse, simulate(trace, ring), trace_name="hand"),
            record_run(
                store.warehouse,
                simulate(trace, ring, config=SimConfig(congestion="aware")),
                trace_name="hand",
            ),
            record_run(store.warehouse, simulate(store.load(expanded), ring), trace_name=expanded),
        ]
        # the finders' hand-worked estimates (tests/app/test_overlap.py), as --estimates records them
        free = SplitCost(overhead_us=0)
        find_and_record(store, "hand", topo="ring:2", measure=False, split=free)
        find_and_record(store, expanded, topo="ring:2", measure=False, split=free)
    return path, runs


@pytest.fixture(scope="session")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A 256-rank transformer step (tp 8, 2 layers: 4,864 ops) simulated on ring:256 and on
    mesh2d:16x16 and recorded: (store path, run id by topology kind, "ring" and "mesh")."""
    path = tmp_path_factory.mktemp("big") / "store"
    tr = transformer(ranks=256, layers=2, tp=8, name="t256")
    groups = tr.params["comm_groups"]
    with EmbeddedStore(path) as store:
        store.ingest(tr)
        runs = {
            kind: record_run(
                store.warehouse, simulate(tr, parse_topology(spec), groups=groups), trace_name=tr.name
            )
            for kind, spec in (("ring", "ring:256"), ("mesh", "mesh2d:16x16"))
        }
    return path, runs
