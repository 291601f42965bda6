"""Whole workloads against ASTRA-sim: issue order, communicator groups, exported files, reference runs.

Reference values are ASTRA-sim analytical runs (built from its public source) of
``etstore workload --tp 8 --layers 8`` (8 ranks; ``pg_name`` mapped to an integer,
same comm-group file) on ``Ring_8`` (50 GB/s, 500 ns) with the system config
``{LIFO, ring, 4 splits, local-mem-bw 1600, endpoint-delay 10}``:
62,070,335 ns congestion-unaware and 77,364,195 ns congestion-aware.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from etstore.errors import ConfigError, OptionError, SimulationError
from etstore.ingest.comm_groups import astra_comm_groups, comm_groups_path, write_astra_et
from etstore.ingest.et import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, read_comm_groups, read_network_config, read_system_config, simulate
from etstore.topology import Topology
from etstore.workloads import transformer

ASTRA_UNAWARE_NS = 62_070_335.0
ASTRA_AWARE_NS = 77_364_195.0


def _system(rt_inputs: Path, tmp_path: Path) -> SimConfig:
    """rt_template's system config with local-mem-bw 1600 GB/s, as the reference runs used."""
    system = json.loads((rt_inputs / "system_cfg.json").read_text())
    system["local-mem-bw"] = 1600
    path = tmp_path / "system.json"
    path.write_text(json.dumps(system))
    return read_system_config(path)


def _compute_ns(trace: Trace) -> np.ndarray:
    """Per rank, the sum of its COMP_NODE durations in ns (they run one at a time)."""
    ops = trace.ops
    comp = pc.equal(ops["type"], "COMP_NODE").to_numpy(zero_copy_only=False)
    rank = ops["rank"].to_numpy()
    dur = ops["duration_micros"].to_numpy().astype(float) * 1000
    return np.bincount(rank[comp], weights=dur[comp])


# ---------------------------------------------------------------- issue order


def _ring(n: int) -> Topology:
    """A ring of ``n`` NPUs with ASTRA-sim's example links: 50 GB/s, 500 ns."""
    return Topology.ring(n, latency_ns=500, bandwidth_gb_per_s=50)


def test_64_rank_workload_completes_under_lifo(rt_inputs: Path, tmp_path: Path) -> None:
    # Ready ops used to be taken last-ready-first under LIFO: ranks started different
    # collectives first and the replay stopped at t=31590612 ns with 1728 of 3904 ops
    # unfinished. ASTRA-sim issues in ascending node id and completes it.
    trace = transformer(ranks=64, tp=8, layers=8)
    assert trace.ops.num_rows == 3904  # 61 ops per rank
    cfg = _system(rt_inputs, tmp_path)
    assert cfg.scheduling_policy == "LIFO"
    res = simulate(trace, _ring(64), config=cfg)
    ends = res.ops["end_ns"].to_numpy()
    assert len(ends) == 3904 and (ends >= 0).all()
    # each rank runs its compute one op at a time, and waits for collectives besides
    assert res.total_ns > _compute_ns(trace).max()
    # a rank holds one collective at a time, so (as in ASTRA-sim) the policy orders nothing here
    fifo = simulate(trace, _ring(64), config=dataclasses.replace(cfg, scheduling_policy="FIFO"))
    assert fifo.total_ns == res.total_ns


def test_ranks_issue_collectives_in_node_id_order() -> None:
    # Two independent all-reduces per rank, ready together; each rank lists them in a
    # different row order. Issue by node id pairs id 1 with id 1 on both ranks: the
    # collective of 1 MiB first, then the 2 MiB one, whatever the rows say.
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [2, 1, 1, 2],
            "type": ["COMM_COLL_NODE"] * 4,
            "comm_type": ["ALL_REDUCE"] * 4,
            "comm_size": [2 << 20, 1 << 20, 1 << 20, 2 << 20],
        }
    )
    for policy in ("LIFO", "FIFO"):
        res = simulate(Trace(ops, name="two"), _ring(2), config=SimConfig(scheduling_policy=policy))
        coll = res.collectives.sort_by("start_ns").to_pylist()
        assert [c["size_bytes"] for c in coll] == [1 << 20, 2 << 20]
        assert coll[1]["start_ns"] == coll[0]["end_ns"]


def test_an_early_member_leaves_before_its_last_message_lands() -> None:
    # Rank 1 joins a 2-rank all-reduce (1 MiB, one chunk) 100 µs late. Messages of
    # 512 KiB take floor(500 + 524288 / 53.687) = 10265 ns, a reduction 3 x 10485 =
    # 31455 ns, an endpoint delay 10 ns. Rank 0: S1 at 10; rank 1's S1 lands 110275;
    # D1 ends 110275 + 10 + 31455 = 141740, S2 leaves then; rank 1's S2 already landed
    # (131475 + 10265 = 141740), so D2 ends 141750 and rank 0 leaves — ASTRA-sim's ring
    # does not wait for its own S2, which lands at 152005 (etstore used to end there).
    ops = ops_table(
        {
            "rank": [0, 1, 1],
            "id": [1, 1, 2],
            "type": ["COMM_COLL_NODE", "COMP_NODE", "COMM_COLL_NODE"],
            "duration_micros": [0, 100, 0],
            "comm_type": ["ALL_REDUCE", None, "ALL_REDUCE"],
            "comm_size": [1 << 20, None, 1 << 20],
        }
    )
    trace = Trace(ops, deps=deps_table([1], [1], [2]), name="late")
    res = simulate(trace, _ring(2), config=SimConfig(preferred_dataset_splits=1))
    ends = {(r["rank"], r["id"]): r["end_ns"] for r in res.ops.to_pylist()}
    assert ends[(0, 1)] == 141750.0
    assert ends[(1, 2)] == res.total_ns == 152005.0 + 10  # the late rank ends after its last receive


# ---------------------------------------------------------------- communicator groups


def _grouped_trace() -> Trace:
    """Rank 0 computes 30 µs, rank 1 10 µs, then each runs an all-reduce in its own group "5"/"6"."""
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "type": ["COMP_NODE", "COMM_COLL_NODE"] * 2,
            "duration_micros": [30, 0, 10, 0],
            "comm_type": [None, "ALL_REDUCE"] * 2,
            "comm_size": [None, 1 << 20] * 2,
            "pg_name": [None, "5", None, "6"],
        }
    )
    return Trace(ops, deps=deps_table([0, 1], [1, 1], [2, 2]), name="one-rank-groups")


def test_a_one_rank_group_costs_zero() -> None:
    # nothing moves in a group of one (ASTRA-sim makes no phase); it used to end at
    # t=0, before it began: -30000 and -10000 ns
    res = simulate(_grouped_trace(), _ring(2), groups={"5": [0], "6": [1]})
    coll = res.collectives.to_pylist()
    assert [(c["pg_name"], c["group_size"], c["time_ns"]) for c in coll] == [("5", 1, 0.0), ("6", 1, 0.0)]
    assert [(c["start_ns"], c["end_ns"]) for c in coll] == [(30000.0, 30000.0), (10000.0, 10000.0)]
    assert res.total_ns == 30000.0


def test_a_missing_communicator_group_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "groups.json"
    path.write_text(json.dumps({"5": [0]}))
    with pytest.raises(ConfigError, match=r"rank 1 node 2: communicator group 6 not found .*\(5\)$"):
        simulate(_grouped_trace(), _ring(2), groups=read_comm_groups(path))


def test_explicit_groups_win_over_the_trace_s_own() -> None:
    # group "7" is ranks 0 and 1 in the collectives, but the trace's params say 0..2
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [1, 1],
            "type": ["COMM_COLL_NODE"] * 2,
            "comm_type": ["ALL_REDUCE"] * 2,
            "comm_size": [1 << 20] * 2,
            "pg_name": ["7", "7"],
        }
    )
    declared = Trace(ops, name="declared", params={"comm_groups": {"7": [0, 1, 2]}})
    with pytest.raises(SimulationError, match=r"group 7 has no matching COMM_COLL_NODE on rank\(s\) \[2\]"):
        simulate(declared, _ring(4))
    res = simulate(declared, _ring(4), groups={"7": [0, 1]})
    plain = simulate(Trace(ops, name="plain"), _ring(4))  # no groups anywhere: the ranks that carry "7"
    assert res.collectives["group_size"].to_pylist() == [2]
    # native ring all-reduce of 1 MiB on 2 ranks: 4 chunks of 256 KiB, each an endpoint
    # delay then 2 steps of a 128 KiB message (floor(500 + 131072 / 53.687) = 2941 ns)
    # plus an endpoint delay, the first step reducing (3 x floor(131072 / 50) = 7863 ns)
    assert res.total_ns == plain.total_ns == 4 * (10 + 2 * (2941 + 10) + 7863) == 55100


# ---------------------------------------------------------------- files for ASTRA-sim


def test_export_writes_integer_pg_names_and_their_groups(tmp_path: Path) -> None:
    trace = transformer(ranks=16, tp=8, layers=2)
    paths = write_astra_et(trace, tmp_path / "w")
    assert [p.name for p in paths] == [f"w.{r}.et" for r in range(16)] + ["w.comm_groups.json"]
    assert comm_groups_path(tmp_path / "w") == paths[-1]
    groups = json.loads(paths[-1].read_text())
    # dp0..dp7 (every 8th rank) then tp0, tp1 (8 consecutive ranks), natural name order
    assert groups == {
        **{str(j + 1): [j, j + 8] for j in range(8)},
        "9": list(range(8)),
        "10": list(range(8, 16)),
    }
    back = read_et(tmp_path / "w")
    names = set(pc.drop_null(back.ops["pg_name"]).to_pylist())
    assert names == {str(i) for i in range(1, 11)}
    assert all(int(k) > 0 for k in groups)  # ASTRA-sim stoi()s them; 0 means every NPU
    # the exported files with their group file simulate as the generator's trace
    a = simulate(trace, _ring(16))
    b = simulate(back, _ring(16), groups=read_comm_groups(paths[-1]))
    assert b.total_ns == a.total_ns


def test_integer_and_default_names_are_kept() -> None:
    ops = ops_table(
        {
            "rank": [0, 1, 0, 1, 0, 1],
            "id": [1, 1, 2, 2, 3, 3],
            "type": ["COMM_COLL_NODE"] * 6,
            "comm_type": ["ALL_REDUCE"] * 6,
            "comm_size": [1024] * 6,
            "pg_name": ["3", "3", "0", "0", "x", "x"],
        }
    )
    renamed, groups = astra_comm_groups(Trace(ops))
    assert renamed.ops["pg_name"].to_pylist() == ["3", "3", "0", "0", "4", "4"]
    assert groups == {"3": [0, 1], "4": [0, 1]}


def test_a_negative_group_name_is_refused() -> None:
    ops = ops_table({"rank": [0], "id": [1], "type": ["COMM_COLL_NODE"], "pg_name": ["-2"]})
    with pytest.raises(OptionError, match="communicator group -2 is negative"):
        astra_comm_groups(Trace(ops, name="neg"))


# ---------------------------------------------------------------- reference runs


def _reference_run(
    rt_inputs: Path, tmp_path: Path, shared_fixture: Callable[[str], Path], congestion: str
) -> float:
    trace = transformer(tp=8, layers=8)
    paths = write_astra_et(trace, tmp_path / "w")  # pg_name "1", group {"1": [0..7]}, as ASTRA-sim ran it
    net = read_network_config(shared_fixture("astra-sim/examples/network/analytical/Ring_8npus.yml"))
    cfg = dataclasses.replace(_system(rt_inputs, tmp_path), congestion=congestion)
    res = simulate(
        read_et(tmp_path / "w"), net.topology, config=cfg, groups=read_comm_groups(paths[-1]), dims=net.dims
    )
    return res.total_ns


_GAP = (
    "etstore gives 46,918,734 ns unaware / 47,463,088 ns aware (-24.4% / -38.6%); the all-gather and "
    "reduce-scatter ring model reproduces ASTRA-sim's microbenchmarks and rt_template exactly, so the "
    "difference is in the workload-level semantics: see docs/simulator.md, 'Whole workloads'"
)


@pytest.mark.xfail(strict=True, reason=_GAP)
def test_8_rank_workload_within_1pct_of_astra_sim_unaware(
    rt_inputs: Path, tmp_path: Path, shared_fixture: Callable[[str], Path]
) -> None:
    total = _reference_run(rt_inputs, tmp_path, shared_fixture, "unaware")
    assert total == pytest.approx(ASTRA_UNAWARE_NS, rel=0.01)


@pytest.mark.xfail(strict=True, reason=_GAP)
def test_8_rank_workload_within_1pct_of_astra_sim_aware(
    rt_inputs: Path, tmp_path: Path, shared_fixture: Callable[[str], Path]
) -> None:
    total = _reference_run(rt_inputs, tmp_path, shared_fixture, "aware")
    assert total == pytest.approx(ASTRA_AWARE_NS, rel=0.01)


def test_8_rank_reference_run_today(
    rt_inputs: Path, tmp_path: Path, shared_fixture: Callable[[str], Path]
) -> None:
    # Pins what etstore computes for the reference case, from the exported files (pg_name
    # "1" and its comm-group file, as ASTRA-sim read them), so a change shows up here.
    # Lower bound: the slowest rank's compute, plus per layer one all-gather (7 steps of
    # 4 chunks of 4 MiB: 4 x 7 x (500 + 4 MiB / 50 GiB/s) ns) that nothing overlaps.
    trace = transformer(tp=8, layers=8)
    ag_ns = 4 * 7 * (500 + (16 << 20) // 4 / (50 * 2**30 / 1e9))
    unaware = _reference_run(rt_inputs, tmp_path, shared_fixture, "unaware")
    assert unaware > _compute_ns(trace).max() + 8 * ag_ns
    assert unaware == 46_918_734.0
    assert _reference_run(rt_inputs, tmp_path, shared_fixture, "aware") == 47_463_088.0
