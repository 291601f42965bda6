"""Built-in algorithms: every generator and collective passes the checker; shapes are hand-checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import GENERATORS, GeneratorInfo, check_algorithm, generate
from etstore.errors import UnsatisfiableError
from etstore.formats.msccl_xml import read_msccl_xml
from etstore.sim import simulate
from etstore.sim.config import SimConfig
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology

CASES = [(name, coll) for name, info in GENERATORS.items() for coll in info.collectives]


def sizes_for(name: str) -> list[int]:
    return [2, 4, 8, 16] if GENERATORS[name].needs_power_of_two else [2, 3, 5, 8, 13]


@pytest.mark.parametrize(("name", "coll"), CASES)
@pytest.mark.parametrize("chunks", [1, 3])
def test_generated_algorithms_pass_the_check(name: str, coll: str, chunks: int) -> None:
    for ranks in sizes_for(name):
        t = generate(name, coll=coll, ranks=ranks, chunks=chunks)
        report = check_algorithm(t)
        assert report.ok, (name, coll, ranks, chunks, report.problems)
        assert t.kind == "algorithm" and t.num_ranks == ranks
        assert t.params["nchunksperloop"] == ranks * chunks
        assert t.params["producer"] == name and t.params["generator"] == name
        assert t.params["chunks_per_rank"] == chunks and t.params["collective"] == coll


def test_registry() -> None:
    assert set(GENERATORS) == {"ring", "direct", "halving-doubling", "tree", "alltoall-direct"}
    assert all(isinstance(v, GeneratorInfo) and v.name == k for k, v in GENERATORS.items())
    assert GENERATORS["tree"].collectives == ("allreduce",)
    with pytest.raises(TypeError):
        GENERATORS["x"] = GENERATORS["ring"]  # type: ignore[index]


def test_ring_allreduce_is_the_custom_allreduce_dag(custom_allreduce_xml: Path) -> None:
    """8-rank ring with fused steps = ASTRA-sim's custom_allreduce.xml node for node, edge for edge."""
    ours = generate("ring", coll="allreduce", ranks=8)
    theirs = read_msccl_xml(custom_allreduce_xml)
    cols = ["rank", "id", "type", "comm_src", "comm_dst", "comm_tag", "chunk_offset", "msg_chunk_cnt"]
    assert ours.ops.select(cols).equals(theirs.ops.select(cols))
    assert ours.deps.select(["rank", "src", "dst"]).equals(theirs.deps.select(["rank", "src", "dst"]))
    # but in 2N-1 fused steps per threadblock instead of 4N-4
    assert pc.max(ours.ops["local_time_step"]).as_py() == 2 * 8 - 2
    assert pc.max(theirs.ops["local_time_step"]).as_py() == 4 * 8 - 5


@pytest.mark.parametrize(
    ("name", "coll", "ranks", "chunks", "ops", "sends"),
    [
        # ring all-reduce: per rank and lane 1 s + (N-2) rrs + rrcs + (N-2) rcs + r
        ("ring", "allreduce", 4, 2, 4 * 2 * (1 + 3 * 2 + 3 + 2 * 2 + 1), 4 * 2 * 2 * 3),
        ("ring", "allgather", 5, 1, 5 * (1 + 2 * 3 + 1), 5 * 4),
        ("ring", "reducescatter", 5, 1, 5 * (1 + 3 * 3 + 2), 5 * 4),
        # direct all-reduce: per peer s, r, s, r and one re per peer
        ("direct", "allreduce", 4, 2, 4 * (3 * 4 + 3), 4 * 3 * 2),
        ("direct", "allgather", 4, 1, 4 * 3 * 2, 4 * 3),
        ("alltoall-direct", "alltoall", 4, 2, 4 * (3 * 2 + 1), 4 * 3),
        # halving-doubling: log N rounds of (s, rrc) then of (s, r)
        ("halving-doubling", "allreduce", 8, 1, 8 * 3 * (1 + 2 + 1 + 1), 8 * 6),
        ("halving-doubling", "allgather", 8, 1, 8 * 3 * 2, 8 * 3),
        # tree: every non-root sends each chunk up once; every rank receives each chunk down once
        ("tree", "allreduce", 4, 1, None, 2 * (3 * 2 + 3 * 2)),
    ],
)
def test_node_counts(name: str, coll: str, ranks: int, chunks: int, ops: int | None, sends: int) -> None:
    t = generate(name, coll=coll, ranks=ranks, chunks=chunks)
    if ops is not None:
        assert t.num_ops == ops
    assert int(pc.sum(pc.equal(t.ops["type"], "COMM_SEND_NODE")).as_py()) == sends


def test_halving_doubling_partners_and_transfer_sizes() -> None:
    t = generate("halving-doubling", coll="allreduce", ranks=4, chunks=1)
    r0 = t.ops.filter(pc.and_(pc.equal(t.ops["rank"], 0), pc.equal(t.ops["type"], "COMM_SEND_NODE")))
    # ops are grouped by threadblock: tb 0 talks to rank 2 (halving: give blocks 2-3; doubling: send
    # blocks 0-1), tb 1 to rank 1 (halving: give block 1; doubling: send block 0)
    assert r0["tb_id"].to_pylist() == [0, 0, 1, 1]
    assert r0["comm_dst"].to_pylist() == [2, 2, 1, 1]
    assert r0["msg_chunk_cnt"].to_pylist() == [2, 2, 1, 1]
    assert r0["chunk_offset"].to_pylist() == [2, 0, 1, 0]


def test_double_binary_tree_uses_two_complementary_trees() -> None:
    t = generate("tree", coll="allreduce", ranks=7, chunks=2)
    assert check_algorithm(t).ok
    sends = t.ops.filter(pc.equal(t.ops["type"], "COMM_SEND_NODE"))
    trees = []
    for tag in (0, 1):
        sub = sends.filter(pc.equal(sends["comm_tag"], tag))
        trees.append(
            {frozenset(e) for e in zip(sub["rank"].to_pylist(), sub["comm_dst"].to_pylist(), strict=True)}
        )
    for edges in trees:  # each is a spanning tree: N-1 edges connecting all ranks
        assert len(edges) == 6
        seen, todo = {0}, [0]
        while todo:
            v = todo.pop()
            for e in edges:
                if v in e:
                    (w,) = e - {v}
                    if w not in seen:
                        seen.add(w)
                        todo.append(w)
        assert seen == set(range(7))
    assert trees[0] != trees[1]
    # 7 ranks make perfect trees: no rank is an interior node (degree >= 2) of both
    interior = [{r for r in range(7) if sum(r in e for e in edges) >= 2} for edges in trees]
    assert not interior[0] & interior[1]
    # each tree moves half the chunks
    halves = [
        set(sends.filter(pc.equal(sends["comm_tag"], tag))["chunk_offset"].to_pylist()) for tag in (0, 1)
    ]
    assert halves == [set(range(7)), set(range(7, 14))]


def test_many_ranks_direct_spreads_connections_over_channels() -> None:
    t = generate("direct", coll="allgather", ranks=70)
    per = t.ops.filter(pc.and_(pc.equal(t.ops["rank"], 0), pc.equal(t.ops["type"], "COMM_SEND_NODE")))
    tags = per["comm_tag"].to_pylist()
    assert max(tags.count(c) for c in set(tags)) <= 32
    assert check_algorithm(t).ok


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"name": "butterfly", "coll": "allreduce", "ranks": 4},
            r"unknown algorithm generator 'butterfly'; known: ",
        ),
        (
            {"name": "tree", "coll": "allgather", "ranks": 4},
            r"generator 'tree' does not implement 'allgather'",
        ),
        ({"name": "ring", "coll": "alltoall", "ranks": 4}, r"does not implement 'alltoall'"),
        ({"name": "ring", "coll": "allreduce", "ranks": 1}, r"needs at least 2 ranks, got 1"),
        (
            {"name": "ring", "coll": "allreduce", "ranks": 4, "chunks": 0},
            r"chunks per rank must be at least 1",
        ),
        (
            {"name": "halving-doubling", "coll": "allreduce", "ranks": 6},
            r"halving-doubling needs a power-of-two number of ranks, got 6",
        ),
    ],
)
def test_impossible_requests(args: dict, message: str) -> None:
    name = args.pop("name")
    with pytest.raises(UnsatisfiableError, match=message):
        generate(name, **args)


def test_a_broadcast_missing_a_receive_fails_the_check() -> None:
    """The check proves a broadcast: drop the last rank's first receive and it fails."""
    good = generate("ring", coll="broadcast", ranks=4, chunks=2)
    assert check_algorithm(good).ok
    ops, deps = good.ops, good.deps
    recv = np.flatnonzero(
        (ops["rank"].to_numpy() == 3) & (ops["type"].to_numpy(zero_copy_only=False) == "COMM_RECV_NODE")
    )
    gone = ops["id"][int(recv[0])].as_py()
    keep = np.ones(ops.num_rows, bool)
    keep[recv[0]] = False
    touches = (deps["rank"].to_numpy() == 3) & (
        (deps["src"].to_numpy() == gone) | (deps["dst"].to_numpy() == gone)
    )
    bad = good.replace(ops=ops.filter(pa.array(keep)), deps=deps.filter(pa.array(~touches)))
    assert not check_algorithm(bad).ok


@pytest.mark.parametrize("ranks", [2, 4, 5])
def test_broadcast_times_on_a_switch_are_the_closed_forms(ranks: int) -> None:
    """On ``switch:N`` (a message crosses two links of latency L; bandwidth B, GB = 2^30):
    direct sends the S bytes to every peer at once, 2L + S/B; the ring chain pipelines its
    C = N chunks (one per rank, as the simulator asks) down N - 1 hops, (C + N - 2)·(2L + S/(C·B))."""
    size, lat, bw = 1 << 20, 500.0, 50.0
    topo = Topology.from_spec(f"switch:{ranks},bw={bw:g},lat={lat:g}")
    per_byte = 1e9 / (bw * 2**30)
    config = SimConfig().replace(integer_ns=False)

    def total(algo: str) -> float:
        work = collective_workload("BROADCAST", ranks, size)
        return simulate(work, topo, algorithms={"BROADCAST": algo}, config=config).total_ns

    assert total("direct") == pytest.approx(2 * lat + size * per_byte, rel=1e-3)
    c = ranks
    assert total("ring") == pytest.approx((c + ranks - 2) * (2 * lat + size / c * per_byte), rel=1e-3)
