"""Read-only stays read-only whatever the environment, and a read-only file system can be read
(issue 35, round 2, items 5 and 7c).

- The Cypher sandbox starts isolated with a clean environment: ``PYTHONPATH=/`` no longer
  widens what it may read (it let ``LOAD FROM '/etc/passwd'`` print the file).
- Read-only SQL never writes beside the store (it wrote into ``warehouse.duckdb.tmp/`` when
  that existed): it spills into a private temporary directory, removed on close, and keeps to
  ``$ETSTORE_MEMORY_BUDGET`` (it took DuckDB's 80% of RAM), so it runs out of core.
- ``expand --where`` text runs in a DuckDB that may touch no file (it could ``read_csv``).
- A read-only Neo4j session refuses what administers the server (``TERMINATE TRANSACTIONS``
  killed another client's publish; ``dbms.killConnections``, ``db.clearQueryCaches``).
- A store on a read-only file system answers ``ls``, ``sql``, ``show``, ``export`` and Cypher.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.algorithms.expand import expand
from etstore.cli import main
from etstore.errors import QueryError
from etstore.store import EmbeddedStore, open_store
from etstore.store._graph_reader import sandbox_available
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_target import parse_url
from etstore.testing import clear_server, serve, trace_from_nodes, two_rank_allreduce
from etstore.workloads import transformer

SECRET = "hunter2-not-for-queries"
OPS = 10  # two_rank_allreduce

_SCRIPT = Path(sys.executable).parent / "etstore"
CLI = [sys.executable, str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "etstore.cli"]

needs_sandbox = pytest.mark.skipif(
    not sandbox_available(),
    reason="the kernel has no Landlock (Linux 5.13+): read-only Cypher is not sandboxed",
)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etstore: error: "), err
    return lines[0]


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A store holding ``t``, its graph index built; a secret file beside it."""
    (tmp_path / "secret.csv").write_text(f"{SECRET},1\n")
    path = tmp_path / "store"
    with EmbeddedStore(path) as s:
        s.ingest(trace_from_nodes(*two_rank_allreduce()), name="t")
        s.cypher("MATCH (n:Op) RETURN count(n)")
    return path


# ------------------------------------------------------------------ 5a: the sandbox's environment


@needs_sandbox
@pytest.mark.parametrize("where", ["/", "secret-dir"])
def test_the_environment_does_not_widen_the_cypher_sandbox(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """``PYTHONPATH`` used to reach the sandboxed process, whose import path is what it may read."""
    path = os.pathsep.join(
        p for p in ("/" if where == "/" else str(tmp_path), os.environ.get("PYTHONPATH")) if p
    )
    query = f"LOAD FROM '{tmp_path / 'secret.csv'}' (file_format='csv', header=false) RETURN *"
    env = {**os.environ, "PYTHONPATH": path, "CI": "true"}
    done = subprocess.run(
        [*CLI, "--store", str(filled), "cypher", query], capture_output=True, text=True, timeout=120, env=env
    )
    assert SECRET not in done.stdout + done.stderr
    assert done.returncode == 1 and "Permission denied" in _one_line(done.stderr)
    # the same through the library, with the variable in this process's environment
    monkeypatch.setenv("PYTHONPATH", path)
    with open_store(filled) as s, pytest.raises(QueryError, match="Permission denied") as got:
        s.cypher(query)
    assert SECRET not in str(got.value)
    with open_store(filled) as s:  # queries still run
        assert s.cypher("MATCH (n:Op) RETURN count(n)").scalar() == OPS


# ------------------------------------------------------------------ 5b: read-only SQL's memory


def test_read_only_sql_spills_outside_the_store_and_keeps_to_the_budget(
    filled: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A query larger than the budget runs out of core: DuckDB spills into a directory of the
    process's own under the system's temporary directory, removed when the store closes; never
    into ``warehouse.duckdb.tmp/`` beside the store (DuckDB's default whenever it exists)."""
    beside = filled / "warehouse.duckdb.tmp"
    beside.mkdir()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    tempfile.tempdir = None  # read $TMPDIR again
    monkeypatch.setenv("ETSTORE_MEMORY_BUDGET", "64MiB")
    settings = "SELECT current_setting('memory_limit') AS m, current_setting('temp_directory') AS t"
    big_sort = "SELECT count(*) AS n FROM (SELECT r FROM range(30000000) t(r) ORDER BY hash(r))"  # ~240 MB
    try:
        with open_store(filled) as s:
            got = s.sql(settings).to_pylist()[0]
            assert got["m"] == "64.0 MiB" and Path(got["t"]).parent == temp
            assert s.sql(big_sort).to_pylist() == [{"n": 30_000_000}]  # four times the budget
            with pytest.raises(QueryError, match="locked"):
                s.sql("SET temp_directory = '/tmp'")
            with pytest.raises(QueryError, match="locked"):
                s.sql("SET memory_limit = '8GB'")
        assert not list(beside.iterdir()) and not list(temp.iterdir())  # the spill is gone
        capsys.readouterr()
        assert main(["--store", str(filled), "sql", big_sort, "--format", "csv"]) == 0
        assert capsys.readouterr().out.split() == ["n", "30000000"]
        assert not list(beside.iterdir()) and not list(temp.iterdir())
    finally:
        tempfile.tempdir = None


# ------------------------------------------------------------------ 5c: expand --where


def test_a_where_fragment_touches_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text(f"{SECRET},1\n")
    work = transformer(ranks=8, tp=2, layers=2, name="w")
    reads = f"comm_type = 'ALL_REDUCE' AND (SELECT count(*) FROM read_csv('{secret}')) > 0"
    with pytest.raises(QueryError, match=r"where predicate .* disabled by configuration") as got:
        expand(work, "ring", where=reads)
    assert "\n" not in str(got.value) and SECRET not in str(got.value)
    assert expand(work, "ring", where="comm_type = 'ALL_REDUCE'").collectives.num_rows  # plain ones run
    store = tmp_path / "s"
    with EmbeddedStore(store) as s:
        s.ingest(work, name="w")
    capsys.readouterr()
    assert main(["--store", str(store), "expand", "w", "--algo", "ring", "--where", reads]) == 1
    out, err = capsys.readouterr()
    assert "disabled by configuration" in _one_line(err) and SECRET not in out + err
    with open_store(store) as s:
        assert [t.name for t in s.traces()] == ["w"]


# ------------------------------------------------------------------ 7c: a read-only file system


def _read_only_copy(src: Path, dst: Path) -> Iterator[Path]:
    """``src`` copied to ``dst``, made read-only: a read-only bind mount as root (root ignores file
    modes), file modes elsewhere."""
    shutil.copytree(src, dst / "rw" / "store")
    view = dst / "ro"
    view.mkdir()
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "--bind", str(dst / "rw"), str(view)], capture_output=True)
        mounted = done.returncode == 0
        if mounted:
            done = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["umount", str(view)], check=False)
                mounted = False
        if not mounted:
            pytest.skip("running as root without mount: file modes would not stop root's writes")
    else:
        view.rmdir()
        view = dst / "rw"
        for p in sorted(view.rglob("*"), reverse=True):
            p.chmod(p.stat().st_mode & 0o555)
        view.chmod(0o555)
    try:
        yield view / "store"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(view)], check=False)
        else:
            for p in [view, *view.rglob("*")]:
                p.chmod(p.stat().st_mode | 0o200)


@pytest.fixture
def read_only_store(filled: Path, tmp_path: Path) -> Iterator[Path]:
    for leftover in ("lock", "lock.readers", "listing.json"):  # none to reuse: a store shipped bare
        (filled / leftover).unlink(missing_ok=True)
    yield from _read_only_copy(filled, tmp_path / "ro-fs")


def test_a_store_on_a_read_only_file_system_can_be_read(
    read_only_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(OSError):
        (read_only_store / "probe").write_text("x")  # it is read-only indeed
    loc = str(read_only_store)
    capsys.readouterr()
    assert main(["--store", loc, "ls", "--format", "json"]) == 0
    assert [(t["name"], t["ops"]) for t in json.loads(capsys.readouterr().out)] == [("t", OPS)]
    assert main(["--store", loc, "sql", "--format", "json", "SELECT count(*) AS n FROM ops"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": OPS}]
    assert main(["--store", loc, "show", "t"]) == 0
    assert "10 ops" in capsys.readouterr().out
    assert main(["--store", loc, "export", "t", "--out", str(tmp_path / "t")]) == 0
    assert sorted(p.name for p in tmp_path.glob("t.*.et")) == ["t.0.et", "t.1.et"]
    capsys.readouterr()
    assert main(["--store", loc, "cypher", "--format", "json", "MATCH (n:Op) RETURN count(n) AS n"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": OPS}]
    # a write is refused in one line, and nothing was written
    assert main(["--store", loc, "rm", "t"]) == 1
    assert "cannot lock the store for writing" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in read_only_store.iterdir()) == ["graph", "warehouse.duckdb"]


# ------------------------------------------------------------------ 5: Neo4j read sessions


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neo4j_url: str) -> Iterator[str]:
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    serve(neo4j_url, tmp_path / "published", {"t": trace_from_nodes(*two_rank_allreduce())})
    yield neo4j_url
    clear_server(neo4j_url)


NEO4J_ADMIN = [
    ("terminate", "TERMINATE TRANSACTIONS 'neo4j-transaction-1'", "TERMINATE TRANSACTIONS"),
    (
        "show-then-terminate",
        "SHOW TRANSACTIONS YIELD transactionId AS t WHERE t <> '' TERMINATE TRANSACTIONS t",
        "TERMINATE TRANSACTIONS",
    ),
    ("hidden", "/* read */ CYPHER 5 terminate\ntransaction 'neo4j-transaction-1'", "TERMINATE TRANSACTIONS"),
    ("kill-connections", "CALL `dbms`.`killConnections`(['bolt-1'])", "CALL dbms.killConnections"),
    ("caches", "CALL db.clearQueryCaches()", "CALL db.clearQueryCaches"),
    ("create-user", "CREATE USER evil SET PASSWORD 'abcdefgh1'", "CREATE USER"),
    ("stop", "USE system STOP DATABASE neo4j", "STOP DATABASE"),
    ("drop", "DROP INDEX nope IF EXISTS", "DROP INDEX"),
]


@pytest.mark.parametrize(("route", "query", "what"), NEO4J_ADMIN, ids=[r[0] for r in NEO4J_ADMIN])
def test_neo4j_read_sessions_cannot_administer(
    capsys: pytest.CaptureFixture[str], server: str, route: str, query: str, what: str
) -> None:
    with open_store(server) as s, pytest.raises(QueryError, match=f"{what} administers the server") as got:
        s.cypher(query)
    assert "\n" not in str(got.value)
    capsys.readouterr()
    assert main(["--store", server, "cypher", query]) == 1
    assert what in _one_line(capsys.readouterr().err)


def test_neo4j_read_sessions_still_read_and_show(server: str) -> None:
    with open_store(server) as s:
        assert s.cypher("MATCH (n:Op) RETURN count(n)").scalar() == OPS
        assert s.cypher("SHOW TRANSACTIONS YIELD transactionId RETURN count(*) AS n").scalar() >= 1
        assert s.cypher("CALL db.labels() YIELD label RETURN count(label)").scalar() >= 1
        assert s.cypher("MATCH (n:Op) WHERE n.name = 'TERMINATE TRANSACTIONS' RETURN count(n)").scalar() == 0


def test_a_neo4j_reader_cannot_kill_another_clients_write(server: str) -> None:
    """A write transaction held open by another client (a publish) survives every reader's attempt
    to end it."""
    held = threading.Event()
    finish = threading.Event()
    outcome: list[object] = []

    def writer() -> None:
        bolt = Bolt(parse_url(server), read_only=False)
        with bolt.session(write=True) as session:
            tx = session.begin_transaction()
            try:
                tx.run("CREATE (:EtstoreProbe {at: timestamp()})").consume()
                held.set()
                finish.wait(60)
                tx.run("MATCH (p:EtstoreProbe) DETACH DELETE p").consume()
                tx.commit()
                outcome.append("committed")
            except Exception as exc:  # terminated: what the reader must not be able to do
                outcome.append(exc)
        bolt.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(60)
        with open_store(server) as r:
            others = (
                "SHOW TRANSACTIONS YIELD transactionId AS t, currentQuery AS q WHERE NOT q CONTAINS 'TRANS'"
            )
            ids = [row[0] for row in r.cypher(f"{others} RETURN t")]
            assert ids  # the writer's, which a reader may see
            kill = f"{others} TERMINATE TRANSACTIONS t YIELD message RETURN message"
            for query in (kill, "TERMINATE TRANSACTIONS $ids"):
                with pytest.raises(QueryError, match="administers the server"):
                    r.cypher(query, {"ids": ids} if "$ids" in query else None)
    finally:
        finish.set()
        thread.join(60)
    assert outcome == ["committed"]
