"""Perturbations of compute: identities, a hand-computed straggler, a straggler in a recorded step."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pytest

from etstore.errors import OptionError
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace
from etstore.sim import perturb as perturb_module
from etstore.sim import simulate
from etstore.sim.perturb import Perturbation, parse_slow, perturb
from etstore.sim.replay import replay
from etstore.testing import two_chains
from etstore.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
_DLRM: list[Trace] = []


def _dlrm() -> Trace:
    if not _DLRM:
        _DLRM.append(read_pytorch_et(ROOT / "examples" / "dlrm_8r"))
    return _DLRM[0]


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(perturb_module)
    assert tried > 0 and failed == 0


def test_a_straggler_on_the_critical_path_moves_the_makespan_by_its_added_time() -> None:
    topo = Topology.from_spec("switch:2")
    t = two_chains()
    assert simulate(t, topo).total_ns == 300_000
    assert simulate(perturb(t, Perturbation(slow={0: 1.5})), topo).total_ns == 450_000
    assert simulate(perturb(t, Perturbation(slow={1: 2.0})), topo).total_ns == 300_000  # off the path
    assert simulate(perturb(t, Perturbation(scale={"gpu": 0.5})), topo).total_ns == 150_000
    assert simulate(perturb(t, Perturbation(scale={"cpu": 3.0})), topo).total_ns == 300_000  # no host op


def test_factor_one_and_no_jitter_change_nothing() -> None:
    t = _dlrm()
    base = replay(t).steps
    same = replay(t, perturbation=Perturbation(slow={3: 1.0}, scale={"gpu": 1.0})).steps
    assert same.equals(base)
    assert Perturbation(slow={3: 1.0}).is_identity


def test_jitter_is_reproducible_by_its_seed_and_centred_on_one() -> None:
    t = _dlrm()
    a, b = (perturb(t, Perturbation(jitter=0.2, seed=s)) for s in (1, 1))
    c = perturb(t, Perturbation(jitter=0.2, seed=2))
    assert a.ops.equals(b.ops) and not a.ops.equals(c.ops)
    comp = np.asarray([x == "COMP_NODE" for x in t.ops["type"].to_pylist()])
    before = t.ops["duration_micros"].to_numpy().astype(float)[comp]
    after = a.ops["duration_micros"].to_numpy().astype(float)[comp]
    keep = before >= 100  # rounding to µs dominates short ops
    assert np.median(after[keep] / before[keep]) == pytest.approx(1.0, abs=0.05)
    assert a.params["perturbation"] == {"slow": {}, "scale": {}, "jitter": 0.2, "seed": 1}


def test_the_last_rank_to_arrive_slowed_delays_every_rank_and_the_measured_side_stays() -> None:
    """Rank 7 reaches the DLRM's first all-to-all last: slowing its compute delays all ranks, most
    of all itself; what was measured is the recording, whatever the what-if."""
    t = _dlrm()
    base = replay(t).steps.to_pandas()
    slow = replay(t, perturbation=Perturbation(slow={7: 1.5})).steps.to_pandas()
    assert (slow["measured_us"] == base["measured_us"]).all()
    more = slow["simulated_us"] - base["simulated_us"]
    assert (more > 1000).all()
    assert more.idxmax() == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3", "expected RANKS=FACTOR"),
        ("a=2", "expected RANKS=FACTOR"),
        ("5-3=2", "empty range"),
        ("1=x", "RANKS="),
    ],
)
def test_bad_slowdowns_are_refused(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_slow(text)


def test_bad_factors_and_ranks_are_refused() -> None:
    with pytest.raises(OptionError, match="must be positive"):
        Perturbation(slow={0: 0.0})
    with pytest.raises(OptionError, match="unknown op class 'tpu'"):
        Perturbation(scale={"tpu": 2.0})
    with pytest.raises(OptionError, match="names rank 9"):
        perturb(two_chains(), Perturbation(slow={9: 2.0}))
