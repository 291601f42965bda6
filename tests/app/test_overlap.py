"""Opportunity finders on hand-built 2-rank traces whose answers are worked out below.

The workload (both ranks identical, peer p = 1 - r), on ``ring:2`` (50 GiB/s, 500 ns):

    id name            type  duration  deps
    0  fwd             COMP  10 µs     -
    1  grad_allreduce  COLL  1 MiB     data 0
    2  indep           COMP  20 µs     data 0, ctrl 1     <- serialized behind the all-reduce
    3  apply           COMP   5 µs     data 1, ctrl 2
    4  stats           COMP  30 µs     ctrl 3             <- sits ahead of the send
    5  send_act        SEND  1 MiB     data 0, ctrl 4     (to p, tag 7)
    6  recv_act        RECV  1 MiB     data 0             (from p, tag 7)
    7  final           COMP   1 µs     data 5, data 6, ctrl 4

All-reduce of 1 MiB, ASTRA-sim's native ring on 2 NPUs (docs/simulator.md): 4 chunks of
256 KiB one after another; each is 2 steps sending 128 KiB (500 + 131072 / 53.687 =
2941 ns), 3 endpoint delays of 10 ns and one reduction of 3 × ⌊131072 / 50⌋ = 7863 ns:
4 × (30 + 2 × 2941 + 7863) = 4 × 13775 = 55100 ns. A 1 MiB message: 500 + 1048576 /
53.687 = 20031 ns.

Timeline: fwd 0–10000; all-reduce 10000–65100; indep 65100–85100; apply –90100;
stats –120100; send issues at 120100 and lands at 140131; final –141131.

Expected, per rank:
* overlap: all-reduce (1) frees indep (2): gain min(55100, 20000) = 20000 ns.
* reorder: send (5) waits on stats/apply/indep (ids 2, 3, 4) through ctrl edges but
  needs only fwd's data; kept predecessors fwd (ends 10000) and the all-reduce (comm
  order stays; ends 65100): it could issue at 65100 instead of 120100, gain 55000 ns;
  ``other_id`` = 4, the compute op right ahead.
* chunk: none (not an expanded trace).

The expanded trace replaces the all-reduce by a hand-written 2-rank reduce-scatter +
all-gather (chunk slot r is this rank's half, p the peer's; 512 KiB messages take
500 + 524288 / 53.687 = 10265 ns) and keeps only fwd → all-reduce → apply (6 µs):

    0 fwd 10 µs | 10 rs_send slot p | 11 rs_recv slot r | 12 rs_reduce 2 µs slot r
    13 ag_send slot r | 14 ag_recv slot p | 3 apply 6 µs (data 13, 14)

Timeline: fwd –10000; rs messages land 20265; reduce –22265; ag messages land 32530;
apply 32530–38530. Slot r is complete at 22265, slot p at 32530. Split in two 3 µs
pieces: 22265–25265 and 32530–35530, so the chunk gain is 38530 − 35530 = 3000 ns and
the consumer could start 32530 − 22265 = 10265 ns earlier.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from etstore.analysis.split import SplitCost
from etstore.app import opportunities
from etstore.app.compare import compare
from etstore.app.opportunities import find_and_record
from etstore.app.overlap import (
    OPPORTUNITIES_SCHEMA,
    explain,
    find_opportunities,
)
from etstore.app.rewrite import rewrite_stored
from etstore.app.runs import record_run
from etstore.errors import EtstoreError, UnknownTraceError
from etstore.sim import SimConfig, simulate
from etstore.store import EmbeddedStore
from etstore.testing import hand_workload
from etstore.testing import ingest_hand_expanded as stored_expanded
from etstore.topology import parse_topology


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [(r["kind"], r["rank"], r["op_id"], r["other_id"], r["gain_ns"]) for r in table.to_pylist()]


def test_hand_timeline_is_what_the_docstring_says() -> None:
    res = simulate(hand_workload(), parse_topology("ring:2"))
    t = {(r["rank"], r["id"]): (r["start_ns"], r["end_ns"]) for r in res.ops.to_pylist()}
    assert t[(0, 1)] == (10000.0, 65100.0)  # the all-reduce: 55100 ns
    assert t[(0, 5)] == (120100.0, 140131.0)
    assert res.total_ns == 141131.0


def test_finder_returns_exactly_the_hand_computed_opportunities(store: EmbeddedStore) -> None:
    store.ingest(hand_workload(), name="hand")
    found = find_opportunities(store, "hand", topo="ring:2", measure=False)
    assert found.schema == OPPORTUNITIES_SCHEMA
    assert rows(found) == [
        ("overlap", 0, 1, 2, 20000.0),
        ("overlap", 1, 1, 2, 20000.0),
        ("reorder", 0, 5, 4, 55000.0),
        ("reorder", 1, 5, 4, 55000.0),
    ]
    overlap = json.loads(found["detail"][0].as_py())
    assert overlap == {"collective_ns": 55100.0, "compute_ns": 20000.0, "compute_ids": [2]}
    reorder = json.loads(found["detail"][2].as_py())
    assert reorder == {"issued_ns": 120100.0, "ready_ns": 65100.0, "compute_ids": [2, 3, 4]}


def test_measured_gains_are_what_the_simulator_says_with_each_applied(store: EmbeddedStore) -> None:
    """The same change on both ranks is one opportunity. Overlap: the 20 µs compute op runs
    under the all-reduce, the step ends 20 µs sooner (the estimate holds). Reorder: the
    estimate (the send could issue 55 µs earlier) is not what the step gains: the makespan
    drops by 20,031 ns, and that is what the rewrite realises."""
    store.ingest(hand_workload(), name="hand")
    found = find_and_record(store, "hand", topo="ring:2")
    assert rows(found) == [("overlap", 0, 1, 2, 20000.0), ("reorder", 0, 5, 4, 20031.0)]
    assert found["id"].to_pylist() == [1, 2]
    for r in found.to_pylist():
        d = json.loads(r["detail"])
        assert d["measured"] and d["makespan_ns"] == 141131.0 and d["alone_gain_ns"] == r["gain_ns"]
        assert [(a["rank"], a["op_id"]) for a in d["applies"]] == [(0, r["op_id"]), (1, r["op_id"])]
    assert json.loads(found["detail"][1].as_py())["estimate_ns"] == 55000.0
    for kind, gain in (("overlap", 20000.0), ("reorder", 20031.0)):
        new = rewrite_stored(store, "hand", kind).trace.name
        assert -compare(store, "hand", new, "ring:2").diff_ns == gain
    # one opportunity by its number: the reorder (the kind comes from the row)
    one = rewrite_stored(store, "hand", "overlap", opportunities=[2], name="just-2")
    assert store.load("just-2").params["applied"] == "reorder"
    assert -compare(store, "hand", one.trace.name, "ring:2").diff_ns == 20031.0


def test_chunk_finder_on_the_expanded_trace(store: EmbeddedStore) -> None:
    name = stored_expanded(store)
    free = SplitCost(overhead_us=0)  # the hand-computed numbers: a piece costs its share, no launch
    measured = find_opportunities(store, name, topo="ring:2", split=free)
    assert rows(measured) == [("chunk", 0, 1, 3, 3000.0)]  # both ranks' consumers: one change
    # with a launch per piece (4 µs, the default), splitting a 6 µs op no longer pays
    assert find_opportunities(store, name, topo="ring:2").num_rows == 0
    found = find_opportunities(store, name, topo="ring:2", measure=False, split=free)
    assert rows(found) == [("chunk", 0, 1, 3, 3000.0), ("chunk", 1, 1, 3, 3000.0)]
    d0 = json.loads(found["detail"][0].as_py())
    assert d0["chunks"] == [[0, 22265.0], [1, 32530.0]]  # rank 0: own half first
    assert d0["pieces"] == [[0], [1]]
    assert (d0["start_ns"], d0["end_ns"]) == (32530.0, 38530.0)
    assert (d0["chunked_start_ns"], d0["chunked_end_ns"], d0["start_gain_ns"]) == (22265.0, 35530.0, 10265.0)
    assert json.loads(found["detail"][1].as_py())["chunks"] == [[1, 22265.0], [0, 32530.0]]
    assert d0["parent_trace"] == "parent"


def test_the_finders_report_progress_by_rank_and_consumer(store: EmbeddedStore) -> None:
    steps: list[tuple[str, int, int]] = []
    store.ingest(hand_workload(), name="hand")
    find_opportunities(store, "hand", topo="ring:2", measure=False, progress=lambda *s: steps.append(s))
    assert steps == [
        ("overlap: ranks", 1, 2),
        ("overlap: ranks", 2, 2),
        ("reorder: ranks", 1, 2),
        ("reorder: ranks", 2, 2),
    ]
    steps.clear()
    name = stored_expanded(store)
    find_opportunities(
        store, name, topo="ring:2", kinds=["chunk"], measure=False, progress=lambda *s: steps.append(s)
    )
    assert steps == [("chunk: consumers", 2, 2)]  # reported every 256 consumers and at the last


def test_independent_compute_already_overlapped_is_no_opportunity(store: EmbeddedStore) -> None:
    # the same workload without the issue-order edges: nothing is serialized, nothing to find
    t = hand_workload()
    t = t.replace(deps=t.deps.filter(pa.compute.equal(t.deps["kind"], "data")), name="free")
    store.ingest(t, name="free")
    assert find_opportunities(store, "free", topo="ring:2").num_rows == 0


def test_recorded_rows_replace_the_traces_earlier_rows(store: EmbeddedStore) -> None:
    store.ingest(hand_workload(), name="hand")
    find_and_record(store, "hand", topo="ring:2")
    find_and_record(store, "hand", topo="ring:2", kinds=("overlap",))
    got = store.sql(
        "SELECT kind, rank, op_id, other_id, gain_ns FROM opportunities WHERE trace = 'hand' ORDER BY rank"
    ).to_pylist()
    assert [tuple(r.values()) for r in got] == [("overlap", 0, 1, 2, 20000.0)]
    schema = store.sql("DESCRIBE opportunities").to_pylist()
    assert [(c["column_name"], c["column_type"]) for c in schema] == [
        ("trace", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("rank", "INTEGER"),
        ("op_id", "UBIGINT"),
        ("other_id", "UBIGINT"),
        ("gain_ns", "DOUBLE"),
        ("detail", "VARCHAR"),
        ("id", "INTEGER"),
    ]
    numbers = store.sql("SELECT id FROM opportunities WHERE trace = 'hand' ORDER BY rank").to_pylist()
    assert [r["id"] for r in numbers] == [1]


def test_timings_from_a_recorded_run(store: EmbeddedStore) -> None:
    trace = hand_workload()
    store.ingest(trace, name="hand")
    # a slower network: 10 GiB/s makes the all-reduce longer than indep, gains stay min(...)
    res = simulate(trace, parse_topology("ring:2,bw=10"), config=SimConfig())
    run = record_run(store.warehouse, res, trace_name="hand")
    found = find_opportunities(store, "hand", run_id=run, kinds=("overlap", "reorder"), measure=False)
    coll = json.loads(found["detail"][0].as_py())["collective_ns"]
    assert coll > 55100.0 and found["gain_ns"][0].as_py() == 20000.0
    with pytest.raises(UnknownTraceError, match="run 99 has no op timings of trace 'hand'"):
        find_opportunities(store, "hand", run_id=99)


def test_explain_lists_cypher_and_sql() -> None:
    engines = {(finder, engine) for finder, engine, _ in explain()}
    assert {("overlap", "cypher"), ("overlap", "sql"), ("chunk", "cypher"), ("reorder", "sql")} <= engines
    assert all(text.strip() for _, _, text in explain())
    recording = [q for q in opportunities.explain() if q[0] == "record"]
    assert [e for e, _, _ in recording] == ["record", "record"] and opportunities.explain()[:-2] == explain()


def test_errors(store: EmbeddedStore) -> None:
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        find_opportunities(store, "nope")
    store.ingest(hand_workload(), name="hand")
    find_and_record(store, "hand", topo="ring:2")
    with pytest.raises(EtstoreError, match="unknown opportunity kind 'bogus'"):
        find_and_record(store, "hand", kinds=("bogus",))
    with pytest.raises(EtstoreError, match="unknown kind 'zz'"):
        find_and_record(store, "hand", topo="zz:2")
    assert store.sql("SELECT count(*) FROM opportunities").scalar() == 2  # the earlier rows, untouched
