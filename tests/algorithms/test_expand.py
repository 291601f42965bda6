"""Expansion of collective nodes: hand-checked small cases, closed forms, ASTRA-sim's regression case."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import generate
from etstore.algorithms.expand import expand, parse_by_type, parse_generator
from etstore.dag import cycle_members, generations, trace_edges
from etstore.errors import EtstoreError, ExpansionError, OptionError, QueryError
from etstore.formats import message_sizes
from etstore.formats.et import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, read_network_config, read_system_config, simulate
from etstore.store import EmbeddedStore
from etstore.topology import Topology
from etstore.workloads import transformer

BYTES_PER_NS_50 = 50 * 2**30 / 1e9  # 50 GB/s with GB = 2^30


def _msg_ns(size: float, lat: float = 500.0) -> float:
    """One hop of the congestion-unaware model on the regression network, truncated like ASTRA-sim."""
    return float(math.floor(lat + size / BYTES_PER_NS_50))


def _coll_workload(n: int, size: int, coll: str = "ALL_REDUCE", *, pg: str | None = None) -> Trace:
    """A → collective → B on every rank (ids 10, 20, 30)."""
    ops = ops_table(
        {
            "rank": np.repeat(np.arange(n), 3),
            "id": np.tile([10, 20, 30], n),
            "name": ["a", "coll", "b"] * n,
            "type": ["COMP_NODE", "COMM_COLL_NODE", "COMP_NODE"] * n,
            "duration_micros": np.tile([1, 0, 1], n).astype(np.uint64),
            "comm_type": [None, coll, None] * n,
            "comm_size": [None, size, None] * n,
            "pg_name": [None, pg, None] * n,
        }
    )
    deps = deps_table(np.repeat(np.arange(n), 2), np.tile([10, 20], n), np.tile([20, 30], n))
    return Trace(ops, deps, name=f"w{n}")


def _rows(t: pa.Table) -> list[dict]:
    return t.to_pylist()


def _sends(trace: Trace) -> pa.Table:
    return trace.ops.filter(pc.equal(trace.ops["type"], "COMM_SEND_NODE"))


# ---------------------------------------------------------------- hand-checked


def test_a_thread_stays_a_chain_through_an_expanded_collective() -> None:
    """a → coll → b ordered by its thread (``thread`` edges): the thread enters the part at its
    first entry and leaves from its last exit; every other entry and exit keeps the order as
    ``ctrl``, so the lanes of the expanded recording are chains and nothing starts earlier."""
    from etstore.analysis.lanes import lanes_of

    w = _coll_workload(2, 1000)
    w = w.replace(
        deps=deps_table(np.repeat(np.arange(2), 2), np.tile([10, 20], 2), np.tile([20, 30], 2), "thread"),
        params={"execution": "recorded"},
    )
    t = expand(w, "ring:2").trace  # two channels: two entries and two exits per rank
    d = t.deps.filter(pc.equal(t.deps["rank"], 0))
    edges = sorted(zip(d["src"].to_pylist(), d["dst"].to_pylist(), d["kind"].to_pylist(), strict=True))
    into = [(s, x, k) for s, x, k in edges if s == 10]
    out = [(s, x, k) for s, x, k in edges if x == 30]
    assert len(into) == 2 and len(out) == 2
    assert sorted(k for *_, k in into) == ["ctrl", "thread"] == sorted(k for *_, k in out)
    (first,) = [x for _, x, k in into if k == "thread"]
    (last,) = [s for s, _, k in out if k == "thread"]
    assert first == min(x for _, x, _ in into) and last == max(s for s, _, _ in out)
    lanes = lanes_of(t)  # no fork
    rows = {i: k for k, i in enumerate(t.ops["id"].to_pylist()[: t.ops.num_rows // 2])}
    assert lanes.next[rows[10]] == rows[first] and lanes.prev[rows[30]] == rows[last]


def test_two_rank_ring_is_wired_between_the_collectives_neighbours() -> None:
    w = _coll_workload(2, 1000)
    x = expand(w, "ring")
    t = x.trace
    assert t.kind == "expanded" and t.params["workload"] == "w2"
    # ring all-reduce on 2 ranks, per rank: send, recv, reduce, send, recv (s, rrcs, r)
    r0 = t.ops.filter(pc.equal(t.ops["rank"], 0))
    assert r0["id"].to_pylist() == [10, 31, 32, 33, 34, 35, 30]  # new ids after the rank's largest (30)
    assert r0["type"].to_pylist() == [
        "COMP_NODE",
        "COMM_SEND_NODE",
        "COMM_RECV_NODE",
        "COMP_NODE",
        "COMM_SEND_NODE",
        "COMM_RECV_NODE",
        "COMP_NODE",
    ]
    # the reduce carries the 500 bytes it reduces, so the simulator can charge it (one cost model)
    assert r0["comm_size"].to_pylist()[1:6] == [500, 500, 500, 500, 500]
    assert t.params["collective_blocks"] == {
        "rank": [0, 1],
        "parent_id": [20, 20],
        "first_id": [31, 31],
        "ops": [5, 5],
        "group_pos": [0, 1],  # each rank's place in its group
        "group_size": [2, 2],
        # what each node was and when it ran (a recording's replay fits its network to them)
        "pg_name": [None, None],
        "comm_type": ["ALL_REDUCE", "ALL_REDUCE"],
        "comm_size": [1000, 1000],
        "start_time_micros": [0, 0],
        "duration_micros": [0, 0],
    }
    assert r0["comm_dst"].to_pylist()[1:6] == [1, None, None, 1, None]
    assert r0["comm_src"].to_pylist()[1:6] == [None, 1, None, None, 1]
    d0 = t.deps.filter(pc.equal(t.deps["rank"], 0))
    edges = sorted(zip(d0["src"].to_pylist(), d0["dst"].to_pylist(), strict=True))
    # a → entry (the first send), the chain of the algorithm, exit (the last recv) → b
    assert edges == [(10, 31), (31, 32), (32, 33), (33, 34), (34, 35), (35, 30)]
    assert _rows(x.lineage.filter(pc.equal(x.lineage["rank"], 1))) == [
        {"rank": 1, "id": i, "parent_id": 20} for i in range(31, 36)
    ]
    assert x.collectives["bytes_sent"].to_pylist() == [2000]  # 2 ranks × 2 sends × 500 B


def test_collective_after_collective_is_the_cross_product_of_exits_and_entries() -> None:
    # two channels: a rank's part has 2 entry and 2 exit ops
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "type": ["COMM_COLL_NODE"] * 4,
            "comm_type": ["ALL_REDUCE"] * 4,
            "comm_size": [4096] * 4,
        }
    )
    w = Trace(ops, deps_table([0, 1], [1, 1], [2, 2], kind="ctrl"), name="chain")
    x = expand(w, "ring:2")
    t = x.trace
    lin = x.lineage.to_pandas()
    first = set(lin[(lin["rank"] == 0) & (lin["parent_id"] == 1)]["id"])
    second = set(lin[(lin["rank"] == 0) & (lin["parent_id"] == 2)]["id"])
    d = t.deps.to_pandas()
    d0 = d[d["rank"] == 0]
    cross = d0[d0["src"].isin(first) & d0["dst"].isin(second)]
    assert len(cross) == 4 and set(cross["kind"]) == {"ctrl"}  # 2 exits × 2 entries, kind kept
    assert sorted(cross.groupby("dst")["pos"].apply(sorted).tolist()) == [[0, 1], [0, 1]]
    assert len(cycle_members(t)) == 0


# ---------------------------------------------------------------- ASTRA-sim's regression case


def _rt(rt_template: Path) -> tuple[Trace, SimConfig, Topology]:
    inputs = rt_template.parent
    cfg = read_system_config(inputs / "system_cfg.json")
    net = read_network_config(inputs / "network_cfg.yml")
    return read_et(rt_template / "chakra_trace"), cfg, net.topology


def _with_reduce_duration(alg: Trace, micros: int) -> Trace:
    ops = alg.ops
    comp = pc.equal(ops["type"], "COMP_NODE").to_numpy(zero_copy_only=False)
    dur = pa.array(np.where(comp, micros, 0).astype(np.uint64))
    return alg.replace(
        ops=ops.set_column(ops.schema.get_field_index("duration_micros"), "duration_micros", dur)
    )


def test_rt_template_expanded_with_a_ring_simulates_like_the_same_ring_run_natively(
    rt_template: Path,
) -> None:
    work, cfg, topo = _rt(rt_template)
    ring = _with_reduce_duration(generate("ring", coll="allreduce", ranks=8), 3)
    native = simulate(work, topo, config=cfg, algorithms={"ALL_REDUCE": ring})
    x = expand(work, ring)
    expanded = simulate(x.trace, topo, config=cfg)
    # 14 ring steps of 1 MiB / 8, 7 of them reduce for 3 µs: the same number both ways
    assert native.total_ns == expanded.total_ns == 14 * _msg_ns((1 << 20) // 8) + 7 * 3000.0 == 62174.0
    assert expanded.ops.num_rows == 8 * 35  # 14 sends, 14 receives, 7 reduces per rank


def test_rt_template_reduce_costs_the_same_natively_and_expanded(rt_template: Path) -> None:
    # A zero-duration reduce of b bytes costs a local reduction (3 × b / 50 GB/s, GB = 1e9) on
    # both paths: inside the collective node and as the expanded trace's COMP node, which
    # carries its b in comm_size. (Before: 96,215 ns natively, 41,181 ns expanded.)
    work, cfg, topo = _rt(rt_template)
    ring = generate("ring", coll="allreduce", ranks=8)
    native = simulate(work, topo, config=cfg, algorithms={"ALL_REDUCE": "ring"})
    expanded = simulate(expand(work, ring).trace, topo, config=cfg)
    msg = (1 << 20) // 8
    assert native.total_ns == 14 * _msg_ns(msg) + 7 * 3 * math.floor(msg / 50) == 96215.0
    assert expanded.total_ns == native.total_ns


def test_rt_template_expansion_moves_what_the_ring_moves(rt_template: Path) -> None:
    work, _, _ = _rt(rt_template)
    x = expand(work, "ring")
    sends = _sends(x.trace)
    per_rank = pc.sum(sends["comm_size"]).as_py() / 8
    assert per_rank == 2 * 7 / 8 * (1 << 20)  # 2(N-1)/N · S per rank
    assert len(cycle_members(x.trace)) == 0
    assert (generations(x.trace.num_ops, *trace_edges(x.trace)) >= 0).all()


# ---------------------------------------------------------------- bytes moved: closed forms


@pytest.mark.parametrize(
    ("coll", "gen", "n", "size", "total"),
    [
        # total bytes sent over all ranks, for a Chakra comm_size (per-rank input for ALL_GATHER)
        ("ALL_REDUCE", "ring", 5, 1_000_003, lambda n, s: 2 * (n - 1) * s),
        ("ALL_REDUCE", "ring:3", 4, 999_999, lambda n, s: 2 * (n - 1) * s),
        ("ALL_REDUCE", "direct", 6, 1 << 20, lambda n, s: 2 * (n - 1) * s),
        ("ALL_REDUCE", "halving-doubling", 8, 1 << 20, lambda n, s: 2 * (n - 1) * s),
        ("ALL_GATHER", "ring", 6, 65_537, lambda n, s: n * (n - 1) * s),
        ("REDUCE_SCATTER", "ring", 4, 1_000_001, lambda n, s: (n - 1) * s),
        ("ALL_TO_ALL", "direct", 4, 1 << 16, lambda n, s: (n - 1) * s),
    ],
)
def test_bytes_moved_match_the_closed_form_and_message_sizes(coll, gen, n, size, total) -> None:  # type: ignore[no-untyped-def]
    w = _coll_workload(n, size, coll)
    x = expand(w, gen)
    sends = _sends(x.trace)
    assert pc.sum(sends["comm_size"]).as_py() == total(n, size)
    # and exactly what the algorithm's own sizing gives (et_writer.message_sizes, same buffer)
    name, chunks = parse_generator(gen)
    short = {"ALL_REDUCE": "allreduce", "ALL_GATHER": "allgather"}.get(coll, coll.lower().replace("_", ""))
    alg = generate(name, coll=short, ranks=n, chunks=chunks)
    buf = size * n if coll == "ALL_GATHER" else size
    sizes = message_sizes(alg, buf, scale_by_ngpus=False)
    is_send = pc.equal(alg.ops["type"], "COMM_SEND_NODE").to_numpy(zero_copy_only=False)
    assert int(sizes[is_send].sum()) == x.collectives["bytes_sent"][0].as_py()
    # receives carry the same bytes as the sends they match
    recvs = x.trace.ops.filter(pc.equal(x.trace.ops["type"], "COMM_RECV_NODE"))
    key = lambda t, a, b: Counter(  # noqa: E731
        zip(
            t[a].to_pylist(),
            t[b].to_pylist(),
            t["comm_tag"].to_pylist(),
            t["comm_size"].to_pylist(),
            strict=True,
        )
    )
    assert key(sends, "rank", "comm_dst") == key(recvs, "comm_src", "rank")


def test_bytes_per_rank_pair_are_the_algorithms_mapped_through_the_group() -> None:
    work = transformer(ranks=8, tp=2, layers=1)  # dp1 = ranks 1, 3, 5, 7
    x = expand(work, "ring", where="pg_name = 'dp1'")
    alg = generate("ring", coll="allreduce", ranks=4)
    size = x.collectives["comm_size"][0].as_py()
    sizes = message_sizes(alg, size, scale_by_ngpus=False)
    a = alg.ops.append_column("bytes", pa.array(sizes))
    a = a.filter(pc.equal(a["type"], "COMM_SEND_NODE"))
    members = [1, 3, 5, 7]
    want: Counter = Counter()
    for r, d, b in zip(a["rank"].to_pylist(), a["comm_dst"].to_pylist(), a["bytes"].to_pylist(), strict=True):
        want[(members[r], members[d])] += b
    s = _sends(x.trace).filter(pc.is_valid(_sends(x.trace)["pg_name"]))
    s = s.filter(pc.equal(s["pg_name"], "dp1"))
    got: Counter = Counter()
    for r, d, b in zip(
        s["rank"].to_pylist(), s["comm_dst"].to_pylist(), s["comm_size"].to_pylist(), strict=True
    ):
        got[(r, d)] += b
    assert got == want and len(got) == 4  # the ring 1→3→5→7→1


# ---------------------------------------------------------------- a DP × TP workload


def test_transformer_expansion_ids_tags_groups_and_lineage() -> None:
    work = transformer(ranks=8, tp=2, layers=3)
    x = expand(work, {"allreduce": "ring", "allgather": "direct", "reducescatter": "ring:2"})
    t = x.trace
    ops = t.ops.to_pandas()
    wops = work.ops.to_pandas()
    assert (ops["type"] == "COMM_COLL_NODE").sum() == 0 and x.skipped == 0
    assert not ops.duplicated(["rank", "id"]).any()
    new = ops.merge(x.lineage.to_pandas(), on=["rank", "id"])
    assert len(new) == x.lineage.num_rows == t.num_ops - (wops["type"] != "COMM_COLL_NODE").sum()
    assert (new["id"] > new["rank"].map(wops.groupby("rank")["id"].max())).all()
    # every parent is one of the rank's collective nodes; its group holds every peer
    parent = new.merge(
        wops[["rank", "id", "type", "pg_name"]], left_on=["rank", "parent_id"], right_on=["rank", "id"]
    )
    assert set(parent["type_y"]) == {"COMM_COLL_NODE"}
    groups = work.params["comm_groups"]
    comm = parent[parent["type_x"].isin(["COMM_SEND_NODE", "COMM_RECV_NODE"])]
    peer = comm["comm_dst"].fillna(comm["comm_src"]).astype(int)
    assert all(
        p in groups[g] and r in groups[g]
        for r, p, g in zip(comm["rank"], peer, comm["pg_name_y"], strict=True)
    )
    # tags: above the workload's own (1), every message inside its instance's range
    assert t.params["tag_base"] == 2 and comm["comm_tag"].min() >= 2
    assert x.collectives.num_rows == 3 * (4 + 4 + 2)  # per layer: 4 TP all-gathers, 4 TP RS, 2 DP AR
    assert t.params["algorithms"] == {
        "ALL_GATHER": "direct-allgather-2r-1c",
        "ALL_REDUCE": "ring-allreduce-4r-1c",
        "REDUCE_SCATTER": "ring-reducescatter-2r-2c",
    }
    assert len(cycle_members(t)) == 0
    # it runs: every send finds its receive
    res = simulate(t, Topology.ring(8), groups=groups)
    assert res.total_ns > 0


def test_instances_get_disjoint_tag_ranges() -> None:
    work = transformer(ranks=4, tp=1, layers=3)  # 3 all-reduces on dp0 = all 4 ranks
    x = expand(work, "ring:2")
    first = x.collectives["first_tag"].to_pylist()
    span = x.trace.params["tag_span"]
    assert span == 2 and first == [x.trace.params["tag_base"] + i * span for i in range(3)]
    lin = x.lineage.to_pandas().merge(x.trace.ops.to_pandas()[["rank", "id", "comm_tag"]], on=["rank", "id"])
    tags = lin.dropna().groupby("parent_id")["comm_tag"].apply(lambda s: set(s.astype(int)))
    assert [sorted(v) for v in tags] == [[f, f + 1] for f in first]


# ---------------------------------------------------------------- selection


def test_where_selects_instances_and_leaves_the_rest() -> None:
    work = transformer(ranks=8, tp=2, layers=2)
    x = expand(work, "ring", where="comm_type = 'ALL_REDUCE' AND pg_name = 'dp0'")
    assert set(x.collectives["pg_name"].to_pylist()) == {"dp0"} and x.collectives.num_rows == 2
    colls = x.trace.ops.filter(pc.equal(x.trace.ops["type"], "COMM_COLL_NODE"))
    assert colls.num_rows == x.skipped == 8 * 2 * 3 - 4 * 2  # every node but dp0's 2 × 4 ranks
    assert "dp0" not in pc.unique(colls["pg_name"]).to_pylist()


def test_by_type_uses_one_algorithm_per_type_and_skips_the_others() -> None:
    work = transformer(ranks=8, tp=2, layers=2)
    x = expand(work, parse_by_type("allreduce=ring,all-gather=direct"))
    assert sorted(set(x.collectives["comm_type"].to_pylist())) == ["ALL_GATHER", "ALL_REDUCE"]
    left = x.trace.ops.filter(pc.equal(x.trace.ops["type"], "COMM_COLL_NODE"))
    assert set(left["comm_type"].to_pylist()) == {"REDUCE_SCATTER"} and left.num_rows == x.skipped == 16


def test_a_single_algorithm_trace_covers_its_own_collective_only() -> None:
    work = transformer(ranks=8, tp=2, layers=1)
    x = expand(work, generate("ring", coll="allgather", ranks=2))
    assert set(x.collectives["comm_type"].to_pylist()) == {"ALL_GATHER"}


# ---------------------------------------------------------------- errors


def test_rank_count_mismatch_names_the_collective_group_and_algorithm() -> None:
    work = transformer(ranks=8, tp=2, layers=1)
    with pytest.raises(
        EtstoreError,
        match=r"collective #0 \(ALL_REDUCE\) of group 'dp0' has 4 member ranks but algorithm "
        r"'ring-allreduce-8r-1c' has 8 ranks",
    ):
        expand(work, {"allreduce": generate("ring", coll="allreduce", ranks=8)})


def test_bad_selections_and_inputs_are_clear_errors() -> None:
    work = transformer(ranks=8, tp=2, layers=1)
    with pytest.raises(
        EtstoreError, match=r"selects collective #0 \(ALL_REDUCE\) of group 'dp0' on ranks \[0\]"
    ):
        expand(work, "ring", where="rank = 0 AND comm_type = 'ALL_REDUCE'")
    with pytest.raises(QueryError, match="where predicate 'comm_size >'"):
        expand(work, "ring", where="comm_size >")
    with pytest.raises(EtstoreError, match="selects no collective"):
        expand(work, "ring", where="comm_size < 0")
    with pytest.raises(EtstoreError, match="no selected collective has an algorithm"):
        expand(work, {"alltoall": "direct"})
    with pytest.raises(EtstoreError, match="neither a stored algorithm nor a generator"):
        expand(work, "spiral")
    with pytest.raises(EtstoreError, match="unknown collective 'allsum'"):
        parse_by_type("allsum=ring")
    with pytest.raises(EtstoreError, match="has no COMM_COLL_NODE to expand"):
        expand(Trace(ops_table({"rank": [0], "id": [1], "type": ["COMP_NODE"]})), "ring")
    with pytest.raises(EtstoreError, match="moves 3 bytes, fewer than the 8 chunks"):
        expand(_coll_workload(8, 3), "ring")
    with pytest.raises(EtstoreError, match=r"cannot generate 'halving-doubling'.* on 6 ranks"):
        expand(_coll_workload(6, 1 << 20), "halving-doubling")


def test_error_classes_say_whether_the_request_or_the_workload_is_wrong() -> None:
    work = transformer(ranks=8, tp=2, layers=1)
    with pytest.raises(OptionError, match=r"algorithm-per-collective item 'allreduce': expected"):
        parse_by_type("allreduce")
    with pytest.raises(OptionError, match=r"algorithm-per-collective list ' , ': expected"):
        parse_by_type(" , ")
    with pytest.raises(OptionError, match="unknown collective 'allsum'"):
        parse_by_type("allsum=ring")
    with pytest.raises(OptionError, match=r"'ring:0': chunks after ':' must be a positive integer"):
        parse_generator("ring:0")
    with pytest.raises(OptionError, match="reduce_duration_micros must not be negative, got -1"):
        expand(work, "ring", reduce_duration_micros=-1)
    with pytest.raises(OptionError, match=r"the where predicate selects collective #0 \(ALL_REDUCE\)"):
        expand(work, "ring", where="rank = 0 AND comm_type = 'ALL_REDUCE'")
    with pytest.raises(ExpansionError, match="nothing to expand: the where predicate selects no collective"):
        expand(work, "ring", where="comm_size < 0")
    with pytest.raises(ExpansionError, match="has 4 member ranks but algorithm"):
        expand(work, {"allreduce": generate("ring", coll="allreduce", ranks=8)})
    with pytest.raises(ExpansionError, match="moves 3 bytes"):
        expand(_coll_workload(8, 3), "ring")


def test_an_algorithm_expansion_cannot_place_is_refused() -> None:
    ring = generate("ring", coll="allreduce", ranks=4)
    coll = ops_table({"rank": [0, 1, 2, 3], "id": [99] * 4, "type": ["COMM_COLL_NODE"] * 4})
    nested = ring.replace(ops=pa.concat_tables([ring.ops, coll.cast(ring.ops.schema)]))
    with pytest.raises(
        ExpansionError, match=r"rank 0 node 99 is a COMM_COLL_NODE; an algorithm expands into"
    ):
        expand(_coll_workload(4, 1 << 20), nested)


def test_a_collective_that_disagrees_across_ranks_is_refused() -> None:
    w = _coll_workload(4, 1024)
    sizes = w.ops["comm_size"].to_pylist()
    sizes[4] = 2048  # rank 1's collective
    ops = w.ops.set_column(
        w.ops.schema.get_field_index("comm_size"), "comm_size", pa.array(sizes, pa.int64())
    )
    with pytest.raises(
        EtstoreError, match="of 1024 bytes on rank 0 but rank 1 node 20 is ALL_REDUCE of 2048"
    ):
        expand(w.replace(ops=ops), "ring")
    keep = pc.invert(pc.and_(pc.equal(w.ops["rank"], 2), pc.equal(w.ops["id"], 20)))
    with pytest.raises(EtstoreError, match=r"has no COMM_COLL_NODE on member rank\(s\) \[2\]"):
        expand(w.replace(ops=w.ops.filter(keep), deps=w.deps.slice(0, 0)), "ring")


# ---------------------------------------------------------------- stored, with lineage


def test_stored_expansion_has_kind_parent_and_queryable_lineage(store: EmbeddedStore) -> None:
    work = transformer(ranks=4, tp=2, layers=1)
    store.ingest(work, name="tx")
    x = expand(store.load("tx"), "ring", where="comm_type = 'ALL_REDUCE'")
    info = store.ingest(x.trace, name="tx-ring", parent="tx", lineage=x.lineage).trace
    assert (info.kind, info.parent) == ("expanded", "tx")
    assert info.params["algorithms"] == {"ALL_REDUCE": "ring-allreduce-2r-1c"}
    got = store.cypher(
        "MATCH (w:Trace {name: $w}), (e:Trace {name: $e}), (c:Op)-[:BECOMES]->(x:Op) "
        "WHERE c.trace_id = w.trace_id AND x.trace_id = e.trace_id "
        "RETURN c.rank AS rank, c.name AS coll, x.type AS type, count(*) AS n ORDER BY rank, coll, type",
        {"w": "tx", "e": "tx-ring"},
    ).to_arrow()
    # one data-parallel all-reduce per rank (2-rank ring: 2 sends, 2 receives, 1 reduce)
    assert _rows(got) == [
        {"rank": r, "coll": "grad_allreduce_L0", "type": ty, "n": n}
        for r in range(4)
        for ty, n in (("COMM_RECV_NODE", 2), ("COMM_SEND_NODE", 2), ("COMP_NODE", 1))
    ]
    n = store.sql("SELECT count(*) AS n FROM lineage WHERE trace = 'tx-ring'").to_arrow()["n"][0].as_py()
    assert n == x.lineage.num_rows == 20
