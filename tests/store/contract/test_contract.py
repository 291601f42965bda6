"""Store contract: what every backend must answer, the same; what a store must do when written."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from etstore.analysis import critical_path
from etstore.errors import QueryError, StoreError, UnknownTraceError
from etstore.formats import read_et, write_et
from etstore.store import EmbeddedStore
from etstore.testing import Backend
from etstore.workloads import transformer


def test_ingest_counts_and_idempotence(backend: Backend, custom_allreduce: Path) -> None:
    trace = read_et(custom_allreduce)
    first = backend.store.ingest(trace)
    assert first.created and first.trace.ops == 280 and first.trace.ranks == 8
    # ring: each rank sends 14 messages (7 reduce-scatter + 7 all-gather steps... as written upstream)
    sends = int(pc.sum(pc.equal(trace.ops["type"], "COMM_SEND_NODE")).as_py())
    assert first.trace.messages == sends and first.unmatched_sends == 0 and first.unmatched_recvs == 0
    again = backend.store.ingest(read_et(custom_allreduce))
    assert not again.created and again.trace.name == first.trace.name
    store = backend.read()
    assert [t.name for t in store.traces()] == ["custom_allreduce"]
    info = store.info("custom_allreduce")
    local = first.trace
    assert (info.kind, info.ops, info.deps, info.missing, info.messages, info.ranks, info.content_hash) == (
        local.kind,
        local.ops,
        local.deps,
        local.missing,
        local.messages,
        local.ranks,
        local.content_hash,
    )
    assert (info.source, dict(info.params), info.parent) == (local.source, dict(local.params), None)


def test_cypher_and_sql_agree(backend: Backend, rt_template: Path) -> None:
    backend.store.ingest(read_et(rt_template))
    backend_store = backend.read()
    n = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (o:Op) WHERE o.trace_id = t.trace_id RETURN count(o) AS n",
        {"t": "chakra_trace"},
    ).scalar()
    m = backend_store.sql("SELECT count(*) FROM ops WHERE trace = $t", {"t": "chakra_trace"}).scalar()
    assert n == m == 8
    rows = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (o:Op) WHERE o.trace_id = t.trace_id "
        "RETURN o.rank AS rank, o.comm_type AS ct, o.comm_size AS size ORDER BY rank",
        {"t": "chakra_trace"},
    ).to_pylist()
    assert rows == [{"rank": r, "ct": "ALL_REDUCE", "size": 1048576} for r in range(8)]


def test_message_edges_cross_ranks(backend: Backend) -> None:
    trace = transformer(ranks=4, layers=1, tp=1)
    backend.store.ingest(trace)
    backend_store = backend.read()
    rows = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (s:Op)-[:MSG]->(r:Op) WHERE s.trace_id = t.trace_id "
        "RETURN s.rank AS src, r.rank AS dst ORDER BY src",
        {"t": "transformer"},
    ).to_pylist()
    assert rows == [{"src": 0, "dst": 1}, {"src": 1, "dst": 2}, {"src": 2, "dst": 3}, {"src": 3, "dst": 0}]
    hops = backend_store.cypher(
        "MATCH (t:Trace {name: $t}), (s:Op {rank: 0, name: 'send_embeddings'})-[:MSG]->(:Op)-[:DEP]->(c:Op) "
        "WHERE s.trace_id = t.trace_id RETURN c.rank AS rank, c.name AS name",
        {"t": "transformer"},
    ).to_pylist()
    assert hops == [{"rank": 1, "name": "embedding"}]


def test_load_and_export_round_trip(backend: Backend, feeder: Path, tmp_path: Path) -> None:
    trace = read_et(feeder)
    backend.store.ingest(trace)
    back = backend.read().load("feeder_tests_trace")
    assert back.ops.equals(trace.ops) and back.deps.equals(trace.deps) and back.missing.equals(trace.missing)
    (path,) = write_et(back, tmp_path / "out")
    assert path.read_bytes() == feeder.read_bytes()
    cp = critical_path(back)
    assert cp.length_micros == critical_path(trace).length_micros > 0


def test_remove_and_unknown_trace(backend: Backend, rt_template: Path) -> None:
    backend.store.ingest(read_et(rt_template))
    assert [t.name for t in backend.read().traces()] == ["chakra_trace"]
    backend.store.remove("chakra_trace")
    backend_store = backend.read()
    assert backend_store.traces() == []
    assert backend_store.sql("SELECT count(*) FROM ops").scalar() == 0
    assert backend_store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0
    with pytest.raises(UnknownTraceError, match="no trace named 'chakra_trace'"):
        backend_store.load("chakra_trace")
    with pytest.raises(UnknownTraceError, match="no trace named 'chakra_trace'"):
        backend_store.info("chakra_trace")
    with pytest.raises(UnknownTraceError):
        backend.store.remove("nope")


def test_bad_queries_raise_query_error(backend: Backend) -> None:
    backend_store = backend.read()
    with pytest.raises(QueryError, match="Cypher"):
        backend_store.cypher("MATCH (o:Op RETURN o")
    with pytest.raises(QueryError, match="SQL"):
        backend_store.sql("SELEC 1")
    with pytest.raises(QueryError, match="nosuch"):
        backend_store.sql("SELECT nosuch FROM ops")


def test_interrupted_ingest_leaves_nothing(store: EmbeddedStore, rt_template: Path) -> None:
    def boom(stage: str, done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.ingest(read_et(rt_template), progress=boom)
    assert store.traces() == []
    assert store.sql("SELECT count(*) FROM ops").scalar() == 0
    assert store.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0
    assert store.ingest(read_et(rt_template)).created


def test_name_conflicts(store: EmbeddedStore, rt_template: Path, custom_allreduce: Path) -> None:
    store.ingest(read_et(rt_template), name="x")
    with pytest.raises(StoreError, match="already named 'x'"):
        store.ingest(read_et(custom_allreduce), name="x")
    auto = store.ingest(read_et(custom_allreduce).replace(name="x"))
    assert auto.trace.name == "x-2"
