"""Degraded, failed and scaled links: identities, hand-computed messages, the long way round a ring,
one-line refusals, and the run's parameters keeping what was changed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from etstore.cli import main
from etstore.errors import OptionError
from etstore.sim import SimConfig, SimResult, simulate
from etstore.sim.network import Network
from etstore.sim.perturb import Perturbation, perturb_network
from etstore.store import open_store
from etstore.testing import p2p_trace
from etstore.topology import GIB, Topology, dims_of
from etstore.workloads import transformer

SIZE, LAT = 1 << 20, 500
BW = 50 * GIB / 1e9  # bytes per ns of a 50 GB/s link (GB = 2^30)
HOP = math.floor(LAT + SIZE / BW)  # 20031: one store-and-forward hop of SIZE bytes
CONFIGS = [SimConfig(), SimConfig(congestion="aware")]
ROOT = Path(__file__).resolve().parents[2]


def _same(a: SimResult, b: SimResult) -> None:
    assert a.total_ns == b.total_ns
    assert a.ops.equals(b.ops) and a.ranks.equals(b.ranks)


@pytest.mark.parametrize("spec", ["ring:8,bw=50,lat=500", "torus2d:4x2,bw=50,lat=500"])
@pytest.mark.parametrize("config", CONFIGS, ids=["unaware", "aware"])
def test_factor_one_changes_nothing(spec: str, config: SimConfig) -> None:
    topo = Topology.from_spec(spec)
    for p in (Perturbation(degrade={"1-2": 1.0}), Perturbation(scale={"bw": 1.0, "lat": 1.0})):
        assert perturb_network(topo, p) is topo and p.is_identity
    tr = transformer(ranks=8, layers=2, tp=2)
    base = simulate(tr, topo, config=config)
    # a copy whose degraded link kept its value: another object, the same model, to the ns
    copy = topo.degraded({(0, 1, True): 1.0})
    assert copy is not topo and copy.is_regular()
    _same(simulate(tr, copy, config=config), base)
    # a link no message of a 2-rank exchange crosses: that exchange does not move
    msg = p2p_trace(SIZE)
    far = perturb_network(topo, Perturbation(degrade={"2-3": 0.5}))
    _same(simulate(msg, far, config=config), simulate(msg, topo, config=config))


@pytest.mark.parametrize("config", CONFIGS, ids=["unaware", "aware"])
def test_a_degraded_link_on_the_only_path_slows_a_message_as_its_closed_form(config: SimConfig) -> None:
    ring2 = Topology.from_spec("ring:2,bw=50,lat=500")  # one link each way: the only path
    slow = perturb_network(ring2, Perturbation(degrade={"0>1": 0.5}))
    assert simulate(p2p_trace(SIZE), ring2, config=config).total_ns == HOP == 20031
    assert (
        simulate(p2p_trace(SIZE), slow, config=config).total_ns
        == math.floor(LAT + SIZE / (0.5 * BW))
        == 39562
    )
    assert simulate(p2p_trace(SIZE, src=1, dst=0), slow, config=config).total_ns == HOP  # 1 → 0 untouched


def test_a_degraded_link_in_a_route_sets_its_bottleneck_or_its_hop() -> None:
    # ring:8, 0 → 2 over 0→1→2 with 1-2 at a quarter: unaware, 2 latencies and the slowest link's
    # transfer; aware store-and-forward, a full hop then a quarter-speed hop
    topo = perturb_network(Topology.from_spec("ring:8,bw=50,lat=500"), Perturbation(degrade={"1-2": 0.25}))
    msg = p2p_trace(SIZE, src=0, dst=2)
    assert simulate(msg, topo).total_ns == math.floor(2 * LAT + SIZE / (0.25 * BW)) == 79125
    aware = simulate(msg, topo, config=SimConfig(congestion="aware")).total_ns
    assert aware == HOP + math.floor(LAT + SIZE / (0.25 * BW)) == 98656


def test_a_degraded_link_keeps_astra_sims_first_axis_rule() -> None:
    # torus2d:4x4, NPU 0 (0, 0) → NPU 6 (2, 1): ASTRA-sim charges 2 hops of axis 0 and nothing of axis 1
    t = Topology.from_spec("torus2d:4x4,bw=50,lat=500")

    def time(p: Perturbation) -> float:
        net = Network(perturb_network(t, p))
        return float(net.message_times_ns(np.array([0]), np.array([6]), np.array([SIZE]))[0])

    assert time(Perturbation()) == math.floor(2 * LAT + SIZE / BW) == 20531
    assert time(Perturbation(degrade={"1-2": 0.5})) == math.floor(2 * LAT + SIZE / (0.5 * BW)) == 40062
    assert time(Perturbation(degrade={"2-6": 0.5})) == 20531  # on axis 1: not charged, as ASTRA-sim


def test_closed_forms_give_way_where_a_link_is_degraded() -> None:
    ring = Topology.from_spec("ring:8,bw=50,lat=500")
    slow = ring.degraded({(0, 1, True): 0.5})
    assert ring.is_regular() and slow.is_intact() and not slow.is_regular()
    assert slow.distances_ns(SIZE)[0, 1] == LAT + SIZE / (0.5 * BW)  # the direct link, at half speed
    assert ring.bisection() == (100.0, True) and slow.bisection() == (75.0, True)  # cut 0-1 and 4-5
    assert np.array_equal(slow.next_link(), ring.next_link())  # routes by hops: the same


@pytest.mark.parametrize("config", CONFIGS, ids=["unaware", "aware"])
def test_a_failed_link_on_a_ring_routes_the_long_way(config: SimConfig) -> None:
    ring = Topology.from_spec("ring:8,bw=50,lat=500")
    cut = perturb_network(ring, Perturbation(fail=("0-1",)))
    assert [int(cut.dst[i]) for i in cut.route(0, 1)] == [7, 6, 5, 4, 3, 2, 1]
    t = simulate(p2p_trace(SIZE), cut, config=config).total_ns
    # unaware: 7 latencies and one transfer; aware: 7 store-and-forward hops
    assert t == (math.floor(7 * LAT + SIZE / BW) if config.congestion == "unaware" else 7 * HOP)
    # the same links as the spec's fail=, which synthesis reads; the axes kept for the collectives
    spec = Topology.from_spec("ring:8,bw=50,lat=500,fail=0-1")
    assert np.array_equal(cut.next_link(), spec.next_link())
    _same(simulate(p2p_trace(SIZE), spec, config=config), simulate(p2p_trace(SIZE), cut, config=config))
    torus = Topology.from_spec("torus2d:4x2")
    kept = perturb_network(torus, Perturbation(fail=("0-1",)))
    assert kept.dims == torus.dims and not kept.is_intact() and dims_of(kept) == (4, 2)


@pytest.mark.parametrize(
    ("spec", "p", "message"),
    [
        (
            "ring:4",
            Perturbation(fail=("0-1", "2-3")),
            "--fail 0-1, --fail 2-3: topology ring:4,bw=50,lat=500 is disconnected: "
            "no path from NPU 0 to NPU 1",
        ),
        (
            "uniring:4",
            Perturbation(fail=("0>1",)),
            "--fail 0>1: topology uniring:4,bw=50,lat=500 is disconnected: no path from NPU 0 to NPU 1",
        ),
        (
            "ring:4",
            Perturbation(fail=("0-2",)),
            "--fail 0-2: topology ring:4,bw=50,lat=500: failed link 0-2 is not a link",
        ),
        (
            "ring:4",
            Perturbation(degrade={"0-2": 0.5}),
            "--degrade 0-2: topology ring:4,bw=50,lat=500: degraded link 0-2 is not a link",
        ),
        (
            "ring:4+switch:4",
            Perturbation(degrade={"0-4": 0.5}),
            "--degrade 0-4: NPUs 0 and 4 meet through a switch (switch:4): its ports are not links of "
            "their own; degrade links of other axes",
        ),
        (
            "ring:4+switch:4",
            Perturbation(fail=("0-1",)),
            "--fail 0-1: the topology has a switch axis (switch:4)",
        ),
    ],
)
def test_links_that_cannot_change_are_one_line_errors(spec: str, p: Perturbation, message: str) -> None:
    with pytest.raises(OptionError) as err:
        perturb_network(Topology.from_spec(spec), p)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_bad_link_options_are_one_line_errors() -> None:
    for kwargs, message in (
        ({"degrade": {"3-4": 1.5}}, "--degrade 3-4: the bandwidth factor must be in (0, 1], got 1.5"),
        ({"degrade": {"3-4": 0.0}}, "--degrade 3-4: the bandwidth factor must be in (0, 1], got 0.0"),
        ({"fail": ("3",)}, "--fail '3': expected a link A-B (both directions) or A>B (one)"),
        ({"scale": {"bw": -1.0}}, "scale factor for 'bw' must be positive, got -1.0"),
        (
            {"scale": {"nic": 2.0}},
            "unknown op class 'nic' to scale; known: cpu, gpu (compute), bw, lat (links)",
        ),
    ):
        with pytest.raises(OptionError) as err:
            Perturbation(**kwargs)
        assert str(err.value) == message


@pytest.mark.parametrize("config", CONFIGS, ids=["unaware", "aware"])
def test_scaling_bandwidth_and_latency_equals_the_spec_with_those_values(config: SimConfig) -> None:
    tr = transformer(ranks=8, layers=2, tp=2)
    scaled = perturb_network(
        Topology.from_spec("torus2d:4x2,bw=50,lat=500"), Perturbation(scale={"bw": 2.0, "lat": 0.5})
    )
    assert scaled.is_regular()  # rebuilt from its scaled axes: ASTRA-sim's closed forms still apply
    _same(
        simulate(tr, scaled, config=config),
        simulate(tr, Topology.from_spec("torus2d:4x2,bw=100,lat=250"), config=config),
    )


def _cli(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_sim_records_the_links_it_changed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    with open_store(s, write=True) as store:
        store.ingest(p2p_trace(SIZE, src=0, dst=2), name="msg")
    code, out, _ = _cli(
        capsys,
        s,
        "sim",
        "msg",
        "--topo",
        "ring:8",
        "--degrade",
        "1-2=0.25",
        "--fail",
        "4-5",
        "--scale",
        "lat=2",
    )
    assert code == 0 and "with links latency x2; link 1-2 bw x0.25; link 4-5 failed" in out
    with open_store(s, read_only=True) as store:
        (row,) = store.sql("SELECT total_ns, params FROM runs").to_pylist()
    assert row["total_ns"] == math.floor(4 * LAT + SIZE / (0.25 * BW))
    assert json.loads(row["params"])["user"]["perturbation"] == {
        "slow": {},
        "scale": {"lat": 2.0},
        "jitter": 0.0,
        "seed": 0,
        "degrade": {"1-2": 0.25},
        "fail": ["4-5"],
    }
    code, out, err = _cli(capsys, s, "sim", "msg", "--topo", "ring:4", "--fail", "0-1/2-3", "--no-record")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(
        "etstore: error: --fail 0-1, --fail 2-3: topology ring:4,bw=50,lat=500 is disconnected"
    )


def test_replay_changes_links_only_of_a_given_topology(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rec = str(ROOT / "tests" / "data" / "torch_ddp_2r")
    code, out, err = _cli(capsys, tmp_path / "none", "replay", rec, "--degrade", "0-1=0.5")
    assert code == 1 and err.count("\n") == 1 and "give --topo SPEC" in err
    code, out, err = _cli(capsys, tmp_path / "none", "replay", rec, "--topo", "ring:2", "--format", "csv")
    base = [line.split(",")[3] for line in out.splitlines()[1:]]
    code, out, err = _cli(
        capsys,
        tmp_path / "none",
        "replay",
        rec,
        "--topo",
        "ring:2",
        "--degrade",
        "0-1=0.01",
        "--format",
        "csv",
    )
    slow = [line.split(",")[3] for line in out.splitlines()[1:]]
    # the step's collectives are small: a link at 1% slows them without reordering the step
    assert code == 0 and sum(map(float, slow)) > sum(map(float, base))
    assert all(float(b) >= float(a) for a, b in zip(base, slow, strict=True))
