"""The event-driven replay: closed forms, ASTRA-sim's regression case, error paths."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms.generators import generate
from etstore.formats.et import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import (
    ConfigError,
    SimConfig,
    SimulationError,
    collective_workload,
    read_comm_groups,
    read_network_config,
    read_system_config,
    simulate,
    sweep,
)
from etstore.testing import p2p_trace as _p2p
from etstore.testing import slot_policy_trace as _policy_trace
from etstore.topology import Topology

BYTES_PER_NS_50 = 50 * 2**30 / 1e9  # 50 GB/s with GB = 2^30


def _msg_ns(size: float, hops: int = 1, lat: float = 500.0) -> float:
    """Closed form of the congestion-unaware model, truncated to whole ns like ASTRA-sim."""
    return float(math.floor(hops * lat + size / BYTES_PER_NS_50))


def _end(res, rank: int, op_id: int) -> float:  # type: ignore[no-untyped-def]
    t = res.ops
    mask = pc.and_(pc.equal(t["rank"], rank), pc.equal(t["id"], op_id))
    return t.filter(mask)["end_ns"][0].as_py()


def _row(res, rank: int, op_id: int) -> dict:  # type: ignore[no-untyped-def]
    t = res.ops
    mask = pc.and_(pc.equal(t["rank"], rank), pc.equal(t["id"], op_id))
    return t.filter(mask).to_pylist()[0]


# ---------------------------------------------------------------- closed forms


def test_one_message_takes_latency_plus_size_over_bandwidth() -> None:
    size = 1 << 20
    res = simulate(_p2p(size), Topology.ring(2))
    expected = _msg_ns(size)  # 500 + 19531.25 -> 20031
    assert res.total_ns == expected == 20031.0
    assert _end(res, 0, 1) == _end(res, 1, 1) == expected
    send = _row(res, 0, 1)
    assert send["ready_ns"] == send["start_ns"] == 0.0


def test_one_message_without_integer_truncation() -> None:
    size = 1 << 20
    res = simulate(_p2p(size), Topology.ring(2), config=SimConfig(integer_ns=False))
    assert res.total_ns == pytest.approx(500 + size / BYTES_PER_NS_50)


def test_multi_hop_message_takes_the_shorter_ring_direction() -> None:
    size = 4096
    res = simulate(_p2p(size, src=0, dst=6), Topology.ring(8))  # 0 -> 7 -> 6: two hops
    assert res.total_ns == _msg_ns(size, hops=2)
    res = simulate(_p2p(size, src=0, dst=6), Topology.ring(8), config=SimConfig(congestion="aware"))
    # store-and-forward: each hop pays latency + serialization
    assert res.total_ns == 2 * _msg_ns(size, hops=1)


def test_compute_chain_adds_durations_and_zero_takes_one_ns() -> None:
    ops = ops_table(
        {"rank": [0, 0, 0, 0], "id": [1, 2, 3, 4], "type": ["COMP_NODE"] * 4, "duration_micros": [2, 3, 0, 5]}
    )
    tr = Trace(ops, deps=deps_table([0, 0, 0], [1, 2, 3], [2, 3, 4]), name="chain")
    res = simulate(tr, Topology.ring(2))
    assert res.total_ns == 2000 + 3000 + 1 + 5000
    assert _row(res, 0, 4)["ready_ns"] == 2000 + 3000 + 1
    br = res.ranks.to_pylist()[0]
    assert br["compute_ns"] == res.total_ns
    assert br["comm_ns"] == br["idle_ns"] == br["exposed_comm_ns"] == 0.0


def test_independent_computes_share_one_slot_unless_allowed_more() -> None:
    ops = ops_table(
        {"rank": [0, 0, 0], "id": [1, 2, 3], "type": ["COMP_NODE"] * 3, "duration_micros": [4, 4, 4]}
    )
    tr = Trace(ops, name="parallel")
    assert simulate(tr, Topology.ring(2)).total_ns == 12000
    assert simulate(tr, Topology.ring(2), config=SimConfig(max_comp_ops=3)).total_ns == 4000
    assert simulate(tr, Topology.ring(2), config=SimConfig(max_comp_ops=None)).total_ns == 4000
    # a CPU op has its own slot
    ops = ops_table(
        {
            "rank": [0, 0],
            "id": [1, 2],
            "type": ["COMP_NODE"] * 2,
            "duration_micros": [4, 4],
            "is_cpu_op": [True, False],
        }
    )
    assert simulate(Trace(ops), Topology.ring(2)).total_ns == 4000


@pytest.mark.parametrize("policy", ["FIFO", "LIFO"])
def test_a_freed_slot_goes_to_the_lowest_node_id_whatever_the_policy(policy: str) -> None:
    # ASTRA-sim issues a rank's dependency-free nodes in ascending node id; its scheduling
    # policy orders collective chunks, not ready ops. X (id 1, GPU 10 µs) holds the slot;
    # P (id 4) is ready at 1 µs, Q (id 5) at 2 µs: P, then Q.
    res = simulate(_policy_trace(), Topology.ring(2), config=SimConfig(scheduling_policy=policy))
    p, q = _row(res, 0, 4), _row(res, 0, 5)
    assert (p["ready_ns"], q["ready_ns"]) == (1000.0, 2000.0)
    assert (p["start_ns"], q["start_ns"]) == (10000.0, 13000.0)


def _id_order_trace() -> Trace:
    """X (id 1, GPU 10 µs) holds the slot; B (id 5, ready at 1 µs) waits for it; A (id 2,
    ready when X ends) comes later but has the lower id; C (id 3, CPU 1 µs) feeds B."""
    ops = ops_table(
        {
            "rank": [0] * 4,
            "id": [1, 2, 3, 5],
            "name": ["X", "A", "C", "B"],
            "type": ["COMP_NODE"] * 4,
            "duration_micros": [10, 2, 1, 3],
            "is_cpu_op": [False, False, True, False],
        }
    )
    return Trace(ops, deps=deps_table([0, 0], [1, 3], [2, 5]), name="id-order")


@pytest.mark.parametrize("policy", ["FIFO", "LIFO"])
def test_an_op_ready_later_with_a_lower_id_goes_first(policy: str) -> None:
    # when X ends, its child A (id 2) and the waiting B (id 5) are both dependency-free:
    # ASTRA-sim issues A first although B has waited 9 µs
    res = simulate(_id_order_trace(), Topology.ring(2), config=SimConfig(scheduling_policy=policy))
    a, b = _row(res, 0, 2), _row(res, 0, 5)
    assert (a["ready_ns"], b["ready_ns"]) == (10000.0, 1000.0)
    assert (a["start_ns"], a["end_ns"]) == (10000.0, 12000.0)
    assert (b["start_ns"], b["end_ns"]) == (12000.0, 15000.0)
    assert res.total_ns == 15000.0


def test_recv_posted_after_arrival_completes_when_posted() -> None:
    size = 1024
    ops = ops_table(
        {
            "rank": [0, 1, 1],
            "id": [1, 1, 2],
            "type": ["COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE"],
            "comm_dst": [1, None, None],
            "comm_src": [None, None, 0],
            "comm_tag": [3, None, 3],
            "comm_size": [size, None, size],
            "duration_micros": [0, 50, 0],
        }
    )
    res = simulate(Trace(ops, deps=deps_table([1], [1], [2])), Topology.ring(2))
    assert _end(res, 0, 1) == _msg_ns(size)
    assert _end(res, 1, 2) == 50000.0  # the message waited for the receive


def test_nth_send_matches_nth_recv_on_the_same_tag() -> None:
    small, big = 1 << 10, 1 << 24
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "type": ["COMM_SEND_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_RECV_NODE"],
            "comm_dst": [1, 1, None, None],
            "comm_src": [None, None, 0, 0],
            "comm_tag": [0, 0, 0, 0],
            "comm_size": [big, small, big, small],
        }
    )
    tr = Trace(ops, deps=deps_table([0, 1], [1, 1], [2, 2]))
    res = simulate(tr, Topology.ring(2))
    t1 = _msg_ns(big)
    assert _end(res, 1, 1) == t1
    assert _end(res, 1, 2) == t1 + _msg_ns(small)


def test_rank_breakdown_splits_compute_exposed_comm_and_idle() -> None:
    size = 1 << 20  # 20031 ns on the wire
    ops = ops_table(
        {
            "rank": [0, 0, 0, 1],
            "id": [1, 2, 3, 1],
            "type": ["COMP_NODE", "COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE"],
            "duration_micros": [5, 0, 1, 0],
            "comm_dst": [None, 1, None, None],
            "comm_src": [None, None, None, 0],
            "comm_tag": [None, 0, None, 0],
            "comm_size": [None, size, None, size],
        }
    )
    # rank 0: compute 1 (5 us) overlaps the send; compute 3 waits for the send
    tr = Trace(ops, deps=deps_table([0], [2], [3]))
    res = simulate(tr, Topology.ring(2))
    t = _msg_ns(size)
    rows = {r["rank"]: r for r in res.ranks.to_pylist()}
    r0, r1 = rows[0], rows[1]
    assert r0["total_ns"] == t + 1000
    assert r0["compute_ns"] == 6000
    assert r0["comm_ns"] == t
    assert r0["overlap_ns"] == 5000
    assert r0["exposed_comm_ns"] == t - 5000
    assert r0["idle_ns"] == 0.0
    for r in (r0, r1):
        assert r["compute_ns"] + r["exposed_comm_ns"] + r["idle_ns"] == pytest.approx(r["total_ns"])
    assert r1["comm_ns"] == t and r1["compute_ns"] == 0.0


# ---------------------------------------------------------------- collectives


@pytest.mark.parametrize("congestion", ["unaware", "aware"])
def test_ring_allreduce_algorithm_on_a_ring(congestion: str) -> None:
    n, size = 8, 8 << 20
    cfg = SimConfig(congestion=congestion)
    res = simulate(
        collective_workload("allreduce", n, size),
        Topology.ring(n),
        config=cfg,
        algorithms={"ALL_REDUCE": "ring"},
    )
    msg = size // n
    reduce_ns = 3 * math.floor(msg / 50)  # one write + two reads at local-mem-bw 50 GB/s (GB = 1e9)
    assert res.total_ns == 2 * (n - 1) * _msg_ns(msg) + (n - 1) * reduce_ns
    coll = res.collectives.to_pylist()[0]
    assert coll["algorithm"] == "ring" and coll["group_size"] == n
    assert coll["busbw_factor"] == pytest.approx(2 * (n - 1) / n)
    algbw = size / res.total_ns  # bytes per ns = GB/s with GB = 10^9, as nccl-tests
    assert coll["algbw_gb_per_s"] == pytest.approx(algbw)
    assert coll["busbw_gb_per_s"] == pytest.approx(algbw * 2 * (n - 1) / n)


def test_ring_algorithm_as_an_expanded_workload() -> None:
    # The algorithm's steps carry its chunk attributes and sized reduce COMP nodes, as
    # expand writes them: a zero-duration reduce costs the same local reduction as
    # inside a collective node (one cost model, docs/simulator.md), not a 1 ns COMP.
    n, size = 8, 8 << 20
    alg = generate("ring", coll="allreduce", ranks=n)
    ops = alg.ops.set_column(
        alg.ops.schema.get_field_index("comm_size"), "comm_size", [[size // n] * alg.num_ops]
    )
    expanded = alg.replace(ops=ops, kind="expanded")
    res = simulate(expanded, Topology.ring(n))
    reduce_ns = 3 * math.floor(size // n / 50)  # one write + two reads at 50 GB/s (GB = 1e9)
    assert res.total_ns == 2 * (n - 1) * _msg_ns(size // n) + (n - 1) * reduce_ns
    assert res.ops.num_rows == n * (3 * (n - 1) + 2 * (n - 1))
    # without a size a zero-duration COMP is an ordinary one: 1 ns, as ASTRA-sim runs it
    unsized = alg.replace(
        ops=ops.set_column(
            ops.schema.get_field_index("comm_size"),
            "comm_size",
            [[size // n if t != "COMP_NODE" else None for t in ops["type"].to_pylist()]],
        )
    )
    assert simulate(unsized, Topology.ring(n)).total_ns == 2 * (n - 1) * _msg_ns(size // n) + (n - 1) * 1.0


def test_astra_sim_regression_case_gives_117780_ns(rt_inputs: Path) -> None:
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    net = read_network_config(rt_inputs / "network_cfg.yml")
    trace = read_et(rt_inputs / "workload" / "chakra_trace")
    res = simulate(trace, net.topology, config=cfg)
    assert res.total_ns == 117780.0
    assert res.ranks["total_ns"].to_pylist() == [117780.0] * 8
    assert res.ranks["exposed_comm_ns"].to_pylist() == [117780.0] * 8
    # and the derivation in docs/simulator.md: 4 chunks x (15 endpoint delays + 14 messages + 7 reductions)
    msg = (1 << 20) // 4 // 8
    per_chunk = 15 * 10 + 14 * _msg_ns(msg) + 7 * 3 * math.floor(msg / 50)
    assert res.total_ns == 4 * per_chunk
    aware = simulate(trace, net.topology, config=cfg.replace(congestion="aware"))
    assert aware.total_ns == 117780.0


def test_custom_ring_allreduce_example_is_14_messages_and_7_computes(
    rt_inputs: Path, custom_allreduce: Path
) -> None:
    net = read_network_config(rt_inputs / "network_cfg.yml")
    trace = read_et(custom_allreduce / "custom_allreduce")
    res = simulate(trace, net.topology)
    message, compute = _msg_ns(131072), 7 * 1000.0
    assert res.total_ns == 14 * message + 7 * compute == 90174.0


def test_custom_ring_runs_as_the_stored_algorithm_of_a_coll_node(
    rt_inputs: Path, custom_allreduce: Path
) -> None:
    net = read_network_config(rt_inputs / "network_cfg.yml")
    algo = read_et(custom_allreduce / "custom_allreduce")
    work = read_et(rt_inputs / "workload" / "chakra_trace")
    res = simulate(work, net.topology, algorithms={"ALL_REDUCE": algo})
    assert res.total_ns == 14 * _msg_ns((1 << 20) // 8) + 7 * 7000.0
    assert res.collectives["algorithm"].to_pylist() == ["trace:custom_allreduce"]


@pytest.mark.parametrize(("coll", "steps", "reduces"), [("REDUCE_SCATTER", 7, 7), ("ALL_GATHER", 7, 0)])
def test_native_ring_reduce_scatter_and_all_gather_closed_form(coll: str, steps: int, reduces: int) -> None:
    n, size = 8, 1 << 20
    cfg = SimConfig()
    res = simulate(collective_workload(coll, n, size), Topology.ring(n), config=cfg)
    comm_size = size // n if coll == "ALL_GATHER" else size
    chunk = comm_size // cfg.preferred_dataset_splits
    msg = chunk if coll == "ALL_GATHER" else chunk // n
    per_chunk = (steps + 1) * 10 + steps * _msg_ns(msg) + reduces * 3 * math.floor(msg / 50)
    assert res.total_ns == cfg.preferred_dataset_splits * per_chunk


def test_two_active_chunks_overlap_on_a_dimension() -> None:
    n, size = 8, 1 << 20
    one = simulate(collective_workload("allreduce", n, size), Topology.ring(n)).total_ns
    two = simulate(
        collective_workload("allreduce", n, size),
        Topology.ring(n),
        config=SimConfig(active_chunks_per_dimension=2),
    ).total_ns
    assert two < one


def test_communicator_groups_from_pg_name() -> None:
    size = 1 << 20
    ops = ops_table(
        {
            "rank": [0, 1, 2, 3],
            "id": [1, 1, 1, 1],
            "type": ["COMM_COLL_NODE"] * 4,
            "comm_type": ["ALL_REDUCE"] * 4,
            "comm_size": [size] * 4,
            "pg_name": ["a", "a", "b", "b"],
        }
    )
    res = simulate(Trace(ops, name="groups"), Topology.ring(4))
    colls = res.collectives.to_pylist()
    assert sorted((c["pg_name"], c["group_size"]) for c in colls) == [("a", 2), ("b", 2)]
    # a two-rank native ring per chunk: 3 endpoint delays, 2 messages of chunk/2, 1 reduction
    msg = size // 4 // 2
    per_chunk = 3 * 10 + 2 * _msg_ns(msg) + 3 * math.floor(msg / 50)
    assert [c["time_ns"] for c in colls] == [4 * per_chunk, 4 * per_chunk]
    # the same groups given explicitly (ASTRA-sim's comm-group file form)
    res2 = simulate(Trace(ops), Topology.ring(4), groups={"a": [0, 1], "b": [2, 3]})
    assert res2.total_ns == res.total_ns


def test_comm_group_file(tmp_path: Path) -> None:
    p = tmp_path / "groups.json"
    p.write_text('{"1": [0, 1], "2": [2, 3]}')
    assert read_comm_groups(p) == {"1": [0, 1], "2": [2, 3]}
    p.write_text('{"1": "all"}')
    with pytest.raises(ConfigError, match="must be a list of integer ranks"):
        read_comm_groups(p)


def test_unknown_collective_replays_its_duration() -> None:
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [1, 1],
            "type": ["COMM_COLL_NODE"] * 2,
            "comm_type": ["BROADCAST"] * 2,
            "comm_size": [1024, 1024],
            "duration_micros": [3, 3],
        }
    )
    res = simulate(Trace(ops), Topology.ring(2))
    assert res.total_ns == 3000.0
    assert res.collectives["algorithm"].to_pylist() == ["replay"]


def test_congestion_aware_queues_messages_on_a_shared_link() -> None:
    # 0 -> 2 -> 3 and 1 -> 2 -> 3 share link 2 -> 3
    topo = Topology.from_links(4, [(0, 2), (1, 2), (2, 3)], latency_ns=100, bandwidth_gb_per_s=50)
    size = 1 << 16
    ops = ops_table(
        {
            "rank": [0, 1, 3, 3],
            "id": [1, 1, 1, 2],
            "type": ["COMM_SEND_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_RECV_NODE"],
            "comm_dst": [3, 3, None, None],
            "comm_src": [None, None, 0, 1],
            "comm_tag": [0, 0, 0, 0],
            "comm_size": [size] * 4,
        }
    )
    tr = Trace(ops)
    ser = math.floor(size / BYTES_PER_NS_50)
    unaware = simulate(tr, topo)
    assert unaware.total_ns == math.floor(200 + size / BYTES_PER_NS_50)
    aware = simulate(tr, topo, config=SimConfig(congestion="aware"))
    assert sorted([_end(aware, 3, 1), _end(aware, 3, 2)]) == [2 * ser + 200, 3 * ser + 200]
    shared = aware.links.filter(pc.and_(pc.equal(aware.links["src"], 2), pc.equal(aware.links["dst"], 3)))
    row = shared.to_pylist()[0]
    assert (row["messages"], row["bytes"], row["busy_ns"]) == (2, 2 * size, 2 * ser)
    assert row["utilization"] == pytest.approx(2 * ser / aware.total_ns)


def test_sweep_reports_busbw_per_point() -> None:
    t = sweep([1 << 20, 1 << 22], ["native", "ring"], [Topology.ring(8)])
    assert t.num_rows == 4
    rows = t.to_pylist()
    for r in rows:
        assert r["busbw_gb_per_s"] == pytest.approx(r["algbw_gb_per_s"] * 2 * 7 / 8)
        assert r["algbw_gb_per_s"] == pytest.approx(r["size_bytes"] / r["time_ns"])  # GB = 10^9
    native_1m = next(r for r in rows if r["algorithm"] == "native" and r["size_bytes"] == 1 << 20)
    assert native_1m["time_ns"] == 117780.0


def test_sweep_accepts_an_algorithm_factory() -> None:
    calls = []

    def factory(topo: Topology, coll: str) -> Trace:
        calls.append((topo.num_npus, coll))
        return generate("ring", coll="allreduce", ranks=topo.num_npus)

    t = sweep([1 << 20, 1 << 21], {"mine": factory}, [Topology.ring(4)])
    assert calls == [(4, "ALL_REDUCE")]
    assert t["algorithm"].to_pylist() == ["mine", "mine"]


# ---------------------------------------------------------------- error paths


def test_recv_whose_send_never_comes_is_reported_not_hung() -> None:
    ops = ops_table(
        {
            "rank": [0, 1, 1],
            "id": [1, 1, 2],
            "name": ["c", "wait", "after"],
            "type": ["COMP_NODE", "COMM_RECV_NODE", "COMP_NODE"],
            "duration_micros": [3, 0, 1],
            "comm_src": [None, 0, None],
            "comm_tag": [None, 7, None],
            "comm_size": [None, 1024, None],
        }
    )
    tr = Trace(ops, deps=deps_table([1], [1], [2]), name="orphan")
    with pytest.raises(SimulationError, match=r"rank 1 id 1 .* from rank 0 \(tag 7.*no matching send") as ei:
        simulate(tr, Topology.ring(2))
    stuck = {(r["rank"], r["id"]): r["state"] for r in ei.value.stuck.to_pylist()}
    assert stuck == {(1, 1): "posted", (1, 2): "blocked"}
    assert "2 of 3 ops never finished" in str(ei.value)


def test_dependency_cycle_is_reported_with_its_ops() -> None:
    ops = ops_table(
        {"rank": [0, 0, 0], "id": [1, 2, 3], "type": ["COMP_NODE"] * 3, "duration_micros": [1, 1, 1]}
    )
    tr = Trace(ops, deps=deps_table([0, 0, 0], [1, 2, 3], [2, 3, 2]), name="loop")
    with pytest.raises(SimulationError, match=r"dependency cycle on rank 0: id \d -> id \d -> id \d") as ei:
        simulate(tr, Topology.ring(2))
    assert sorted(ei.value.stuck["id"].to_pylist()) == [2, 3]


def test_sizes_must_match_when_asked() -> None:
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [1, 1],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [1, None],
            "comm_src": [None, 0],
            "comm_tag": [0, 0],
            "comm_size": [100, 200],
        }
    )
    assert simulate(Trace(ops), Topology.ring(2)).total_ns == _msg_ns(100)
    with pytest.raises(SimulationError, match="no matching send"):
        simulate(Trace(ops), Topology.ring(2), config=SimConfig(match_on_size=True))


def test_collective_missing_on_a_rank() -> None:
    ops = ops_table(
        {
            "rank": [0, 1, 2],
            "id": [1, 1, 1],
            "type": ["COMM_COLL_NODE", "COMM_COLL_NODE", "COMP_NODE"],
            "comm_type": ["ALL_REDUCE", "ALL_REDUCE", None],
            "comm_size": [64, 64, None],
        }
    )
    with pytest.raises(SimulationError, match=r"no matching COMM_COLL_NODE on rank\(s\) \[2\]"):
        simulate(Trace(ops), Topology.ring(3))


def test_collective_size_mismatch_across_ranks() -> None:
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [1, 1],
            "type": ["COMM_COLL_NODE"] * 2,
            "comm_type": ["ALL_REDUCE"] * 2,
            "comm_size": [64, 128],
        }
    )
    with pytest.raises(SimulationError, match="ALL_REDUCE of 64 bytes on one rank but rank 1"):
        simulate(Trace(ops), Topology.ring(2))


def test_send_without_destination() -> None:
    ops = ops_table({"rank": [0], "id": [9], "type": ["COMM_SEND_NODE"], "comm_size": [8]})
    with pytest.raises(SimulationError, match=r"rank 0 node 9 .* has no comm_dst"):
        simulate(Trace(ops), Topology.ring(2))


def test_more_ranks_than_npus() -> None:
    with pytest.raises(SimulationError, match=r"has ranks 0\.\.5 but topology"):
        simulate(_p2p(8, src=0, dst=5), Topology.ring(4))


def test_algorithm_with_the_wrong_rank_count() -> None:
    with pytest.raises(SimulationError, match="has 4 ranks but the ALL_REDUCE group has 8"):
        simulate(
            collective_workload("allreduce", 8, 1 << 20),
            Topology.ring(8),
            algorithms={"allreduce": generate("ring", coll="allreduce", ranks=4)},
        )


def test_unknown_collective_name_in_algorithms() -> None:
    with pytest.raises(ConfigError, match="unknown collective 'allsum'"):
        simulate(collective_workload("allreduce", 2, 64), Topology.ring(2), algorithms={"allsum": "ring"})


def test_algorithm_without_sizes() -> None:
    alg = generate("ring", coll="allreduce", ranks=2)
    ops = alg.ops.set_column(
        alg.ops.schema.get_field_index("total_chunk_cnt"),
        "total_chunk_cnt",
        pa.nulls(alg.num_ops, pa.int64()),
    )
    with pytest.raises(SimulationError, match=r"neither chunk columns .* nor comm_size"):
        simulate(
            collective_workload("allreduce", 2, 64),
            Topology.ring(2),
            algorithms={"allreduce": alg.replace(ops=ops)},
        )


def test_bad_config_values() -> None:
    with pytest.raises(ConfigError, match="scheduling_policy must be FIFO or LIFO"):
        SimConfig(scheduling_policy="RANDOM")
    with pytest.raises(ConfigError, match="congestion must be"):
        SimConfig(congestion="maybe")
    with pytest.raises(ConfigError, match="max_comm_ops must be >= 1"):
        SimConfig(max_comm_ops=0)


def test_system_config_reader(tmp_path: Path, rt_inputs: Path) -> None:
    cfg = read_system_config(rt_inputs / "system_cfg.json")
    assert (
        cfg.scheduling_policy,
        cfg.endpoint_delay_ns,
        cfg.active_chunks_per_dimension,
        cfg.preferred_dataset_splits,
        cfg.local_mem_bw_gb_per_s,
        cfg.all_reduce_impl,
    ) == ("LIFO", 10.0, 1, 4, 50.0, "native")
    assert cfg.collective_optimization == "localBWAware" and cfg.ignored == ()  # boost-mode 0: off
    bad = tmp_path / "s.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="line 1: not valid JSON"):
        read_system_config(bad)
    bad.write_text('{"scheduling-policy": "EXPLICIT"}')
    with pytest.raises(ConfigError, match=r"EXPLICIT.*not supported"):
        read_system_config(bad)
    bad.write_text('{"all-reduce-implementation": ["ring", "direct"]}')  # per dimension: accepted
    assert read_system_config(bad).native_impls == {"ALL_REDUCE": ("ring", "direct")}
    bad.write_text('{"all-reduce-implementation": ["magic"]}')
    with pytest.raises(ConfigError, match="unknown collective implementation 'magic'"):
        read_system_config(bad)
    with pytest.raises(ConfigError, match="no such system config file"):
        read_system_config(tmp_path / "absent.json")


def test_result_summary_is_json_able() -> None:
    import json

    res = simulate(_p2p(1024), Topology.ring(2))
    s = json.loads(json.dumps(res.summary()))
    assert s["total_ns"] == _msg_ns(1024) and s["ops"] == 2
    assert res.events >= 1 and res.events_per_s > 0
    assert np.isfinite(res.wall_s)
