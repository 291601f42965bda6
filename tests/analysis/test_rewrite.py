"""Rewrites on the hand-built traces of test_overlap: exact edges, dependency check, simulated time.

Expected makespans on ring:2 (timelines in tests/app/test_overlap.py):
* overlap: indep runs 10000–30000 under the all-reduce; apply 65100–70100, stats
  –100100, send lands 120131, final –121131: 141131 − 20000 = 121131 ns.
* reorder: the send issues when the all-reduce ends (65100) and lands at 85131;
  final still waits for stats (ends 120100): 121100 ns.
* chunk-split of the expanded trace: pieces 22265–25265 and 32530–35530: 35530 ns
  (was 38530).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.analysis._chunks import chunk_consumers
from etstore.analysis._rankgraph import rank_graphs
from etstore.analysis.rewrite import check_rewrite, rewrite
from etstore.analysis.split import SplitCost
from etstore.app.overlap import expansions_of, find_opportunities
from etstore.app.rewrite import rewrite_stored
from etstore.dag import cycle_members
from etstore.errors import EtstoreError, RewriteError, UnknownTraceError
from etstore.model import Trace, deps_table
from etstore.sim import simulate
from etstore.store import EmbeddedStore
from etstore.testing import hand_expanded, hand_workload
from etstore.testing import ingest_hand_expanded as stored_expanded
from etstore.topology import parse_topology
from etstore.workloads import transformer

RING2 = parse_topology("ring:2")
FREE = SplitCost(overhead_us=0)  # the hand-computed cases split for free: a piece costs its share


def test_split_cost_charges_launches_and_interference_and_keeps_reductions_whole() -> None:
    t, lineage = hand_expanded()
    exp = pa.table({"rank": lineage["rank"], "id": lineage["id"], "coll_id": lineage["parent_id"]})
    exp = exp.filter(pc.equal(exp["coll_id"], 1))
    # apply (6 µs) in two pieces: free 3 + 3; with a 4 µs launch and compute 1.5x slower beside
    # the communication, 5 (3 x 1.5, rounded up) + 7 (3 + a launch): 12 µs of work for 6
    free = rewrite(t, "chunk-split", expansions=exp, split=FREE)
    paid = rewrite(t, "chunk-split", expansions=exp, split=SplitCost(overhead_us=4, interference=1.5))
    assert [o["pieces_us"] for o in free.params["split_ops"]] == [[3, 3], [3, 3]]
    assert [o["pieces_us"] for o in paid.params["split_ops"]] == [[5, 7], [5, 7]]
    assert paid.params["split_ops"][0] == {
        "rank": 0,
        "id": 3,
        "name": "apply",
        "before_us": 6,
        "pieces_us": [5, 7],
    }
    assert paid.params["split"] == {"overhead_us": 4, "interference": 1.5}
    assert simulate(free, RING2).total_ns <= simulate(t, RING2).total_ns < simulate(paid, RING2).total_ns
    # a softmax needs all of its row: it is not split
    names = [
        "softmax" if (r, i) == (0, 3) else n
        for r, i, n in zip(*(t.ops[c].to_pylist() for c in ("rank", "id", "name")), strict=True)
    ]
    soft = t.replace(ops=t.ops.set_column(t.ops.schema.get_field_index("name"), "name", pa.array(names)))
    out = rewrite(soft, "chunk-split", expansions=exp, split=FREE)
    assert [(o["rank"], o["name"]) for o in out.params["split_ops"]] == [(1, "apply")]
    with pytest.raises(EtstoreError, match=r"interference factor 0\.5: expected ≥ 1"):
        SplitCost(interference=0.5)


def edges(trace: Trace, rank: int = 0) -> set[tuple[int, int, str]]:
    d = trace.deps.filter(pc.equal(trace.deps["rank"], rank))
    return set(zip(d["src"].to_pylist(), d["dst"].to_pylist(), d["kind"].to_pylist(), strict=True))


def test_overlap_bypasses_the_collective() -> None:
    t = hand_workload()
    out = rewrite(t, "overlap")
    assert out.kind == "rewritten" and out.name == "hand-overlap"
    assert out.params["applied"] == "overlap" and out.params["parent"] == "hand"
    # only the issue-order edge all-reduce → indep is gone (fwd → indep already stood)
    assert edges(t) - edges(out) == {(1, 2, "ctrl")}
    assert edges(out) - edges(t) == set()
    assert simulate(out, RING2).total_ns == 121131.0 < simulate(t, RING2).total_ns


def test_reorder_moves_the_send_ahead_of_independent_compute() -> None:
    t = hand_workload()
    out = rewrite(t, "reorder")
    assert edges(t) - edges(out) == {(4, 5, "ctrl")}
    # the send now follows the all-reduce (comm order kept); final still waits for stats,
    # apply and indep, which it used to reach through the send
    assert edges(out) - edges(t) == {(1, 5, "ctrl"), (3, 7, "ctrl"), (2, 7, "ctrl")}
    # issue (file) order: the send sits right after the all-reduce, before indep
    r0 = out.ops.filter(pc.equal(out.ops["rank"], 0))
    assert r0["id"].to_pylist() == [0, 1, 5, 2, 3, 4, 6, 7]
    assert simulate(out, RING2).total_ns == 121100.0


def test_rewrites_pass_the_dependency_check_and_are_acyclic() -> None:
    t = hand_workload()
    for kind in ("overlap", "reorder"):
        out = rewrite(t, kind)
        check_rewrite(t, out)
        assert len(cycle_members(out)) == 0
        data = t.deps.filter(pc.equal(t.deps["kind"], "data"))
        kept = set(
            zip(
                out.deps["rank"].to_pylist(),
                out.deps["src"].to_pylist(),
                out.deps["dst"].to_pylist(),
                strict=True,
            )
        )
        assert all(
            e in kept
            for e in zip(
                data["rank"].to_pylist(), data["src"].to_pylist(), data["dst"].to_pylist(), strict=True
            )
        )


def test_check_catches_a_lost_data_dependency_and_a_cycle() -> None:
    t = hand_workload()
    keep = pc.invert(pc.and_(pc.equal(t.deps["src"], 0), pc.equal(t.deps["dst"], 6)))
    with pytest.raises(RewriteError, match="rank 0: op 6 no longer waits for op 0"):
        check_rewrite(t, t.replace(deps=t.deps.filter(keep), name="broken"))
    back = deps_table(np.asarray([0]), [7], [0], "ctrl")
    with pytest.raises(RewriteError, match="'cyclic' is cyclic: rank 0: dependency cycle"):
        check_rewrite(t, t.replace(deps=pa.concat_tables([t.deps, back]), name="cyclic"))


def test_chunk_split_pipelines_the_consumer(store: EmbeddedStore) -> None:
    name = stored_expanded(store)
    original = store.load(name)
    report = rewrite_stored(store, name, "chunk-split", topo="ring:2", split=FREE)
    out = store.load(report.trace.name)
    assert report.trace.parent == name and out.params["changes"] == 2
    r0 = out.ops.filter(pc.equal(out.ops["rank"], 0))
    assert r0["id"].to_pylist() == [0, 10, 11, 12, 13, 14, 15, 3]
    assert r0["name"].to_pylist()[-2:] == ["apply.chunk0", "apply.chunk1"]
    assert r0["duration_micros"].to_pylist()[-2:] == [3, 3]
    # piece 15 waits for the writers of slot 0 (rank 0's own half); piece 3 for ag_recv and
    # everything apply waited for before
    assert edges(out) - edges(original) == {(11, 15, "data"), (12, 15, "data"), (15, 3, "ctrl")}
    check_rewrite(original, out)
    assert simulate(original, RING2).total_ns == 38530.0
    assert simulate(out, RING2).total_ns == 35530.0
    # lineage: both pieces BECOME from apply
    got = store.cypher(
        "MATCH (t:Trace {name: $t}), (a:Op)-[:BECOMES]->(b:Op) "
        "WHERE b.trace_id = t.trace_id AND b.rank = 0 AND a.id = 3 "
        "RETURN b.id ORDER BY b.id",
        {"t": out.name},
    ).to_arrow()
    assert got.column(0).to_pylist() == [3, 15]


def test_chunk_split_without_arrival_order_uses_slot_order() -> None:
    t, lineage = hand_expanded()
    exp = pa.table({"rank": lineage["rank"], "id": lineage["id"], "coll_id": lineage["parent_id"]})
    exp = exp.filter(pc.equal(exp["coll_id"], 1))
    out = rewrite(t, "chunk-split", expansions=exp, split=FREE)
    # rank 1: slot order puts the peer's half (slot 0, last to arrive) first: no gain, no loss
    assert simulate(out, RING2).total_ns <= simulate(t, RING2).total_ns
    check_rewrite(t, out)


def test_promised_gains_hold_on_a_real_workload(store: EmbeddedStore) -> None:
    # the synthetic transformer, with an issue-order chain added (each op waits for the one
    # before it in file order, as a single stream issues them)
    t = transformer(ranks=4, layers=2, tp=2, hidden=1024, seq_tokens=512)
    rows = t.rank_slices()
    r, s, d = [], [], []
    ids = t.ops["id"].to_numpy()
    for rank, (a, b) in rows.items():
        r += [rank] * (b - a - 1)
        s += ids[a : b - 1].tolist()
        d += ids[a + 1 : b].tolist()
    chain = deps_table(np.asarray(r), s, d, "ctrl")
    t = t.replace(deps=pa.concat_tables([t.deps, chain]), name="chained")
    store.ingest(t, name="chained")
    topo = parse_topology("ring:4")
    base = simulate(t, topo).total_ns
    found = find_opportunities(store, "chained", topo=topo, measure=False)
    # on every rank, layer 1's gradient all-reduce now holds back layer 0's backward compute
    # (layer 0's is followed only by the optimizer step, which needs its data)
    got = found.filter(pc.equal(found["kind"], "overlap"))
    assert got["rank"].to_pylist() == [0, 1, 2, 3]
    names = dict(
        zip(t.ops["id"].to_pylist()[: rows[0][1]], t.ops["name"].to_pylist()[: rows[0][1]], strict=True)
    )
    assert {names[i] for i in got["op_id"].to_pylist()} == {"grad_allreduce_L1"}
    assert {names[i] for i in got["other_id"].to_pylist()} == {"bwd_mlp_L0"}
    for kind in ("overlap", "reorder"):
        out = rewrite(t, kind)
        check_rewrite(t, out)
        assert simulate(out, topo).total_ns <= base
    # measured: the gains of a kind add up to what applying those opportunities realises
    measured = find_opportunities(store, "chained", topo=topo)
    assert measured.num_rows
    for kind in set(measured["kind"].to_pylist()):
        mine = measured.filter(pc.equal(measured["kind"], kind)).to_pylist()
        only: dict[int, set[int]] = {}
        for r in mine:
            for a in json.loads(r["detail"])["applies"]:
                only.setdefault(a["rank"], set()).add(a["op_id"])
        out = rewrite(t, kind, only=only)
        assert base - simulate(out, topo).total_ns == pytest.approx(sum(r["gain_ns"] for r in mine))
        assert sum(r["gain_ns"] for r in mine) < base


def test_errors(store: EmbeddedStore) -> None:
    t = hand_workload()
    with pytest.raises(RewriteError, match="unknown rewrite 'bogus'; expected one of overlap, reorder"):
        rewrite(t, "bogus")
    with pytest.raises(RewriteError, match="chunk-split of 'hand' needs the expansion lineage"):
        rewrite(t, "chunk-split")
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        rewrite_stored(store, "nope", "overlap")
    store.ingest(t, name="hand")
    with pytest.raises(RewriteError, match="chunk-split needs an expanded trace; 'hand' has no ops expanded"):
        rewrite_stored(store, "hand", "chunk-split")
    with pytest.raises(RewriteError, match="unknown rewrite 'x'"):
        rewrite_stored(store, "hand", "x")
    assert [i.name for i in store.traces()] == ["hand"]


def test_chunk_split_of_a_real_expansion(store: EmbeddedStore) -> None:
    from etstore.algorithms.expand import expand

    w = transformer(ranks=4, layers=2, tp=4, hidden=1024, seq_tokens=512)
    store.ingest(w, name="w")
    e = expand(w, "ring:2")
    store.ingest(e.trace, name="wx", parent="w", lineage=e.lineage)
    topo = parse_topology("ring:4")
    found = find_opportunities(store, "wx", topo=topo, kinds=("chunk",), measure=False, split=FREE)
    assert found.num_rows > 0 and min(found["gain_ns"].to_pylist()) > 0
    report = rewrite_stored(store, "wx", "chunk-split", topo=topo, split=FREE)
    out = store.load(report.trace.name)
    check_rewrite(store.load("wx"), out)
    split = {(o["rank"], o["id"]) for o in out.params["split_ops"]}
    promised = set(zip(found["rank"].to_pylist(), found["other_id"].to_pylist(), strict=True))
    assert promised <= split  # every promised consumer was split
    # a reduce-scatter leaves a rank only its own share: 2 of the 8 chunks (tp 4, ring:2), the
    # rest pass through it as partial sums; an all-gather's consumers read every chunk
    exp = expansions_of(store, "wx")
    keys = zip(exp["rank"].to_pylist(), exp["coll_id"].to_pylist(), strict=True)
    vals = zip(exp["coll_type"].to_pylist(), exp["group_pos"].to_pylist(), strict=True)
    kinds = dict(zip(keys, vals, strict=True))
    seen = set()
    for cc in chunk_consumers(store.load("wx"), rank_graphs(store.load("wx")), exp):
        ctype, pos = kinds[(cc.rank, cc.coll_id)]
        seen.add(ctype)
        if ctype == "REDUCE_SCATTER":
            assert sorted(cc.writers) == [2 * pos, 2 * pos + 1], (cc.rank, cc.coll_id)
        else:  # an all-gather writes every chunk but the rank's own, already in place
            assert sorted(cc.writers) == [c for c in range(8) if c // 2 != pos]
    assert seen == {"ALL_GATHER", "REDUCE_SCATTER"}
    assert simulate(out, topo).total_ns < simulate(store.load("wx"), topo).total_ns
