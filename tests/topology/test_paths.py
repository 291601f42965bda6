"""Routes on built-in shapes in closed form (etstore/topology/paths.py), and what a big fully connected
network costs before and while it is built (etstore/topology/axes.py).

Evidence: the closed-form next-link table equals the search over links on every kind of axis
and their products (and a topology whose links are not in the built order falls back to the
search); a 512- and a 4,096-NPU fully connected network route without per-link work, measured
by tracemalloc's peak rather than wall time; a 4,096-NPU FullyConnected network config over the
memory budget is refused before any link is built.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etstore.errors import TopologyError
from etstore.sim import simulate
from etstore.sim.sweep import collective_workload
from etstore.topology import Dim, Topology, read_network_config
from etstore.topology.axes import compose_links

MIB = 1 << 20


def _searched(t: Topology) -> np.ndarray:
    """The next-link table of the search over links: the same arrays, without the axes."""
    return Topology(t.num_npus, t.src, t.dst, t.latency_ns, t.bandwidth_gb_per_s, "searched").next_link()


def _peak(work: Callable[[], Any]) -> tuple[Any, int]:
    """``work()``'s result and the most bytes it held at once (numpy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        out = work()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``budget("1GiB")`` sets the memory budget for this test."""
    yield lambda size: monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", size)


# ---------------------------------------------------------------- closed-form routes


@pytest.mark.parametrize(
    "spec",
    [
        "ring:8",
        "ring:2",
        "ring:3",
        "uniring:5",
        "mesh:5",
        "fc:7",
        "switch:6",
        "mesh2d:4x3",
        "torus2d:4x5",
        "torus3d:2x4x3",
        "hypercube:16",
        "ring:4+switch:8",
        "switch:3+uniring:4",
        "fc:3+mesh:4x2",
        "ring:8+ring:2",
        "switch:4+uniring:2+mesh:3",
    ],
)
def test_closed_form_routes_equal_the_search(spec: str) -> None:
    t = Topology.from_spec(spec)
    assert t.is_regular()
    np.testing.assert_array_equal(t.next_link(), _searched(t))


def test_axes_of_one_npu_keep_their_place() -> None:
    t = Topology.compose([Dim("line", 3, 50, 500), Dim("switch", 1, 50, 500), Dim("ring", 4, 20, 100)])
    np.testing.assert_array_equal(t.next_link(), _searched(t))


def test_links_out_of_the_built_order_are_searched() -> None:
    # transpose() keeps the axes, but its links are sorted by destination: the closed form's link
    # ids would name other links, so the table comes from the search (and is still a valid route)
    t = Topology.from_spec("mesh2d:3x4").transpose()
    assert t.is_regular()
    nl = t.next_link()
    np.testing.assert_array_equal(nl, _searched(t))
    hops = t.hop_distances()
    for s in range(t.num_npus):
        for d in range(t.num_npus):
            assert len(t.route(s, d)) == hops[s, d]


def test_built_links_by_hand() -> None:
    # the links are written in their final order without a sort: NPU 4 = (1, 1) of a 3 x 2 mesh
    # has +x (5), -x (3), then -y (1); a 4-NPU fully connected axis lists the other NPUs ascending
    n, src, dst, _, bw = compose_links([Dim("line", 3, 10, 1), Dim("line", 2, 20, 2)])
    assert n == 6 and src.dtype == dst.dtype == np.int32
    assert dst[src == 4].tolist() == [5, 3, 1] and bw[src == 4].tolist() == [10, 10, 20]
    _, src, dst, _, _ = compose_links([Dim("fc", 4, 50, 500)])
    assert dst[src == 2].tolist() == [0, 1, 3]


# ---------------------------------------------------------------- big fully connected networks


def test_a_small_trace_on_512_fully_connected_npus_needs_no_per_link_tables() -> None:
    # 261,632 links. The search over links scored every (link, destination) pair: 512 x 261,632
    # int64 scores, over 1 GiB, 13.7 s for a 4-rank all-reduce. The closed form is one 512 x 512
    # int32 table (1 MiB) plus its temporaries.
    t = Topology.fully_connected(512)
    nl, peak = _peak(t.next_link)
    assert peak < 16 * MIB
    s, d = np.nonzero(nl >= 0)
    assert len(s) == 512 * 511 and (t.src[nl[s, d]] == s).all() and (t.dst[nl[s, d]] == d).all()
    res, peak = _peak(
        lambda: simulate(collective_workload("allreduce", 4, MIB), Topology.fully_connected(512))
    )
    assert res.total_ns > 0 and peak < 160 * MIB


def test_a_4096_npu_fully_connected_network_routes_within_its_table(budget: Callable[[str], None]) -> None:
    # The search needed 4,096^2 x (4 + 24 x 4,095) bytes and was refused ("needs about 1.5 TiB")
    # after the 16.8M links were built; the closed form needs the 64 MiB table.
    budget("2GiB")
    t = Topology.from_spec("fc:4096")
    nl, peak = _peak(t.next_link)
    assert nl.shape == (4096, 4096) and peak < 128 * MIB
    rows = np.array([0, 1, 2047, 4095])
    s, d = np.nonzero(nl[rows] >= 0)
    assert len(s) == 4 * 4095
    assert (t.src[nl[rows[s], d]] == rows[s]).all() and (t.dst[nl[rows[s], d]] == d).all()


def test_a_4096_npu_fully_connected_config_over_budget_is_refused_before_building(
    tmp_path: Path, budget: Callable[[str], None]
) -> None:
    net = tmp_path / "fc4096.yml"
    net.write_text(
        "topology: [ FullyConnected ]\nnpus_count: [ 4096 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
    )
    budget("1GiB")

    def refusal() -> str:
        with pytest.raises(TopologyError) as err:
            read_network_config(net)
        return str(err.value)

    message, peak = _peak(refusal)
    assert message.startswith(f"{net}: topology fc:4096,bw=50,lat=500: building its 16,773,120 links")
    assert "needs about 1.5 GiB, more than the memory budget of 1 GiB" in message
    assert peak < MIB  # refused from the counts alone: no link array was allocated
