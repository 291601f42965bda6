"""ASTRA-sim network files: one reader behind read_network_config and read_topology; dimensions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.errors import TopologyError
from etstore.model import Trace
from etstore.topology import (
    Topology,
    astra_topology,
    default_topology,
    dims_of,
    link_dimensions,
    parse_topology,
    read_network_config,
    read_topology,
)


def _pairs(t: Topology) -> set[tuple[int, int]]:
    return set(zip(t.src.tolist(), t.dst.tolist(), strict=True))


def test_astra_network_files(astra_networks: Path) -> None:
    ring = read_network_config(astra_networks / "Ring_8npus.yml")
    assert (ring.kinds, ring.dims, ring.topology.num_npus, ring.topology.num_links) == (
        ("Ring",),
        (8,),
        8,
        16,
    )
    assert ring.topology.name == "ring:8"
    assert set(ring.topology.bandwidth_gb_per_s.tolist()) == {50.0}
    sw = read_network_config(astra_networks / "HGX-H100-validated.yml")
    assert sw.topology.num_links == 8 * 7
    assert set(sw.topology.latency_ns.tolist()) == {2 * 936.25}


def test_both_entry_points_read_the_same_links(tmp_path: Path) -> None:
    path = tmp_path / "net.yml"
    path.write_text(
        "topology: [ Ring, Switch ]\nnpus_count: [ 4, 3 ]\nbandwidth: [ 50.0, 25.0 ]\nlatency: [ 500, 100 ]\n"
    )
    net = read_network_config(path)
    topo = read_topology(path)
    assert net.topology.name == "astra-Ring-Switch:4x3"
    assert topo.name == "ring:4+switch:3,bw=50/25,lat=500/100"
    np.testing.assert_array_equal(net.topology.src, topo.src)
    np.testing.assert_array_equal(net.topology.dst, topo.dst)
    np.testing.assert_array_equal(net.topology.bandwidth_gb_per_s, topo.bandwidth_gb_per_s)
    assert _pairs(topo) == _pairs(parse_topology("ring:4+switch:3"))


def test_one_npu_dimension(tmp_path: Path) -> None:
    path = tmp_path / "net.yml"
    path.write_text(
        "topology: [ Ring, Switch ]\nnpus_count: [ 1, 8 ]\nbandwidth: [ 50, 400 ]\nlatency: [ 500, 10 ]\n"
    )
    net = read_network_config(path)
    assert net.dims == (1, 8) and net.kinds == ("Ring", "Switch")
    assert (net.topology.num_npus, net.topology.num_links) == (8, 56)
    assert dims_of(net.topology) == (1, 8)
    assert set(link_dimensions(net.topology).tolist()) == {1}
    assert net.topology.diameter == 1
    assert net.topology.bisection_bandwidth() == pytest.approx(4 * 400.0)
    assert read_topology(path).num_links == 56
    single = astra_topology(["Ring"], [1], [50], [500])
    assert (single.num_npus, single.num_links, single.name) == (1, 0, "ring:1")


def test_astra_kinds() -> None:
    fc = astra_topology(["FullyConnected"], [4], [100], [10])
    assert fc.num_links == 12 and fc.name == "fullyconnected:4"
    sw = astra_topology(["Switch"], [4], [100], [10])
    assert sw.num_links == 12 and set(sw.latency_ns.tolist()) == {20.0}
    ring2 = astra_topology(["Ring", "Ring"], [2, 3], [1, 2], [1, 2])
    assert ring2.num_links == 2 * 3 + 6 * 2
    assert dims_of(ring2) == (2, 3)
    assert sorted(set(link_dimensions(ring2).tolist())) == [0, 1]
    with pytest.raises(TopologyError, match="unknown topology 'Tree'"):
        astra_topology(["Tree"], [4], [1], [1])
    with pytest.raises(TopologyError, match="one entry per dimension"):
        astra_topology(["Ring"], [4, 4], [1], [1])
    with pytest.raises(TopologyError, match="at least 1 NPU, got 0"):
        astra_topology(["Ring"], [0], [1], [1])


def test_dims_from_names() -> None:
    topo = Topology.from_links(8, [(i, (i + 1) % 8) for i in range(8)], name="mesh2d:2x4")
    assert dims_of(topo) == (2, 4)
    assert dims_of(Topology.from_links(8, [(0, 1)], name="custom")) == (8,)
    assert dims_of(Topology.from_links(8, [(0, 1)], name="mesh2d:3x3")) == (8,)


def test_network_config_errors(tmp_path: Path) -> None:
    p = tmp_path / "net.yml"
    p.write_text("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\n")
    with pytest.raises(TopologyError, match="missing key 'latency'"):
        read_network_config(p)
    p.write_text("topology: [ Ring, Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TopologyError, match="one entry per dimension"):
        read_network_config(p)
    p.write_text("topology: [ Torus ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TopologyError, match="unknown topology"):
        read_network_config(p)
    p.write_text("topology: [ Ring ]\nnpus_count: [ 8.5 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n")
    with pytest.raises(TopologyError, match=r"npus_count 8\.5 is not an integer"):
        read_network_config(p)
    p.write_text("spec: ring:4\n")
    with pytest.raises(TopologyError, match="missing key 'topology'"):
        read_network_config(p)
    p.write_text("topology: [ Ring\n")
    with pytest.raises(TopologyError, match="not valid YAML") as info:
        read_network_config(p)
    assert str(info.value).startswith(str(p))
    with pytest.raises(TopologyError, match="cannot read topology file"):
        read_network_config(tmp_path / "absent.yml")


def test_default_topology_is_a_ring_over_the_ranks() -> None:
    trace = Trace(pa.table({"rank": [0, 3, 3], "id": [0, 0, 1]}))
    assert default_topology(trace) == "ring:4"
    assert default_topology(Trace(pa.table({"rank": [0], "id": [0]}))) == "ring:2"
