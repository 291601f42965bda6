"""Sensitivity sweeps: each point is the simulation with the knob at its value, a straggler on the
critical path moves the makespan by its added time, bad knobs are one-line errors, and the command
records one run per point with the knob in its parameters."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import OptionError
from etstore.sim import SimConfig, SimResult, simulate
from etstore.sim.perturb import Knob, Perturbation, parse_knob, perturb, perturb_network
from etstore.sim.sweep import sensitivity, sensitivity_table
from etstore.store import open_store
from etstore.testing import two_chains
from etstore.topology import Topology
from etstore.workloads import transformer

RING8 = "ring:8,bw=50,lat=500"


def _same(a: SimResult, b: SimResult) -> None:
    assert a.total_ns == b.total_ns
    assert a.ops.equals(b.ops) and a.ranks.equals(b.ranks)


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(
        importlib.import_module("etstore.sim.sweep")
    )  # the package's sweep is a function
    assert tried > 0 and failed == 0


@pytest.mark.parametrize("config", [SimConfig(), SimConfig(congestion="aware")], ids=["unaware", "aware"])
def test_points_equal_single_simulations_with_the_knob_at_their_value(config: SimConfig) -> None:
    tr = transformer(ranks=8, layers=2, tp=2)
    topos = [Topology.from_spec(RING8), Topology.from_spec("torus2d:4x2,bw=50,lat=500")]
    for text, one in (
        ("slow:3=1,1.5,2", lambda v: (perturb(tr, Perturbation(slow={3: v})), None)),
        ("scale:bw=0.5,1,2", lambda v: (tr, Perturbation(scale={"bw": v}))),
        ("degrade:1-2=1,0.5", lambda v: (tr, Perturbation(degrade={"1-2": v}))),
        ("jitter=0,0.2", lambda v: (perturb(tr, Perturbation(jitter=v, seed=7)), None)),
    ):
        knob, values = parse_knob(text, seed=7)
        points = sensitivity(tr, topos, knob, values, config=config)
        assert [(p.topology.name, p.value) for p in points] == [(t.name, v) for t in topos for v in values]
        for p in points:
            work, net = one(p.value)
            topo = p.topology if net is None else perturb_network(p.topology, net)
            _same(p.result, simulate(work, topo, config=config))
            if p.value == (0 if knob.kind == "jitter" else 1):  # the identity: the plain simulation
                _same(p.result, simulate(tr, p.topology, config=config))


def test_a_straggler_on_the_critical_path_moves_the_makespan_by_its_added_time() -> None:
    # rank 0's chain (300 µs) is the critical path: x F adds 300 (F - 1) µs; rank 1's is off it
    topo = Topology.from_spec("switch:2")
    knob, values = parse_knob("slow:0=1,1.5,2")
    t = sensitivity_table(sensitivity(two_chains(), [topo], knob, values), knob)
    assert t["total_ns"].to_pylist() == [300_000, 450_000, 600_000]
    assert t["delta_ns"].to_pylist() == [0, 150_000, 300_000]
    assert t["delta_pct"].to_pylist() == [0, 50, 100]
    assert t["last_rank"].to_pylist() == [0, 0, 0]
    knob, values = parse_knob("slow:1=1,2,5")
    t = sensitivity_table(sensitivity(two_chains(), [topo], knob, values), knob)
    assert t["total_ns"].to_pylist() == [300_000, 300_000, 500_000]  # off the path until it is the path
    assert t["last_rank"].to_pylist()[2] == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slow:3", "--knob 'slow:3': expected KNOB=V1,V2,..., e.g. slow:3=1,1.5,2 or scale:bw=0.5,1,2"),
        ("nic:3=1,2", "unknown knob 'nic'; known: slow, scale, degrade, jitter"),
        ("slow=1,2", "knob 'slow': write it as slow:TARGET"),
        ("jitter:3=0.1", "knob 'jitter:3': write it as jitter"),
        ("slow:3=1,a", "--knob 'slow:3=1,a': the values must be numbers separated by commas"),
        ("slow:3=", "--knob 'slow:3=': no values"),
        ("degrade:3-4=1,2", "--degrade 3-4: the bandwidth factor must be in (0, 1], got 2.0"),
        ("degrade:3=0.5", "--degrade '3': expected a link A-B (both directions) or A>B (one)"),
        ("scale:nic=2", "unknown op class 'nic' to scale; known: cpu, gpu (compute), bw, lat (links)"),
    ],
)
def test_bad_knobs_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(OptionError) as err:
        parse_knob(text)
    assert str(err.value) == message


def test_a_knob_is_the_option_with_its_value_left_open() -> None:
    assert Knob("slow", "0,4-5").at(2.0) == Perturbation(slow={0: 2.0, 4: 2.0, 5: 2.0})
    assert Knob("scale", "lat").at(0.5) == Perturbation(scale={"lat": 0.5})
    assert Knob("degrade", "3>4").at(0.5) == Perturbation(degrade={"3>4": 0.5})
    assert Knob("jitter", seed=3).at(0.1) == Perturbation(jitter=0.1, seed=3)
    assert [Knob("slow", "3").name, Knob("jitter").name] == ["slow:3", "jitter"]


def _cli(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_sweep_records_a_run_per_point_with_the_knob_in_its_params(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    tr = transformer(ranks=8, layers=2, tp=2)
    with open_store(s, write=True) as store:
        store.ingest(tr)
    code, out, _ = _cli(capsys, s, "sim", tr.name, "--topo", RING8)  # run 1, not a sweep's
    assert code == 0
    args = ["sweep", tr.name, "--knob", "slow:3=1,1.5", "--topo", RING8, "--topo", "torus2d:4x2"]
    code, out, _ = _cli(capsys, s, *args, "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["run_id"], r["knob"], r["value"]) for r in rows] == [
        (2, "slow:3", 1.0),
        (3, "slow:3", 1.5),
        (4, "slow:3", 1.0),
        (5, "slow:3", 1.5),
    ]
    topo = Topology.from_spec(RING8)
    assert rows[0]["total_ns"] == simulate(tr, topo).total_ns
    assert rows[1]["total_ns"] == simulate(perturb(tr, Perturbation(slow={3: 1.5})), topo).total_ns
    assert rows[1]["delta_ns"] == rows[1]["total_ns"] - rows[0]["total_ns"] and rows[2]["delta_ns"] == 0
    with open_store(s, read_only=True) as store:
        runs = store.sql(
            "SELECT run_id, total_ns, params FROM runs WHERE run_id > 1 ORDER BY run_id"
        ).to_pylist()
    assert [r["total_ns"] for r in runs] == [r["total_ns"] for r in rows]
    user = [json.loads(r["params"])["user"] for r in runs]
    assert [u["sensitivity"] for u in user] == [
        {"knob": "slow:3", "value": v, "values": [1.0, 1.5], "first_run": 2} for v in (1.0, 1.5, 1.0, 1.5)
    ]
    assert user[1]["perturbation"]["slow"] == {"3": 1.5} and user[1]["argv"] == "sweep"
    code, out, _ = _cli(capsys, s, *args, "--no-record")
    assert code == 0 and "makespan per slow:3" in out and "recorded" not in out
    code, out, err = _cli(capsys, s, "sweep", tr.name, "--topo", RING8)
    assert code == 1 and err == (
        "etstore: error: sweep TRACE: give --knob KNOB=V1,V2,..., e.g. slow:3=1,1.5,2 or scale:bw=0.5,1,2\n"
    )
    code, out, err = _cli(capsys, s, "sweep", "--topo", RING8)
    assert (
        code == 1
        and err == "etstore: error: sweep: give --algo (e.g. --algo ring,direct), or a TRACE and --knob\n"
    )
