"""A trace stored part by part (rank ranges) is the trace stored whole (the embedded store: the
one written; what a server reads back is what publish sends of it, the same as of any trace)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.algorithms.synth import synthesize
from etstore.dag import match_messages
from etstore.errors import StoreError
from etstore.formats import read_et
from etstore.model import Trace
from etstore.store import EmbeddedStore
from etstore.testing import rank_parts


def _same_tables(a: Trace, b: Trace) -> None:
    for name in ("ops", "deps", "missing", "meta"):
        assert getattr(a, name).combine_chunks().equals(getattr(b, name).combine_chunks()), name


def test_parts_store_the_whole_trace(store: EmbeddedStore, custom_allreduce: Path) -> None:
    trace = read_et(custom_allreduce)
    # rank 0's receives dropped: its peers' sends to it stay unmatched, as a whole ingest reports
    ops = trace.ops
    keep = ~((ops["rank"].to_numpy() == 0) & (np.asarray(ops["type"]) == "COMM_RECV_NODE"))
    kept_ids = set(
        ops.filter(pa.array(keep))
        .filter(pa.array(ops.filter(pa.array(keep))["rank"].to_numpy() == 0))["id"]
        .to_pylist()
    )
    deps = trace.deps
    dr = deps["rank"].to_numpy()
    ok = (dr != 0) | (
        np.isin(deps["src"].to_numpy(), list(kept_ids)) & np.isin(deps["dst"].to_numpy(), list(kept_ids))
    )
    trace = trace.replace(ops=ops.filter(pa.array(keep)), deps=deps.filter(pa.array(ok)))
    expected = match_messages(trace)
    assert expected.unmatched_sends > 0
    report = store.ingest_parts(rank_parts(trace, [1, 3, 6]), name="parts")
    info = report.trace
    assert report.created and (info.ops, info.deps, info.ranks) == (trace.num_ops, trace.num_deps, 8)
    assert info.messages == len(expected.send_row)
    assert (report.unmatched_sends, report.unmatched_recvs) == (
        expected.unmatched_sends,
        expected.unmatched_recvs,
    )
    _same_tables(store.load("parts"), trace)
    base = store.sql("SELECT min(uid) FROM ops WHERE trace = 'parts'").scalar()
    got = store.sql(
        "SELECT send_uid - $b AS s, recv_uid - $b AS r, tag FROM messages WHERE trace = 'parts' ORDER BY s",
        {"b": base},
    ).to_arrow()
    assert got["s"].to_pylist() == expected.send_row.tolist()
    assert got["r"].to_pylist() == expected.recv_row.tolist()
    edges, deps_n = (
        store.cypher(
            f"MATCH (t:Trace {{name: 'parts'}}), (a:Op)-[:{rel}]->(b:Op) WHERE a.trace_id = t.trace_id "
            "RETURN count(*)"
        ).scalar()
        for rel in ("MSG", "DEP")
    )
    assert (edges, deps_n) == (len(expected.send_row), trace.num_deps)
    # the same content whole: one more name, nothing stored twice (the identity is the same)
    again = store.ingest(trace, name="whole")
    assert again.created and again.same_as == "parts"
    assert store.ingest_parts(rank_parts(trace, [5]), name="parts").created is False


def test_synthesized_parts_match_the_trace(store: EmbeddedStore) -> None:
    r = synthesize("mesh2d:3x3", coll="allreduce", chunks_per_npu=2, trials=1, seed=0)
    report = store.ingest_parts(r.trace_parts(max_ops=40), name="synth")
    assert report.trace.ops == r.num_ops and report.trace.deps == r.trace.num_deps
    _same_tables(store.load("synth"), r.trace)
    assert store.ingest(r.trace, name="synth-whole").same_as == "synth"


def test_one_part_is_a_whole_ingest(store: EmbeddedStore, custom_allreduce: Path) -> None:
    trace = read_et(custom_allreduce)
    report = store.ingest_parts(iter([trace]))
    assert report.trace.name == trace.name and report.trace.ops == trace.num_ops


def test_ranks_without_ops_and_empty_parts(store: EmbeddedStore) -> None:
    # ops on ranks 0 and 2, metadata also on rank 1 (which has no op): cut anywhere, even into
    # a part of metadata alone, or an empty part, it is the trace stored whole
    whole = synthesize("ring:3", coll="allgather", trials=1, seed=0).trace
    keep = whole.ops["rank"].to_numpy() != 1
    ops = whole.ops.filter(pa.array(keep))
    deps = whole.deps.filter(pa.array(whole.deps["rank"].to_numpy() != 1))
    meta = pa.table({"rank": pa.array([0, 1, 2], pa.int32()), "metadata": pa.array([b"a", b"b", b"c"])})
    trace = whole.replace(ops=ops, deps=deps, meta=meta)
    empty = rank_parts(trace, [0])[0]  # no rank below 0: every table empty
    parts = [*rank_parts(trace, [1, 2]), empty]
    assert parts[1].num_ops == 0 and parts[1].meta.num_rows == 1
    report = store.ingest_parts(parts, name="gappy")
    assert report.trace.ops == trace.num_ops and report.trace.ranks == 2
    _same_tables(store.load("gappy"), trace)
    assert store.ingest(trace, name="whole").same_as == "gappy"


def _failing(parts: list[Trace]) -> Iterator[Trace]:
    yield parts[0]
    yield parts[1]
    raise RuntimeError("the producer failed")


@pytest.mark.parametrize("case", ["overlap", "order", "kind", "schema", "empty", "producer"])
def test_bad_parts_leave_nothing(
    store: EmbeddedStore, custom_allreduce: Path, tmp_path: Path, case: str
) -> None:
    trace = read_et(custom_allreduce)
    a, b, c = rank_parts(trace, [3, 6])
    parts: object = {
        "overlap": [a, b, rank_parts(trace, [5])[1]],
        "order": [b, a],
        "kind": [a, b.replace(kind="expanded")],
        "schema": [
            a,
            b.replace(meta=b.meta.cast(pa.schema([("rank", pa.int64()), ("metadata", pa.binary())]))),
        ],
        "empty": [],
        "producer": _failing([a, b, c]),
    }[case]
    err = RuntimeError if case == "producer" else StoreError
    match = {
        "overlap": "starts at rank 5",
        "order": "starts at rank 0",
        "kind": "part 1 has another",
        "schema": "another meta schema",
        "empty": "no parts",
        "producer": "producer failed",
    }[case]
    with pytest.raises(err, match=match):
        store.ingest_parts(parts, name="bad")  # type: ignore[arg-type]
    assert store.traces() == []
    assert store.sql("SELECT count(*) FROM trace_ops").scalar() == 0
    assert store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0
    if Path(store.location).is_dir():
        assert not list(Path(store.location).glob("spool-*"))
