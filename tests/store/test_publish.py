"""``etstore publish``: an embedded store published to a real Neo4j server, read back through the
server's URL (Cypher on the graph, SQL on the client-side copy of traces and runs).

The server is the test server (``ETSTORE_TEST_NEO4J``), emptied before each case; what it
holds is compared with the store's own graph index and tables, query by query.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etstore.algorithms.generators import generate
from etstore.app._publish_records import RECORD_KINDS
from etstore.app.expand import expand_stored
from etstore.app.ingest_files import ingest_paths
from etstore.app.publish import publish, store_identity
from etstore.app.runs import record_run
from etstore.cli import main
from etstore.errors import StoreError, UnknownTraceError
from etstore.sim import simulate
from etstore.store import EmbeddedStore, open_store
from etstore.store._neo4j_publish import Server
from etstore.store._neo4j_records import SHAPES
from etstore.store._neo4j_target import parse_url
from etstore.store.graph import TUNER_STEP_PROPERTIES
from etstore.testing import clear_server
from etstore.topology import Topology
from etstore.workloads import transformer

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "nccl_tests" / "superbench_nccl_allreduce.log"
TUNER = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"

COUNTS = {
    "ops": "MATCH (o:Op) RETURN count(o) AS n",
    "deps": "MATCH (:Op)-[r:DEP]->(:Op) RETURN count(r) AS n",
    "data deps": "MATCH (:Op)-[r:DEP {kind: 'data'}]->(:Op) RETURN count(r) AS n",
    "messages": "MATCH (:Op)-[r:MSG]->(:Op) RETURN count(r) AS n",
    "message bytes": "MATCH (:Op)-[r:MSG]->(:Op) RETURN sum(r.comm_size) AS n",
    "becomes": "MATCH (:Op)-[r:BECOMES]->(:Op) RETURN count(r) AS n",
    "traces": "MATCH (t:Trace) RETURN count(t) AS n",
    "tuner steps": "MATCH (s:TunerStep) RETURN count(s) AS n",
    "linked tuner steps": "MATCH (s:TunerStep) WHERE s.trace_id IS NOT NULL RETURN count(s) AS n",
}
PER_NAME = (
    "MATCH (t:Trace), (o:Op) WHERE o.trace_id = t.trace_id "
    "RETURN t.name AS name, t.kind AS kind, t.parent AS parent, count(o) AS ops, "
    "max(o.duration_micros) AS longest, sum(o.rank) AS ranks ORDER BY name"
)
EXPANDED = (
    "MATCH (p:Trace {name: 'w'}), (c:Op)-[:BECOMES]->(x:Op) WHERE c.trace_id = p.trace_id "
    "RETURN c.rank AS rank, c.name AS name, count(x) AS n ORDER BY rank, name"
)


# the published tables a reader's SQL copy holds, each as the store holds it (in one order)
TABLES = {
    "runs": "run_id",
    "rank_breakdown": "run_id, rank",
    "comparisons": "comparison_id, rank NULLS FIRST",
    "opportunities": "trace, id",
    "measured_runs": "run_id",
    "measurements": "run_id, line, in_place",
    "tuner_runs": "run_id",
}
# what of a tuner step is published (the rest of its row stays in the store)
STEP_COLUMNS = ", ".join(
    [
        "run_id",
        "trace",
        *(c for c in TUNER_STEP_PROPERTIES if c not in ("uid", "run", "content_hash", "trace_id")),
    ]
)


@pytest.fixture
def server(neo4j_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test server, emptied before and after."""
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "server-warehouse"))
    clear_server(neo4j_url)
    yield neo4j_url
    clear_server(neo4j_url)


def _filled(path: Path) -> EmbeddedStore:
    """A store with a workload under two names, its expansion (lineage: ``BECOMES``), an
    algorithm, runs simulated on both, a comparison, opportunities, a measured run and a
    tuner run whose steps link to the algorithm."""
    store = EmbeddedStore(path)
    w = transformer(ranks=2, layers=1, tp=1)
    store.ingest(w, name="w")
    store.ingest(w, name="w2")  # the same content: one content on the server, two Trace nodes
    expand_stored(store, "w", "ring")
    record_run(store.warehouse, simulate(store.load("w"), Topology.ring(2)), trace_name="w")
    record_run(store.warehouse, simulate(store.load("w-expanded"), Topology.ring(2)), trace_name="w-expanded")
    store.ingest(generate("ring", coll="allreduce", ranks=4, chunks=1))  # what the tuner run's steps ran
    ingest_paths(store, [str(LOG), str(TUNER)])
    # what `compare` and `overlap` record (rows as their recorders write them)
    store.warehouse.execute(
        "INSERT INTO comparisons (comparison_id, trace_a, trace_b, run_a, run_b, topology, rank, "
        "total_a_ns, total_b_ns, diff_ns, speedup) "
        "SELECT 1, 'w', 'w-expanded', 1, 2, 'ring:2', r, a, 8.0, 8.0 - a, a / 8 "
        "FROM (SELECT r, 10.0 + coalesce(r, 0) AS a FROM (VALUES (NULL::INTEGER), (0), (1)) v(r))"
    )
    store.warehouse.execute(
        "INSERT INTO opportunities VALUES ('w', 'overlap', 0, 3, 4, 125.0, 'move', 1), "
        "('w', 'reorder', 1, 5, 6, 50.0, 'swap', 2)"
    )
    return store


def _counts(store: Any) -> dict[str, Any]:
    got = {k: store.cypher(q).scalar() for k, q in COUNTS.items()}
    got["per name"] = store.cypher(PER_NAME).to_pylist()
    got["expanded"] = store.cypher(EXPANDED).to_pylist()
    return got


def _server_state(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every node and relationship on the server: element id -> labels or type, and properties."""
    with open_store(url) as s:
        nodes = s.cypher("MATCH (n) RETURN elementId(n) AS i, labels(n) AS l, properties(n) AS p")
        rels = s.cypher("MATCH ()-[r]->() RETURN elementId(r) AS i, type(r) AS l, properties(r) AS p")
    return (
        {r["i"]: (r["l"], r["p"]) for r in nodes.to_pylist()},
        {r["i"]: (r["l"], r["p"]) for r in rels.to_pylist()},
    )


def test_published_graph_and_runs_match_the_store_and_republishing_changes_nothing(
    server: str, tmp_path: Path
) -> None:
    phases: list[str] = []
    with _filled(tmp_path / "store") as store:
        local = _counts(store)
        runs = store.sql("SELECT trace, total_ns FROM runs ORDER BY run_id").to_pylist()
        tables = {t: store.sql(f"SELECT * FROM {t} ORDER BY {o}").to_pylist() for t, o in TABLES.items()}
        steps = store.sql(f"SELECT {STEP_COLUMNS} FROM tuner_steps ORDER BY run_id, step").to_pylist()
        ranks = store.sql("SELECT count(*) FROM rank_breakdown").scalar()
        measured = store.sql("SELECT count(*) FROM measurements").scalar()
        report = publish(store, server, progress=lambda phase, done, total: phases.append(phase))
        # w = w2, the expansion and its algorithm, the tuner's algorithm
        assert report.contents_sent == 4 and report.contents_present == 0
        assert report.names_added == 5 and report.changed
        assert report.records_added == {
            "Run": 2,
            "Comparison": 1,
            "Opportunity": 2,
            "MeasuredRun": 1,
            "TunerRun": 1,
            "Calibration": 0,
            "Sweep": 0,
        }
        assert {"contents", "names", "Run"} <= set(phases)
        assert local["becomes"] > 0 and local["linked tuner steps"] > 0
        before = _server_state(server)
        again = publish(store, server)
        assert not again.changed, again
        assert again.contents_present == 4 and not any(again.records_added.values())
    assert _server_state(server) == before  # the same nodes and relationships, not one property changed
    with open_store(server) as remote:  # the server read through its URL: the published graph and runs
        assert _counts(remote) == local
        for table, order in TABLES.items():  # the SQL copy holds the published runs as the store does
            assert remote.sql(f"SELECT * FROM {table} ORDER BY {order}").to_pylist() == tables[table], table
        assert (
            remote.sql(f"SELECT {STEP_COLUMNS} FROM tuner_steps ORDER BY run_id, step").to_pylist() == steps
        )
        got = remote.cypher(
            "MATCH (r:Run)-[:OF]->(t:Trace) RETURN r.trace AS trace, r.total_ns AS total_ns, "
            "t.trace_id = r.trace_id AS linked ORDER BY r.run_id"
        ).to_pylist()
        assert got == [{**r, "linked": True} for r in runs]
        assert remote.cypher("MATCH (:Run)-[:RANK]->(x:RankTime) RETURN count(x)").scalar() == ranks
        busbw = remote.cypher(
            "MATCH (r:Run {trace: 'w'})-[:COLLECTIVE]->(c:CollectiveStat) "
            "RETURN c.comm_type AS type, c.count AS n, c.busbw_gb_per_s > 0 AS positive"
        ).to_pylist()
        assert busbw and all(row["positive"] for row in busbw)
        cmp = remote.cypher(
            "MATCH (a:Run)<-[:A]-(c:Comparison)-[:B]->(b:Run), (c)-[:RANK]->(x:ComparisonRank) "
            "RETURN a.trace AS a, b.trace AS b, c.speedup AS speedup, count(x) AS ranks"
        ).to_pylist()
        assert cmp == [{"a": "w", "b": "w-expanded", "speedup": 10.0 / 8, "ranks": 2}]
        opp = remote.cypher("MATCH (o:Opportunity)-[:IN]->(:Trace {name: 'w'}) RETURN count(o)").scalar()
        assert opp == 2
        assert (
            remote.cypher("MATCH (:MeasuredRun)-[:POINT]->(m:Measurement) RETURN count(m)").scalar()
            == measured
        )
        # two names of one content: one set of ops, two Trace nodes with one trace id
        ids = remote.cypher(
            "MATCH (t:Trace) WHERE t.name IN ['w', 'w2'] RETURN DISTINCT t.trace_id"
        ).to_pylist()
        assert len(ids) == 1
        assert remote.cypher("MATCH (c:Content) RETURN count(c)").scalar() == 4


def test_prune_removes_names_runs_and_unnamed_contents(server: str, tmp_path: Path) -> None:
    with _filled(tmp_path / "store") as store:
        publish(store, server)
        store.remove("w2")
        store.remove("w-expanded")
        store.warehouse.execute("DELETE FROM runs WHERE trace = 'w-expanded'")
        kept = publish(store, server)  # default: add and update only
        assert not kept.changed
        with open_store(server) as remote:
            assert remote.cypher("MATCH (t:Trace) RETURN count(t)").scalar() == 5
        pruned = publish(store, server, prune=True)
        assert (pruned.names_removed, pruned.contents_removed) == (2, 1)  # the expansion's content went
        assert pruned.records_removed["Run"] == 1
        local = _counts(store)
    with open_store(server) as remote:
        assert _counts(remote) == local
        assert remote.cypher("MATCH (r:Run) RETURN collect(r.trace)").scalar() == ["w"]
        assert remote.cypher("MATCH (c:Content) RETURN count(c)").scalar() == 3


def test_a_publish_killed_midway_leaves_nothing_visible(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import etstore.app.publish as publishing

    def fail(*args: Any, **kwargs: Any) -> Iterator[Any]:
        raise RuntimeError("killed after the ops")
        yield

    with EmbeddedStore(tmp_path / "store") as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1), name="w")
        local = _counts(store)
        with monkeypatch.context() as m:
            m.setattr(publishing, "_dep_batches", fail)
            with pytest.raises(RuntimeError, match="killed after the ops"):
                publish(store, server, single_tx_rows=0)  # ops committed batch by batch
            with open_store(server) as remote:  # a failure removes what it wrote
                assert (
                    remote.cypher(
                        "MATCH (n) WHERE n:Op OR n:Trace OR n:Content OR n:Payload RETURN count(n)"
                    ).scalar()
                    == 0
                )
            m.setattr(Server, "purge", lambda self, trace_id: None)  # a client that dies cleans nothing
            with pytest.raises(RuntimeError):
                publish(store, server, single_tx_rows=0)
        with open_store(server) as remote:
            assert remote.cypher("MATCH (o:Op) RETURN count(o)").scalar() == local["ops"]  # written...
            assert remote.cypher(PER_NAME).to_pylist() == []  # ...but no name reaches them
            assert remote.cypher("MATCH (c:Content) RETURN c.status").scalar() == "loading"
        with pytest.raises(StoreError, match=r"being published or removed by another client after 0\.5 s"):
            publish(store, server, wait_s=0.5)  # its heartbeat is fresh: it could be another client's
        report = publish(store, server, stale_after_s=0)
        assert report.swept == 1 and report.contents_sent == 1
    with open_store(server) as remote:
        assert _counts(remote) == local


def test_stores_share_a_server_without_sharing_names(server: str, tmp_path: Path) -> None:
    w = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "a") as a:
        a.ingest(w, name="w")
        publish(a, server)
        a_id = store_identity(a)
    with EmbeddedStore(tmp_path / "b") as b:
        b.ingest(w, name="w")
        b.ingest(transformer(ranks=2, layers=2, tp=1), name="big")
        with pytest.raises(StoreError, match=r"has 'w' from another store"):
            publish(b, server)
        with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
            publish(b, server, names=["nope"])
        b.ingest(w, name="w-b")
        report = publish(b, server, names=["w-b", "big"])
        assert (report.contents_present, report.contents_sent, report.names_added) == (1, 1, 2)
        assert store_identity(b) != a_id
        big_ops = b.info("big").ops
    with open_store(server) as remote:
        rows = remote.cypher(
            "MATCH (t:Trace) RETURN t.name AS name, t.trace_id AS id ORDER BY name"
        ).to_pylist()
        by_name = {r["name"]: r["id"] for r in rows}
        assert by_name["w"] == by_name["w-b"] and by_name["big"] != by_name["w"]
        assert remote.cypher("MATCH (o:Op) RETURN count(o)").scalar() == w.num_ops + big_ops
        dup = remote.cypher("MATCH (o:Op) WITH o.uid AS u, count(*) AS n WHERE n > 1 RETURN count(u)")
        assert dup.scalar() == 0
        assert remote.cypher("MATCH (s:Store) RETURN count(s)").scalar() == 2


def test_cli_publish(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store"
    with EmbeddedStore(path) as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1), name="w")
    assert main(["--store", str(path), "publish", server, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["contents_sent"], doc["names_added"]) == (1, 1)
    assert doc["location"] == parse_url(server).location  # never the credentials
    assert main(["--store", str(path), "publish", server]) == 0
    out = capsys.readouterr().out
    assert "contents already there" in out and parse_url(server).password not in out
    assert main(["--store", str(path), "publish", server, "--trace", "nope"]) == 1
    assert "no trace named 'nope'" in capsys.readouterr().err


def test_one_line_errors_without_a_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "store"
    with EmbeddedStore(path) as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1), name="w")
        with pytest.raises(StoreError, match="not a Neo4j URL"):
            publish(store, "http://db.example:7687")
        with pytest.raises(StoreError, match="cannot reach Neo4j") as down:
            publish(store, "bolt://u:hunter2@127.0.0.1:1")
        assert "hunter2" not in str(down.value)
    with (
        EmbeddedStore(tmp_path / "never", read_only=True) as never,
        pytest.raises(StoreError, match="has not published before and is open read-only"),
    ):
        publish(never, "bolt://127.0.0.1:1")
    assert main(["--store", str(path), "publish", "bolt://u:hunter2@127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach Neo4j" in err and "hunter2" not in err


def test_lineage_and_links_follow_whichever_side_comes_later(server: str, tmp_path: Path) -> None:
    with _filled(tmp_path / "store") as store:
        first = publish(store, server, names=["w-expanded"])  # the child alone: no parent to link
        assert first.records_added["Run"] == 1 and first.records_added["Comparison"] == 1
        assert first.records_added["TunerRun"] == 0  # about no trace: only with everything
        with open_store(server) as remote:
            assert remote.cypher(COUNTS["becomes"]).scalar() == 0
            assert remote.cypher("MATCH (:Comparison)-[r:A|B]->(:Run) RETURN count(r)").scalar() == 1
        publish(store, server)  # the parent arrives: its BECOMES edges to the child come with it
        local = _counts(store)
    with open_store(server) as remote:
        assert _counts(remote) == local
        assert remote.cypher("MATCH (:Comparison)-[r:A|B]->(:Run) RETURN count(r)").scalar() == 2
        assert remote.cypher("MATCH (:Run)-[r:OF]->(:Trace) RETURN count(r)").scalar() == 2


def test_lineage_between_contents_another_store_published(server: str, tmp_path: Path) -> None:
    with _filled(tmp_path / "store") as store:
        local = _counts(store)
        w, expanded = store.load("w"), store.load("w-expanded")
        with EmbeddedStore(tmp_path / "other") as other:  # the same two contents, unrelated there
            other.ingest(w, name="other-w")
            other.ingest(expanded, name="other-x")
            publish(other, server)
        report = publish(store, server, names=["w", "w-expanded"])
        assert (report.contents_sent, report.contents_present, report.lineage_added) == (0, 2, 1)
        assert not publish(store, server).lineage_added  # recorded: not sent twice
    with open_store(server) as remote:
        assert remote.cypher(COUNTS["becomes"]).scalar() == local["becomes"]
        assert remote.cypher(EXPANDED).to_pylist() == local["expanded"]


def test_small_pages_and_batches_give_the_same_graph(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import etstore.app.publish as publishing

    monkeypatch.setattr(publishing, "_PAGE", 7)  # every table read in many pages
    with _filled(tmp_path / "store") as store:
        local = _counts(store)
        report = publish(store, server, batch_rows=3, single_tx_rows=0)  # a transaction per statement
        assert report.contents_sent == 4
    with open_store(server) as remote:
        assert _counts(remote) == local


def test_what_publish_sends_is_what_a_reader_reads_back() -> None:
    """One protocol: every kind of record publish sends has the shape the reader's copy reads."""
    sent = [(k.label, [(label, rel) for label, rel, _sql in k.children]) for k in RECORD_KINDS]
    read = [(s.label, [(c.label, c.rel) for c in s.children]) for s in SHAPES]
    assert sent == read
