"""Measured breakdowns of recorded traces against HTA's own numbers on the same Kineto traces
(tests/data/hta_reference.json, written by scripts/hta_reference.py with HTA 0.5.0)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import numpy as np
import pytest

from etstore.analysis import breakdown as breakdown_module
from etstore.analysis.breakdown import _launch_bound, breakdown, kernel_class, merged_length
from etstore.errors import OptionError
from etstore.formats.pytorch_et import read_pytorch_et

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((ROOT / "tests" / "data" / "hta_reference.json").read_text())["traces"]
TRACES = {
    "dlrm_8r": ROOT / "examples" / "dlrm_8r",
    "torch_ddp_cuda_1r": ROOT / "tests" / "data" / "torch_ddp_cuda_1r",
    "torch_ddp_cuda_gloo_2r": ROOT / "tests" / "data" / "torch_ddp_cuda_gloo_2r",
    "torch_tp_cuda_gloo_2r": ROOT / "tests" / "data" / "torch_tp_cuda_gloo_2r",
}


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(breakdown_module)
    assert tried > 0 and failed == 0


@pytest.mark.parametrize("name", sorted(TRACES))
def test_temporal_breakdown_and_overlap_agree_with_hta_within_a_point(name: str) -> None:
    out = breakdown(read_pytorch_et(TRACES[name]))
    ours = {r["rank"]: r for r in out.ranks.to_pylist() if r["step"] == "all"}
    hta = {r["rank"]: r for r in REF[name]["temporal"]}
    assert set(ours) == set(hta)
    for rank, h in hta.items():
        o = ours[rank]
        for mine, theirs in (
            ("idle_pct", "idle_time_pctg"),
            ("compute_pct", "compute_time_pctg"),
            ("non_compute_pct", "non_compute_time_pctg"),
        ):
            assert o[mine] == pytest.approx(h[theirs], abs=1.0), (rank, mine)
        assert o["idle_pct"] + o["compute_pct"] + o["non_compute_pct"] == pytest.approx(100, abs=0.02)
    for h in REF[name]["comm_comp_overlap"]:
        if h["comp_comm_overlap_pctg"] is None:  # no communication kernel: HTA divides by zero
            assert ours[h["rank"]]["comm_comp_overlap_pct"] is None
        else:
            assert ours[h["rank"]]["comm_comp_overlap_pct"] == pytest.approx(
                h["comp_comm_overlap_pctg"], abs=1.0
            )


def test_the_dlrm_matches_hta_to_the_microsecond() -> None:
    """One profiler step, so nothing is left out: the kernel time of every rank is HTA's, with the
    previous step's tail (64 kernels per rank launched before the execution trace began)."""
    out = breakdown(read_pytorch_et(TRACES["dlrm_8r"]))
    whole = [r for r in out.ranks.to_pylist() if r["step"] == "all"]
    for o, h in zip(whole, REF["dlrm_8r"]["temporal"], strict=True):
        assert o["kernel_us"] == h["kernel_time(us)"]
        assert o["compute_us"] == h["compute_time(us)"]
        assert o["idle_us"] == h["idle_time(us)"]


def test_a_collectives_wait_and_transfer_add_up_to_its_recorded_time() -> None:
    """Per member: wait (latest arrival less its own) + transfer (its end less the latest arrival)
    is its recorded kernel time; the last to arrive waits nothing; the skew is the instance's
    arrival spread; bus bandwidth on the transfer part exceeds the one on the recorded time."""
    out = breakdown(read_pytorch_et(TRACES["dlrm_8r"])).collectives.to_pandas()
    assert len(out) == 64
    assert np.allclose(out["wait_us"] + out["transfer_us"], out["measured_us"], atol=1)
    for _, inst in out.groupby(["pg_name", "seq"]):
        assert inst["wait_us"].min() == 0
        assert inst["skew_us"].iloc[0] == inst["wait_us"].max()
    # the first all-to-all: the early ranks waited ~7 ms for the last one
    first = out[out["seq"] == 0]
    assert first["skew_us"].iloc[0] > 5000
    ar = out[out["comm_type"] == "ALL_REDUCE"]
    recorded = ar["size_bytes"] * 2 * 7 / 8 / (ar["measured_us"] * 1e3)
    assert (ar["busbw_transfer_gb_per_s"] >= recorded - 1e-3).all()


def test_kernel_classes_sum_to_the_activity_time() -> None:
    t = read_pytorch_et(TRACES["dlrm_8r"])
    out = breakdown(t)
    k = out.kernels.to_pandas()
    assert set(k["kernel_class"]) == {"COMPUTATION", "COMMUNICATION", "MEMORY"}
    ops = t.ops.to_pandas()
    dev = ops[ops["is_cpu_op"] == False]  # noqa: E712
    for r, mine in k.groupby("rank"):
        assert mine["count"].sum() == (dev["rank"] == r).sum()
        assert mine["sum_us"].sum() == dev[dev["rank"] == r]["duration_micros"].sum()
        assert mine["pct"].sum() == pytest.approx(100, abs=0.05)
    assert kernel_class("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)") == "COMMUNICATION"


def test_merged_length_is_the_union() -> None:
    rng = np.random.default_rng(7)
    s = rng.integers(0, 1000, 200)
    e = s + rng.integers(0, 50, 200)
    covered = np.zeros(1100, bool)
    for a, b in zip(s, e, strict=True):
        covered[a:b] = True
    assert merged_length(s, e) == covered.sum()


def test_a_cpu_only_recording_has_nothing_to_break_down() -> None:
    with pytest.raises(OptionError, match="no recorded device activity"):
        breakdown(read_pytorch_et(ROOT / "tests" / "data" / "torch_ddp_2r"))


def test_a_row_per_profiler_step_splits_the_compute_by_launch() -> None:
    """Three profiler steps: a row each after the whole's; the compute of the steps adds up to the
    union of every computation kernel's time (the steps' kernels do not overlap in time)."""
    t = read_pytorch_et(TRACES["torch_ddp_cuda_1r"])
    rows = breakdown(t).ranks.to_pylist()
    assert [r["step"] for r in rows] == ["all", "ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    ops = t.ops.to_pandas()
    dev = ops[(ops["is_cpu_op"] == False) & (ops["start_time_micros"] > 0)]  # noqa: E712
    comp = dev[[kernel_class(n) == "COMPUTATION" for n in dev["name"]]]
    s = comp["start_time_micros"].to_numpy()
    assert sum(r["compute_us"] for r in rows[1:]) == merged_length(s, s + comp["duration_micros"].to_numpy())


def test_launch_bound_idle_counts_gaps_the_host_caused() -> None:
    """Activities [0, 10) and [20, 30) and [40, 50): the second launched at 15, after the device went
    idle at 10 (10 µs launch-bound); the third at 25, before its gap began (not launch-bound)."""
    start, end, launch = np.array([0, 20, 40]), np.array([10, 30, 50]), np.array([-5, 15, 25])
    assert _launch_bound(start, end, launch) == 10.0
    # on the DLRM most idle time is the device waiting: its all-to-alls wait for late peers, and
    # what follows them is launched after they end
    rows = [r for r in breakdown(read_pytorch_et(TRACES["dlrm_8r"])).ranks.to_pylist() if r["step"] == "all"]
    assert all(0 < r["launch_bound_pct"] <= r["idle_pct"] for r in rows)
