"""Topology model: specs, files, failures, distances, routing and bisection, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from etstore.errors import TopologyError
from etstore.topology import GIB, Dim, Topology, parse_topology, read_topology


def _pairs(t: Topology) -> set[tuple[int, int]]:
    return set(zip(t.src.tolist(), t.dst.tolist(), strict=True))


# ------------------------------------------------------------------ built-ins
@pytest.mark.parametrize(
    ("spec", "npus", "links", "diameter", "bisection", "min_in"),
    [
        ("ring:8", 8, 16, 4, 2 * 50.0, 2),
        ("ring:2", 2, 2, 1, 50.0, 1),
        ("uniring:4", 4, 4, 3, 50.0, 1),
        ("fc:4", 4, 12, 1, 4 * 50.0, 3),
        ("fullyconnected:4", 4, 12, 1, 4 * 50.0, 3),
        ("switch:8", 8, 56, 1, 4 * 50.0, 7),  # 4 ports at full bandwidth on each side
        ("mesh2d:4x4", 16, 48, 6, 4 * 50.0, 2),
        ("mesh2d:8x4", 32, 104, 10, 4 * 50.0, 2),
        ("mesh3d:2x2x2", 8, 24, 3, 4 * 50.0, 3),
        ("torus2d:4x4", 16, 64, 4, 8 * 50.0, 4),
        ("torus3d:4x4x4", 64, 384, 6, 32 * 50.0, 6),
        ("hypercube:16", 16, 64, 4, 8 * 50.0, 4),
        ("ring:4+switch:8", 32, 4 * 2 * 8 + 4 * 56, 3, 8 * 2 * 50.0, 9),
    ],
)
def test_builtin_shapes(
    spec: str, npus: int, links: int, diameter: int, bisection: float, min_in: int
) -> None:
    t = parse_topology(spec)
    assert (t.num_npus, t.num_links, t.diameter) == (npus, links, diameter)
    assert t.bisection_bandwidth() == pytest.approx(bisection)
    assert int(t.in_degree().min()) == min_in
    assert t.is_strongly_connected()


def test_mesh_links_by_hand() -> None:
    t = parse_topology("mesh2d:3x2")
    # NPU u = x + 3y; links of each NPU: axis 0 first (+ then -), then axis 1
    assert t.src.tolist()[:2] == [0, 0]
    assert t.dst.tolist()[:2] == [1, 3]
    assert _pairs(t) == {
        (0, 1),
        (1, 0),
        (1, 2),
        (2, 1),
        (3, 4),
        (4, 3),
        (4, 5),
        (5, 4),
        (0, 3),
        (3, 0),
        (1, 4),
        (4, 1),
        (2, 5),
        (5, 2),
    }
    assert [d.size for d in t.dims] == [3, 2]


def test_per_axis_bandwidth_and_latency() -> None:
    t = parse_topology("mesh2d:5x5,bw=50/75,lat=500/700")
    m = t.link_matrix()
    assert t.bandwidth_gb_per_s[m[0, 1]] == 50.0 and t.latency_ns[m[0, 1]] == 500.0
    assert t.bandwidth_gb_per_s[m[0, 5]] == 75.0 and t.latency_ns[m[0, 5]] == 700.0
    assert t.name == "mesh2d:5x5,bw=50/75,lat=500/700"
    # keyword defaults apply per axis; the spec overrides them
    k = Topology.from_spec("torus2d:4x4", bandwidth_gb_per_s=[10, 20], latency_ns=100)
    assert sorted(set(k.bandwidth_gb_per_s.tolist())) == [10.0, 20.0]
    assert set(Topology.from_spec("ring:4,bw=7", bandwidth_gb_per_s=3).bandwidth_gb_per_s.tolist()) == {7.0}


def test_switch_is_unwound_fairly() -> None:
    t = Topology.switch(8, bandwidth_gb_per_s=70, latency_ns=100)
    assert set(t.bandwidth_gb_per_s.tolist()) == {10.0}  # a port shared by 7 peers
    assert set(t.latency_ns.tolist()) == {200.0}  # NPU → switch → NPU


def test_constructors_agree_with_specs() -> None:
    assert _pairs(Topology.ring(6)) == _pairs(parse_topology("ring:6"))
    assert _pairs(Topology.mesh([3, 4])) == _pairs(parse_topology("mesh2d:3x4"))
    assert _pairs(Topology.torus([3, 3, 3])) == _pairs(parse_topology("torus3d:3x3x3"))
    assert _pairs(Topology.hypercube(8)) == _pairs(parse_topology("mesh3d:2x2x2"))
    assert _pairs(Topology.fully_connected(5)) == {(a, b) for a in range(5) for b in range(5) if a != b}
    c = Topology.compose([Dim("ring", 4, 50, 500), Dim("fc", 2, 100, 800)])
    assert c.num_npus == 8 and c.num_links == 4 * 2 * 2 + 8


def test_link_time() -> None:
    t = parse_topology("ring:4,bw=50,lat=500")
    # 1 MiB at 50 GiB/s = 2^20 / (50 · 2^30) s = 19531.25 ns
    assert t.link_time_ns(1 << 20)[0] == pytest.approx(500 + 19531.25)
    assert GIB == 2**30


# ---------------------------------------------------------------------- files
def test_astra_sim_ring(tmp_path: Path, astra_networks: Path, rt_inputs: Path) -> None:
    t = read_topology(astra_networks / "Ring_8npus.yml")
    assert (t.num_npus, t.num_links, t.diameter) == (8, 16, 4)
    assert set(t.bandwidth_gb_per_s.tolist()) == {50.0} and set(t.latency_ns.tolist()) == {500.0}
    assert _pairs(t) == _pairs(parse_topology("ring:8"))
    cfg = read_topology(rt_inputs / "network_cfg.yml")
    assert cfg.num_npus == 8


def test_astra_sim_switch(astra_networks: Path) -> None:
    t = parse_topology(str(astra_networks / "HGX-H100-validated.yml"))
    assert (t.num_npus, t.num_links) == (8, 56)
    assert t.bandwidth_gb_per_s[0] == pytest.approx(400.0 / 7)
    assert t.latency_ns[0] == pytest.approx(2 * 936.25)
    assert t.bisection_bandwidth() == pytest.approx(4 * 400.0)


def test_astra_sim_multi_dimensional(tmp_path: Path) -> None:
    path = tmp_path / "net.yml"
    path.write_text(
        "topology: [ Ring, FullyConnected, Switch ]\nnpus_count: [ 4, 2, 3 ]\n"
        "bandwidth: [ 50.0, 100.0, 25.0 ]\nlatency: [ 500.0, 200.0, 1000.0 ]\n"
    )
    t = read_topology(path)
    s = parse_topology("ring:4+fc:2+switch:3,bw=50/100/25,lat=500/200/1000")
    assert _pairs(t) == _pairs(s)
    np.testing.assert_array_equal(t.bandwidth_gb_per_s, s.bandwidth_gb_per_s)
    assert t.name == s.name


def test_own_format_links(tmp_path: Path) -> None:
    path = tmp_path / "four.yaml"
    path.write_text(
        "name: square\nnpus: 4\nbandwidth_gb_per_s: 50\nlatency_ns: 500\nlinks:\n"
        "  - [0, 1]\n"
        "  - [1, 2]\n"
        "  - {src: 2, dst: 3, bandwidth_gb_per_s: 100, latency_ns: 250}\n"
        "  - {src: 3, dst: 0, bidirectional: false}\n"
        "  - {src: 0, dst: 3, bidirectional: false, bandwidth_gb_per_s: 10}\n"
    )
    t = read_topology(path)
    assert t.name == "square" and t.num_npus == 4 and t.num_links == 8
    m = t.link_matrix()
    assert t.bandwidth_gb_per_s[m[3, 2]] == 100.0 and t.latency_ns[m[2, 3]] == 250.0
    assert t.bandwidth_gb_per_s[m[0, 3]] == 10.0 and t.bandwidth_gb_per_s[m[3, 0]] == 50.0
    assert not t.is_symmetric()
    # round trip through JSON
    back = read_topology(t.write(tmp_path / "square.json"))
    assert _pairs(back) == _pairs(t)
    np.testing.assert_array_equal(back.bandwidth_gb_per_s, t.bandwidth_gb_per_s)
    assert json.loads((tmp_path / "square.json").read_text())["format"] == "etstore-topology/1"


def test_own_format_spec_with_failures(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {"spec": "mesh2d:3x3", "bandwidth_gb_per_s": 100, "fail_npus": [4], "fail_links": [[0, 1]]}
        )
    )
    t = read_topology(path)
    assert t.num_npus == 8
    assert set(t.bandwidth_gb_per_s.tolist()) == {100.0}
    assert t.labels.tolist() == [0, 1, 2, 3, 5, 6, 7, 8]
    assert (0, 1) not in _pairs(t) and (1, 0) not in _pairs(t)
    # written back as YAML, read again
    again = read_topology(t.write(tmp_path / "t.yml"))
    assert _pairs(again) == _pairs(t)


# ------------------------------------------------------------------ failures
def test_failures_in_spec() -> None:
    t = parse_topology("mesh2d:3x3,fail=4")
    assert t.num_npus == 8 and t.num_links == 24 - 8
    assert t.label(4) == 5 and t.num_removed() == 1
    assert t.diameter == 4
    one_way = parse_topology("ring:4,fail=0>1")
    assert (0, 1) not in _pairs(one_way) and (1, 0) in _pairs(one_way)
    assert one_way.num_links == 7 and not one_way.is_symmetric()
    assert one_way.hop_distances()[0, 1] == 3
    both = parse_topology("ring:4,fail=0-1")
    assert both.diameter == 3 and both.num_links == 6
    assert both.name == "ring:4,bw=50,lat=500,fail=0-1"


def test_without_keeps_ids_when_only_links_fail() -> None:
    t = parse_topology("torus2d:3x3").without(links=[(0, 1)])
    assert t.num_npus == 9 and t.labels is None and t.dims == ()
    assert t.num_links == 36 - 2


# ------------------------------------------------------- distances and routes
def test_hop_distances_match_networkx() -> None:
    rng = np.random.default_rng(1)
    n = 30
    pairs = {(i, (i + 1) % n) for i in range(n)}  # a ring keeps it strongly connected
    pairs |= {(int(a), int(b)) for a, b in rng.integers(0, n, size=(60, 2)) if a != b}
    t = Topology.from_links(n, sorted(pairs))
    g = nx.DiGraph(sorted(pairs))
    want = dict(nx.all_pairs_shortest_path_length(g))
    hops = t.hop_distances()
    for s in range(n):
        for d in range(n):
            assert hops[s, d] == want[s][d]
    w = rng.uniform(1, 10, size=t.num_links)
    tw = Topology(n, t.src, t.dst, w, np.full(t.num_links, 1e12), "weighted")
    for (a, b), x in zip(zip(t.src.tolist(), t.dst.tolist(), strict=True), w.tolist(), strict=True):
        g[a][b]["w"] = x
    wd = dict(nx.all_pairs_dijkstra_path_length(g, weight="w"))
    dist = tw.distances_ns(0.0)
    for s in range(n):
        for d in range(n):
            assert dist[s, d] == pytest.approx(wd[s][d])


def test_product_distances_equal_generic_ones() -> None:
    for spec in ("torus3d:3x4x2,bw=50/70/90", "ring:3+uniring:3+fc:2+switch:3", "mesh2d:4x3,lat=100/900"):
        t = parse_topology(spec)
        generic = Topology(t.num_npus, t.src, t.dst, t.latency_ns, t.bandwidth_gb_per_s, "generic")
        np.testing.assert_array_equal(t.hop_distances(), generic.hop_distances())
        np.testing.assert_allclose(t.distances_ns(1 << 20), generic.distances_ns(1 << 20))


def test_routes_are_dimension_ordered() -> None:
    t = parse_topology("mesh2d:4x4")
    path = [(int(t.src[x]), int(t.dst[x])) for x in t.route(0, 15)]
    assert path == [(0, 1), (1, 2), (2, 3), (3, 7), (7, 11), (11, 15)]
    assert t.route(5, 5) == []
    nh = t.next_hop()
    assert nh[0, 15] == 1 and nh[15, 0] == 14 and nh[3, 3] == -1
    nl = t.next_link()
    assert nl.shape == (16, 16) and nl.dtype == np.int32
    # following next_link from anywhere reaches the destination in exactly hops[s, d] links
    hops = t.hop_distances()
    for s in range(16):
        for d in range(16):
            assert len(t.route(s, d)) == hops[s, d]


def test_bisection_exact_and_spectral() -> None:
    ring6 = [(i, (i + 1) % 6) for i in range(6)]
    hexagon = Topology.from_links(6, ring6 + [(b, a) for a, b in ring6])
    assert hexagon.bisection() == (pytest.approx(100.0), True)
    broken = parse_topology("mesh2d:6x6,fail=0")
    value, exact = broken.bisection()
    assert not exact and 6 * 50.0 <= value <= 7 * 50.0
    one_way = Topology.from_links(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
    assert one_way.bisection_bandwidth() == pytest.approx(50.0)


def test_describe() -> None:
    d = parse_topology("mesh2d:8x8,bw=100").describe()
    assert d["npus"] == 64 and d["links"] == 224 and d["diameter_hops"] == 14
    assert d["bisection_bandwidth_gb_per_s"] == pytest.approx(800.0) and d["bisection_exact"]
    assert d["min_in_degree"] == 2 and d["max_in_degree"] == 4 and d["symmetric"]
    assert json.loads(json.dumps(d)) == d


def test_transpose() -> None:
    t = Topology.from_links(3, [(0, 1), (1, 2), (2, 0)])
    assert _pairs(t.transpose()) == {(1, 0), (2, 1), (0, 2)}


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "spec is empty"),
        ("donut:4", "unknown kind 'donut'"),
        ("mesh2d:4", "mesh2d takes 2 size"),
        ("mesh2d:4x", "cannot read 'mesh2d:4x'"),
        ("ring", "expected kind:sizes"),
        ("ring:4x4", "ring takes 1 size"),
        ("ring:4,speed=9", "unknown option 'speed=9'"),
        ("ring:4,bw=1,bw=2", "option bw= given twice"),
        ("ring:4,bw=fast", "bw='fast' is not a number"),
        ("mesh2d:4x4,bw=1/2/3", "bw has 3 values but the topology has 2 axes"),
        ("hypercube:12", "power-of-two NPU count, got 12"),
        ("mesh2d:1x4", "an axis needs at least 2 NPUs, got 1"),
        ("ring:4,bw=0", "needs bandwidth > 0"),
        ("ring:4,fail=x", "cannot read failure 'x'"),
        ("ring:4,fail=9", "failed NPU 9 is not in 0..3"),
        ("ring:4,fail=0-2", "failed link 0-2 is not a link"),
        ("ring:4,fail=0>2", "failed link 0>2 is not a link"),
        ("ring:2,fail=0/1", "every NPU failed"),
        ("ring:4,fail=0-1/2-3", "is disconnected: no path from NPU 0 to NPU 1"),
        ("uniring:4,fail=0>1", "disconnected"),
    ],
)
def test_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        parse_topology(spec)


def test_bad_construction() -> None:
    z = np.zeros(1)
    with pytest.raises(TopologyError, match="link arrays differ in length"):
        Topology(2, np.array([0]), np.array([1, 0]), z, z + 1)
    with pytest.raises(TopologyError, match="needs at least one NPU"):
        Topology(0, np.array([]), np.array([]), np.array([]), np.array([]))
    with pytest.raises(TopologyError, match=r"names an NPU outside 0\.\.1"):
        Topology(2, np.array([0]), np.array([2]), z, z + 1)
    with pytest.raises(TopologyError, match="bandwidth > 0 and latency >= 0"):
        Topology(2, np.array([0]), np.array([1]), z - 1, z + 1)
    with pytest.raises(TopologyError, match="must be finite"):
        Topology(2, np.array([0]), np.array([1]), z, z + np.inf)
    with pytest.raises(TopologyError, match="loops from NPU 1 to itself"):
        Topology(2, np.array([1]), np.array([1]), z, z + 1)
    with pytest.raises(TopologyError, match="unknown axis kind 'star'"):
        Topology.compose([Dim("star", 4, 50, 500)])
    with pytest.raises(TopologyError, match="needs at least one dimension"):
        Topology.compose([])
    with pytest.raises(TopologyError, match="power of two"):
        Topology.hypercube(6)
    t = Topology.from_links(3, [(0, 1), (1, 0), (1, 2)])
    with pytest.raises(TopologyError, match="disconnected: no path from NPU 2 to NPU 0"):
        _ = t.diameter
    with pytest.raises(TopologyError, match="no path from NPU 2 to NPU 0"):
        t.route(2, 0)
    with pytest.raises(TopologyError, match=r"route 0 → 5 names an NPU outside 0..2"):
        t.route(0, 5)
    with pytest.raises(TopologyError, match="failed link 0-2 is not a link"):
        t.without(links=[(0, 2)])


@pytest.mark.parametrize(
    ("text", "name", "match"),
    [
        (
            "topology: [ Ring ]\nnpus_count: [ 4, 4 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n",
            "a.yml",
            "one entry per dimension",
        ),
        (
            "topology: [ Torus ]\nnpus_count: [ 4 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n",
            "a.yml",
            "unknown topology 'Torus'",
        ),
        ("topology: [ Ring ]\nnpus_count: [ 4 ]\nlatency: [ 500 ]\n", "a.yml", "missing key 'bandwidth'"),
        (
            "topology: [ Ring ]\nnpus_count: [ 4.5 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n",
            "a.yml",
            "npus_count 4.5 is not an integer",
        ),
        (
            "topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ fast ]\nlatency: [ 500 ]\n",
            "a.yml",
            "bandwidth must be a list of numbers",
        ),
        ("- 1\n- 2\n", "a.yml", "expected a mapping at the top level"),
        ("topology: [ Ring\n", "a.yml", "not valid YAML"),
        ('{"spec": ', "a.json", "not valid JSON"),
        ("spec: ring:4\nnpus: 4\n", "a.yml", "either spec or npus \\+ links"),
        ("shape: ring:4\n", "a.yml", "unknown key 'shape'"),
        ("name: x\n", "a.yml", "expected spec, or npus and links"),
        ("npus: 2\nlinks: 5\n", "a.yml", "links must be a list"),
        ("npus: 2\nlinks:\n  - [0, 1, 2]\n", "a.yml", "link 0 must be \\[src, dst\\]"),
        ("npus: 2\nlinks:\n  - {src: 0}\n", "a.yml", "link 0 .* needs integer src/dst"),
        ("npus: 2\nlinks:\n  - {src: 0, dst: 1, speed: 3}\n", "a.yml", "link 0 has unknown key 'speed'"),
        ("npus: 2\nlinks:\n  - [0, 5]\n", "a.yml", "names an NPU outside 0..1"),
        ("npus: 3\nlinks:\n  - [0, 1]\n", "a.yml", "disconnected"),
        ("npus: many\nlinks: []\n", "a.yml", "npus must be an integer"),
        ("spec: ring:4\nfail_links: [[0]]\n", "a.yml", "fail_links \\[a, b\\] pairs"),
        ("spec: donut:4\n", "a.yml", "unknown kind 'donut'"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, name: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TopologyError, match=match) as info:
        read_topology(path)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read topology file"):
        read_topology(tmp_path / "nope.yml")
    with pytest.raises(TopologyError, match="cannot read topology file"):
        parse_topology(str(tmp_path / "nope.json"))
