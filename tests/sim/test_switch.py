"""The congestion-aware Switch (a switch node with an uplink and a downlink per NPU) and hop models.

ASTRA-sim's congestion-aware backend (astra-network-analytical ``congestion_aware/``:
``Switch`` connects every NPU to one switch device, a chunk's route is NPU → switch →
NPU, and each ``Link`` is a FIFO queue that is busy ``trunc(size / bw)`` and delivers
``trunc(latency + size / bw)`` after the chunk left) is modelled here as the closed
forms below. Bandwidth is GB/s with GB = 2^30, so 100 GB/s is 107.3741824 bytes/ns and
1 MiB takes 9765.625 ns to serialise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from etstore.errors import ConfigError
from etstore.formats.et import read_et
from etstore.model import Trace, ops_table
from etstore.sim import (
    SimConfig,
    SimResult,
    _loop,
    collective_workload,
    read_network_config,
    read_system_config,
    simulate,
)
from etstore.sim.network import HOP_MODES, Network
from etstore.topology import Topology, astra_topology

MIB = 1 << 20
SER_1MIB_100 = 9765.625  # ns: 1 MiB at 100 GB/s
AWARE = SimConfig(congestion="aware", max_comm_ops=None)


def _numbered(msgs: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Per message ``(send rank, send id, receive rank, receive id)``; a rank's ids follow message order."""
    count: dict[int, int] = {}
    out = []
    for src, dst, _size in msgs:
        count[src] = count.get(src, 0) + 1
        count[dst] = count.get(dst, 0) + 1
        out.append((src, count[src], dst, count[dst]))
    return out


def _messages(msgs: Sequence[tuple[int, int, int]]) -> Trace:
    """One send per ``(src, dst, size)`` (all ready at t = 0) and its receive; tag = message index."""
    cols: dict[str, list] = {
        k: [] for k in ("rank", "id", "type", "comm_dst", "comm_src", "comm_tag", "comm_size")
    }
    for tag, ((src, dst, size), (_, sid, _, rid)) in enumerate(zip(msgs, _numbered(msgs), strict=True)):
        cols["rank"] += [src, dst]
        cols["id"] += [sid, rid]
        cols["type"] += ["COMM_SEND_NODE", "COMM_RECV_NODE"]
        cols["comm_dst"] += [dst, None]
        cols["comm_src"] += [None, src]
        cols["comm_tag"] += [tag, tag]
        cols["comm_size"] += [size, size]
    return Trace(ops_table(cols).sort_by([("rank", "ascending"), ("id", "ascending")]), name="messages")


def _send_ends(res: SimResult, msgs: Sequence[tuple[int, int, int]]) -> list[float]:
    """End time of every send, in message order."""
    ends = {(r["rank"], r["id"]): r["end_ns"] for r in res.ops.to_pylist()}
    return [ends[(src, sid)] for src, sid, _, _ in _numbered(msgs)]


def _hop(lat: float, ser: float) -> float:
    """One store-and-forward link: latency + serialization, truncated as one delay (ASTRA-sim's Link)."""
    return float(math.floor(lat + ser))


def _switch(n: int = 4, bw: float = 100, lat: float = 10) -> Topology:
    return Topology.switch(n, bandwidth_gb_per_s=bw, latency_ns=lat)


# ---------------------------------------------------------------- one switch, closed forms


def test_a_message_through_the_switch_is_serialised_on_both_links() -> None:
    res = simulate(_messages([(0, 3, MIB)]), _switch(), config=AWARE)
    # NPU 0 -> switch, then switch -> NPU 3: 2 x floor(10 + 9765.625)
    assert res.total_ns == 2 * _hop(10, SER_1MIB_100) == 19550.0


def test_unaware_switch_is_two_latencies_and_one_serialisation() -> None:
    # ASTRA-sim's congestion-unaware Switch: hops_count 2, one size / bandwidth
    res = simulate(_messages([(0, 3, MIB)]), _switch(), config=SimConfig(max_comm_ops=None))
    assert res.total_ns == math.floor(2 * 10 + SER_1MIB_100) == 9785.0


def test_an_npu_s_sends_share_its_uplink() -> None:
    # NPU 0 sends to 1 and to 2 at t = 0: the uplink serialises the second behind the first
    # (free at floor(9765.625) = 9765), each downlink is its own
    msgs = [(0, 1, MIB), (0, 2, MIB)]
    res = simulate(_messages(msgs), _switch(), config=AWARE)
    first = 2 * _hop(10, SER_1MIB_100)  # 19550
    second = 9765 + 2 * _hop(10, SER_1MIB_100)  # 29315
    assert _send_ends(res, msgs) == [first, second] == [19550.0, 29315.0]


def test_messages_to_one_npu_share_its_downlink() -> None:
    # NPUs 0 and 1 both send to NPU 2: the uplinks run in parallel, both reach the switch
    # at 9775, and the downlink to 2 takes them one after the other
    msgs = [(0, 2, MIB), (1, 2, MIB)]
    res = simulate(_messages(msgs), _switch(), config=AWARE)
    assert _send_ends(res, msgs) == [19550.0, 9775 + 9765 + 9775.0]


def test_disjoint_pairs_do_not_meet() -> None:
    msgs = [(0, 1, MIB), (2, 3, MIB), (1, 0, MIB)]
    res = simulate(_messages(msgs), _switch(), config=AWARE)
    assert _send_ends(res, msgs) == [19550.0] * 3


def test_fractional_latency_is_truncated_with_the_serialisation() -> None:
    # HGX-H100's switch: 400 GB/s, 936.25 ns; 1 MiB serialises in 2441.40625 ns; ASTRA-sim's
    # link delivers trunc(936.25 + 2441.40625) = 3377 ns after the chunk left
    topo = _switch(8, 400, 936.25)
    res = simulate(_messages([(0, 5, MIB)]), topo, config=AWARE)
    assert res.total_ns == 2 * 3377.0


def test_links_table_counts_the_switch_messages_on_their_pair_links() -> None:
    topo = _switch()
    res = simulate(_messages([(0, 1, MIB), (0, 2, MIB), (3, 1, 4096)]), topo, config=AWARE)
    links = {(r["src"], r["dst"]): r for r in res.links.to_pylist()}
    assert len(links) == topo.num_links == 12
    assert (links[(0, 1)]["bytes"], links[(0, 1)]["messages"]) == (MIB, 1)
    assert (links[(3, 1)]["bytes"], links[(3, 1)]["messages"]) == (4096, 1)
    assert links[(1, 0)]["messages"] == 0
    # a port is busy bytes / port bandwidth for each of its messages
    assert links[(0, 2)]["busy_ns"] == pytest.approx(SER_1MIB_100)


# ---------------------------------------------------------------- multi-dimensional and failed shapes


def test_a_ring_then_switch_route_takes_the_switch_ports() -> None:
    # ring:2+switch:4 (8 NPUs): 0 -> 7 changes the ring coordinate (0 -> 1, 50 GB/s, 500 ns)
    # then the switch coordinate (1 -> 7 through switch 1 of 2, 100 GB/s, 10 ns)
    topo = Topology.from_spec("ring:2+switch:4,bw=50/100,lat=500/10")
    net = Network(topo)
    graph = net.hop_graph()
    assert graph.num_nodes == 8 + 2  # one switch per ring coordinate
    hops = []
    node = 0
    while node != 7:
        link = int(graph.next_link[7, node])
        hops.append((node, int(graph.dst[link])))
        node = int(graph.dst[link])
    assert hops == [(0, 1), (1, 9), (9, 7)]
    res = simulate(_messages([(0, 7, MIB)]), topo, config=AWARE)
    ser_50 = MIB / (50 * 2**30 / 1e9)  # 19531.25
    assert res.total_ns == _hop(500, ser_50) + 2 * _hop(10, SER_1MIB_100) == 20031 + 19550


def test_a_switch_with_a_failed_npu_stays_pairwise() -> None:
    # without its full axes the topology no longer says which NPUs share a switch: the
    # pairwise links (2 x latency, bw / (n - 1)) carry the message, serialised once
    topo = _switch().without(npus=[3])
    res = simulate(_messages([(0, 2, MIB)]), topo, config=AWARE)
    assert Network(topo).hop_graph().num_nodes == 3
    assert res.total_ns == math.floor(20 + 3 * SER_1MIB_100)


# ---------------------------------------------------------------- hop models


def test_cut_through_pays_the_serialisation_once_per_route() -> None:
    # ring of 8 (50 GB/s, 500 ns), 0 -> 4: 4 hops, the head moves on after each latency
    ring = Topology.ring(8, bandwidth_gb_per_s=50, latency_ns=500)
    res = simulate(_messages([(0, 4, MIB)]), ring, config=dataclasses.replace(AWARE, hops="cut-through"))
    assert res.total_ns == 4 * 500 + math.floor(MIB / (50 * 2**30 / 1e9)) == 21531.0
    # through a switch: 2 latencies + one serialisation, ASTRA-sim's unaware time
    cut = dataclasses.replace(AWARE, hops="cut-through")
    res = simulate(_messages([(0, 3, MIB)]), _switch(), config=cut)
    assert res.total_ns == 2 * 10 + 9765 == 9785.0


def test_cut_through_still_queues_on_a_shared_link() -> None:
    # NPUs 0 and 1 send to 2 through the switch: both heads reach the switch at 10, the
    # downlink carries one tail at a time (the second starts when the first has left, 9775)
    msgs = [(0, 2, MIB), (1, 2, MIB)]
    res = simulate(_messages(msgs), _switch(), config=dataclasses.replace(AWARE, hops="cut-through"))
    assert _send_ends(res, msgs) == [9785.0, 9775 + 9765 + 10.0]


def test_store_and_forward_is_the_default_and_pays_each_hop() -> None:
    ring = Topology.ring(8, bandwidth_gb_per_s=50, latency_ns=500)
    assert Network(ring).hops == HOP_MODES[0] == "store-and-forward"
    res = simulate(_messages([(0, 4, MIB)]), ring, config=AWARE)
    assert res.total_ns == 4 * _hop(500, MIB / (50 * 2**30 / 1e9)) == 4 * 20031.0
    explicit = dataclasses.replace(AWARE, hops="store-and-forward")
    assert simulate(_messages([(0, 4, MIB)]), ring, config=explicit).total_ns == res.total_ns


def test_the_hop_model_does_not_change_the_unaware_time() -> None:
    unaware = SimConfig(max_comm_ops=None)
    base = simulate(_messages([(0, 4, MIB), (0, 3, 4096)]), Topology.ring(8), config=unaware).total_ns
    cut = dataclasses.replace(unaware, hops="cut-through")
    assert simulate(_messages([(0, 4, MIB), (0, 3, 4096)]), Topology.ring(8), config=cut).total_ns == base


def test_an_unknown_hop_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"hops must be 'store-and-forward' or 'cut-through', not 'x'"):
        SimConfig(hops="x")
    with pytest.raises(
        ConfigError, match=r"hop model must be one of store-and-forward, cut-through, not 'wormhole'"
    ):
        Network(Topology.ring(4), hops="wormhole")


@pytest.mark.needs_extension("etstore.sim._simloop")
@pytest.mark.parametrize("hops", HOP_MODES)
def test_python_and_native_loops_agree_on_switch_ports(monkeypatch: pytest.MonkeyPatch, hops: str) -> None:
    rng = np.random.default_rng(7)
    msgs = [
        (int(a), int(b), int(s))
        for a, b, s in zip(
            rng.integers(0, 8, 40), rng.integers(0, 8, 40), rng.integers(1, 1 << 22, 40), strict=True
        )
        if a != b
    ]
    topo = Topology.from_spec("ring:2+switch:4,bw=50/100,lat=500/10.5")
    native = simulate(_messages(msgs), topo, config=dataclasses.replace(AWARE, hops=hops))
    monkeypatch.setattr(_loop, "_simloop", None)
    python = simulate(_messages(msgs), topo, config=dataclasses.replace(AWARE, hops=hops))
    assert native.ops["end_ns"].to_pylist() == python.ops["end_ns"].to_pylist()
    assert native.links.equals(python.links)
    assert native.total_ns == python.total_ns > 0


# ---------------------------------------------------------------- Switch_8 microbenchmarks

BPN_50 = 50 * 2**30 / 1e9  # bytes per ns at 50 GB/s


def _native_ring_ns(coll: str, n: int, size: int, message_ns: Callable[[int], float]) -> float:
    """ASTRA-sim's native ring on one dimension (docs/simulator.md), closed form per chunk.

    Defaults of SimConfig: 4 chunks run one after another, endpoint delay 10 ns on entry
    and per received message, a reduction 3 x floor(msg / 50) ns (local-mem-bw 50 GB/s).
    """
    comm = size // n if coll == "ALL_GATHER" else size
    chunk = comm // 4
    steps, msg, reduces = {
        "ALL_REDUCE": (2 * (n - 1), chunk // n, n - 1),
        "REDUCE_SCATTER": (n - 1, chunk // n, n - 1),
        "ALL_GATHER": (n - 1, chunk, 0),
        "ALL_TO_ALL": (n * (n - 1) // 2, chunk // n, 0),
    }[coll]
    return 4 * ((steps + 1) * 10 + steps * message_ns(msg) + reduces * 3 * math.floor(msg / 50))


@pytest.mark.parametrize("size", [1 << 16, 1 << 20, 1 << 24])
@pytest.mark.parametrize("coll", ["ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"])
def test_switch_8_native_collectives_closed_form(coll: str, size: int) -> None:
    # Switch_8 (50 GB/s, 500 ns). The ring's step sends r -> r+1 through the switch: no two
    # messages of a step share a port, so a message takes its two links back to back,
    # 2 x floor(500 + msg / bw) aware against floor(2 x 500 + msg / bw) unaware.
    topo = astra_topology(["Switch"], [8], [50], [500])
    work = collective_workload(coll, 8, size)
    aware = simulate(work, topo, config=SimConfig(congestion="aware")).total_ns
    unaware = simulate(work, topo).total_ns
    assert aware == _native_ring_ns(coll, 8, size, lambda m: 2 * math.floor(500 + m / BPN_50))
    assert unaware == _native_ring_ns(coll, 8, size, lambda m: math.floor(1000 + m / BPN_50))


# ---------------------------------------------------------------- against ASTRA-sim
#
# Reference values: ASTRA-sim analytical built from public source (astra-sim 518bd513,
# astra-network-analytical 599a047), AstraSim_Analytical_Congestion_{Unaware,Aware}, run
# on the files etstore writes (write_astra_et) with --remote-memory NO_MEMORY_EXPANSION.
# Each value is the largest "sys[r] finished, T cycles" (ns). Both tools agree to the ns.

# collective_workload(coll, 8, size) on Switch_8 (topology [Switch], npus_count [8],
# bandwidth [50], latency [500]) with rt_template's system_cfg.json (LIFO, ring, 4 splits,
# 1 active chunk, endpoint-delay 10, local-mem-bw 50): (unaware, aware) ns
ASTRA_SWITCH_8 = {
    ("ALL_REDUCE", 1 << 16): (62088, 64216),
    ("ALL_REDUCE", 1 << 20): (145780, 179940),
    ("ALL_REDUCE", 1 << 24): (1484180, 2031020),
    ("ALL_GATHER", 1 << 16): (29384, 30448),
    ("ALL_GATHER", 1 << 20): (45400, 62480),
    ("ALL_GATHER", 1 << 24): (301740, 575160),
    ("REDUCE_SCATTER", 1 << 16): (32744, 33808),
    ("REDUCE_SCATTER", 1 << 20): (100420, 117500),
    ("REDUCE_SCATTER", 1 << 24): (1182480, 1455900),
    ("ALL_TO_ALL", 1 << 16): (117416, 121672),
    ("ALL_TO_ALL", 1 << 20): (181480, 249800),
    ("ALL_TO_ALL", 1 << 24): (1206840, 2300520),
}

# ASTRA-sim's own microbenchmarks (examples/workload/microbenchmarks/<coll>/8npus_1MB) on
# Switch_8 with rt_template's system_cfg.json, and on HGX-H100-validated.yml (Switch 8,
# 400 GB/s, 936.25 ns) with system/native_collectives/HGX-H100-validated.json (2 active
# chunks, local-mem-bw 3350): (unaware, aware) ns
ASTRA_MICROBENCHMARKS = {
    ("all_reduce", "switch8"): (145780, 179940),
    ("all_gather", "switch8"): (165016, 301712),
    ("reduce_scatter", "switch8"): (100420, 117500),
    ("all_to_all", "switch8"): (181480, 249800),
    ("all_reduce", "hgx"): (55222, 57426),
    ("all_gather", "hgx"): (34908, 44058),
    ("reduce_scatter", "hgx"): (27810, 28950),
    ("all_to_all", "hgx"): (109668, 114000),
}

# _messages(...) on a Switch of 4 (100 GB/s, 10 ns), rt_template's system: (unaware, aware) ns
ASTRA_P2P_SWITCH_4 = {
    # two 1 MiB messages into NPU 2 share its downlink
    "into one npu": ([(0, 2, MIB), (1, 2, MIB), (3, 0, 4096)], (9785, 29315)),
    # NPU 0's two sends: its communication slot takes them one after the other
    "out of one npu": ([(0, 1, MIB), (0, 2, MIB), (3, 0, 4096)], (19570, 39100)),
    "mixed": ([(0, 1, MIB), (0, 2, MIB), (3, 2, MIB), (1, 3, 4096), (2, 0, 3 * MIB)], (29316, 58612)),
}


@pytest.mark.parametrize(("coll", "size"), list(ASTRA_SWITCH_8))
def test_switch_8_collectives_equal_astra_sim(coll: str, size: int, rt_inputs: Path) -> None:
    topo = astra_topology(["Switch"], [8], [50], [500])
    work = collective_workload(coll, 8, size)
    unaware, aware = ASTRA_SWITCH_8[(coll, size)]
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    assert simulate(work, topo, config=cfg).total_ns == unaware
    assert simulate(work, topo, config=dataclasses.replace(cfg, congestion="aware")).total_ns == aware


@pytest.mark.parametrize(("coll", "network"), list(ASTRA_MICROBENCHMARKS))
def test_astra_sim_microbenchmarks_on_a_switch(
    coll: str, network: str, rt_inputs: Path, shared_fixture: Callable[[str], Path]
) -> None:
    trace = read_et(shared_fixture(f"astra-sim/examples/workload/microbenchmarks/{coll}/8npus_1MB"))
    if network == "hgx":
        net = read_network_config(
            shared_fixture("astra-sim/examples/network/analytical/HGX-H100-validated.yml")
        )
        system = shared_fixture("astra-sim/examples/system/native_collectives/HGX-H100-validated.json")
        topo = net.topology
    else:
        topo, system = astra_topology(["Switch"], [8], [50], [500]), rt_inputs / "system_cfg.json"
    unaware, aware = ASTRA_MICROBENCHMARKS[(coll, network)]
    assert simulate(trace, topo, config=read_system_config(system)).total_ns == unaware
    assert simulate(trace, topo, config=read_system_config(system, congestion="aware")).total_ns == aware


@pytest.mark.parametrize("case", list(ASTRA_P2P_SWITCH_4))
def test_messages_through_a_switch_equal_astra_sim(case: str, rt_inputs: Path) -> None:
    msgs, (unaware, aware) = ASTRA_P2P_SWITCH_4[case]
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    assert simulate(_messages(msgs), _switch(), config=cfg).total_ns == unaware
    aware_cfg = dataclasses.replace(cfg, congestion="aware")
    assert simulate(_messages(msgs), _switch(), config=aware_cfg).total_ns == aware


# _messages(...) on Ring_8npus.yml and a FullyConnected 8 (both 50 GB/s, 500 ns), rt_template's
# system: on the ring every intermediate NPU stores and forwards, and the messages meet on links
ASTRA_P2P_8 = {"Ring": (41062, 158248), "FullyConnected": (39562, 39562)}
P2P_8 = [(0, 4, MIB), (1, 3, MIB), (2, 6, 4096), (5, 7, MIB), (6, 2, 2 * MIB), (7, 5, MIB)]


@pytest.mark.parametrize("kind", list(ASTRA_P2P_8))
def test_multi_hop_messages_equal_astra_sim(kind: str, rt_inputs: Path) -> None:
    topo = astra_topology([kind], [8], [50], [500])
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    unaware, aware = ASTRA_P2P_8[kind]
    assert simulate(_messages(P2P_8), topo, config=cfg).total_ns == unaware
    assert (
        simulate(_messages(P2P_8), topo, config=dataclasses.replace(cfg, congestion="aware")).total_ns
        == aware
    )
