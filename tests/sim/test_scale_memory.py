"""Memory that follows the collective steps in flight, not the expanded run (issue 33).

A native ring all-reduce over ``g`` ranks is ``g · chunks · (1 + 6(g - 1))`` sub-ops:
quadratic in the group. The native loop makes a rank's sub-op when it becomes due and
gives it back when it is done (``_simdefer.c``), and a template whose ranks all run the
same ops is kept as one program (``_templates.Uniform``), so both the loop's state and
the preparation grow with the ranks, not with the steps. These tests pin that, and that
the results stay those of the full expansion for every native implementation.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, _loop, collective_workload, engine
from etstore.sim._routes import ClosedRoutes
from etstore.sim.network import Network
from etstore.topology import Topology
from etstore.workloads import transformer

pytestmark = pytest.mark.needs_extension("etstore.sim._simloop")


def _loop_outputs(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every LoopOutput run_loop returns, in order."""
    seen: list[Any] = []
    inner = _loop.run_loop

    def spy(*args: Any, **kw: Any) -> Any:
        out = inner(*args, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(engine, "run_loop", spy)
    return seen


def _ring_allreduce(g: int) -> tuple[Trace, Topology]:
    return collective_workload("allreduce", g, 1 << 20), Topology.ring(g)


@pytest.mark.parametrize("g", [32, 128])
def test_sub_ops_alive_at_once_follow_the_ranks_not_the_ring(monkeypatch: pytest.MonkeyPatch, g: int) -> None:
    seen = _loop_outputs(monkeypatch)
    trace, topo = _ring_allreduce(g)
    engine.simulate(trace, topo)
    out = seen[0]
    # 4 chunks, each an entry delay and 2 (g - 1) steps of send, receive and delay
    assert out.sub_ops == g * 4 * (1 + 3 * 2 * (g - 1))
    # each rank holds its step's send, receive and delay at most: O(g), where making a
    # rank's part whole when it starts held every step of the ring at once (out.sub_ops)
    assert out.peak_sub_ops <= 3 * g


def test_traced_memory_grows_with_the_ranks_not_with_the_steps() -> None:
    peaks = {}
    for g in (64, 256):
        trace, topo = _ring_allreduce(g)
        tracemalloc.start()
        try:
            engine.simulate(trace, topo)
            peaks[g] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # 16x the expanded steps, 4x the ranks: the preparation (templates, keys, message
    # times) must follow the ranks; a template laid out per rank grew 16x
    assert peaks[256] < 6 * peaks[64], peaks


def _same_tables(got: Any, want: Any) -> None:
    for table in ("ops", "ranks", "collectives", "links", "overloaded"):
        assert getattr(got, table).equals(getattr(want, table)), table
    assert (got.total_ns, got.events, got.sim_ops) == (want.total_ns, want.events, want.sim_ops)


def _lazy_and_full(monkeypatch: pytest.MonkeyPatch, trace: Trace, topo: Topology, config: SimConfig) -> Any:
    """Simulate with sub-ops made as they become due and with every collective expanded up front;
    the result tables must be equal."""
    lazy = engine.simulate(trace, topo, config=config)
    with monkeypatch.context() as m:
        m.setattr(engine, "DEFER_COLLECTIVES", False)
        full = engine.simulate(trace, topo, config=config)
    _same_tables(lazy, full)
    return lazy


IMPLS = [
    ((8,), ()),
    ((8,), ("direct",)),
    ((8,), ("halvingDoubling",)),
    ((4, 2), ()),
    ((4, 2), ("direct", "ring")),
    ((4, 2), ("halvingDoubling", "direct")),
    ((4, 2), ("ring", "doubleBinaryTree")),  # a tree mixed in: every rank laid out
    ((2, 4), ("oneRing",)),
    ((2, 2, 2), ("ring", "halvingDoubling", "direct")),
]
CASES = [
    pytest.param(dims, impls, coll, id=f"{coll}-{'x'.join(map(str, dims))}-{'-'.join(impls) or 'ring'}")
    for dims, impls in IMPLS
    for coll in ("allreduce", "allgather", "reducescatter", "alltoall")
    # ASTRA-sim has no all-to-all by halving-doubling or tree
    if coll != "alltoall" or not {"halvingDoubling", "doubleBinaryTree"} & set(impls)
]


@pytest.mark.parametrize(("dims", "impls", "coll"), CASES)
@pytest.mark.parametrize("congestion", ["unaware", "aware"])
def test_every_native_implementation_gives_the_full_expansion_results(
    monkeypatch: pytest.MonkeyPatch, dims: tuple[int, ...], impls: tuple[str, ...], coll: str, congestion: str
) -> None:
    topo = Topology.mesh(list(dims)) if len(dims) > 1 else Topology.ring(dims[0])
    cfg = SimConfig(congestion=congestion, native_impls={coll: impls} if impls else {})
    res = _lazy_and_full(monkeypatch, collective_workload(coll, topo.num_npus, 3 << 20), topo, cfg)
    assert res.total_ns > 0


@pytest.mark.parametrize("match_on_size", [True, False])
@pytest.mark.parametrize("impl", ["ring", "direct", "halvingDoubling"])
def test_communicator_groups_and_staggered_starts_give_the_full_expansion_results(
    monkeypatch: pytest.MonkeyPatch, match_on_size: bool, impl: str
) -> None:
    # tensor- and data-parallel groups (rings of members 8 apart on a ring of 32) ...
    cfg = SimConfig(match_on_size=match_on_size, native_impls={"ALL_REDUCE": (impl,)})
    _lazy_and_full(monkeypatch, transformer(ranks=32, tp=8, layers=2), Topology.ring(32), cfg)
    # ... and ranks that enter one ring far apart in time: early ranks run ahead while a
    # late one's sends and receives pile up unmatched (a part's window of rows grows)
    n = 16
    ops = ops_table(
        {
            "rank": np.repeat(np.arange(n), 2),
            "id": np.tile([1, 2], n),
            "type": ["COMP_NODE", "COMM_COLL_NODE"] * n,
            "duration_micros": np.repeat((np.arange(n) * 37) % 11 * 50, 2),
            "comm_type": [None, "ALL_REDUCE"] * n,
            "comm_size": [None, 5 << 20] * n,
        }
    )
    deps = deps_table(np.arange(n), np.ones(n), np.full(n, 2))
    _lazy_and_full(monkeypatch, Trace(ops, deps, name="staggered"), Topology.ring(n), cfg)


@pytest.mark.parametrize(
    "spec",
    ["ring:12", "ring:2", "uniring:5", "mesh2d:4x3", "torus2d:4x4", "fc:6", "switch:5", "hypercube:16",
     "ring:4+switch:3", "mesh3d:2x3x2", "fc:3+ring:4"],
)  # fmt: skip
def test_closed_routes_are_the_topology_table(spec: str) -> None:
    topo = Topology.from_spec(spec)
    closed = ClosedRoutes.of(topo)
    assert closed is not None
    n = topo.num_npus
    cur, dst = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    assert np.array_equal(closed.next_links(cur, dst), topo.next_link()[cur, dst].astype(np.int64))


def test_a_topology_not_laid_out_by_its_axes_routes_by_its_table() -> None:
    for topo in (Topology.from_spec("ring:8,fail=2-3"), Topology.from_spec("torus2d:4x4").transpose()):
        assert ClosedRoutes.of(topo) is None
        net = Network(topo)
        hops, _lat, _bw = net.route_metrics(np.array([0, 5]), np.array([4, 1]))
        want = [len(topo.route(0, 4)), len(topo.route(5, 1))]
        assert hops.tolist() == want


def test_an_unaware_replay_on_a_ring_builds_no_routing_table() -> None:
    net = Network(Topology.ring(4096))
    src = np.arange(4096)
    net.message_times_ns(src, (src + 8) % 4096, np.full(4096, 1 << 20))
    loads, msgs, _busy = net.link_loads(src, (src + 8) % 4096, np.full(4096, 1.0))
    assert msgs.sum() == 8 * 4096 and loads.sum() == 8 * 4096
    assert net._table is None  # 64 MiB at 4,096 NPUs, 1 GiB at 16,384
