"""Neo4j backend specifics: URLs and credentials, the client-side SQL mirror, batched loads, sweeps."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.errors import StoreError
from etstore.ingest import read_et
from etstore.model import Trace, TraceKind, ops_table
from etstore.store._neo4j_catalog import FORMAT_VERSION
from etstore.store.neo4j import Neo4jStore, parse_url, translate_cypher
from etstore.testing import clear_store
from etstore.workloads import transformer

SECRET = "s3cr3t-Pa55"


def test_url_credentials_never_shown() -> None:
    t = parse_url(f"neo4j://alice:{SECRET}@db.example:7688/traces", env={})
    assert (t.uri, t.database, t.auth) == ("neo4j://db.example:7688", "traces", ("alice", SECRET))
    assert t.location == "neo4j://db.example:7688/traces"
    assert SECRET not in repr(t) and "alice" not in repr(t)


def test_credentials_from_environment() -> None:
    t = parse_url("bolt://localhost", env={"NEO4J_USER": "bob", "NEO4J_PASSWORD": SECRET})
    assert (t.uri, t.auth, t.location) == ("bolt://localhost:7687", ("bob", SECRET), "bolt://localhost:7687")
    assert parse_url("bolt://localhost", env={}).auth is None
    escaped = parse_url("neo4j://u:p%40ss%2Fword@h", env={})
    assert escaped.auth == ("u", "p@ss/word")


def test_bad_urls_and_unreachable_server_hide_the_password() -> None:
    with pytest.raises(StoreError, match="not a Neo4j URL") as bad:
        parse_url(f"neo4j://u:{SECRET}@", env={})
    assert SECRET not in str(bad.value)
    with pytest.raises(StoreError, match="cannot reach Neo4j") as down:
        Neo4jStore(f"bolt://u:{SECRET}@127.0.0.1:1")
    assert SECRET not in str(down.value) and "127.0.0.1:1" in str(down.value)


def test_translate_cypher_only_outside_strings() -> None:
    q = "MATCH (a)-[r:DEP]->(b) WHERE a.name = 'label(r)' RETURN label(r), LABEL(a)"
    assert translate_cypher(q) == (
        "MATCH (a)-[r:DEP]->(b) WHERE a.name = 'label(r)' RETURN type(r), head(labels(a))"
    )


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neo4j_url: str) -> Iterator[str]:
    url = neo4j_url
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    with Neo4jStore(url, stale_after_s=0) as s:
        clear_store(s)
    yield url


def test_wrong_password_is_a_store_error(server: str) -> None:
    bad = parse_url(server).uri.replace("://", "://neo4j:wrong-password@", 1)
    with pytest.raises(StoreError, match="refused the credentials") as err:
        Neo4jStore(bad)
    assert "wrong-password" not in str(err.value)


def test_other_clients_see_traces_through_sql(server: str, tmp_path: Path, feeder: Path) -> None:
    trace = read_et(feeder)
    with Neo4jStore(server, warehouse=tmp_path / "a") as a:
        a.ingest(trace)
    with Neo4jStore(server, warehouse=tmp_path / "b", read_only=True) as b:
        assert b.sql("SELECT count(*) FROM ops").scalar() == trace.num_ops
        assert b.sql("SELECT ops FROM traces").scalar() == trace.num_ops
        assert b.load("feeder_tests_trace").ops.equals(trace.ops)
    with Neo4jStore(server, warehouse=tmp_path / "a") as a:
        a.remove("feeder_tests_trace")
    with Neo4jStore(server, warehouse=tmp_path / "b", read_only=True) as b:
        assert b.sql("SELECT count(*) FROM ops").scalar() == 0


def test_batched_load_matches_single_transaction(server: str, tmp_path: Path) -> None:
    trace = transformer(ranks=4, layers=2, tp=2)
    with Neo4jStore(server, batch_rows=7, single_tx_rows=0) as s:
        report = s.ingest(trace)
        p = {"t": report.trace.name}
        n = s.cypher("MATCH (t:Trace {name: $t}), (o:Op) WHERE o.trace_id = t.trace_id RETURN count(o)", p)
        d = s.cypher(
            "MATCH (t:Trace {name: $t}), (o:Op)-[r:DEP]->() WHERE o.trace_id = t.trace_id RETURN count(r)", p
        )
        assert (n.scalar(), d.scalar()) == (trace.num_ops, trace.num_deps)
        assert s.load(report.trace.name).deps.equals(trace.deps)

        def boom(stage: str, done: int, total: int) -> None:
            if stage == "deps":
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            s.ingest(transformer(ranks=2, layers=1, tp=1), progress=boom)
        assert [t.name for t in s.traces()] == [report.trace.name]
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == trace.num_ops


def test_abandoned_ingest_is_swept(server: str, caplog: pytest.LogCaptureFixture) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    with Neo4jStore(server) as s:
        seq, _ = s._claim(trace, TraceKind(trace.kind), "ghost", True, None, "not-a-real-hash")
        s._run("CREATE (:Op {uid: $u, trace_id: $s})", {"u": seq << 40, "s": seq}, write=True)
    ghost = "MATCH (o:Op {trace_id: $s}) RETURN count(o)"
    with Neo4jStore(server, stale_after_s=3600) as s:  # fresh heartbeat: another client may be loading
        assert s.cypher(ghost, {"s": seq}).scalar() == 1
        assert s.cypher("MATCH (t:Trace) RETURN count(t)").scalar() == 0  # not ready: no Trace node
    with caplog.at_level(logging.WARNING), Neo4jStore(server, stale_after_s=0) as s:
        assert s.cypher(ghost, {"s": seq}).scalar() == 0
        assert s.cypher("MATCH (t:EtstoreTrace) RETURN count(t)").scalar() == 0
    assert "ghost" in caplog.text


def test_ids_beyond_neo4j_integers_are_refused(server: str) -> None:
    ops = ops_table(
        {
            "rank": pa.array([0, 0], pa.int32()),
            "id": pa.array(np.array([0, 1 << 63], dtype=np.uint64)),
            "name": ["a", "b"],
            "type": ["COMP_NODE", "COMP_NODE"],
        }
    )
    with Neo4jStore(server) as s:
        with pytest.raises(StoreError, match="column id holds 9223372036854775808"):
            s.ingest(Trace(ops=ops, name="huge"))
        assert s.traces() == []
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == 0


_TO_FORMAT2 = [
    # each content's ops carry its first name in `trace`, as etstore wrote them before Trace nodes
    "MATCH (t:EtstoreTrace) WITH t ORDER BY t.created WITH t.seq AS seq, collect(t.name)[0] AS first "
    "MATCH (c:EtstoreContent {seq: seq}) SET c.graph_name = first",
    "MATCH (c:EtstoreContent) MATCH (o:Op {trace_id: c.seq}) SET o.trace = c.graph_name REMOVE o.trace_id",
    "MATCH (t:Trace) DELETE t",
    "DROP CONSTRAINT etstore_trace_node_name IF EXISTS",
    "DROP INDEX etstore_trace_node_id IF EXISTS",
    "DROP INDEX etstore_op_trace_id IF EXISTS",
    "CREATE INDEX etstore_op_trace IF NOT EXISTS FOR (o:Op) ON (o.trace)",
    "MATCH (f:EtstoreFormat) SET f.version = 2",
]
_PER_NAME = (
    "MATCH (t:Trace), (o:Op) WHERE o.trace_id = t.trace_id "
    "RETURN t.name AS name, t.trace_id AS id, count(o) AS n ORDER BY name"
)


def test_format2_server_store_is_upgraded_in_place(server: str, tmp_path: Path) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    with Neo4jStore(server) as s:
        s.ingest(trace, name="a")
        s.ingest(trace, name="b")
        seq = s.info("b").trace_id
        before = s.traces()
        for q in _TO_FORMAT2:
            s._run(q, write=True)
        assert s.cypher("MATCH (o:Op {trace: 'a'}) RETURN count(o)").scalar() == trace.num_ops
        # an upgrade interrupted after moving a few ops: the next writable open finishes it
        s._run(
            "MATCH (o:Op) WITH o LIMIT 5 SET o.trace_id = o.uid / 1099511627776 REMOVE o.trace", write=True
        )
    with pytest.raises(StoreError, match=r"format 2 .*python -m etstore\.store\.upgrade"):
        Neo4jStore(server, read_only=True)
    with Neo4jStore(server, warehouse=tmp_path / "w") as s:
        assert s.traces() == before
        assert s.cypher("MATCH (f:EtstoreFormat) RETURN f.version").scalar() == FORMAT_VERSION == 3
        assert s.cypher(_PER_NAME).to_pylist() == [
            {"name": "a", "id": seq, "n": trace.num_ops},
            {"name": "b", "id": seq, "n": trace.num_ops},
        ]
        assert s.cypher("MATCH (o:Op) WHERE o.trace IS NOT NULL RETURN count(o)").scalar() == 0
        assert (
            s.cypher("MATCH (c:EtstoreContent) WHERE c.graph_name IS NOT NULL RETURN count(c)").scalar() == 0
        )
        indexes = {r["name"] for r in s._run("SHOW INDEXES YIELD name")}
        assert "etstore_op_trace" not in indexes and "etstore_op_trace_id" in indexes
        s.remove("a")
        assert s.cypher(_PER_NAME).to_pylist() == [{"name": "b", "id": seq, "n": trace.num_ops}]
        assert s.sql("SELECT count(*) FROM ops WHERE trace = 'b'").scalar() == trace.num_ops
    with Neo4jStore(server, read_only=True) as ro:
        assert [t.name for t in ro.traces()] == ["b"]


_TO_FORMAT1 = [
    # names and contents back on one node per trace, as etstore wrote them before names
    "MATCH (t:EtstoreTrace) MATCH (c:EtstoreContent {seq: t.seq}) "
    "SET t.kind = c.kind, t.content_hash = c.content_hash, t.ranks = c.ranks, t.ops = c.ops, "
    "t.deps = c.deps, t.missing = c.missing, t.messages = c.messages, t.heartbeat = c.heartbeat "
    "REMOVE t.parent_seq",
    "MATCH (c:EtstoreContent) DELETE c",
    "MATCH (p:EtstorePayload) WHERE p.table STARTS WITH 'lineage@' SET p.table = 'lineage'",
    "MATCH (f:EtstoreFormat) DELETE f",
    "DROP CONSTRAINT etstore_content_hash IF EXISTS",
    "DROP CONSTRAINT etstore_content_seq IF EXISTS",
    "DROP INDEX etstore_trace_seq_index IF EXISTS",
    "CREATE CONSTRAINT etstore_trace_seq IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.seq IS UNIQUE",
]


def test_format1_server_store_is_upgraded_in_place(server: str, tmp_path: Path) -> None:
    from etstore.collectives.stored import expand_stored

    with Neo4jStore(server) as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1))
        expand_stored(s, "transformer", "ring")
        before = {t.name: (t.kind, t.ops, t.parent) for t in s.traces()}
        for q in _TO_FORMAT2 + _TO_FORMAT1:
            s._run(q, write=True)
    assert before["transformer-expanded"] == ("expanded", 28, "transformer")
    with pytest.raises(StoreError, match=r"format 1 .*python -m etstore\.store\.upgrade"):
        Neo4jStore(server, read_only=True)
    with Neo4jStore(server, warehouse=tmp_path / "w") as s:
        assert {t.name: (t.kind, t.ops, t.parent) for t in s.traces()} == before
        assert s.cypher("MATCH (f:EtstoreFormat) RETURN f.version").scalar() == FORMAT_VERSION
        assert s.sql("SELECT count(*) FROM lineage WHERE parent_trace = 'transformer'").scalar() == 10
        becomes = (
            "MATCH (t:Trace {name: 'transformer'}), (o:Op)-[b:BECOMES]->() WHERE o.trace_id = t.trace_id "
            "RETURN count(b)"
        )
        assert s.cypher(becomes).scalar() == 10
        again = s.ingest(transformer(ranks=2, layers=1, tp=1))
        assert not again.created and again.trace.name == "transformer"
