"""Collectives the native loop expands as they start (``etstore.sim._defer``, ``_simdefer.c``).

tests/sim/test_simloop.py compares every workload shape with and without deferral; here:
memory that follows the parts in flight, the stuck path, the C side's validation of
what it is handed, and the routing shortcut that keeps large rings fast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from etstore.sim import SimConfig, SimulationError, _defer, _loop, collective_workload, engine
from etstore.sim.network import Network
from etstore.topology import Topology
from etstore.workloads import transformer

pytestmark = pytest.mark.needs_extension("etstore.sim._simloop")


def _spy_loop(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every LoopOutput run_loop returns, in order."""
    seen: list[Any] = []
    inner = _loop.run_loop

    def spy(*args: Any, **kw: Any) -> Any:
        out = inner(*args, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(engine, "run_loop", spy)
    return seen


def test_parts_in_flight_bound_memory_and_results_match_full_expansion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = transformer(ranks=32, tp=4, layers=6)
    topo = Topology.ring(32)
    seen = _spy_loop(monkeypatch)
    lazy = engine.simulate(work, topo)
    monkeypatch.setattr(engine, "DEFER_COLLECTIVES", False)
    full = engine.simulate(work, topo)
    for table in ("ops", "ranks", "collectives", "links", "overloaded"):
        assert getattr(lazy, table).equals(getattr(full, table)), table
    assert (lazy.total_ns, lazy.events, lazy.sim_ops) == (full.total_ns, full.events, full.sim_ops)
    out = seen[0]
    # every sub-op the full expansion has up front is made once, as its part starts
    assert out.sub_ops == full.sim_ops - len(out.end) == len(seen[1].end) - len(out.end) > 0
    # 6 layers of tensor- and data-parallel collectives per rank, run one after another:
    # at most a few collectives' parts are alive at once, never the whole run's
    assert 0 < out.peak_sub_ops < out.sub_ops / 4
    # the link table (equal above) came from messages summed per NPU pair
    assert len(out.pairs.src) and (out.pairs.first < out.pairs.last).all() and (out.pairs.count > 0).all()


def test_pair_totals_count_every_message_of_a_native_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    # ASTRA-sim's native ring all-reduce on 8 NPUs with one chunk: 2 (n - 1) steps, each
    # rank sending one message to its right neighbour per step -> 8 pairs of 14 messages
    cfg = dataclasses.replace(SimConfig(), preferred_dataset_splits=1)
    seen = _spy_loop(monkeypatch)
    res = engine.simulate(collective_workload("allreduce", 8, 1 << 20), Topology.ring(8), config=cfg)
    pairs = seen[0].pairs
    assert sorted(zip(pairs.src.tolist(), pairs.dst.tolist(), strict=True)) == [
        (r, (r + 1) % 8) for r in range(8)
    ]
    assert pairs.count.tolist() == [14] * 8
    assert np.allclose(pairs.nbytes, 14 * (1 << 20) / 8)
    assert res.links["messages"].to_numpy().sum() == 8 * 14


def test_stuck_replay_is_diagnosed_on_the_full_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    from etstore.model import Trace, ops_table

    # rank 0 all-reduces with rank 1, then waits for a message nobody sends
    ops = ops_table(
        {
            "rank": [0, 1, 0],
            "id": [1, 1, 2],
            "type": ["COMM_COLL_NODE", "COMM_COLL_NODE", "COMM_RECV_NODE"],
            "comm_type": ["ALL_REDUCE", "ALL_REDUCE", None],
            "comm_size": [1 << 20, 1 << 20, 64],
            "comm_src": [None, None, 1],
            "comm_tag": [None, None, 7],
        }
    )
    trace = Trace(ops, name="orphan")
    with pytest.raises(SimulationError) as lazy:
        engine.simulate(trace, Topology.ring(2))
    monkeypatch.setattr(engine, "DEFER_COLLECTIVES", False)
    with pytest.raises(SimulationError) as full:
        engine.simulate(trace, Topology.ring(2))
    assert str(lazy.value) == str(full.value)
    assert "1 of 3 ops never finished" in str(lazy.value)
    assert lazy.value.stuck.equals(full.value.stuck)


@pytest.mark.parametrize(
    ("name", "corrupt", "message"),
    [
        ("tsucc", lambda a: a + 1, "tsucc"),  # a successor outside its template's rank
        ("coll_inst", lambda a: np.where(a >= 0, 0, a), "coll_"),  # two collective ops start one part
        ("i_join", lambda a: a * 0, "i_join"),  # a join that is not a join op
        ("grp", lambda a: a + 10_000, "grp"),  # an NPU outside the network
        ("t_poff", lambda a: a + 1_000_000, "t_poff"),  # rank starts past the packed array
    ],
)
def test_native_loop_rejects_inconsistent_deferred_collectives(
    monkeypatch: pytest.MonkeyPatch, name: str, corrupt: Any, message: str
) -> None:
    spec = _defer.Deferred.spec
    field = _defer.SPEC_FIELDS.index(name)

    def bad(self: _defer.Deferred, *args: Any) -> tuple[object, ...]:
        out = list(spec(self, *args))
        assert len(out) == len(_defer.SPEC_FIELDS)
        out[field] = np.ascontiguousarray(corrupt(np.asarray(out[field])), dtype=np.int64)
        return tuple(out)

    monkeypatch.setattr(_defer.Deferred, "spec", bad)
    with pytest.raises(ValueError, match=f"bad deferred collectives: {message}"):
        engine.simulate(transformer(ranks=8, tp=2, layers=1), Topology.ring(8))


@pytest.mark.parametrize(
    ("topo", "dims"),
    [
        (Topology.ring(12), (12,)),
        (Topology.mesh([4, 3]), (4, 3)),
        (Topology.torus([4, 4]) if hasattr(Topology, "torus") else Topology.mesh([4, 4]), (4, 4)),
        (Topology.mesh([2, 3, 2]), (2, 3, 2)),
    ],
)
def test_routes_shared_with_the_topology_equal_the_dimension_ordered_search(
    topo: Topology, dims: tuple
) -> None:
    net = Network(topo, dims)
    assert net._labels_follow_link_ids()
    shared = net._nh.copy()
    net._done[:] = False  # the per-destination search the table replaces
    net.prepare(np.arange(topo.num_npus))
    assert np.array_equal(net._nh, shared)


def test_dimensions_that_disagree_with_link_order_keep_their_own_search() -> None:
    # a 16-NPU ring read as 4 x 4: links of one NPU are not listed in dimension order
    topo = Topology.ring(16)
    net = Network(topo, (4, 4))
    if net._labels_follow_link_ids():
        pytest.skip("this topology lists its links in dimension order")
    assert not net._done.any()
    hops, _lat, _bw = net.route_metrics(np.array([0, 0]), np.array([8, 5]))
    assert hops.tolist() == [8, 5]  # fewest hops on the ring
