"""Several machines publishing to one Neo4j server at the same moment: every trace and run of
every store lands there once, a content two stores hold is sent once, and publishing it all
again changes nothing.

Each machine is an OS process with its own embedded store (or two processes with one store
directory), released together through a file barrier once imported, publishing to the test
server (``ETSTORE_TEST_NEO4J``) through the CLI or through :func:`etstore.app.publish.publish`
with a transaction per statement (so loads overlap for longer). What the server holds
afterwards is compared with each store's own SQL, then read back through the server's URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from etstore.algorithms.generators import generate
from etstore.app.expand import expand_stored
from etstore.app.publish import store_identity
from etstore.app.runs import record_run
from etstore.sim import simulate
from etstore.store import EmbeddedStore, open_store
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_target import parse_url
from etstore.testing import clear_server
from etstore.topology import Topology
from etstore.workloads import transformer

# one machine: imports, says it is ready, waits for the start signal, publishes, prints its report
MACHINE = """
import json, sys, time
from pathlib import Path
ready, go, mode, store, url = sys.argv[1:]
from etstore.app.publish import publish
from etstore.cli import main
from etstore.store import EmbeddedStore
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.002)
if mode == "cli":
    sys.exit(main(["--store", store, "publish", url, "--format", "json"]))
with EmbeddedStore(store, read_only=True) as s:
    print(json.dumps(publish(s, url, batch_rows=50, single_tx_rows=0).as_row()))
"""

Job = tuple[Path, str]
"""A store directory and how it is published: ``cli``, or ``paged`` (a transaction per statement)."""


@pytest.fixture
def server(neo4j_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test server, emptied before and after."""
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "server-warehouse"))
    clear_server(neo4j_url)
    yield neo4j_url
    clear_server(neo4j_url)


def _store(path: Path, seed: int, *, identity: bool) -> Path:
    """A store holding a workload and a ring algorithm (their contents set by ``seed``), named
    after the directory, the workload's expansion with it (lineage), and a simulated run of
    the workload and of its expansion."""
    name = path.name
    with EmbeddedStore(path) as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1, seed=seed), name=name)
        store.ingest(generate("ring", coll="allreduce", ranks=2, chunks=1 + seed % 4), name=f"{name}-ring")
        expand_stored(store, name, f"{name}-ring")
        for n in (name, f"{name}-expanded"):
            record_run(store.warehouse, simulate(store.load(n), Topology.ring(2)), trace_name=n)
        if identity:  # a store published read-only has published before; the CLI makes its own
            store_identity(store)
    return path


def _race(url: str, jobs: Sequence[Job], where: Path) -> list[dict[str, Any]]:
    """Publish every job at once, one process each; their reports."""
    where.mkdir(parents=True, exist_ok=True)
    go = where / "go"
    go.unlink(missing_ok=True)
    ready = [where / f"ready-{i}" for i in range(len(jobs))]
    for r in ready:
        r.unlink(missing_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MACHINE, str(r), str(go), mode, str(path), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CI": "true"},
        )
        for r, (path, mode) in zip(ready, jobs, strict=True)
    ]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a machine did not start"
        time.sleep(0.01)
    go.touch()
    reports = []
    for p, (path, _mode) in zip(procs, jobs, strict=True):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"{path.name}: {err.strip().splitlines()[-1:]}"
        reports.append(json.loads(out))
    return reports


def _local(paths: Sequence[Path]) -> dict[str, Any]:
    """What the stores hold, as the server should: contents by (hash, kind), names, lineage
    between contents, runs (with their rank rows) by store."""
    contents: dict[tuple[str, str], dict[str, int]] = {}
    names: dict[str, tuple[str, tuple[str, str]]] = {}
    lineage: dict[tuple[tuple[str, str], tuple[str, str]], int] = {}
    runs: Counter[tuple[str, int, str, float, int]] = Counter()
    for path in dict.fromkeys(paths):
        with EmbeddedStore(path, read_only=True) as store:
            sid = store_identity(store, create=False)
            assert sid is not None
            by_id = {}
            for r in store.sql(
                "SELECT trace_id, content_hash, kind, ops, deps, messages FROM contents "
                "WHERE status = 'ready'"
            ).to_pylist():
                key = (r["content_hash"], r["kind"])
                by_id[r["trace_id"]] = key
                contents[key] = {k: int(r[k]) for k in ("ops", "deps", "messages")}
            for r in store.sql("SELECT name, trace_id FROM traces").to_pylist():
                names[r["name"]] = (sid, by_id[r["trace_id"]])
            for r in store.sql(
                "SELECT trace_id, parent_trace_id, count(*) AS n FROM trace_lineage GROUP BY ALL"
            ).to_pylist():
                lineage[(by_id[r["trace_id"]], by_id[r["parent_trace_id"]])] = int(r["n"])
            for r in store.sql(
                "SELECT r.run_id, r.trace, r.total_ns, count(b.rank) AS ranks FROM runs r "
                "LEFT JOIN rank_breakdown b USING (run_id) GROUP BY ALL"
            ).to_pylist():
                runs[(sid, int(r["run_id"]), r["trace"], float(r["total_ns"]), int(r["ranks"]))] += 1
    return {"contents": contents, "names": names, "lineage": lineage, "runs": runs}


def _cypher(url: str, query: str) -> list[dict[str, Any]]:
    with open_store(url) as remote:
        return remote.cypher(query).to_pylist()


def _check(url: str, paths: Sequence[Path]) -> None:
    """The server holds every content, name, lineage edge and run of the stores exactly once,
    nothing else, and nothing left loading; the read view sees every run once."""
    want = _local(paths)
    got = _cypher(
        url,
        "MATCH (c:Content) RETURN c.content_hash AS h, c.kind AS k, c.status AS status, c.trace_id AS t, "
        "c.ops AS ops, c.payload AS payload, "
        "COUNT { MATCH (o:Op) WHERE o.trace_id = c.trace_id } AS op_nodes, "
        "COUNT { MATCH (o:Op)-[:DEP]->() WHERE o.trace_id = c.trace_id } AS deps, "
        "COUNT { MATCH (o:Op)-[:MSG]->() WHERE o.trace_id = c.trace_id } AS messages",
    )
    assert Counter((r["h"], r["k"]) for r in got) == Counter(dict.fromkeys(want["contents"], 1))
    assert {r["status"] for r in got} == {"ready"} and all(r["payload"] for r in got)
    ids = {(r["h"], r["k"]): int(r["t"]) for r in got}
    for r in got:
        local = want["contents"][(r["h"], r["k"])]
        assert (r["op_nodes"], r["deps"], r["messages"]) == (local["ops"], local["deps"], local["messages"])
    assert _cypher(url, "MATCH (o:Op) RETURN count(o) AS n")[0]["n"] == sum(
        c["ops"] for c in want["contents"].values()
    )
    chunks = _cypher(
        url, "MATCH (p:Payload) RETURN p.trace_id AS t, p.table AS tb, p.part AS part, count(*) AS n"
    )
    assert {r["t"] for r in chunks} == set(ids.values()) and {r["n"] for r in chunks} == {1}
    becomes = _cypher(
        url,
        "MATCH (p:Op)-[:BECOMES]->(c:Op) RETURN c.trace_id AS c, p.trace_id AS p, count(*) AS n",
    )
    assert {(r["c"], r["p"]): r["n"] for r in becomes} == {
        (ids[c], ids[p]): n for (c, p), n in want["lineage"].items()
    }
    traces = _cypher(url, "MATCH (t:Trace) RETURN t.name AS name, t.store AS store, t.trace_id AS t")
    assert {r["name"]: (r["store"], r["t"]) for r in traces} == {
        n: (sid, ids[key]) for n, (sid, key) in want["names"].items()
    }
    runs = _cypher(
        url,
        "MATCH (r:Run) RETURN r.store AS s, r.run_id AS id, r.trace AS trace, r.total_ns AS total, "
        "COUNT { (r)-[:RANK]->() } AS ranks, "
        "COUNT { (r)-[:OF]->(:Trace {name: r.trace, store: r.store}) } AS of, "
        "COUNT { (r)-[:OF]->() } AS links",
    )
    assert Counter((r["s"], r["id"], r["trace"], float(r["total"]), r["ranks"]) for r in runs) == want["runs"]
    assert {(r["of"], r["links"]) for r in runs} == {(1, 1)}
    stats = _cypher(
        url,
        "MATCH (r:Run)-[:COLLECTIVE]->(c:CollectiveStat) "
        "WITH r, c.comm_type AS t, c.algorithm AS a, c.group_size AS g, c.size_bytes AS b, count(*) AS n "
        "RETURN max(n) AS n",
    )
    assert stats[0]["n"] == 1
    stores = _cypher(url, "MATCH (s:Store) RETURN s.store_id AS s")
    assert sorted(r["s"] for r in stores) == sorted({sid for sid, _ in want["names"].values()})
    counter = _cypher(url, "MATCH (k:EtstoreCounter) RETURN k.name AS name, k.value AS v")
    assert len(counter) == 1 and counter[0]["v"] >= max(ids.values())
    with open_store(url) as remote:  # the read view: every run once, ids renumbered where they collide
        copy = remote.sql("SELECT count(*) AS n, count(DISTINCT run_id) AS ids FROM runs").to_pylist()
        assert copy == [{"n": want["runs"].total(), "ids": want["runs"].total()}]
        rows = remote.sql("SELECT trace, total_ns FROM runs").to_pylist()
        assert Counter((r["trace"], float(r["total_ns"])) for r in rows) == Counter(
            (trace, total) for (_s, _i, trace, total, _r), n in want["runs"].items() for _ in range(n)
        )
        assert sorted(t.name for t in remote.traces()) == sorted(want["names"])
        assert remote.sql("SELECT count(*) FROM traces").scalar() == len(want["names"])


def _state(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every node and relationship on the server: element id -> labels or type, and properties."""
    with open_store(url) as s:
        nodes = s.cypher("MATCH (n) RETURN elementId(n) AS i, labels(n) AS l, properties(n) AS p")
        rels = s.cypher("MATCH ()-[r]->() RETURN elementId(r) AS i, type(r) AS l, properties(r) AS p")
    return (
        {r["i"]: (r["l"], r["p"]) for r in nodes.to_pylist()},
        {r["i"]: (r["l"], r["p"]) for r in rels.to_pylist()},
    )


def _more_runs(path: Path, n: int) -> None:
    """``n`` more simulated runs of the store's workload (on contents published already)."""
    with EmbeddedStore(path) as store:
        trace = store.load(path.name)
        for bw in range(n):
            result = simulate(trace, Topology.ring(2, bandwidth_gb_per_s=10.0 + bw))
            record_run(store.warehouse, result, trace_name=path.name)


def _race_checked(
    url: str, jobs: Sequence[Job], where: Path, published: Sequence[Path] = ()
) -> tuple[list[Any], list[Any]]:
    """Race ``jobs`` and check the server against their stores (and the ``published`` before);
    add runs to every store and race again (the runs race alone: their traces are there) and
    check; race once more: nothing changes. The reports of the first two races."""
    reports = _race(url, jobs, where / "first")
    racing = [path for path, _mode in jobs]
    _check(url, [*racing, *published])
    for path in dict.fromkeys(racing):
        _more_runs(path, 3)
    more = _race(url, jobs, where / "more")
    _check(url, [*racing, *published])
    assert not [r for r in more if r["contents_sent"] or r["names_added"]]
    before = _state(url)
    again = _race(url, jobs, where / "again")
    assert not [r for r in again if any(r[k] for k in ("contents_sent", "names_added", "names_updated"))]
    assert not [r for r in again if any(r["records_added"].values())]
    assert _state(url) == before  # the same nodes and relationships, not one property changed
    return reports, more


MODES = pytest.mark.parametrize("mode", ["cli", "paged"])


@MODES
def test_stores_of_different_traces_racing_land_every_trace_and_run_once(
    server: str, tmp_path: Path, mode: str
) -> None:
    jobs = [(_store(tmp_path / f"d{i}", seed=10 + i, identity=mode == "paged"), mode) for i in range(4)]
    reports, more = _race_checked(server, jobs, tmp_path / "race")
    assert [r["contents_sent"] for r in reports] == [3] * 4  # each its workload, algorithm, expansion
    assert [r["records_added"]["Run"] for r in more] == [3] * 4


@MODES
def test_stores_of_the_same_content_racing_share_one_copy(server: str, tmp_path: Path, mode: str) -> None:
    jobs = [(_store(tmp_path / f"s{i}", seed=7, identity=mode == "paged"), mode) for i in range(4)]
    reports, more = _race_checked(server, jobs, tmp_path / "race")
    assert sum(r["contents_sent"] for r in reports) == 3  # one copy of the workload, algorithm, expansion
    assert [r["contents_sent"] + r["contents_present"] for r in reports] == [3] * 4
    assert sum(r["records_added"]["Run"] for r in reports) == 8  # every store's own two runs
    assert _cypher(server, "MATCH (c:Content) RETURN count(c) AS n")[0]["n"] == 3
    assert [r["records_added"]["Run"] for r in more] == [3] * 4


@MODES
def test_one_store_published_twice_at_once_doubles_nothing(server: str, tmp_path: Path, mode: str) -> None:
    path = _store(tmp_path / "one", seed=3, identity=mode == "paged")
    reports, more = _race_checked(server, [(path, mode), (path, mode), (path, mode)], tmp_path / "race")
    assert sum(r["contents_sent"] for r in reports) == 3
    assert sum(r["records_added"]["Run"] for r in reports) == 2
    assert sum(r["records_added"]["Run"] for r in more) == 3  # each new run by one of the three
    assert len({r["store_id"] for r in reports}) == 1


def test_machines_racing_onto_a_fresh_server(server: str, tmp_path: Path) -> None:
    """A server that never saw a publish (no constraints or indexes yet), raced by stores of
    their own traces, stores sharing a content, and one store twice, by both paths."""
    bolt = Bolt(parse_url(server), read_only=False)
    try:
        for shown, drop in (("CONSTRAINTS", "CONSTRAINT"), ("INDEXES", "INDEX")):  # constraints own indexes
            for r in bolt.run(f"SHOW {shown} YIELD name, type WHERE type <> 'LOOKUP' RETURN name"):
                bolt.run(f"DROP {drop} {r['name']}")
    finally:
        bolt.close()
    own = [_store(tmp_path / f"own{i}", seed=20 + i, identity=True) for i in range(2)]
    same = [_store(tmp_path / f"same{i}", seed=30, identity=True) for i in range(2)]
    jobs = [(own[0], "cli"), (own[1], "paged"), (same[0], "cli"), (same[1], "paged"), (own[0], "paged")]
    _race_checked(server, jobs, tmp_path / "race")


@MODES
def test_stores_racing_to_complete_contents_already_there(server: str, tmp_path: Path, mode: str) -> None:
    """The contents are on the server from a store that holds them unrelated, and without their
    payload (as an older etstore sent them): the racing stores, which hold them with lineage,
    add the ``BECOMES`` edges and the payload once between them."""
    racing = [_store(tmp_path / f"r{i}", seed=5, identity=mode == "paged") for i in range(3)]
    with EmbeddedStore(racing[0], read_only=True) as first, EmbeddedStore(tmp_path / "other") as other:
        for name in ("r0", "r0-ring", "r0-expanded"):
            other.ingest(first.load(name), name=f"other-{name}")
        store_identity(other)
    _race(server, [(tmp_path / "other", "cli")], tmp_path / "other-race")
    bolt = Bolt(parse_url(server), read_only=False)
    try:
        bolt.run("MATCH (p:Payload) DELETE p")
        bolt.run("MATCH (c:Content) SET c.payload = false")
    finally:
        bolt.close()
    jobs = [(path, mode) for path in racing]
    reports, _more = _race_checked(server, jobs, tmp_path / "race", [tmp_path / "other"])
    assert sum(r["lineage_added"] for r in reports) == 1
    assert sum(r["payloads_sent"] for r in reports) == 3
    assert [r["contents_present"] for r in reports] == [3] * 3


def test_two_stores_racing_for_one_name_leave_it_to_one(server: str, tmp_path: Path) -> None:
    """Stores publishing the same names (their own contents) at once: each name lands once, for
    one store; a store that lost a name ends with one line and leaves no content of it."""
    stores = [_store(tmp_path / side / "w", seed=40 + i, identity=True) for i, side in enumerate("ab")]
    go, ready = tmp_path / "go", [tmp_path / f"ready-{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MACHINE, str(r), str(go), "cli", str(path), server],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CI": "true"},
        )
        for r, path in zip(ready, stores, strict=True)
    ]
    while not all(r.exists() for r in ready):
        assert all(p.poll() is None for p in procs), "a machine did not start"
        time.sleep(0.01)
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    failed = [e for p, e in zip(procs, errors, strict=True) if p.returncode != 0]
    assert failed and all(
        e.count("\n") == 1 and ("from another store" in e or "taken by another store" in e) for e in failed
    ), errors
    traces = _cypher(server, "MATCH (t:Trace) RETURN t.name AS name, t.trace_id AS t ORDER BY name")
    assert [r["name"] for r in traces] == ["w", "w-expanded", "w-ring"]
    contents = _cypher(server, "MATCH (c:Content) RETURN c.trace_id AS t, c.status AS s, c.ops AS ops")
    assert sorted(r["t"] for r in contents) == sorted(r["t"] for r in traces)  # every one named, once
    assert {r["s"] for r in contents} == {"ready"}
    ops = _cypher(server, "MATCH (o:Op) RETURN count(o) AS n")[0]["n"]
    assert ops == sum(r["ops"] for r in contents)  # nothing left of what the loser sent
