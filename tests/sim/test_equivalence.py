"""One cost model: ``simulate(W, algorithms=A)`` equals ``simulate(expand(W, A))`` (issue 14, item 4).

Every built-in generator, for every collective it implements, and the shipped MSCCL-IR
ring run through both paths must give the same makespan within 0.1%. The workloads
are built so that every difference between the paths would show: reductions and
copies (charged by local-memory passes on both), concurrent sends (no NPU slot on
either), two collectives that the workload lets overlap (the collective node holds
the communication slot, so the expanded block must too), sizes the chunks do not
divide, and groups that are not every rank. Before the change the ring all-reduce on
ASTRA-sim's rt_template gave 96,215 ns with ``algorithms`` and 41,181 ns expanded.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.algorithms import generate
from etstore.algorithms.expand import expand
from etstore.algorithms.generators import GENERATORS
from etstore.cli import main
from etstore.errors import ExpansionError
from etstore.formats import read_trace
from etstore.formats.et import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, read_network_config, read_system_config, simulate
from etstore.store import open_store
from etstore.topology import Topology
from etstore.workloads import transformer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_CHAKRA = {
    "allreduce": "ALL_REDUCE",
    "allgather": "ALL_GATHER",
    "reducescatter": "REDUCE_SCATTER",
    "alltoall": "ALL_TO_ALL",
    "broadcast": "BROADCAST",
}
CASES = [(g, c) for g, info in GENERATORS.items() for c in info.collectives]


def _two_collectives(n: int, size: int, coll: str, *, group: str | None = None) -> Trace:
    """Per rank: compute 10 → two independent collectives 20, 30 → compute 40 after both.

    The collectives may overlap as far as the dependencies go; only the communication
    slot (one collective in flight per NPU) orders them, lowest node id first.
    """
    ops = ops_table(
        {
            "rank": np.repeat(np.arange(n), 4),
            "id": np.tile([10, 20, 30, 40], n),
            "name": ["a", "c1", "c2", "b"] * n,
            "type": ["COMP_NODE", "COMM_COLL_NODE", "COMM_COLL_NODE", "COMP_NODE"] * n,
            "duration_micros": np.tile([2, 0, 0, 1], n).astype(np.uint64),
            "comm_type": [None, coll, coll, None] * n,
            "comm_size": [None, size, size // 2, None] * n,
            "pg_name": [None, group, group, None] * n,
        }
    )
    src = np.tile([10, 10, 20, 30], n)
    dst = np.tile([20, 30, 40, 40], n)
    return Trace(ops, deps_table(np.repeat(np.arange(n), 4), src, dst), name=f"two-{coll}-{n}")


def _both(w: Trace, topo: Topology, algo: str | Trace, coll: str, cfg: SimConfig) -> tuple[float, float]:
    native = simulate(w, topo, config=cfg, algorithms={coll: algo})
    expanded = simulate(expand(w, {coll: algo}).trace, topo, config=cfg)
    assert native.collectives.num_rows and not expanded.collectives.num_rows
    return native.total_ns, expanded.total_ns


@pytest.mark.parametrize(("gen", "coll"), CASES, ids=[f"{g}-{c}" for g, c in CASES])
def test_every_generator_costs_the_same_through_algorithms_and_expand(gen: str, coll: str) -> None:
    chakra = _CHAKRA[coll]
    ranks = 8
    w = _two_collectives(ranks, 1_000_003 if coll != "alltoall" else 1 << 16, chakra)
    a, b = _both(w, Topology.ring(ranks), gen, chakra, SimConfig())
    assert b == pytest.approx(a, rel=1e-3)
    # the workload lets the two collectives overlap; on every rank the slot runs them one after
    # the other (the expanded blocks must too, or the makespans would differ)
    t = simulate(w, Topology.ring(ranks), algorithms={chakra: gen}).ops.to_pandas()
    c1, c2 = (t[t["id"] == i].set_index("rank") for i in (20, 30))
    assert (c2["start_ns"] >= c1["end_ns"]).all()


@pytest.mark.parametrize("gen", ["ring", "direct", "halving-doubling", "tree"])
def test_rt_template_all_reduce_costs_the_same_both_ways(gen: str, rt_inputs: Path) -> None:
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    net = read_network_config(rt_inputs / "network_cfg.yml")
    w = read_et(rt_inputs / "workload" / "chakra_trace")
    algo = generate(gen, coll="allreduce", ranks=8)
    a, b = _both(w, net.topology, algo, "ALL_REDUCE", cfg)
    assert b == pytest.approx(a, rel=1e-3)
    if gen == "ring":  # 14 messages of 1 MiB / 8, 7 reductions of 3 passes at 50 GB/s (GB = 1e9)
        msg = (1 << 20) // 8
        assert a == b == 14 * math.floor(500 + msg / (50 * 2**30 / 1e9)) + 7 * 3 * math.floor(msg / 50)


@pytest.mark.parametrize(
    ("congestion", "policy"), [("unaware", "LIFO"), ("aware", "LIFO"), ("unaware", "FIFO")]
)
def test_transformer_with_tp_and_dp_groups_costs_the_same_both_ways(congestion: str, policy: str) -> None:
    # all-gather and reduce-scatter in tp groups, all-reduce in dp groups, overlapping in time
    w = transformer(ranks=8, tp=4, layers=2)
    cfg = SimConfig(congestion=congestion, scheduling_policy=policy)
    topo = Topology.ring(8)
    for gen in ("ring", "direct", "halving-doubling"):
        algos = dict.fromkeys(("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER"), gen)
        a = simulate(w, topo, config=cfg, algorithms=algos).total_ns
        b = simulate(expand(w, gen).trace, topo, config=cfg).total_ns
        assert b == pytest.approx(a, rel=1e-3), gen


@pytest.mark.parametrize("which", ["shipped-4r-2ch", "astra-sim-custom-8r"])
def test_msccl_ir_ring_costs_the_same_both_ways(which: str, request: pytest.FixtureRequest) -> None:
    if which == "shipped-4r-2ch":
        path = EXAMPLES / "algorithms" / "ring_allreduce_4r.xml"
    else:  # ASTRA-sim's own custom ring all-reduce (../shared/fixtures)
        path = request.getfixturevalue("custom_allreduce") / "custom_allreduce.xml"
    algo = read_trace(path)
    n = int(algo.params["ngpus"])
    w = _two_collectives(n, 1 << 20, "ALL_REDUCE")
    a, b = _both(w, Topology.ring(n), algo, "ALL_REDUCE", SimConfig())
    assert b == pytest.approx(a, rel=1e-3)


def test_reduce_costs_local_memory_passes_on_every_path() -> None:
    # 2 ranks, ring all-reduce of 1 MB: each rank reduces one 500,000-byte half once
    w = _two_collectives(2, 1_000_000, "ALL_REDUCE")
    cfg = SimConfig(local_mem_bw_gb_per_s=10.0)
    base = simulate(
        w, Topology.ring(2), config=cfg.replace(reduction_mem_accesses=0), algorithms={"ALL_REDUCE": "ring"}
    )
    full = simulate(w, Topology.ring(2), config=cfg, algorithms={"ALL_REDUCE": "ring"})
    x = expand(w, "ring").trace
    base_x = simulate(x, Topology.ring(2), config=cfg.replace(reduction_mem_accesses=0))
    full_x = simulate(x, Topology.ring(2), config=cfg)
    # two collectives (1 MB and 500 KB), one reduction each: 3 passes of b / 10 GB/s (GB = 1e9);
    # with no passes a reduction still lasts min_comp_ns (1 ns), as ASTRA-sim's custom collectives run it
    reduce_ns = 3 * (500_000 // 10) + 3 * (250_000 // 10)
    assert full.total_ns - base.total_ns == full_x.total_ns - base_x.total_ns == reduce_ns - 2 * 1


def _cli(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> object:
    code = main(["--store", str(store), *args, "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_cli_sim_with_algo_equals_sim_of_the_expanded_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path, rt_inputs: Path
) -> None:
    # the case: a stored 8-rank ring, through `sim --algo` and through `expand` + `sim`
    s = tmp_path / "s"
    _cli(capsys, s, "ingest", str(rt_template))
    _cli(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "8")
    _cli(capsys, s, "expand", "chakra_trace", "--algo", "ring-allreduce-8r-1c", "--name", "rt-x")
    net = ["--network-config", str(rt_inputs / "network_cfg.yml")]
    system = ["--system-config", str(rt_inputs / "system_cfg.json")]
    a = _cli(capsys, s, "sim", "chakra_trace", "--algo", "ring-allreduce-8r-1c", *net, *system)
    b = _cli(capsys, s, "sim", "rt-x", *net, *system)
    assert isinstance(a, list) and isinstance(b, list)  # the summary table: one row
    assert a[0]["total_ns"] == b[0]["total_ns"] == 96215.0  # was 96,215 vs 41,181


# ---------------------------------------------------------------- groups (issue 14, item 6)


def _mixed_groups() -> Trace:
    """Ranks 0-1: an all-reduce in group "1" (2 ranks); rank 2: one in group "2" (itself) after 30 µs."""
    ops = ops_table(
        {
            "rank": [0, 1, 2, 2],
            "id": [1, 1, 1, 2],
            "type": ["COMM_COLL_NODE", "COMM_COLL_NODE", "COMP_NODE", "COMM_COLL_NODE"],
            "duration_micros": [0, 0, 30, 0],
            "comm_type": ["ALL_REDUCE", "ALL_REDUCE", None, "ALL_REDUCE"],
            "comm_size": [1 << 20, 1 << 20, None, 1 << 20],
            "pg_name": ["1", "1", None, "2"],
        }
    )
    return Trace(
        ops, deps_table([2], [1], [2]), name="mixed", params={"comm_groups": {"1": [0, 1], "2": [2]}}
    )


@pytest.mark.parametrize("algo", ["native", "replay", *GENERATORS])
def test_a_one_rank_group_costs_zero_with_every_algorithm(algo: str) -> None:
    w = _mixed_groups()
    if algo == "alltoall-direct":  # all-to-all only: the all-reduce falls back to the default
        algo = "native"
    res = simulate(w, Topology.ring(3), algorithms={"ALL_REDUCE": algo})
    one = [c for c in res.collectives.to_pylist() if c["pg_name"] == "2"]
    assert [(c["group_size"], c["start_ns"], c["time_ns"]) for c in one] == [(1, 30000.0, 0.0)]
    assert res.total_ns >= 30000.0


def test_expand_leaves_a_one_rank_group_in_place_and_costs_the_same() -> None:
    w = _mixed_groups()
    x = expand(w, "ring")
    assert x.skipped == 1 and x.collectives["group_size"].to_pylist() == [2]
    kept = x.trace.ops.to_pandas().query("type == 'COMM_COLL_NODE'")
    assert kept[["rank", "id", "pg_name"]].values.tolist() == [[2, 2, "2"]]
    a = simulate(w, Topology.ring(3), algorithms={"ALL_REDUCE": "ring"}).total_ns
    b = simulate(x.trace, Topology.ring(3), algorithms={"ALL_REDUCE": "ring"}).total_ns
    assert a == b
    with pytest.raises(
        ExpansionError, match=r"nothing to expand: every selected collective is in a one-rank"
    ):
        expand(w, "ring", where="pg_name = '2'")


def test_cli_comm_groups_file_is_honoured_and_a_missing_group_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    with open_store(s, write=True) as store:
        store.ingest(_mixed_groups())
    ok = tmp_path / "groups.json"
    ok.write_text(json.dumps({"1": [0, 1], "2": [2]}))
    doc = _cli(capsys, s, "sim", "mixed", "--topo", "ring:3", "--comm-groups", str(ok), "--no-record")
    assert isinstance(doc, list) and doc[0]["total_ns"] >= 30000.0  # the summary table: one row
    # a file without group "2": one line naming the node and the groups it has, exit code 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"1": [0, 1]}))
    code = main(["--store", str(s), "sim", "mixed", "--topo", "ring:3", "--comm-groups", str(bad)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code != 0 and len(lines) == 1
    assert "rank 2 node 2: communicator group 2 not found in the communicator groups given (1)" in lines[0]
    # an explicit file wins over the trace's own groups: "1" as ranks 0..2 leaves rank 2 without its node
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps({"1": [0, 1, 2], "2": [2]}))
    code = main(["--store", str(s), "sim", "mixed", "--topo", "ring:3", "--comm-groups", str(wide)])
    err = capsys.readouterr().err
    assert code != 0 and "has no matching COMM_COLL_NODE on rank(s) [2]" in err


def test_a_rewrite_of_an_expansion_keeps_the_blocks_holding_the_slot() -> None:
    # a rewrite nests its parent's params under parent_params and keeps its ops' ids
    w = _two_collectives(8, 1 << 20, "ALL_REDUCE")
    x = expand(w, "direct").trace
    rewritten = x.replace(kind="rewritten", params={"applied": "none", "parent_params": dict(x.params)})
    lost = x.replace(params={k: v for k, v in x.params.items() if k != "collective_blocks"})
    a = simulate(w, Topology.ring(8), algorithms={"ALL_REDUCE": "direct"}).total_ns
    assert simulate(rewritten, Topology.ring(8)).total_ns == simulate(x, Topology.ring(8)).total_ns == a
    # without the blocks (e.g. read back from .et) the two collectives overlap: faster than possible
    assert simulate(lost, Topology.ring(8)).total_ns < a


def test_a_rewrite_that_threads_an_op_through_a_block_drops_its_hold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # ring:2 on 2 ranks: rank 0's first block has two channels, entries 41 and 46; a rewrite
    # that makes entry 46 wait for an op after 42 (on the other channel) would, with the
    # block's acquire op in front of both entries, wait for itself
    w = _two_collectives(2, 1 << 20, "ALL_REDUCE")
    x = expand(w, "ring:2").trace
    assert x.params["collective_blocks"]["first_id"][:2] == [41, 51]
    u = ops_table({"rank": [0], "id": [99], "name": ["u"], "type": ["COMP_NODE"], "duration_micros": [1]})
    ops = pa.concat_tables([x.ops, u])
    deps = pa.concat_tables([x.deps, deps_table([0, 0], [42, 99], [99, 46])])
    threaded = x.replace(ops=ops, deps=deps)
    plain = simulate(threaded.replace(params={}), Topology.ring(2)).total_ns
    rewritten = threaded.replace(kind="rewritten", params={"parent_params": dict(x.params)})
    with caplog.at_level("WARNING", logger="etstore.sim._build"):
        assert simulate(rewritten, Topology.ring(2)).total_ns == plain
    assert "they hold no comm slot" in caplog.text
