"""NCCL's tuning model: small cases worked out by hand from tuning.cc's formulas and constants."""

from __future__ import annotations

import pytest

from etstore.algorithms.nccl_tuning import PRESETS, NcclSystem, choose, cost_table, nccl_channels, system_for
from etstore.errors import OptionError

A100 = PRESETS["a100"]  # ampere, 12 search channels of 20 GB/s over NVLink, 1 node


def _cost(coll: str, nbytes: int, ranks: int, system: NcclSystem, algo: str, proto: str):  # type: ignore[no-untyped-def]
    return next(
        c for c in cost_table(coll, nbytes, ranks, system) if (c.algorithm, c.protocol) == (algo, proto)
    )


def test_ring_ll_one_node_by_hand() -> None:
    c = _cost("allreduce", 1 << 20, 8, A100, "ring", "LL")
    assert c.latency_us == pytest.approx(6.6 + 14 * 0.6)  # base + 2(N-1) NVLink steps
    # 12 · 20 GB/s, halved for LL, capped by llMaxBw (Ampere, 1 node: 87.7), times N / nsteps
    assert c.bandwidth_gb_per_s == pytest.approx(87.7 * 8 / 14)
    assert c.time_us == pytest.approx(15.0 + (1 << 20) / (1000 * 87.7 * 8 / 14))  # 35.92


def test_tree_simple_one_node_by_hand() -> None:
    c = _cost("allreduce", 1 << 20, 8, A100, "tree", "Simple")
    assert c.latency_us == pytest.approx(8.4 + 2 * (7 * 4.0))  # base + 2 · (ppn - 1) NVLink hops
    bw = min(240 * 0.92, 12 * 24.0) * 0.5  # tree: x0.92, per-channel cap 24 (Ampere), x0.5 to algbw
    assert c.bandwidth_gb_per_s == pytest.approx(bw)
    # treeCorrectionFactor[Simple][log2(1 MiB >> 6) = 14] = 0.5
    assert c.time_us == pytest.approx(64.4 + (1 << 20) / (1000 * bw * 0.5))


def test_ring_simple_two_nodes_by_hand() -> None:
    two = A100._replace(nodes=2)
    c = _cost("allreduce", 1 << 20, 16, two, "ring", "Simple")
    # 30 steps, 2 of them across the network at hwLat[NET][ring][Simple] = 14 us; the rest at
    # max(NVLink 3.4, net overhead 1.0 x 3 for Simple)
    lat = 8.4 + 28 * 3.4 + 2 * 14.0
    assert c.latency_us == pytest.approx(lat)
    # bwIntra on <= 2 nodes; the plateau x1.4 (sm80+) when bytes / (channels · ranks) >= 64
    assert c.time_us == pytest.approx(lat * 1.4 + (1 << 20) / (1000 * 240 * 16 / 30))


def test_pat_allgather_one_gpu_per_node_by_hand() -> None:
    four = A100._replace(nodes=4)
    c = _cost("allgather", 1 << 20, 4, four, "pat", "Simple")
    # base 8 + log2(nodes) · (tree's network latency 14 / 3.5) + 2.8 per rank
    assert c.latency_us == pytest.approx(8.0 + 2 * 14.0 / 3.5 + 4 * 2.8)
    assert c.bandwidth_gb_per_s == pytest.approx(12 * 20 * 0.75)  # x0.75, busbw kept for PAT
    assert _cost("allgather", 1 << 20, 8, four, "pat", "Simple").why_not == "PAT needs one GPU per node"


def test_nvls_on_an_h100_node_by_hand() -> None:
    c = _cost("allreduce", 1 << 30, 8, PRESETS["h100"], "nvls", "Simple")
    # min(24 · 0.85 · 15/16 · 2, 24) = 24 per NVLS channel, 16 channels, x N / nsteps
    assert c.bandwidth_gb_per_s == pytest.approx(16 * 24 * 8 / 14)
    assert c.latency_us == pytest.approx(25.0)  # NVLS latency is its NVLink hw latency alone
    assert choose("allreduce", 1 << 30, 8, PRESETS["h100"]).algorithm == "nvls"


def test_choice_follows_size_and_honours_nccl_algo_and_proto() -> None:
    picks = [choose("allreduce", s, 8, A100)[:2] for s in (1 << 10, 1 << 22, 1 << 26)]
    assert picks == [("ring", "LL"), ("ring", "LL128"), ("ring", "Simple")]
    forced = choose("allreduce", 1 << 26, 8, A100, algorithms=["Tree"], protocols=["ll128"])
    assert forced[:2] == ("tree", "LL128")
    # LL128 off on PCI; CollNet and NVLS unavailable without their hardware
    pci = A100._replace(link="pci")
    assert "LL128 is off" in _cost("allreduce", 1 << 20, 8, pci, "ring", "LL128").why_not
    assert _cost("allreduce", 1 << 20, 8, A100, "collnet_direct", "Simple").time_us is None


def test_channels_shrink_for_small_calls() -> None:
    assert nccl_channels("ring", "Simple", "allreduce", 1 << 30, 8, A100) == (24, 544)
    # LL ring: threshold 8 · nRanks per thread, 512 threads: 64 KiB keeps 2 channels
    assert nccl_channels("ring", "LL", "allreduce", 1 << 16, 8, A100) == (2, 512)
    # tiny: one channel, threads halved down to the floor of 3 warps
    assert nccl_channels("ring", "LL", "allreduce", 8, 8, A100) == (1, 96)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cost_table("alltoall", 8, 8, A100), "unknown collective 'alltoall'"),
        (lambda: cost_table("allreduce", 8, 6, A100._replace(nodes=4)), "6 ranks on 4 nodes"),
        (lambda: cost_table("allreduce", 8, 8, A100._replace(generation="kepler")), "unknown GPU generation"),
        (lambda: choose("allreduce", 8, 8, A100, algorithms=["ringo"]), "unknown algorithm 'ringo'"),
        (lambda: choose("broadcast", 8, 8, A100, algorithms=["tree"]), "no algorithm/protocol available"),
        (lambda: system_for("tpu"), "unknown; presets"),
    ],
)
def test_errors_say_what_is_wrong(call, match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match=match):
        call()
