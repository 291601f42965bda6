"""Tuner runs in the store: tables, links to stored algorithms, the two views, Cypher, docs SQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from etstore.algorithms.generators import generate
from etstore.app.ingest_files import ingest_paths
from etstore.app.publish import publish
from etstore.app.runs import record_sweep
from etstore.app.tuner import remove_tuner_run, store_tuner_run
from etstore.cli import main
from etstore.errors import StoreError, TraceFormatError, UnknownTraceError
from etstore.formats import read_msccl_xml
from etstore.formats.tuner import read_tuner_log
from etstore.sim.sweep import sweep
from etstore.store import EmbeddedStore, Store, open_store
from etstore.store.warehouse import Warehouse
from etstore.testing import clear_server

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "examples" / "tuner" / "nccl_tuner_4r.csv"
JSONL = ROOT / "examples" / "tuner" / "rl_tuner_4r.jsonl"
RING_XML = ROOT / "examples" / "algorithms" / "ring_allreduce_4r.xml"


def _algorithms(store: Store) -> None:
    """The two algorithms the example trajectories run: the MSCCL-IR ring and a generated tree."""
    store.ingest(read_msccl_xml(RING_XML))  # ring_allreduce_4r
    store.ingest(generate("tree", coll="allreduce", ranks=4, chunks=1))  # tree-allreduce-4r-1c


@pytest.fixture
def tuned(tmp_path: Path) -> Iterator[EmbeddedStore]:
    with EmbeddedStore(tmp_path / "store") as s:
        _algorithms(s)
        stats = ingest_paths(s, [CSV, JSONL])
        assert [(t.name, t.rows, t.linked, t.created) for t in stats.tuner] == [
            ("nccl_tuner_4r", 12, 5, True),  # Tree on lines 5, 6, 7, 10; line 13 names the ring
            ("rl_tuner_4r", 4, 2, True),  # Tree on lines 1 and 5
        ]
        yield s


def _rows(store: Store, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    return store.sql(sql, params).to_pylist()


# ---------------------------------------------------------------- tables


def test_runs_and_steps_match_the_files(tuned: EmbeddedStore) -> None:
    runs = _rows(tuned, "SELECT run_id, name, format, rows, linked, source FROM tuner_runs ORDER BY run_id")
    assert [(r["run_id"], r["name"], r["format"], r["rows"], r["linked"]) for r in runs] == [
        (1, "nccl_tuner_4r", "csv", 12, 5),
        (2, "rl_tuner_4r", "jsonl", 4, 2),
    ]
    assert runs[0]["source"] == str(CSV)
    steps = _rows(
        tuned,
        "SELECT step, line, size_bytes, algorithm, protocol, channels, chunk_bytes, algorithm_trace, trace, "
        "trace_rule, time_us, extra FROM tuner_steps WHERE run_id = 1 ORDER BY step",
    )
    assert len(steps) == 12
    # line 13: allreduce,1048576,4,1,dgx-a-4g,,Simple,2,,ring_allreduce_4r,175.0,8.987,1
    assert steps[10] == {
        "step": 10,
        "line": 13,
        "size_bytes": 1048576,
        "algorithm": None,
        "protocol": "Simple",
        "channels": 2,
        "chunk_bytes": None,
        "algorithm_trace": "ring_allreduce_4r",
        "trace": "ring_allreduce_4r",
        "trace_rule": "named",
        "time_us": 175.0,
        "extra": '{"explore": "1"}',
    }
    links = [(s["algorithm"], s["trace"], s["trace_rule"]) for s in steps]
    assert links.count(("Tree", "tree-allreduce-4r-1c", "matched")) == 4
    # Ring: the stored ring is MSCCL-IR XML (no generator, its own name); NVLS: nothing stored
    assert links.count(("Ring", None, None)) == 6 and links[11] == ("NVLS", None, None)


def test_same_bytes_store_once_and_names(tuned: EmbeddedStore, tmp_path: Path) -> None:
    copy = tmp_path / "renamed.txt"
    copy.write_bytes(CSV.read_bytes())
    again = ingest_paths(tuned, [copy]).tuner[0]
    assert (again.name, again.run_id, again.created, again.rows, again.linked) == (
        "nccl_tuner_4r",
        1,
        False,
        12,
        5,
    )
    assert _rows(tuned, "SELECT count(*) AS n FROM tuner_steps") == [{"n": 16}]
    other = tmp_path / "nccl_tuner_4r.csv"
    other.write_text(CSV.read_text().replace("200.0", "201.0"))
    assert ingest_paths(tuned, [other]).tuner[0].name == "nccl_tuner_4r-2"
    third = tmp_path / "third.csv"
    third.write_text(CSV.read_text().replace("200.0", "202.0"))
    with pytest.raises(StoreError, match=r"tuner run 'rl_tuner_4r' already holds another file"):
        store_tuner_run(tuned, read_tuner_log(third), name="rl_tuner_4r")
    assert _rows(tuned, "SELECT count(*) AS n FROM tuner_runs") == [{"n": 3}]


def test_bad_row_stores_nothing(tuned: EmbeddedStore, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(CSV.read_text().replace("65536,4,1,dgx-a-4g,Tree", "65536,4,1,dgx-a-4g,Tree,extra"))
    with pytest.raises(TraceFormatError, match=r"bad\.csv:10: 14 cells; the header on line 2 has 13"):
        ingest_paths(tuned, [bad])
    assert _rows(tuned, "SELECT count(*) AS n FROM tuner_runs") == [{"n": 2}]
    assert tuned.cypher("MATCH (s:TunerStep) RETURN count(s)").scalar() == 16


def test_a_warehouse_failure_leaves_no_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_append = Warehouse.append

    def failing_append(wh: Warehouse, table: str, rows: pa.Table) -> None:
        if table == "tuner_steps":  # the run's row is in, its steps are refused
            raise StoreError("SQL error: disk full")
        real_append(wh, table, rows)

    with EmbeddedStore(tmp_path / "s") as s:
        _algorithms(s)
        monkeypatch.setattr(Warehouse, "append", failing_append)
        with pytest.raises(StoreError, match="disk full"):
            store_tuner_run(s, read_tuner_log(CSV))
        monkeypatch.undo()
        assert _rows(s, "SELECT count(*) AS n FROM tuner_runs") == [{"n": 0}]
        assert _rows(s, "SELECT count(*) AS n FROM tuner_steps") == [{"n": 0}]
        assert s.cypher("MATCH (t:TunerStep) RETURN count(t)").scalar() == 0
        # and the same file stores once the warehouse takes it
        assert store_tuner_run(s, read_tuner_log(CSV)).linked == 5
        assert s.cypher("MATCH (t:TunerStep) RETURN count(t)").scalar() == 12


def test_remove_tuner_run(tuned: EmbeddedStore) -> None:
    remove_tuner_run(tuned, "nccl_tuner_4r")
    assert _rows(tuned, "SELECT name FROM tuner_runs") == [{"name": "rl_tuner_4r"}]
    assert _rows(tuned, "SELECT DISTINCT run_id FROM tuner_steps") == [{"run_id": 2}]
    assert tuned.cypher("MATCH (s:TunerStep) RETURN DISTINCT s.run AS run").to_pylist() == [
        {"run": "rl_tuner_4r"}
    ]
    with pytest.raises(UnknownTraceError, match=r"no tuner run named 'nccl_tuner_4r'"):
        remove_tuner_run(tuned, "nccl_tuner_4r")


_JOINED = (
    "MATCH (s:TunerStep), (o:Op) WHERE o.trace_id = s.trace_id "
    "RETURN s.run AS run, s.step AS step, count(o) AS ops ORDER BY run, step"
)


def test_removing_a_trace_keeps_the_steps(tuned: EmbeddedStore) -> None:
    ring = [{"run": "nccl_tuner_4r", "step": 10, "ops": 120}]
    tree = [{"run": r, "step": n, "ops": 60} for r, n in [("nccl_tuner_4r", 2), ("nccl_tuner_4r", 3)]]
    tree += [{"run": r, "step": n, "ops": 60} for r, n in [("nccl_tuner_4r", 4), ("nccl_tuner_4r", 7)]]
    tree += [{"run": "rl_tuner_4r", "step": n, "ops": 60} for n in (0, 3)]
    assert tuned.cypher(_JOINED).to_pylist() == sorted(ring + tree, key=lambda r: (r["run"], r["step"]))
    tuned.remove("ring_allreduce_4r")  # its ops leave the graph index; the steps stay
    assert tuned.cypher("MATCH (s:TunerStep) RETURN count(s)").scalar() == 16
    assert tuned.cypher(_JOINED).to_pylist() == tree  # the ring's step reaches nothing
    tuned.remove("tree-allreduce-4r-1c")  # the last trace
    assert tuned.cypher("MATCH (s:TunerStep) RETURN count(s)").scalar() == 16
    assert tuned.cypher(_JOINED).to_pylist() == []
    assert tuned.cypher("MATCH (s:TunerStep) WHERE s.trace_id IS NOT NULL RETURN count(s)").scalar() == 0
    # the link was made at ingest: the steps still name the removed traces
    assert _rows(tuned, "SELECT count(trace) AS n FROM tuner_steps") == [{"n": 7}]
    tuned.ingest(read_msccl_xml(RING_XML))  # stored again under the name the step holds
    assert tuned.cypher(_JOINED).to_pylist() == ring  # Cypher joins as SQL does: by that name


# ---------------------------------------------------------------- the views


def test_best_action_per_size_bucket(tuned: EmbeddedStore) -> None:
    best = _rows(
        tuned,
        "SELECT size_bucket_bytes, algorithm, protocol, channels, trace, steps, median_time_us, "
        "actions_tried, bucket_steps FROM v_tuner_best WHERE run = 'nccl_tuner_4r' "
        "ORDER BY size_bucket_bytes",
    )
    assert [tuple(r.values()) for r in best] == [
        # 1024 and 1536: Ring LL 2 (12, 14 → 13), Tree LL 2 (10, 11, 30 → 11)
        (1024, "Tree", "LL", 2, "tree-allreduce-4r-1c", 3, 11.0, 2, 5),
        # 65536: Ring LL128 4 (40, 42 → 41), Tree LL128 4 (45)
        (65536, "Ring", "LL128", 4, None, 2, 41.0, 2, 3),
        # 1 MiB: Ring Simple 8 (180, 190 → 185), the named ring (175), NVLS (200)
        (1048576, None, "Simple", 2, "ring_allreduce_4r", 1, 175.0, 3, 4),
    ]
    rl = _rows(
        tuned, "SELECT size_bucket_bytes, algorithm, median_time_us FROM v_tuner_best WHERE run_id = 2"
    )
    assert sorted(tuple(r.values()) for r in rl) == [(4096, "Tree", 9.5), (1048576, "Ring", 182.0)]


def _sweep_rows(rows: list[tuple[str, int, float]]) -> pa.Table:
    """Hand-made sweep points on one topology: (algorithm, size in bytes, time in ns)."""
    return pa.table(
        {
            "topology": ["ring:4"] * len(rows),
            "num_npus": [4] * len(rows),
            "collective": ["ALL_REDUCE"] * len(rows),
            "algorithm": [a for a, _, _ in rows],
            "congestion": ["aware"] * len(rows),
            "size_bytes": [s for _, s, _ in rows],
            "time_ns": [t for _, _, t in rows],
        }
    )


def test_picks_against_the_simulator(tuned: EmbeddedStore) -> None:
    points = [
        ("ring", 1024, 9000.0),
        ("tree", 1024, 8000.0),
        ("ring", 65536, 30000.0),
        ("tree", 65536, 35000.0),
    ]
    points += [("ring", 1048576, 170000.0), ("tree", 1048576, 160000.0)]
    record_sweep(tuned.warehouse, _sweep_rows(points))
    rows = _rows(
        tuned,
        "SELECT step, picked, sim_fastest, sim_fastest_us, sim_picked_us, picked_is_fastest, sim_algorithms "
        "FROM v_tuner_vs_sim WHERE run_id = 1 ORDER BY step",
    )
    # steps at 1024 B (0, 2, 3), 64 KiB (5, 6, 7) and 1 MiB (8-11); 1536 B (1, 4) was not simulated
    assert [tuple(r.values()) for r in rows] == [
        (0, "Ring", "tree", 8.0, 9.0, False, 2),
        (2, "Tree", "tree", 8.0, 8.0, True, 2),
        (3, "Tree", "tree", 8.0, 8.0, True, 2),
        (5, "Ring", "ring", 30.0, 30.0, True, 2),
        (6, "Ring", "ring", 30.0, 30.0, True, 2),
        (7, "Tree", "ring", 30.0, 35.0, False, 2),
        (8, "Ring", "tree", 160.0, 170.0, False, 2),
        (9, "Ring", "tree", 160.0, 170.0, False, 2),
        # the stored ring and NVLS were not simulated: whether they were the fastest is unknown
        (10, "ring_allreduce_4r", "tree", 160.0, None, None, 2),
        (11, "NVLS", "tree", 160.0, None, None, 2),
    ]
    often = _rows(
        tuned,
        "SELECT picked, sim_fastest, count(*) AS steps FROM v_tuner_vs_sim WHERE NOT picked_is_fastest "
        "GROUP BY ALL ORDER BY picked",
    )
    # the CSV's steps 0, 8, 9 and 7; the JSON lines' step 2 (Ring at 1 MiB; 4 KiB was not simulated)
    assert often == [
        {"picked": "Ring", "sim_fastest": "tree", "steps": 4},
        {"picked": "Tree", "sim_fastest": "ring", "steps": 1},
    ]


# ---------------------------------------------------------------- Cypher


_BY_TRACE = (
    "MATCH (s:TunerStep), (t:Trace), (o:Op) WHERE t.trace_id = s.trace_id AND o.trace_id = t.trace_id "
    "AND s.run = 'nccl_tuner_4r' "
    "RETURN t.name AS trace, count(DISTINCT s.step) AS steps, count(o) AS pairs ORDER BY trace"
)


def test_cypher_joins_steps_to_the_dags_they_ran(tuned: EmbeddedStore) -> None:
    assert tuned.cypher("MATCH (s:TunerStep) RETURN count(s)").scalar() == 16
    got = tuned.cypher(_BY_TRACE).to_pylist()
    # the ring XML has 120 ops (1 step), the generated 4-rank tree 60 (4 steps)
    ring_ops = tuned.sql("SELECT count(*) FROM ops WHERE trace = 'ring_allreduce_4r'").scalar()
    tree_ops = tuned.sql("SELECT count(*) FROM ops WHERE trace = 'tree-allreduce-4r-1c'").scalar()
    assert (ring_ops, tree_ops) == (120, 60)
    assert got == [
        {"trace": "ring_allreduce_4r", "steps": 1, "pairs": 120},
        {"trace": "tree-allreduce-4r-1c", "steps": 4, "pairs": 240},
    ]
    # a step's trace_id is the content id of the trace its ``trace`` column names
    ids = {t.name: t.trace_id for t in tuned.traces()}
    linked = {
        (r["run"], r["step"]): ids[r["trace"]]
        for r in _rows(
            tuned,
            "SELECT r.name AS run, s.step, s.trace FROM tuner_steps s JOIN tuner_runs r "
            "USING (run_id) WHERE s.trace IS NOT NULL",
        )
    }
    nodes = tuned.cypher(
        "MATCH (s:TunerStep) WHERE s.trace_id IS NOT NULL "
        "RETURN s.run AS run, s.step AS step, s.trace_id AS t"
    ).to_pylist()
    assert {(r["run"], r["step"]): r["t"] for r in nodes} == linked and len(linked) == 7
    step = tuned.cypher(
        "MATCH (s:TunerStep) WHERE s.run = 'rl_tuner_4r' AND s.step = 3 "
        "RETURN s.collective, s.size_bytes, s.algorithm, s.channels, s.time_us, s.reward"
    ).to_pylist()
    assert [tuple(r.values()) for r in step] == [("ALL_REDUCE", 1048576, "Tree", 8, 201.5, -201.5)]


def test_a_step_linked_to_a_second_name_reaches_the_shared_content(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(read_msccl_xml(RING_XML))
        assert s.ingest(read_msccl_xml(RING_XML), name="my-ring").same_as == "ring_allreduce_4r"
        path = tmp_path / "t.csv"
        path.write_text("collective,size,ranks,trace,time_us\nallreduce,1048576,4,my-ring,170\n")
        report = store_tuner_run(s, read_tuner_log(path))
        assert report.linked == 1
        assert _rows(s, "SELECT trace, trace_rule FROM tuner_steps") == [
            {"trace": "my-ring", "trace_rule": "named"}
        ]
        # one content, two names: the step reaches its ops once, and both names by Trace nodes
        joined = "MATCH (t:TunerStep), (o:Op) WHERE o.trace_id = t.trace_id RETURN count(o)"
        assert s.cypher(joined).scalar() == 120
        names = s.cypher(
            "MATCH (s:TunerStep), (t:Trace) WHERE t.trace_id = s.trace_id RETURN t.name AS n ORDER BY n"
        ).to_pylist()
        assert names == [{"n": "my-ring"}, {"n": "ring_allreduce_4r"}]
        s.remove("ring_allreduce_4r")  # the other name goes: the content stays, and the link
        assert s.cypher(joined).scalar() == 120


# ---------------------------------------------------------------- Neo4j


def test_published_steps_join_the_dags_they_ran_on_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neo4j_url: str
) -> None:
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    clear_server(neo4j_url)
    try:
        with EmbeddedStore(tmp_path / "store") as store:
            _algorithms(store)
            stats = ingest_paths(store, [CSV])
            assert [(t.rows, t.linked) for t in stats.tuner] == [(12, 5)]
            publish(store, neo4j_url)
            with open_store(neo4j_url) as server:
                assert server.cypher(_BY_TRACE).to_pylist() == [
                    {"trace": "ring_allreduce_4r", "steps": 1, "pairs": 120},
                    {"trace": "tree-allreduce-4r-1c", "steps": 4, "pairs": 240},
                ]
                assert server.sql("SELECT count(*) FROM tuner_steps").scalar() == 12
            remove_tuner_run(store, "nccl_tuner_4r")
            publish(store, neo4j_url, prune=True)
            with open_store(neo4j_url) as server:
                assert server.cypher("MATCH (s:TunerStep) RETURN count(s)").scalar() == 0
                assert server.sql("SELECT count(*) FROM tuner_runs").scalar() == 0
    finally:
        clear_server(neo4j_url)


# ---------------------------------------------------------------- docs/measured.md

DOC = (ROOT / "docs" / "measured.md").read_text()
SECTION = DOC.split("## Tuner trajectories", 1)[1].split("\n## ", 1)[0]
SQL = re.findall(r"```sql\n(.*?)```", SECTION, re.S)
CYPHER = re.findall(r"```cypher\n(.*?)```", SECTION, re.S)


@pytest.fixture(scope="module")
def documented(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStore]:
    """The store the section's examples describe: the two algorithms, both example files, a real sweep."""
    with EmbeddedStore(tmp_path_factory.mktemp("doc") / "store") as s:
        _algorithms(s)
        ingest_paths(s, [CSV, JSONL])
        points = sweep(
            [1024, 4096, 65536, 1048576], ["ring", "tree"], ["ring:4,bw=50,lat=500"], collective="allreduce"
        )
        record_sweep(s.warehouse, points)
        yield s


def test_the_section_has_examples_for_both_views() -> None:
    assert len(SQL) >= 4 and CYPHER
    text = "".join(SQL)
    assert all(name in text for name in ("tuner_runs", "tuner_steps", "v_tuner_best", "v_tuner_vs_sim"))


@pytest.mark.parametrize("sql", SQL, ids=[e.split("\n")[0][:50] for e in SQL])
def test_documented_sql_returns_rows(documented: EmbeddedStore, sql: str) -> None:
    assert len(documented.sql(sql)), f"example returned no rows:\n{sql}"


@pytest.mark.parametrize("query", CYPHER, ids=[e.split("\n")[0][:50] for e in CYPHER])
def test_documented_cypher_returns_rows(documented: EmbeddedStore, query: str) -> None:
    assert len(documented.cypher(query)), f"example returned no rows:\n{query}"


# ---------------------------------------------------------------- the command line


def test_cli_ingest_renders_tuner_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    assert main(["--store", store, "ingest", str(JSONL), "--name", "rl", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"tuner_run": "rl", "run_id": 1, "status": "new", "rows": 4, "linked": 0}
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(JSONL.read_text().replace('"nchannels": 8,', '"nchannels": -8,', 1))
    assert main(["--store", store, "ingest", str(bad)]) == 1
    assert re.search(
        r"bad\.jsonl:4: field 'channels': expected a positive integer, got -8", capsys.readouterr().err
    )
