"""Messages between NPUs that differ in several coordinates of a multi-dimensional network.

ASTRA-sim's congestion-unaware analytical network (``MultiDimTopology::send`` in
astra-network-analytical) charges such a message as one transfer inside the FIRST
dimension (dimension 0 first) on which source and destination differ: that dimension's
hop count between their two coordinates (``Ring``: the shorter way; ``FullyConnected``:
1; ``Switch``: 2) times its latency, plus ``size / bandwidth`` of that dimension,
truncated to whole ns. The other dimensions cost nothing. etstore's unaware model does
the same on every topology ASTRA-sim can describe; its aware model keeps the full route
(ASTRA-sim's congestion-aware backend refuses multi-dimensional networks:
"only support 1-dim topology", so there is no reference for it).

Reference values are facts recorded from ASTRA-sim's congestion-unaware analytical backend,
built from public source (astra-sim 518bd513ae110428cd62eb60efc0f3993fd53c70 with
astra-network-analytical 599a047), on exactly these inputs:

* networks (:data:`NETWORKS`): ``Ring4xRing2`` = ``[Ring, Ring]``, ``[4, 2]`` NPUs,
  ``[50, 25]`` GB/s, ``[500, 700]`` ns; ``Ring4xFC2xSwitch4`` = ``[Ring, FullyConnected,
  Switch]``, ``[4, 2, 4]`` NPUs, ``[100, 50, 25]`` GB/s, ``[200, 300, 700]`` ns;
* system: ``{"scheduling-policy": "LIFO", "endpoint-delay": 10,
  "active-chunks-per-dimension": 1, "preferred-dataset-splits": 4, "local-mem-bw": 50,
  "collective-optimization": "localBWAware"}`` with the named implementation list for all
  four collectives; remote memory ``NO_MEMORY_EXPANSION``;
* collectives: one ``COMM_COLL_NODE`` per NPU, ``etstore.sim.sweep.collective_workload``;
  point-to-point: one ``COMM_SEND_NODE`` on the source and one ``COMM_RECV_NODE`` on the
  destination per message (tag = its index), and a 1 µs ``COMP_NODE`` on every NPU that
  has no message; both written with ``etstore.formats.comm_groups.write_astra_et``;
* whole workloads: ``etstore.workloads.transformer(ranks=8, tp=TP, layers=L)`` (what
  ``etstore workload --ranks 8 --tp TP --layers L --out w`` writes: ``w.<rank>.et`` with
  integer ``pg_name``s and ``w.comm_groups.json``), rt_template's system config with
  ``local-mem-bw`` 1600, on :data:`WORKLOAD_NETWORKS`;
* value: ``sys[r] finished, T cycles`` per rank, or their maximum.

Before this rule etstore charged every hop of every differing dimension: the oneRing
all-reduce on Ring4xRing2 took 136,120 ns against ASTRA-sim's 117,780, and the tp 2
workload on Ring4xRing2 65,705,973 against 62,070,335 (data-parallel rings and the
embedding send/recv cross both axes).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from etstore.errors import TopologyError
from etstore.formats.comm_groups import write_astra_et
from etstore.formats.et import read_et
from etstore.model import Trace, ops_table
from etstore.sim import (
    AstraNetwork,
    SimConfig,
    read_comm_groups,
    read_network_config,
    read_system_config,
    simulate,
)
from etstore.sim.network import Network
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology, astra_topology
from etstore.workloads import transformer

MIB = 1 << 20
NETWORKS = {
    "Ring4xRing2": ("[ Ring, Ring ]", "[ 4, 2 ]", "[ 50.0, 25.0 ]", "[ 500.0, 700.0 ]"),
    "Ring4xFC2xSwitch4": (
        "[ Ring, FullyConnected, Switch ]",
        "[ 4, 2, 4 ]",
        "[ 100.0, 50.0, 25.0 ]",
        "[ 200.0, 300.0, 700.0 ]",
    ),
}
WORKLOAD_NETWORKS = {
    "Ring4xRing2": NETWORKS["Ring4xRing2"],
    "Ring2xFC4": ("[ Ring, FullyConnected ]", "[ 2, 4 ]", "[ 100.0, 25.0 ]", "[ 200.0, 700.0 ]"),
}

# (network, tp, layers) -> ASTRA-sim's unaware makespan in ns
WORKLOADS: dict[tuple[str, int, int], int] = {
    ("Ring4xRing2", 2, 4): 62_070_335,
    ("Ring4xRing2", 4, 8): 67_314_122,
    ("Ring2xFC4", 2, 4): 75_984_832,
    ("Ring2xFC4", 4, 8): 62_834_441,  # 69,618,093 by full routes
}

# (network, implementation list, collective, nccl-tests size in bytes, ASTRA-sim makespan in ns)
COLLECTIVES: list[tuple[str, tuple[str, ...], str, int, int]] = [
    ("Ring4xRing2", ("oneRing",), "allreduce", MIB, 117780),
    ("Ring4xRing2", ("oneRing",), "allgather", MIB, 31400),
    ("Ring4xRing2", ("oneRing",), "reducescatter", MIB, 86420),
    ("Ring4xRing2", ("oneDirect",), "allreduce", MIB, 20860),
    ("Ring4xRing2", ("oneDirect",), "allgather", MIB, 7760),
    ("Ring4xRing2", ("oneDirect",), "alltoall", MIB, 7760),
    ("Ring4xRing2", ("oneHalvingDoubling",), "allreduce", MIB, 80508),
    ("Ring4xFC2xSwitch4", ("oneRing",), "allreduce", MIB, 131604),
    ("Ring4xFC2xSwitch4", ("oneRing",), "allgather", MIB, 35504),
    ("Ring4xFC2xSwitch4", ("oneDirect",), "allreduce", 16 * MIB, 63180),
    ("Ring4xFC2xSwitch4", ("oneDirect",), "allgather", MIB, 6900),
    ("Ring4xFC2xSwitch4", ("ring", "ring", "ring"), "allreduce", MIB, 75102),
]

# (network, messages (src, dst, bytes), ASTRA-sim finish time per rank in ns)
P2P: list[tuple[str, list[tuple[int, int, int]], list[int]]] = [
    (
        "Ring4xRing2",
        [(0, 5, MIB), (1, 7, 65536), (2, 4, 1000), (3, 6, 1 << 18), (4, 0, MIB), (5, 1, MIB), (6, 3, 4096),
         (7, 2, 65536)],
        [39762, 39762, 1720, 5382, 39762, 39762, 5382, 2220],
    ),
    (
        "Ring4xFC2xSwitch4",
        [(0, 31, MIB), (1, 6, 65536), (2, 9, 1000), (3, 16, 1 << 18), (4, 29, MIB), (5, 13, 123457),
         (8, 2, 4096), (30, 11, 65536), (12, 20, 777), (17, 27, MIB)],
        [9965, 810, 438, 2641, 9965, 5999, 810, 1000, 438, 209, 1000, 810, 1428, 5999, 1000, 1000,
         2641, 10165, 1000, 1000, 1428, 1000, 1000, 1000, 1000, 1000, 1000, 10165, 1000, 9965, 810, 9965],
    ),
]  # fmt: skip


def _network(tmp_path: Path, name: str) -> AstraNetwork:
    topo, npus, bw, lat = {**NETWORKS, **WORKLOAD_NETWORKS}[name]
    path = tmp_path / f"{name}.yml"
    path.write_text(f"topology: {topo}\nnpus_count: {npus}\nbandwidth: {bw}\nlatency: {lat}\n")
    return read_network_config(path)


def _config(tmp_path: Path, impl: tuple[str, ...] = ("ring",)) -> SimConfig:
    data: dict[str, Any] = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": 10,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": 4,
        "local-mem-bw": 50,
        "collective-optimization": "localBWAware",
    }
    for coll in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        data[f"{coll}-implementation"] = list(impl)
    path = tmp_path / "system.json"
    path.write_text(json.dumps(data))
    return read_system_config(path)


def _p2p(n: int, messages: list[tuple[int, int, int]]) -> Trace:
    """One send and one matching receive per message (tag = index); idle NPUs compute 1 µs."""
    cols: dict[str, list[Any]] = {
        k: []
        for k in ("rank", "id", "type", "comm_dst", "comm_src", "comm_tag", "comm_size", "duration_micros")
    }
    count = [0] * n

    def add(
        rank: int, kind: str, dst: int | None, src: int | None, tag: int | None, size: int | None
    ) -> None:
        count[rank] += 1
        row = (rank, count[rank], kind, dst, src, tag, size, 0 if size else 1)
        for key, value in zip(cols, row, strict=True):
            cols[key].append(value)

    for tag, (s, d, size) in enumerate(messages):
        add(s, "COMM_SEND_NODE", d, None, tag, size)
        add(d, "COMM_RECV_NODE", None, s, tag, size)
    for r in range(n):
        if not count[r]:
            add(r, "COMP_NODE", None, None, None, None)
    return Trace(ops_table(cols), name="p2p")


def _msg(size: int, hops: int, lat: float, bw_gb: float) -> int:
    """ASTRA-sim's BasicTopology delay: hops x latency + size / bandwidth (GB = 2^30), truncated."""
    return math.floor(hops * lat + size / (bw_gb * 2**30 / 1e9))


def _per_rank(res: Any) -> list[int]:
    return [int(x) for x in res.ranks.sort_by("rank")["total_ns"].to_pylist()]


# ---------------------------------------------------------------- ASTRA-sim references


@pytest.mark.parametrize("case", COLLECTIVES, ids=lambda c: f"{c[0]}-{'+'.join(c[1])}-{c[2]}-{c[3]}")
def test_collectives_across_dimensions_equal_astra_sim(
    tmp_path: Path, case: tuple[str, tuple[str, ...], str, int, int]
) -> None:
    name, impl, coll, size, expected = case
    net = _network(tmp_path, name)
    w = collective_workload(coll, net.topology.num_npus, size)
    res = simulate(w, net.topology, config=_config(tmp_path, impl), dims=net.dims)
    assert res.total_ns == expected


@pytest.mark.parametrize("case", P2P, ids=lambda c: c[0])
def test_point_to_point_across_dimensions_equals_astra_sim_per_rank(
    tmp_path: Path, case: tuple[str, list[tuple[int, int, int]], list[int]]
) -> None:
    name, messages, expected = case
    net = _network(tmp_path, name)
    res = simulate(
        _p2p(net.topology.num_npus, messages), net.topology, config=_config(tmp_path), dims=net.dims
    )
    assert _per_rank(res) == expected


@pytest.mark.parametrize("case", sorted(WORKLOADS), ids=lambda c: f"{c[0]}-tp{c[1]}-l{c[2]}")
def test_workloads_across_dimensions_equal_astra_sim(
    rt_inputs: Path, tmp_path: Path, case: tuple[str, int, int]
) -> None:
    name, tp, layers = case
    paths = write_astra_et(transformer(ranks=8, tp=tp, layers=layers), tmp_path / "w")
    system = json.loads((rt_inputs / "system_cfg.json").read_text())
    system["local-mem-bw"] = 1600
    (tmp_path / "system.json").write_text(json.dumps(system))
    cfg = read_system_config(tmp_path / "system.json")
    net = _network(tmp_path, name)
    groups = read_comm_groups(paths[-1])
    res = simulate(read_et(tmp_path / "w"), net.topology, config=cfg, groups=groups, dims=net.dims)
    assert res.total_ns == WORKLOADS[case]


# ---------------------------------------------------------------- the rule, by hand


def test_p2p_references_follow_the_first_differing_dimension_by_hand() -> None:
    # Ring4xRing2, NPU u = (u % 4, u // 4).
    # 4 -> 0: (0,1) -> (0,0), dimension 1 only: one hop of the 2-ring at 700 ns, 25 GB/s.
    assert _msg(MIB, 1, 700, 25) == 39762
    # 7 -> 2: (3,1) -> (2,0) differs in both; dimension 0 alone: one hop at 500 ns, 50 GB/s
    # (the full route would add 700 ns and serialise at 25 GB/s: 3,641 ns).
    assert _msg(65536, 1, 500, 50) == 1720
    assert _msg(65536, 2, 600, 25) == 3641
    # 2 -> 4: (2,0) -> (0,1): dimension 0, ring 2 -> 0 is two hops either way.
    assert _msg(1000, 2, 500, 50) == 1018  # rank 2 finishes on its receive from 7 (1,720)
    # Ring4xFC2xSwitch4, u = (u % 4, u // 4 % 2, u // 8).
    # 0 -> 31: (0,0,0) -> (3,1,3): ring 0 -> 3 is one hop back: 200 ns, 100 GB/s.
    assert _msg(MIB, 1, 200, 100) == 9965
    # 12 -> 20: (0,1,1) -> (0,1,2): only the switch differs: two hops of 700 ns at 25 GB/s.
    assert _msg(777, 2, 700, 25) == 1428
    # 17 -> 27: (1,0,2) -> (3,0,3): ring 1 -> 3 is two hops.
    assert _msg(MIB, 2, 200, 100) == 10165
    # 5 -> 13: (1,1,0) -> (1,1,1): switch.
    assert _msg(123457, 2, 700, 25) == 5999


def test_unaware_metrics_charge_the_first_differing_axis_only() -> None:
    topo = astra_topology(["Ring", "FullyConnected", "Switch"], [4, 2, 4], [100, 50, 25], [200, 300, 700])
    net = Network(topo, dims=(4, 2, 4))
    src = np.array([0, 0, 12, 8, 1, 6])
    dst = np.array([31, 4, 20, 2, 3, 6])
    hops, lat, bw = net.unaware_metrics(src, dst)
    gb = 2**30 / 1e9
    # 0->31 ring 1 hop; 0->4 fc; 12->20 switch; 8->2 (0,0,1)->(2,0,0) ring 2 hops; 1->3 ring; self
    assert hops.tolist() == [1, 1, 2, 2, 2, 0]
    assert lat.tolist() == [200.0, 300.0, 1400.0, 400.0, 400.0, 0.0]
    assert bw[:5] == pytest.approx([100 * gb, 50 * gb, 25 * gb, 100 * gb, 100 * gb])
    assert np.isinf(bw[5])
    # the route still crosses every differing axis: 0 -> 31 takes 1 + 1 + 2 hops
    r_hops, r_lat, r_bw = net.route_metrics(np.array([0]), np.array([31]))
    assert (int(r_hops[0]), float(r_lat[0])) == (3, 200.0 + 300.0 + 1400.0)
    assert r_bw[0] == pytest.approx(25 * gb)


@pytest.mark.parametrize("spec", ["ring:8", "switch:8,bw=100,lat=10", "fc:6", "ring:2"])
def test_one_axis_the_rule_is_the_route(spec: str) -> None:
    topo = Topology.from_spec(spec)
    net = Network(topo)
    s, d = (a.ravel() for a in np.meshgrid(np.arange(topo.num_npus), np.arange(topo.num_npus)))
    h1, l1, b1 = net.unaware_metrics(s, d)
    h2, l2, b2 = net.route_metrics(s, d)
    assert np.array_equal(l1, l2) and np.array_equal(b1, b2)
    # a switch's route is one pairwise link of twice the latency; the rule counts two hops
    assert np.array_equal(h1, h2 * (2 if spec.startswith("switch") else 1))


def test_torus_charges_first_axis_mesh_and_failed_torus_keep_full_routes() -> None:
    s, d = np.array([0]), np.array([10])  # (0,0) -> (2,2) on 4x4
    torus = Network(Topology.from_spec("torus2d:4x4,bw=50,lat=500"))
    assert torus.unaware_metrics(s, d)[0].tolist() == [2]  # ring axes: ASTRA-sim can describe it
    assert torus.message_times_ns(s, d, np.array([MIB])).tolist() == [_msg(MIB, 2, 500, 50)]
    mesh = Network(Topology.from_spec("mesh2d:4x4,bw=50,lat=500"))  # line axes: no ASTRA-sim shape
    assert mesh.unaware_metrics(s, d)[0].tolist() == [4]
    assert mesh.message_times_ns(s, d, np.array([MIB])).tolist() == [_msg(MIB, 4, 500, 50)]
    failed = Network(Topology.from_spec("torus2d:4x4,bw=50,lat=500").without(links=[(5, 9)]))
    assert failed.unaware_metrics(s, d)[0].tolist() == [4]


def test_npu_outside_the_topology_is_named() -> None:
    net = Network(astra_topology(["Ring", "Ring"], [4, 2], [50, 25], [500, 700]))
    with pytest.raises(TopologyError, match=r"NPU 8 is outside 0\.\.7"):
        net.unaware_metrics(np.array([0]), np.array([8]))
    with pytest.raises(TopologyError, match=r"NPU -1 is outside 0\.\.7"):
        net.message_times_ns(np.array([-1]), np.array([3]), np.array([8]))
    with pytest.raises(TopologyError, match=r"NPU 9 is outside 0\.\.7"):  # 0 * 8 + 9 is not pair (1, 1)
        net.message_times_ns(np.array([0]), np.array([9]), np.array([8]))


# ---------------------------------------------------------------- physics and the aware model


def test_lone_cross_axis_message_is_flagged_under_unaware(tmp_path: Path) -> None:
    # 0 -> 5 = (1,1) is charged one 50 GB/s hop (20,031 ns) but its bytes cross the 25 GB/s
    # link 1 -> 5 too: 1 MiB over 20,031 ns is 48.75 GB/s offered to a 25 GB/s link
    net = _network(tmp_path, "Ring4xRing2")
    res = simulate(_p2p(8, [(0, 5, MIB)]), net.topology, config=_config(tmp_path), dims=net.dims)
    assert res.total_ns == _msg(MIB, 1, 500, 50) == 20031
    over = res.overloaded.to_pylist()
    assert [(o["src"], o["dst"]) for o in over] == [(1, 5)]
    assert over[0]["offered_gb_per_s"] == pytest.approx(MIB / 20031 * 1e9 / 2**30)


@pytest.mark.parametrize(("hops", "expected"), [("store-and-forward", 20031 + 39762), ("cut-through", 40262)])
def test_aware_keeps_the_full_route(tmp_path: Path, hops: str, expected: int) -> None:
    # no ASTRA-sim reference (its aware backend is 1-D only); by hand: 0 -> 1 at 50 GB/s then
    # 1 -> 5 at 25 GB/s, each hop whole (store-and-forward) or the head on after the latency
    net = _network(tmp_path, "Ring4xRing2")
    cfg = dataclasses.replace(_config(tmp_path), congestion="aware", hops=hops)
    res = simulate(_p2p(8, [(0, 5, MIB)]), net.topology, config=cfg, dims=net.dims)
    assert _msg(MIB, 1, 500, 50) == 20031 and _msg(MIB, 1, 700, 25) == 39762
    assert math.floor(500 + 700 + MIB / (25 * 2**30 / 1e9)) == 40262
    assert res.total_ns == expected
