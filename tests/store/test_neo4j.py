"""A Neo4j server read as a store: URLs and credentials, writes refused, the client-side SQL copy
of what was published (runs included), and servers of etstore's former Neo4j backend upgraded
in place to the published form."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from etstore.app.expand import expand_stored
from etstore.app.ingest_files import ingest_paths
from etstore.app.publish import publish
from etstore.app.runs import record_run
from etstore.cli import main
from etstore.errors import StoreError
from etstore.formats import read_et
from etstore.model import Trace, ops_table
from etstore.sim import simulate
from etstore.store import EmbeddedStore, open_store
from etstore.store._identity import identity
from etstore.store._mirror import FORMER_COPY
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_load import edge_batches, node_batches, trace_payload
from etstore.store._neo4j_migrate import LEGACY_STORE
from etstore.store.graph import dep_edges, message_edges, op_nodes, uid_base
from etstore.store.neo4j import Neo4jStore, parse_url, translate_cypher
from etstore.store.upgrade import main as upgrade_main
from etstore.store.upgrade import upgrade_store
from etstore.store.warehouse import Warehouse
from etstore.testing import clear_server, serve
from etstore.topology import Topology
from etstore.workloads import transformer

SECRET = "s3cr3t-Pa55"
ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "nccl_tests" / "superbench_nccl_allreduce.log"


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


def test_opening_for_writing_is_refused_before_connecting() -> None:
    with pytest.raises(StoreError, match=r"^bolt://127\.0\.0\.1:1 is read-only: ") as got:
        open_store(f"bolt://u:{SECRET}@127.0.0.1:1", write=True)
    assert "\n" not in str(got.value) and SECRET not in str(got.value)
    assert "etstore publish bolt://127.0.0.1:1" in str(got.value)


# ---------------------------------------------------------------- against the test server


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neo4j_url: str) -> Iterator[str]:
    """The test server, emptied before and after."""
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    clear_server(neo4j_url)
    yield neo4j_url
    clear_server(neo4j_url)


def _state(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every node and relationship on the server: element id -> labels or type, and properties."""
    with open_store(url) as s:
        nodes = s.cypher("MATCH (n) RETURN elementId(n) AS i, labels(n) AS l, properties(n) AS p")
        rels = s.cypher("MATCH ()-[r]->() RETURN elementId(r) AS i, type(r) AS l, properties(r) AS p")
    return (
        {r["i"]: (r["l"], r["p"]) for r in nodes.to_pylist()},
        {r["i"]: (r["l"], r["p"]) for r in rels.to_pylist()},
    )


def test_wrong_password_is_a_store_error(server: str) -> None:
    bad = parse_url(server).uri.replace("://", "://neo4j:wrong-password@", 1)
    with pytest.raises(StoreError, match="refused the credentials") as err:
        Neo4jStore(bad)
    assert "wrong-password" not in str(err.value)


def test_writes_are_refused_in_one_line_and_change_nothing(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(w, name="w")
        publish(store, server)
    before = _state(server)
    location = parse_url(server).location
    with open_store(server) as reader:
        for write in (
            lambda: reader.ingest(w, name="x"),
            lambda: reader.ingest_parts([w], name="x"),
            lambda: reader.remove("w"),
        ):
            with pytest.raises(StoreError, match=f"^{location} is read-only: ") as got:
                write()
            assert "\n" not in str(got.value) and f"then run etstore publish {location}" in str(got.value)
    trace_dir = tmp_path / "et"
    assert main(["--store", str(tmp_path / "store"), "export", "w", "--out", str(trace_dir / "w")]) == 0
    capsys.readouterr()
    refused = [
        ["ingest", str(trace_dir)],
        ["rm", "w"],
        ["expand", "w", "--by-type", "allreduce=ring"],
        ["sim", "w", "--topo", "ring:2"],
        ["cypher", "--write", "MATCH (o:Op) SET o.name = 'x'"],
    ]
    for argv in refused:
        assert main(["--store", server, *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"etstore {argv[0]} writes; {location} is read-only" in err, argv
        assert server not in err and parse_url(server).password not in err
    assert "or pass --no-record to read it without recording" in _cli_error(
        capsys, server, "sim", "w", "--topo", "ring:2"
    )
    assert _state(server) == before  # not one node, relationship or property changed


def _cli_error(capsys: pytest.CaptureFixture[str], server: str, *argv: str) -> str:
    assert main(["--store", server, *argv]) == 1
    return capsys.readouterr().err


def test_commands_read_what_was_published(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A teammate's machine: list, load, simulate without recording, export, SQL over runs."""
    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1), name="w")
        record_run(store.warehouse, simulate(store.load("w"), Topology.ring(2)), trace_name="w")
        local_runs = store.sql("SELECT run_id, trace, total_ns, num_ops FROM runs").to_pylist()
        publish(store, server)
        exported = tmp_path / "local"
        assert main(["--store", str(tmp_path / "store"), "export", "w", "--out", str(exported / "w")]) == 0
    capsys.readouterr()
    assert main(["--store", server, "ls", "--format", "json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["w"]
    assert main(["--store", server, "sim", "w", "--topo", "ring:2", "--no-record", "--format", "json"]) == 0
    simulated = json.loads(capsys.readouterr().out)[0]
    assert simulated["total_ns"] == local_runs[0]["total_ns"]
    remote = tmp_path / "remote"
    assert main(["--store", server, "export", "w", "--out", str(remote / "w")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in remote.iterdir()) == sorted(p.name for p in exported.iterdir())
    for path in remote.iterdir():
        assert path.read_bytes() == (exported / path.name).read_bytes()
    query = "SELECT run_id, trace, total_ns, num_ops FROM runs"
    assert main(["--store", server, "sql", query, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == local_runs
    assert main(["--store", server, "runs", "--format", "json"]) == 0
    assert [(r["kind"], r["name"]) for r in json.loads(capsys.readouterr().out)] == [("sim", "w")]
    assert main(["--store", server, "critical-path", "--run", "1"]) == 1  # per-op timings stay home
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run 1 has no per-op timings" in err


def test_other_clients_see_traces_through_sql(server: str, tmp_path: Path, feeder: Path) -> None:
    trace = read_et(feeder)
    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(trace)
        publish(store, server)
        with Neo4jStore(server, warehouse=tmp_path / "b") as b:
            assert b.sql("SELECT count(*) FROM ops").scalar() == trace.num_ops
            assert b.sql("SELECT ops FROM traces").scalar() == trace.num_ops
            assert b.load("feeder_tests_trace").ops.equals(trace.ops)
            assert b.warehouse.read_only
        store.remove("feeder_tests_trace")
        publish(store, server, prune=True)
    with Neo4jStore(server, warehouse=tmp_path / "b") as b:  # the copy drops what the server dropped
        assert b.sql("SELECT count(*) FROM ops").scalar() == 0
        assert b.traces() == []


def test_runs_of_two_stores_keep_their_ids_apart(server: str, tmp_path: Path) -> None:
    ids = {}
    for name in ("a", "b"):
        with EmbeddedStore(tmp_path / name) as store:
            store.ingest(transformer(ranks=2, layers=1, tp=1), name=f"w{name}")
            result = simulate(store.load(f"w{name}"), Topology.ring(2))
            ids[name] = record_run(store.warehouse, result, trace_name=f"w{name}")
            ingest_paths(store, [str(LOG)])
            publish(store, server)
    assert ids == {"a": 1, "b": 1}  # each store numbers its runs from 1
    with open_store(server) as reader:
        runs = reader.sql("SELECT run_id, trace FROM runs ORDER BY run_id").to_pylist()
        assert sorted(r["trace"] for r in runs) == ["wa", "wb"]
        assert sorted(r["run_id"] for r in runs) == [1, 2]
        per_run = reader.sql(
            "SELECT run_id, trace, count(*) AS n FROM rank_breakdown GROUP BY ALL ORDER BY 1"
        )
        assert [(r["run_id"], r["trace"], r["n"]) for r in per_run.to_pylist()] == [
            (r["run_id"], r["trace"], 2) for r in runs
        ]
        # the same log from both stores is one measured run (its key is the file's hash)
        assert reader.sql("SELECT count(*) FROM measured_runs").scalar() == 1


def test_a_content_published_without_its_payload_gets_it_from_the_next_publish(
    server: str, tmp_path: Path
) -> None:
    w = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(w, name="w")
        publish(store, server)
        bolt = Bolt(parse_url(server), read_only=False)
        try:  # what an etstore before payloads left: no Payload nodes, no flag
            bolt.run(
                "MATCH (p:Payload) DELETE p WITH count(*) AS n MATCH (c:Content) REMOVE c.payload", write=True
            )
        finally:
            bolt.close()
        with open_store(server) as reader:
            with pytest.raises(StoreError, match=r"did not send its lossless form; publish it again") as got:
                reader.load("w")
            assert "\n" not in str(got.value)
            assert reader.sql("SELECT count(*) FROM traces").scalar() == 1  # listed, without rows
        report = publish(store, server)
        assert report.payloads_sent == 1 and report.changed
        assert publish(store, server).payloads_sent == 0
    with open_store(server) as reader:
        back = reader.load("w")
        assert back.ops.equals(w.ops) and back.deps.equals(w.deps) and back.meta.equals(w.meta)
        assert reader.sql("SELECT count(*) FROM ops").scalar() == w.num_ops


def test_ids_beyond_neo4j_integers_are_refused(server: str, tmp_path: Path) -> None:
    ops = ops_table(
        {
            "rank": pa.array([0, 0], pa.int32()),
            "id": pa.array(np.array([0, 1 << 63], dtype=np.uint64)),
            "name": ["a", "b"],
            "type": ["COMP_NODE", "COMP_NODE"],
        }
    )
    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(Trace(ops=ops, name="huge"))
        with pytest.raises(StoreError, match="column id holds 9223372036854775808"):
            publish(store, server)
    with open_store(server) as reader:
        assert reader.traces() == []
        assert reader.cypher("MATCH (n) WHERE n:Op OR n:Content OR n:Payload RETURN count(n)").scalar() == 0


# ---------------------------------------------------------------- the former Neo4j backend


def _legacy_ingest(
    bolt: Bolt,
    trace: Trace,
    name: str,
    *,
    parent: tuple[str, int] | None = None,
    lineage: list[dict[str, Any]] | None = None,
) -> int:
    """Store ``trace`` as etstore's former Neo4j backend did (its format 3): a catalog content and
    name, the ``Trace`` node, ops and edges, payload chunks; with ``parent`` (name, trace id),
    ``lineage`` rows (``rank``, ``id``, ``parent_id``) as ``BECOMES`` edges and a lineage payload."""
    seq = int(
        bolt.run(
            "MERGE (k:EtstoreCounter {name: 'trace_seq'}) ON CREATE SET k.value = 0 "
            "SET k.value = k.value + 1 RETURN k.value AS v",
            write=True,
        )[0]["v"]
    )
    base = uid_base(seq)
    msgs, _, _ = message_edges(trace, base)
    statements = [
        *node_batches(op_nodes(trace, seq, base), name, 10_000),
        *edge_batches(dep_edges(trace, base), "DEP", 10_000),
        *edge_batches(msgs, "MSG", 10_000),
    ]
    chunks = list(trace_payload(trace))
    if parent is not None:
        statements.append(
            (
                "UNWIND $rows AS r MATCH (a:Op {trace_id: $p, rank: r.rank, id: r.parent_id}) "
                "MATCH (b:Op {trace_id: $s, rank: r.rank, id: r.id}) CREATE (a)-[:BECOMES]->(b)",
                {"rows": lineage or [], "p": parent[1], "s": seq},
                0,
            )
        )
        chunks.append((f"lineage@{parent[1]}", 0, b"lineage rows"))
    for query, params, _ in statements:
        bolt.run(query, params, write=True)
    for table, part, data in chunks:
        bolt.run(
            "CREATE (:EtstorePayload {seq: $s, table: $t, part: $p, data: $d})",
            {"s": seq, "t": table, "p": part, "d": data},
            write=True,
        )
    content = {
        "seq": seq,
        "content_hash": identity(trace),
        "kind": trace.kind,
        "ranks": trace.num_ranks,
        "ops": trace.num_ops,
        "deps": trace.num_deps,
        "missing": trace.num_missing,
        "messages": msgs.num_rows,
        "lineage_from": [parent[1]] if parent else [],
    }
    bolt.run(
        "CREATE (c:EtstoreContent) SET c = $c, c.status = 'ready', c.heartbeat = timestamp(), "
        "c.created = datetime() "
        "CREATE (t:EtstoreTrace {name: $n, seq: $s, parent: $parent, parent_seq: $pseq, source: $source, "
        "params: $params, created: datetime(), status: 'ready'}) "
        "CREATE (:Trace {name: $n, trace_id: $s, kind: c.kind, ranks: c.ranks, ops: c.ops, parent: $parent, "
        "source: $source}) MERGE (f:EtstoreFormat) SET f.version = 3",
        {
            "c": content,
            "n": name,
            "s": seq,
            "parent": parent[0] if parent else None,
            "pseq": parent[1] if parent else None,
            "source": trace.source,
            "params": json.dumps(dict(trace.params), sort_keys=True, default=str),
        },
        write=True,
    )
    return seq


_LEGACY_SCHEMA = [  # the former backend's own constraints and indexes (its format 3)
    "CREATE CONSTRAINT etstore_trace_name IF NOT EXISTS FOR (t:EtstoreTrace) REQUIRE t.name IS UNIQUE",
    "CREATE INDEX etstore_trace_seq_index IF NOT EXISTS FOR (t:EtstoreTrace) ON (t.seq)",
    "CREATE CONSTRAINT etstore_content_seq IF NOT EXISTS FOR (c:EtstoreContent) REQUIRE c.seq IS UNIQUE",
    "CREATE CONSTRAINT etstore_content_hash IF NOT EXISTS "
    "FOR (c:EtstoreContent) REQUIRE (c.content_hash, c.kind) IS UNIQUE",
    "CREATE INDEX etstore_payload_seq IF NOT EXISTS FOR (p:EtstorePayload) ON (p.seq)",
]


@pytest.fixture
def legacy(server: str, tmp_path: Path) -> dict[str, Any]:
    """The test server as the former backend left it: a workload under two names, a trace derived
    from it, a content left loading by a client that died; and the same traces in a store."""
    w = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "local") as store:
        store.ingest(w, name="w")
        derived = expand_stored(store, "w", "ring").report.trace.name
        x = store.load(derived)
        expected = {
            "derived": derived,
            "w": store.load("w"),
            "x": x,
            "lineage": store.sql("SELECT rank, id, parent_id FROM lineage ORDER BY ALL").to_pylist(),
        }
    bolt = Bolt(parse_url(server), read_only=False)
    try:
        for ddl in _LEGACY_SCHEMA:
            bolt.run(ddl, write=True)
        seq = _legacy_ingest(bolt, w, "w")
        _legacy_ingest(bolt, x, derived, parent=("w", seq), lineage=expected["lineage"])
        bolt.run(  # a second name of the workload
            "MATCH (t:EtstoreTrace {name: 'w'}) CREATE (u:EtstoreTrace {name: 'w2', seq: t.seq, "
            "parent: t.parent, parent_seq: t.parent_seq, source: t.source, params: t.params, "
            "created: t.created, status: t.status}) "
            "WITH u MATCH (c:EtstoreContent {seq: u.seq}) CREATE (:Trace {name: 'w2', trace_id: c.seq, "
            "kind: c.kind, ranks: c.ranks, ops: c.ops, parent: null, source: u.source})",
            write=True,
        )
        ghost = _legacy_ingest(bolt, transformer(ranks=4, layers=1, tp=1), "ghost")
        bolt.run("MATCH (c:EtstoreContent {seq: $s}) SET c.status = 'loading'", {"s": ghost}, write=True)
        bolt.run("MATCH (t:EtstoreTrace {seq: $s}) SET t.status = 'loading'", {"s": ghost}, write=True)
    finally:
        bolt.close()
    return {**expected, "seq": seq, "ghost": ghost}


def _check_upgraded(server: str, legacy: dict[str, Any], *, second_name: bool = True) -> None:
    w, x = legacy["w"], legacy["x"]
    names = {"w": w, **({"w2": w} if second_name else {}), legacy["derived"]: x}
    with open_store(server) as reader:
        assert {t.name: (t.kind, t.ops, t.parent) for t in reader.traces()} == {
            name: (trace.kind, trace.num_ops, "w" if trace is x else None) for name, trace in names.items()
        }
        assert {reader.info(n).trace_id for n in ("w", *(["w2"] if second_name else []))} == {legacy["seq"]}
        for name, trace in names.items():
            back = reader.load(name)
            assert (
                back.ops.equals(trace.ops) and back.deps.equals(trace.deps) and back.meta.equals(trace.meta)
            )
            assert dict(back.params) == dict(trace.params)
        lineage = reader.sql(
            "SELECT rank, id, parent_id FROM lineage WHERE trace = $t ORDER BY ALL", {"t": legacy["derived"]}
        )
        assert lineage.to_pylist() == legacy["lineage"]
        becomes = reader.cypher("MATCH (:Op)-[b:BECOMES]->(:Op) RETURN count(b)").scalar()
        assert becomes == len(legacy["lineage"]) > 0
        assert (
            reader.cypher("MATCH (o:Op {trace_id: $g}) RETURN count(o)", {"g": legacy["ghost"]}).scalar() == 0
        )
        left = "MATCH (n) WHERE n:EtstoreContent OR n:EtstoreTrace OR n:EtstorePayload OR n:EtstoreFormat "
        assert reader.cypher(left + "RETURN count(n)").scalar() == 0
        assert reader.cypher("MATCH (t:Trace) RETURN collect(DISTINCT t.store)").scalar() == [LEGACY_STORE]
        indexes = {r["name"] for r in reader.cypher("SHOW INDEXES YIELD name RETURN name").to_pylist()}
        assert not {"etstore_content_hash", "etstore_trace_name", "etstore_payload_seq"} & indexes


def test_a_server_of_the_former_backend_is_refused_then_upgraded_in_place(
    server: str, legacy: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    location = parse_url(server).location
    with pytest.raises(StoreError, match=r"former Neo4j backend \(its format 3\)") as got:
        open_store(server)
    assert str(got.value).endswith(f"python -m etstore.store.upgrade {location}")
    assert main(["--store", server, "ls"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert upgrade_main([server]) == 0
    out = capsys.readouterr().out
    assert out == f"{location} holds what etstore publish writes\n"  # never the credentials
    _check_upgraded(server, legacy)
    assert upgrade_main([server]) == 0  # nothing left to do
    _check_upgraded(server, legacy)


def test_an_interrupted_upgrade_goes_on_and_publish_upgrades_too(
    server: str, legacy: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import etstore.store._neo4j_migrate as migrate

    done: list[int] = []
    real = migrate._content

    def once(bolt: Bolt, seq: int) -> None:
        if done:
            raise KeyboardInterrupt
        real(bolt, seq)
        done.append(seq)

    with monkeypatch.context() as m:
        m.setattr(migrate, "_content", once)
        with pytest.raises(KeyboardInterrupt):
            migrate.upgrade_server(server)
    with pytest.raises(StoreError, match="former Neo4j backend"):  # half done: still refused
        open_store(server)
    with EmbeddedStore(tmp_path / "other") as other:  # a store publishing the same workload
        other.ingest(legacy["w"], name="mine")
        report = publish(other, server)
        assert report.legacy_upgraded == 1  # the content the interrupted upgrade left
        assert (report.contents_present, report.contents_sent) == (1, 0)  # the workload, upgraded before
        other.ingest(legacy["w"], name="w")
        with pytest.raises(StoreError, match=r"has 'w' from another store"):  # the former backend's
            publish(other, server, names=["w"])
    with open_store(server) as reader:
        assert {t.name for t in reader.traces()} == {"w", "w2", legacy["derived"], "mine"}
        assert reader.info("mine").trace_id == reader.info("w").trace_id == legacy["seq"]  # one content
        owners = reader.cypher("MATCH (t:Trace) RETURN t.name AS n, t.store AS s").to_pylist()
        assert {r["n"] for r in owners if r["s"] == LEGACY_STORE} == {"w", "w2", legacy["derived"]}


# how the former backend's formats 2 and 1 differed from its format 3 (what it upgraded from)
_TO_FORMAT2 = [
    "MATCH (t:EtstoreTrace) WITH t ORDER BY t.created WITH t.seq AS seq, collect(t.name)[0] AS first "
    "MATCH (c:EtstoreContent {seq: seq}) SET c.graph_name = first",
    "MATCH (c:EtstoreContent) MATCH (o:Op {trace_id: c.seq}) SET o.trace = c.graph_name REMOVE o.trace_id",
    "MATCH (t:Trace) DELETE t",
    "MATCH (f:EtstoreFormat) SET f.version = 2",
]
_TO_FORMAT1 = [
    "MATCH (t:EtstoreTrace) MATCH (c:EtstoreContent {seq: t.seq}) "
    "SET t.kind = c.kind, t.content_hash = c.content_hash, t.ranks = c.ranks, t.ops = c.ops, "
    "t.deps = c.deps, t.missing = c.missing, t.messages = c.messages, t.heartbeat = c.heartbeat "
    "REMOVE t.parent_seq",
    "MATCH (c:EtstoreContent) DELETE c",
    "MATCH (p:EtstorePayload) WHERE p.table STARTS WITH 'lineage@' SET p.table = 'lineage'",
    "MATCH (f:EtstoreFormat) DELETE f",
]


@pytest.mark.parametrize("version", [2, 1])
def test_older_formats_of_the_former_backend_are_upgraded_too(
    server: str, legacy: dict[str, Any], version: int
) -> None:
    bolt = Bolt(parse_url(server), read_only=False)
    try:
        if version == 1:  # one name per content then
            bolt.run("MATCH (t) WHERE (t:EtstoreTrace OR t:Trace) AND t.name = 'w2' DELETE t", write=True)
        for query in _TO_FORMAT2 + (_TO_FORMAT1 if version == 1 else []):
            bolt.run(query, write=True)
    finally:
        bolt.close()
    with pytest.raises(StoreError, match=rf"former Neo4j backend \(its format {version}\)"):
        open_store(server)
    upgrade_store(server)
    _check_upgraded(server, legacy, second_name=version > 1)


def test_runs_the_former_backend_recorded_in_its_local_copy_are_kept(
    server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    serve(server, tmp_path / "published", {"w": transformer(ranks=2, layers=1, tp=1)})
    copy = tmp_path / "copy"
    copy.mkdir()
    with Warehouse.open(copy / "warehouse.duckdb") as wh:  # the former backend's copy, a run in it
        wh.execute(
            "CREATE TABLE _etstore_mirror_contents "
            "(trace_id BIGINT PRIMARY KEY, content_hash VARCHAR, lineage VARCHAR, server VARCHAR)"
        )
        record_run(wh, simulate(transformer(ranks=2, layers=1, tp=1), Topology.ring(2)), trace_name="old")
    with caplog.at_level(logging.WARNING), Neo4jStore(server, warehouse=copy) as reader:
        assert reader.sql("SELECT count(*) FROM runs").scalar() == 0  # the copy holds what was published
        assert reader.sql("SELECT trace FROM ops GROUP BY trace").scalar() == "w"
    kept = copy / FORMER_COPY
    assert str(kept) in caplog.text
    with Warehouse.open(kept, read_only=True) as wh:
        assert wh.query("SELECT trace FROM runs").to_pylist() == [{"trace": "old"}]
    with Neo4jStore(server, warehouse=copy) as reader:  # set aside once: the new copy is reused
        assert reader.sql("SELECT count(*) FROM ops").scalar() > 0
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith("former")) == [FORMER_COPY]
