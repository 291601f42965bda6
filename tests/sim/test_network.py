"""Routing and message models over the shared topology model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from etstore.errors import TopologyError
from etstore.sim import read_network_config
from etstore.sim.network import Network, dims_of, grid_topology, link_dimensions
from etstore.topology import Topology

FIX = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "astra-sim"
NET = FIX / "examples" / "network" / "analytical"
BPN = 50 * 2**30 / 1e9  # bytes per ns at 50 GB/s (GB = 2^30)


def _pairs(topo: Topology, links: list[int]) -> list[tuple[int, int]]:
    return [(int(topo.src[k]), int(topo.dst[k])) for k in links]


@pytest.mark.parametrize("own_bfs", [False, True])
def test_mesh_routes_are_dimension_ordered(own_bfs: bool) -> None:
    topo = grid_topology(["Mesh", "Mesh"], [4, 4], bandwidth_gb_per_s=[50, 50], latency_ns=[500, 500])
    net = Network(topo, dims=(4, 4)) if own_bfs else Network(topo)
    # 0 = (0,0) to 15 = (3,3): x first, then y
    assert _pairs(topo, net.route(0, 15)) == [(0, 1), (1, 2), (2, 3), (3, 7), (7, 11), (11, 15)]
    assert _pairs(topo, net.route(15, 0)) == [(15, 14), (14, 13), (13, 12), (12, 8), (8, 4), (4, 0)]
    assert net.route(5, 5) == []


def test_own_bfs_and_topology_routes_agree_on_hop_counts() -> None:
    topo = grid_topology(["Ring"] * 3, [4, 4, 2], bandwidth_gb_per_s=[50] * 3, latency_ns=[500] * 3)
    shared = Network(topo)
    own = Network(topo, dims=(4, 4, 2))
    src, dst = np.meshgrid(np.arange(32), np.arange(32))
    h1, lat1, _bw1 = shared.route_metrics(src.ravel(), dst.ravel())
    h2, _lat2, _bw2 = own.route_metrics(src.ravel(), dst.ravel())
    assert np.array_equal(h1, h2)
    assert h1.max() == 2 + 2 + 1  # torus diameter
    assert np.array_equal(lat1, h1 * 500.0)


def test_unaware_time_is_hops_times_latency_plus_size_over_bandwidth() -> None:
    net = Network(Topology.ring(8))
    size = np.array([32768, 32768, 32768, 1000])
    t = net.message_times_ns(np.array([0, 0, 0, 3]), np.array([1, 4, 7, 3]), size)
    expected = [np.floor(h * 500 + 32768 / BPN) for h in (1, 4, 1)] + [0.0]
    assert t.tolist() == expected
    t2 = net.message_times_ns(
        np.array([0]), np.array([4]), np.array([32768]), integer_ns=False, overhead_ns=7
    )
    assert t2[0] == pytest.approx(4 * 500 + 32768 / BPN + 7)


def test_heterogeneous_route_uses_summed_latency_and_bottleneck_bandwidth() -> None:
    topo = Topology(
        3, np.array([0, 1]), np.array([1, 2]), np.array([100.0, 300.0]), np.array([100.0, 25.0]), "line"
    )
    net = Network(topo)
    hops, lat, bw = net.route_metrics(np.array([0]), np.array([2]))
    assert (hops[0], lat[0]) == (2, 400.0)
    assert bw[0] == pytest.approx(25 * 2**30 / 1e9)


def test_unreachable_destination() -> None:
    topo = Topology.from_links(3, [(0, 1), (1, 2)])
    net = Network(topo, dims=(3,))
    with pytest.raises(TopologyError, match="NPU 0 is unreachable from NPU 2"):
        net.message_times_ns(np.array([2]), np.array([0]), np.array([8]))
    with pytest.raises(TopologyError, match="NPU 0 is unreachable from NPU 1"):
        net.route(1, 0)


def test_npu_outside_the_topology() -> None:
    net = Network(Topology.ring(4), dims=(4,))
    with pytest.raises(TopologyError, match=r"NPU 9 is outside 0\.\.3"):
        net.prepare(np.array([9]))


def test_link_loads_follow_routes() -> None:
    topo = Topology.ring(4)
    net = Network(topo)
    nbytes, msgs, busy = net.link_loads(np.array([0, 0]), np.array([2, 1]), np.array([1000, 500]))
    assert nbytes.sum() == 2 * 1000 + 500
    assert msgs.sum() == 3
    assert busy.sum() == pytest.approx(2500 / BPN)


def test_grid_kinds() -> None:
    fc = grid_topology(["FullyConnected"], [4], bandwidth_gb_per_s=[100], latency_ns=[10])
    assert fc.num_links == 12 and fc.name == "fullyconnected:4"
    sw = grid_topology(["Switch"], [4], bandwidth_gb_per_s=[100], latency_ns=[10])
    assert sw.num_links == 12 and set(sw.latency_ns.tolist()) == {20.0}
    ring2 = grid_topology(["Ring", "Ring"], [2, 3], bandwidth_gb_per_s=[1, 2], latency_ns=[1, 2])
    assert ring2.num_links == 2 * 3 + 6 * 2
    assert dims_of(ring2) == (2, 3)
    assert sorted(set(link_dimensions(ring2).tolist())) == [0, 1]
    with pytest.raises(TopologyError, match="unknown topology kind 'Tree'"):
        grid_topology(["Tree"], [4], bandwidth_gb_per_s=[1], latency_ns=[1])
    with pytest.raises(TopologyError, match="one entry per dimension"):
        grid_topology(["Ring"], [4, 4], bandwidth_gb_per_s=[1], latency_ns=[1])


def test_dims_from_names() -> None:
    topo = Topology.from_links(8, [(i, (i + 1) % 8) for i in range(8)], name="mesh2d:2x4")
    assert dims_of(topo) == (2, 4)
    assert dims_of(Topology.from_links(8, [(0, 1)], name="custom")) == (8,)
    assert dims_of(Topology.from_links(8, [(0, 1)], name="mesh2d:3x3")) == (8,)


def test_astra_network_files() -> None:
    if not NET.exists():
        pytest.skip("ASTRA-sim network fixtures not present")
    ring = read_network_config(NET / "Ring_8npus.yml")
    assert (ring.kinds, ring.dims, ring.topology.num_npus, ring.topology.num_links) == (
        ("Ring",),
        (8,),
        8,
        16,
    )
    assert set(ring.topology.bandwidth_gb_per_s.tolist()) == {50.0}
    sw = read_network_config(NET / "HGX-H100-validated.yml")
    assert sw.topology.num_links == 8 * 7
    assert set(sw.topology.latency_ns.tolist()) == {2 * 936.25}
    net = Network(sw.topology)
    t = net.message_times_ns(np.array([0]), np.array([5]), np.array([1 << 20]))
    assert t[0] == np.floor(2 * 936.25 + (1 << 20) / (400 * 2**30 / 1e9))


def test_network_config_errors(tmp_path: Path) -> None:
    p = tmp_path / "net.yml"
    p.write_text("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\n")
    with pytest.raises(TopologyError, match="missing key\\(s\\) latency"):
        read_network_config(p)
    p.write_text("topology: [ Ring, Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TopologyError, match="one entry per dimension"):
        read_network_config(p)
    p.write_text("topology: [ Torus ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TopologyError, match="unknown topology"):
        read_network_config(p)
    p.write_text("topology: [ Ring\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        read_network_config(p)
    with pytest.raises(TopologyError, match="no such network config file"):
        read_network_config(tmp_path / "absent.yml")
