"""A store opened read-only cannot write (or read) files through any query, by the engines' own means.

Every write route of issue 19 is tried through the library and through ``etstore sql`` /
``etstore cypher`` without ``--write``: the error is one line, the target does not exist and
the store is unchanged (same ``ls``, same row counts). DuckDB refuses by its configuration
(read-only, external access off, configuration locked); Ladybug's queries run in a process
the kernel's Landlock sandbox keeps from files; Neo4j runs them in READ access mode on a
server that refuses ``file:///`` URLs. ``--write`` still writes where asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import QueryError, StoreError
from etstore.store import EmbeddedStore, open_store
from etstore.store._graph_reader import SandboxedGraph, sandbox_available
from etstore.store.warehouse import Warehouse
from etstore.testing import clear_server, serve, trace_from_nodes, two_rank_allreduce

SECRET = "hunter2-not-for-queries"

# two_rank_allreduce: ids 0..4 on each of 2 ranks (send, recv, reduce, send, recv), chained
OPS, DEPS = 2 * 5, 2 * 4

needs_sandbox = pytest.mark.skipif(
    not sandbox_available(),
    reason="the kernel has no Landlock (Linux 5.13+): read-only Cypher is not sandboxed",
)


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # no traceback
    assert lines[0].startswith("etstore: error: ")
    return lines[0]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory (relative targets land here) and a file no query may read."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (tmp_path / "secret.csv").write_text(f"{SECRET},1\n")
    return tmp_path


@pytest.fixture
def filled(work: Path) -> Path:
    """An embedded store holding one hand-built trace ``t``."""
    path = work / "store"
    with EmbeddedStore(path) as s:
        s.ingest(trace_from_nodes(*two_rank_allreduce()), name="t")
    return path


def _state(capsys: pytest.CaptureFixture[str], location: str) -> tuple[object, ...]:
    """What ``ls`` prints, the row counts, the graph's node count."""
    capsys.readouterr()
    assert main(["--store", location, "ls", "--format", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    with open_store(location, read_only=True) as s:
        counts = tuple(s.sql(f"SELECT count(*) FROM {t}").scalar() for t in ("ops", "deps", "traces"))
        nodes = s.cypher("MATCH (n:Op) RETURN count(n)").scalar()
    return [(r["name"], r["ops"], r["deps"]) for r in listing], counts, nodes


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


# ------------------------------------------------------------------ SQL (DuckDB)

SQL_ROUTES = [
    ("copy-csv", "COPY ops TO '{out}'", "out.csv"),
    ("copy-parquet", "COPY (SELECT * FROM ops) TO '{out}' (FORMAT parquet)", "x.parquet"),
    ("export", "EXPORT DATABASE '{out}'", "dump"),
    ("attach", "ATTACH '{out}' AS evil", "new.duckdb"),
    ("create-in-attached", "CREATE TABLE evil.t AS SELECT 1 AS a", "new.duckdb"),
    ("read-by-path", "SELECT * FROM read_csv('{secret}')", "out.csv"),
    ("glob", "SELECT * FROM glob('{secret}')", "out.csv"),
    ("install", "INSTALL httpfs", "out.csv"),
    ("turn-access-on", "SET enable_external_access = true", "out.csv"),
    ("unlock", "SET lock_configuration = false", "out.csv"),
    ("write-table", "CREATE TABLE evil AS SELECT 1 AS a", "out.csv"),
]
SQL_REFUSAL = (
    r"SQL error: (Permission Error: Cannot access (file|directory) .* disabled by configuration"
    r"|Invalid Input Error: Cannot change configuration option .* locked"
    r"|Catalog Error: .*evil"
    r"|Invalid Input Error: Cannot execute statement of type \"CREATE\" .* read-only mode)"
)


@pytest.mark.parametrize(("route", "sql", "target"), SQL_ROUTES, ids=[r[0] for r in SQL_ROUTES])
def test_sql_cannot_touch_files(
    capsys: pytest.CaptureFixture[str], filled: Path, work: Path, route: str, sql: str, target: str
) -> None:
    before, files = _state(capsys, str(filled)), _files(filled)
    query = sql.format(out=work / "cwd" / target, secret=work / "secret.csv")
    with open_store(filled, read_only=True) as s, pytest.raises(QueryError, match=SQL_REFUSAL) as got:
        s.sql(query)
    assert "\n" not in str(got.value) and SECRET not in str(got.value)
    capsys.readouterr()
    assert main(["--store", str(filled), "sql", query]) == 1
    out, err = capsys.readouterr()
    line = _one_line_error(err)
    assert SECRET not in line + out
    assert not (work / "cwd" / target).exists() and not list((work / "cwd").iterdir())
    assert _state(capsys, str(filled)) == before == ([("t", OPS, DEPS)], (OPS, DEPS, 1), OPS)
    assert _files(filled) == files


def test_relative_targets_land_nowhere(capsys: pytest.CaptureFixture[str], filled: Path, work: Path) -> None:
    for query in (
        "COPY ops TO 'out.csv'",
        "COPY traces TO 'out.parquet' (FORMAT parquet)",
        "EXPORT DATABASE 'dump'",
    ):
        assert main(["--store", str(filled), "sql", query]) == 1
        _one_line_error(capsys.readouterr().err)
    assert not list((work / "cwd").iterdir())


def test_read_only_warehouse_file_stays_read_only(filled: Path, work: Path) -> None:
    """No detour: the file cannot be detached and attached again writable, nor opened twice."""
    path = filled / "warehouse.duckdb"
    with Warehouse.open(path, read_only=True) as wh:
        assert wh.read_only
        assert wh.query("SELECT current_setting('enable_external_access')").scalar() is False
        for sql in (
            f"ATTACH '{path}' AS again (READ_WRITE)",
            "RESET enable_external_access",
            "DETACH warehouse",
        ):
            with pytest.raises(QueryError, match="SQL error: "):
                wh.query(sql)
        with pytest.raises(QueryError, match="read-only mode"):
            wh.query("INSERT INTO traces (name, trace_id) VALUES ('evil', 99)")
        assert wh.query("SELECT count(*) FROM ops").scalar() == OPS  # reading still works


def test_fresh_store_opened_read_only_is_locked_too(work: Path) -> None:
    """A store the read-only open creates gets its schema, then refuses like any other."""
    path = work / "fresh"
    with open_store(path, read_only=True) as s:
        assert s.sql("SELECT count(*) FROM ops").scalar() == 0
        with pytest.raises(QueryError, match="disabled by configuration"):
            s.sql("COPY (SELECT 1) TO 'out.csv'")
        if sandbox_available():
            with pytest.raises(QueryError, match="Permission denied"):
                s.cypher("COPY (MATCH (n:Op) RETURN n.uid) TO 'out.csv'")
    assert not list((work / "cwd").iterdir())


def test_a_new_store_queried_read_only_reads_empty_and_refuses_writes(
    capsys: pytest.CaptureFixture[str], work: Path
) -> None:
    """A directory that holds no store yet, queried read-only: the store is made (its warehouse
    is the store), SQL sees empty tables (not "database does not exist") and still refuses
    every write."""
    path = work / "nowarehouse"
    assert main(["--store", str(path), "sql", "SELECT count(*) AS n FROM ops", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 0}]
    for query, refusal in (
        ("CREATE TABLE x (a INT)", "read-only mode"),
        ("COPY (SELECT 1) TO 'out.csv'", "disabled by configuration"),
    ):
        assert main(["--store", str(path), "sql", query]) == 1
        err = capsys.readouterr().err
        assert refusal in err and err.count("\n") == 1
    with open_store(path, read_only=True) as s:
        assert s.sql("SELECT count(*) FROM information_schema.tables WHERE table_name = 'x'").scalar() == 0
    assert not list((work / "cwd").iterdir())


# ------------------------------------------------------------------ Cypher (Ladybug)

CYPHER_ROUTES = [
    (
        "copy-to",
        "COPY (MATCH (n:Op) RETURN n.name) TO '{out}'",
        "out.csv",
        "Cannot open file .*Permission denied",
    ),
    ("export", "EXPORT DATABASE '{out}'", "dump", "Failed to create directory .*Permission denied"),
    (
        "load-from",
        "LOAD FROM '{secret}' (file_format='csv', header=false) RETURN *",
        "out.csv",
        "Cannot open file .*secret.csv: Permission denied",
    ),
    (
        "load-environment",
        "LOAD FROM '/proc/self/environ' (file_format='csv', header=false) RETURN *",
        "out.csv",
        "Cannot open file /proc/self/environ: Permission denied",
    ),
    ("create", "CREATE (:Op {{uid: 123456789, trace: 'evil'}})", "out.csv", "read-only"),
]


@needs_sandbox
@pytest.mark.parametrize(
    ("route", "cypher", "target", "refusal"), CYPHER_ROUTES, ids=[r[0] for r in CYPHER_ROUTES]
)
def test_cypher_cannot_touch_files(
    capsys: pytest.CaptureFixture[str],
    filled: Path,
    work: Path,
    route: str,
    cypher: str,
    target: str,
    refusal: str,
) -> None:
    before, files = _state(capsys, str(filled)), _files(filled)
    query = cypher.format(out=work / "cwd" / target, secret=work / "secret.csv")
    with (
        open_store(filled, read_only=True) as s,
        pytest.raises(QueryError, match=f"Cypher error: .*{refusal}") as got,
    ):
        s.cypher(query)
    assert "\n" not in str(got.value) and SECRET not in str(got.value)
    capsys.readouterr()
    assert main(["--store", str(filled), "cypher", query]) == 1
    out, err = capsys.readouterr()
    assert SECRET not in _one_line_error(err) + out
    assert not (work / "cwd" / target).exists() and not list((work / "cwd").iterdir())
    assert _state(capsys, str(filled)) == before == ([("t", OPS, DEPS)], (OPS, DEPS, 1), OPS)
    assert _files(filled) == files


@needs_sandbox
def test_sandboxed_cypher_answers_like_the_engine(filled: Path) -> None:
    """Rows, parameters, nodes and the worker's life: same answers as an in-process query."""
    with EmbeddedStore(filled) as s:
        want = s.cypher("MATCH (n:Op) WHERE n.rank = $r RETURN n ORDER BY n.id", {"r": 1}).to_arrow()
    with EmbeddedStore(filled, read_only=True) as s:
        got = s.cypher("MATCH (n:Op) WHERE n.rank = $r RETURN n ORDER BY n.id", {"r": 1}).to_arrow()
        assert got.equals(want) and got.num_rows == 5
        assert [r[0] for r in s.cypher("MATCH (n:Op {rank: 0}) RETURN n.id ORDER BY n.id")] == [0, 1, 2, 3, 4]
        assert len(s.cypher("MATCH (n:Op) WHERE n.uid < 0 RETURN n.uid")) == 0
        reader = s.graph
        assert isinstance(reader, SandboxedGraph)
    assert reader._proc.poll() is not None  # closing the store ended the process


@needs_sandbox
def test_a_killed_sandbox_is_one_line(filled: Path) -> None:
    with EmbeddedStore(filled, read_only=True) as s:
        s.cypher("MATCH (n:Op) RETURN count(n)")
        s.graph._proc.kill()
        with pytest.raises(StoreError, match=r"graph: the read-only Cypher process was killed by signal 9$"):
            s.cypher("MATCH (n:Op) RETURN count(n)")


@needs_sandbox
def test_a_parameter_that_cannot_travel_is_one_line(filled: Path) -> None:
    with EmbeddedStore(filled, read_only=True) as s, pytest.raises(QueryError, match="cannot be passed"):
        s.cypher("MATCH (n:Op) WHERE n.uid = $u RETURN n.uid", {"u": lambda: 1})


def test_a_real_process_prints_one_line(filled: Path, work: Path) -> None:
    """The command as users run it, in its own process: exit status 1 and one line on stderr."""
    queries = [("sql", "COPY ops TO 'out.csv'")]
    if sandbox_available():
        queries.append(("cypher", "COPY (MATCH (n:Op) RETURN n.name) TO 'out.csv'"))
    run_cli = [sys.executable, "-c", "import sys; from etstore.cli import main; sys.exit(main())"]
    for command, query in queries:
        done = subprocess.run(
            [*run_cli, "--store", str(filled), command, query],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and done.stdout == ""
        assert "out.csv" in _one_line_error(done.stderr)
    assert not list((work / "cwd").iterdir())


# ------------------------------------------------------------------ --write still writes


def test_write_flag_still_writes(capsys: pytest.CaptureFixture[str], filled: Path, work: Path) -> None:
    out = work / "cwd" / "sql.csv"
    assert (
        main(["--store", str(filled), "sql", "--write", f"COPY (SELECT count(*) AS n FROM ops) TO '{out}'"])
        == 0
    )
    assert out.read_text().split() == ["n", str(OPS)]
    graph_out = work / "cwd" / "cypher.csv"
    query = f"COPY (MATCH (n:Op) RETURN count(n) AS n) TO '{graph_out}' (header=true)"
    assert main(["--store", str(filled), "cypher", "--write", query]) == 0
    assert graph_out.read_text().split() == ["n", str(OPS)]
    capsys.readouterr()


# ------------------------------------------------------------------ Neo4j


@pytest.fixture
def server(work: Path, monkeypatch: pytest.MonkeyPatch, neo4j_url: str) -> Iterator[str]:
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(work / "warehouse"))
    serve(neo4j_url, work / "published", {"t": trace_from_nodes(*two_rank_allreduce())})
    yield neo4j_url
    clear_server(neo4j_url)


NEO4J_CYPHER = [
    ("load-csv", "LOAD CSV FROM 'file://{secret}' AS line RETURN line", "allow_csv_import_from_file_urls"),
    (
        "load-csv-root",
        "LOAD CSV FROM 'file:///etc/passwd' AS line RETURN line",
        "allow_csv_import_from_file_urls",
    ),
    ("create", "CREATE (:Op {{uid: 123456789, trace: 'evil'}})", "read access mode"),
    ("copy-to", "COPY (MATCH (n:Op) RETURN n.name) TO '{out}'", "Invalid input"),
    ("export", "EXPORT DATABASE '{out}'", "Invalid input"),
]


@pytest.mark.parametrize(("route", "cypher", "refusal"), NEO4J_CYPHER, ids=[r[0] for r in NEO4J_CYPHER])
def test_neo4j_read_only_cypher(
    capsys: pytest.CaptureFixture[str], server: str, work: Path, route: str, cypher: str, refusal: str
) -> None:
    before = _state(capsys, server)
    query = cypher.format(out=work / "cwd" / "out.csv", secret=work / "secret.csv")
    with (
        open_store(server, read_only=True) as s,
        pytest.raises(QueryError, match=f"Cypher error: .*{refusal}") as got,
    ):
        s.cypher(query)
    assert "\n" not in str(got.value) and SECRET not in str(got.value) and "root:" not in str(got.value)
    capsys.readouterr()
    assert main(["--store", server, "cypher", query]) == 1
    out, err = capsys.readouterr()
    assert SECRET not in _one_line_error(err) + out and "root:" not in out
    assert not list((work / "cwd").iterdir())
    assert _state(capsys, server) == before == ([("t", OPS, DEPS)], (OPS, DEPS, 1), OPS)


@pytest.mark.parametrize(("route", "sql", "target"), SQL_ROUTES[:6], ids=[r[0] for r in SQL_ROUTES[:6]])
def test_neo4j_read_only_sql(
    capsys: pytest.CaptureFixture[str], server: str, work: Path, route: str, sql: str, target: str
) -> None:
    before = _state(capsys, server)
    query = sql.format(out=work / "cwd" / target, secret=work / "secret.csv")
    with open_store(server, read_only=True) as s, pytest.raises(QueryError, match=SQL_REFUSAL):
        s.sql(query)
    capsys.readouterr()
    assert main(["--store", server, "sql", query]) == 1
    _one_line_error(capsys.readouterr().err)
    assert not list((work / "cwd").iterdir())
    assert _state(capsys, server) == before == ([("t", OPS, DEPS)], (OPS, DEPS, 1), OPS)
    with open_store(server) as s:  # the local copy still serves the next reader
        assert s.sql("SELECT count(*) FROM ops").scalar() == OPS
