"""Routing and message models over the shared topology model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from etstore.errors import TopologyError
from etstore.sim import read_network_config
from etstore.sim.network import Network
from etstore.topology import Topology, astra_topology

BPN = 50 * 2**30 / 1e9  # bytes per ns at 50 GB/s (GB = 2^30)


def _pairs(topo: Topology, links: list[int]) -> list[tuple[int, int]]:
    return [(int(topo.src[k]), int(topo.dst[k])) for k in links]


@pytest.mark.parametrize("own_bfs", [False, True])
def test_mesh_routes_are_dimension_ordered(own_bfs: bool) -> None:
    topo = Topology.mesh([4, 4], bandwidth_gb_per_s=50, latency_ns=500)
    net = Network(topo, dims=(4, 4)) if own_bfs else Network(topo)
    # 0 = (0,0) to 15 = (3,3): x first, then y
    assert _pairs(topo, net.route(0, 15)) == [(0, 1), (1, 2), (2, 3), (3, 7), (7, 11), (11, 15)]
    assert _pairs(topo, net.route(15, 0)) == [(15, 14), (14, 13), (13, 12), (12, 8), (8, 4), (4, 0)]
    assert net.route(5, 5) == []


def test_own_bfs_and_topology_routes_agree_on_hop_counts() -> None:
    topo = astra_topology(["Ring"] * 3, [4, 4, 2], [50] * 3, [500] * 3)
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


def test_switch_messages_move_at_full_port_bandwidth() -> None:
    # the topology shares a port fairly (100 / 3 per link); a message through the switch
    # still moves at the port's 100 GiB/s over two hops, as ASTRA-sim times it
    sw = astra_topology(["Switch"], [4], [100], [10])
    assert sw.bandwidth_gb_per_s.tolist() == pytest.approx([100 / 3] * 12)
    t = Network(sw).message_times_ns(np.array([0]), np.array([3]), np.array([1 << 20]))
    assert t[0] == np.floor(20 + (1 << 20) / (100 * 2**30 / 1e9))


def test_one_npu_dimension_keeps_its_place() -> None:
    # a 1-NPU dimension adds no link but keeps dimension indices as the file lists them
    topo = astra_topology(["Ring", "Switch"], [1, 8], [50, 400], [500, 936.25])
    for dims in (None, (1, 8)):
        net = Network(topo, dims=dims)
        assert net.dims == (1, 8)
        assert set(net.label.tolist()) == {1}
        t = net.message_times_ns(np.array([0]), np.array([5]), np.array([1 << 20]))
        assert t[0] == np.floor(2 * 936.25 + (1 << 20) / (400 * 2**30 / 1e9))


def test_astra_switch_file_times_at_full_port_bandwidth(astra_networks: Path) -> None:
    sw = read_network_config(astra_networks / "HGX-H100-validated.yml")
    net = Network(sw.topology)
    t = net.message_times_ns(np.array([0]), np.array([5]), np.array([1 << 20]))
    assert t[0] == np.floor(2 * 936.25 + (1 << 20) / (400 * 2**30 / 1e9))


def test_aware_graph_gives_a_switch_a_node_and_two_ports_per_npu() -> None:
    topo = astra_topology(["Switch"], [4], [100], [10])
    graph = Network(topo).hop_graph()
    nl = topo.num_links  # 12 pairwise links, kept (unused by the routes) so link ids stay
    assert graph.num_nodes == 5
    assert graph.dst[nl:].tolist() == [4, 4, 4, 4, 0, 1, 2, 3]  # uplinks, then downlinks
    assert graph.bytes_per_ns[nl:].tolist() == [100 * 2**30 / 1e9] * 8
    assert graph.latency_ns[nl:].tolist() == [10.0] * 8
    assert graph.replaced.tolist() == [True] * nl
    # 2 -> 0: uplink of 2, then the switch's downlink to 0; the switch is no destination
    assert graph.next_link[0, 2] == nl + 2 and graph.next_link[0, 4] == nl + 4 + 0
    assert (graph.next_link[4] == -1).all()


def test_aware_graph_without_a_switch_is_the_topology() -> None:
    topo = Topology.mesh([4, 4])
    net = Network(topo)
    graph = net.hop_graph()
    assert graph.num_nodes == 16 and not graph.replaced.any()
    assert graph.dst is net.dst and graph.next_link is net._nh


def test_two_switch_axes_get_their_own_switches() -> None:
    # switch:2+switch:3: 6 NPUs; axis 0 has 3 switches of 2, axis 1 has 2 switches of 3
    topo = Topology.from_spec("switch:2+switch:3,bw=100/200,lat=5/7")
    net = Network(topo)
    graph = net.hop_graph()
    assert graph.num_nodes == 6 + 3 + 2
    nl = topo.num_links
    up0 = graph.dst[nl : nl + 6].tolist()  # NPU u -> switch of its axis-1 coordinate u // 2
    up1 = graph.dst[nl + 12 : nl + 18].tolist()  # NPU u -> switch of its axis-0 coordinate u % 2
    assert up0 == [6, 6, 7, 7, 8, 8] and up1 == [9, 10, 9, 10, 9, 10]
    # 0 -> 5 = (1, 2): axis 0 first (0 -> switch 6 -> 1), then axis 1 (1 -> switch 10 -> 5)
    node, path = 0, []
    while node != 5:
        node = int(graph.dst[graph.next_link[5, node]])
        path.append(node)
    assert path == [6, 1, 10, 5]
