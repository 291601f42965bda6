"""What an interrupted writer leaves is swept or finished by the next open, and the graph index, a
build of which may be cut short anywhere, answers Cypher right the next time it is asked.

Writers are killed for real where that is cheap (a child process dies with ``os._exit`` at a
chosen point of the real code path); the graph index's failures are raised at a chosen point.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import ladybug
import pytest

from etstore.app.expand import expand_stored
from etstore.errors import StoreError
from etstore.store import EmbeddedStore
from etstore.store import _graph_index as graph_index
from etstore.store import _trace_rows as rows
from etstore.store._journal import Journal, JournalEntry
from etstore.store.catalog import ContentRecord
from etstore.store.graph import dep_edges, message_edges, uid_base
from etstore.workloads import transformer

_READY = "SELECT trace_id FROM contents WHERE status = 'ready'"
_BY_NAME = "MATCH (x:Trace), (o:Op) WHERE o.trace_id = x.trace_id RETURN x.name AS t, count(o) AS n"


def _views(s: EmbeddedStore) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
    """(ls, SQL ops per name, graph ops per name, raw content rows)."""
    listed = {t.name: t.ops for t in s.traces()}
    by_sql = {
        r["t"]: r["n"] for r in s.sql("SELECT trace AS t, count(*) AS n FROM ops GROUP BY 1").to_pylist()
    }
    by_graph = {r["t"]: r["n"] for r in s.cypher(_BY_NAME).to_pylist()}
    return listed, by_sql, by_graph, int(s.sql("SELECT count(*) FROM trace_ops").scalar())


def _graph_vs_sql(s: EmbeddedStore) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the graph index holds beside what it should hold: the ops' uids and the edge
    counts, each content once (a content under two names is one set of nodes)."""
    graph: dict[str, Any] = {
        rel: int(s.cypher(f"MATCH ()-[r:{rel}]->() RETURN count(r)").scalar())
        for rel in ("DEP", "MSG", "BECOMES")
    }
    graph["Op"] = s.cypher("MATCH (o:Op) RETURN o.uid AS u ORDER BY u").to_arrow()["u"].to_pylist()
    q = {
        "DEP": f"SELECT count(*) FROM trace_deps WHERE trace_id IN ({_READY})",
        "MSG": f"SELECT count(*) FROM trace_messages WHERE trace_id IN ({_READY})",
        "BECOMES": f"SELECT count(*) FROM trace_lineage WHERE trace_id IN ({_READY}) "
        f"AND parent_trace_id IN ({_READY})",
    }
    sql: dict[str, Any] = {rel: int(s.sql(sql).scalar()) for rel, sql in q.items()}
    sql["Op"] = (
        s.sql(f"SELECT uid AS u FROM trace_ops WHERE trace_id IN ({_READY}) ORDER BY u")
        .to_arrow()["u"]
        .to_pylist()
    )
    return graph, sql


def _dirty(store: Path) -> bool:
    """Whether the graph index's state says a build is under way (read without opening the store)."""
    with duckdb.connect(str(store / "warehouse.duckdb"), read_only=True) as con:
        got = con.execute("SELECT dirty FROM graph_state").fetchall()
    return bool(got and got[0][0])


def _run(code: str, *args: str) -> int:
    """Run ``code`` in a child Python; its exit status."""
    return subprocess.run([sys.executable, "-c", code, *args], check=False, timeout=300).returncode


# ---------------------------------------------------------------- the catalog's states


def test_content_left_loading_or_without_a_name_is_swept(tmp_path: Path) -> None:
    kept, lost, orphan = (transformer(ranks=r, layers=1, tp=1) for r in (2, 3, 4))
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(kept, name="kept")
        s.ingest(orphan, name="orphan")
        s.cypher("MATCH (o:Op) RETURN count(o)")  # the graph index holds both
        wh, cat = s.warehouse, s.catalog
        # what a streamed ingest leaves when it dies between its parts: committed rows under
        # a content still loading
        with wh.transaction():
            ghost = cat.claim(ContentRecord(content_hash="x", kind="workload"))
        assert ghost.trace_id is not None
        base = uid_base(ghost.trace_id)
        with wh.transaction():
            rows.insert_content(
                wh, lost, ghost.trace_id, base, dep_edges(lost, base), message_edges(lost, base)[0]
            )
        with wh.transaction():  # and a content whose last name went without it
            cat.drop_name("orphan")
        assert cat.stale() == [2, ghost.trace_id]
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # readers never see either
        assert _views(s)[:3] == ({"kept": kept.num_ops},) * 3
    with EmbeddedStore(tmp_path / "s") as s:  # the next writable open removes both
        assert s.sql("SELECT trace_id FROM contents").to_pylist() == [{"trace_id": 1}]
        assert _views(s) == ({"kept": kept.num_ops},) * 3 + (kept.num_ops,)
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and len(graph["Op"]) == kept.num_ops  # the index dropped the orphan


# ---------------------------------------------------------------- writers killed


_KILLED_IN_INGEST = """
import os, sys
from etstore.store import EmbeddedStore, _trace_rows
from etstore.workloads import transformer

real = _trace_rows.insert_messages
def dying(*args, **kwargs):
    real(*args, **kwargs)
    os._exit(9)  # every row written (messages are the last), the transaction not committed
_trace_rows.insert_messages = dying
with EmbeddedStore(sys.argv[1], purpose="ingest") as s:
    s.ingest(transformer(ranks=4, layers=2, tp=2), name="b")
"""


def test_an_ingest_whose_writer_died_leaves_nothing(tmp_path: Path) -> None:
    a = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
    assert _run(_KILLED_IN_INGEST, str(tmp_path / "s")) == 9
    entry = Journal(tmp_path / "s").read()  # what the dead writer left
    assert entry is not None and (entry.op, entry.name) == ("ingest", "b")
    told: list[str] = []
    with EmbeddedStore(tmp_path / "s", read_only=True, notify=told.append) as s:
        assert s.recovered == (entry,)
        assert _views(s) == ({"a": a.num_ops}, {"a": a.num_ops}, {"a": a.num_ops}, a.num_ops)
        assert s.sql("SELECT count(*) FROM contents").scalar() == 1
    assert told == [
        f"recovering from an interrupted ingest of 'b' (PID {entry.pid}, ingest) in {tmp_path / 's'} ..."
    ]
    assert not (tmp_path / "s" / "journal.json").exists()
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # nothing left to do
        assert s.recovered == ()


def _dead_pid() -> int:
    """The PID of a process that has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_removal_is_committed_by_its_journal_and_finished_by_the_next_open(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
    # killed right after writing its journal: nothing else happened yet
    Journal(tmp_path / "s").write(JournalEntry(pid=_dead_pid(), command="rm", op="remove", name="b"))
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:
        assert _views(s) == ({"a": a.num_ops}, {"a": a.num_ops}, {"a": a.num_ops}, a.num_ops)
    with EmbeddedStore(tmp_path / "s") as s:
        assert s.removed_names() == ["b"]  # an rm run again is told so
        s.ingest(b, name="b")
        assert s.removed_names() == []  # stored again: no longer "removed"
        s.remove("b")
        assert s.removed_names() == ["b"]


_KILLED_IN_REMOVAL = """
import os, sys
from etstore.store import EmbeddedStore
from etstore.store.catalog import Catalog

real = Catalog.delete_content
def dying(self, trace_id):
    real(self, trace_id)
    os._exit(9)  # the rows deleted, the transaction not committed
Catalog.delete_content = dying
with EmbeddedStore(sys.argv[1], purpose="rm") as s:
    s.remove("b")
"""


def test_a_removal_killed_before_its_transaction_commits_is_finished(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
        s.cypher("MATCH (o:Op) RETURN count(o)")
    assert _run(_KILLED_IN_REMOVAL, str(tmp_path / "s")) == 9
    with duckdb.connect(str(tmp_path / "s" / "warehouse.duckdb"), read_only=True) as con:
        assert con.execute("SELECT name FROM traces ORDER BY 1").fetchall() == [("a",), ("b",)]  # rolled back
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # the journal is its commit point
        assert [e.op for e in s.recovered] == ["remove"]
        assert _views(s) == ({"a": a.num_ops}, {"a": a.num_ops}, {"a": a.num_ops}, a.num_ops)
        assert s.removed_names() == ["b"]
        graph, sql = _graph_vs_sql(s)
        assert graph == sql


_KILLED_MID_STREAM = """
import os, sys
from etstore.algorithms.synth import synthesize
from etstore.store import EmbeddedStore

r = synthesize("mesh2d:3x3", coll="allgather", trials=1, seed=0)
def parts():
    for i, part in enumerate(r.trace_parts(max_ops=20)):
        if i == 3:  # three parts' rows committed: the process dies
            os._exit(9)
        yield part
with EmbeddedStore(sys.argv[1]) as s:
    s.ingest_parts(parts(), name="streamed")
"""


def test_streamed_ingest_killed_midway_is_swept(tmp_path: Path) -> None:
    store = tmp_path / "s"
    kept = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(store) as s:
        s.ingest(kept, name="kept")
    assert _run(_KILLED_MID_STREAM, str(store)) == 9
    with duckdb.connect(str(store / "warehouse.duckdb"), read_only=True) as con:  # what the dead writer left
        assert con.execute("SELECT trace_id, status FROM contents ORDER BY 1").fetchall() == [
            (1, "ready"),
            (2, "loading"),
        ]
        assert con.execute("SELECT count(*) FROM trace_ops WHERE trace_id = 2").fetchall() != [(0,)]
    with EmbeddedStore(store, read_only=True) as s:  # the next open, a reader's, removes it
        assert [e.op for e in s.recovered] == ["ingest"]
        assert _views(s) == ({"kept": kept.num_ops},) * 3 + (kept.num_ops,)
        assert s.sql("SELECT trace_id FROM contents").to_pylist() == [{"trace_id": 1}]
    assert not list(store.glob("*spool*"))


# ---------------------------------------------------------------- the graph index cut short


_KILLED_IN_BUILD = """
import os, sys
from etstore.store import EmbeddedStore, _graph_index

real = _graph_index.load_spool
def dying(graph, spool, tables):
    real(graph, spool, [t for t in tables if t in ("Trace", "Op")])
    os._exit(9)  # the nodes loaded and checkpointed, no edge
_graph_index.load_spool = dying
with EmbeddedStore(sys.argv[1]) as s:
    s.cypher("MATCH (o:Op) RETURN count(o)")
"""


def _raw_graph(store: Path) -> dict[str, int]:
    """Op nodes and DEP edges in the graph file as it is (opened without the store)."""
    db = ladybug.Database(str(store / "graph"), read_only=True)
    try:
        conn: Any = ladybug.Connection(db)
        return {
            "Op": int(conn.execute("MATCH (o:Op) RETURN count(o)").get_next()[0]),
            "DEP": int(conn.execute("MATCH ()-[r:DEP]->() RETURN count(r)").get_next()[0]),
        }
    finally:
        db.close()


def test_a_build_killed_midway_is_redone_by_the_next_query(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    store = tmp_path / "s"
    with EmbeddedStore(store) as s:
        s.ingest(a, name="a")
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == a.num_ops
        s.ingest(b, name="b")  # not in the index yet
    assert not _dirty(store)
    assert _run(_KILLED_IN_BUILD, str(store)) == 9
    assert _dirty(store)
    # the killed build had loaded b's nodes (whether its log kept them is Ladybug's), not its edges
    raw = _raw_graph(store)
    assert raw["Op"] in (a.num_ops, a.num_ops + b.num_ops) and raw["DEP"] == a.num_deps
    with EmbeddedStore(store, read_only=True) as s:  # a reader's query builds it over
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and sql["DEP"] == a.num_deps + b.num_deps
        assert _views(s)[2] == {"a": a.num_ops, "b": b.num_ops}
    assert not _dirty(store)
    assert _raw_graph(store) == {"Op": a.num_ops + b.num_ops, "DEP": a.num_deps + b.num_deps}


def test_a_build_that_fails_leaves_the_index_dirty_and_the_next_query_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    real = graph_index.load_spool

    def failing(graph: Any, spool: Path, tables: list[str]) -> None:
        real(graph, spool, [t for t in tables if t in ("Trace", "Op")])
        raise StoreError("the graph could not load DEP: disk full")

    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
        monkeypatch.setattr(graph_index, "load_spool", failing)
        with pytest.raises(StoreError, match="disk full"):
            s.cypher("MATCH (o:Op) RETURN count(o)")
        assert s.sql("SELECT dirty FROM graph_state").scalar() is True
        assert s.graph.execute("MATCH ()-[r:DEP]->() RETURN count(r)").get_next()[0] == 0  # half built
        monkeypatch.undo()
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and sql["DEP"] == a.num_deps + b.num_deps
        assert s.sql("SELECT dirty FROM graph_state").scalar() is False
        assert s.index() is False  # up to date: nothing more to do


def test_an_in_place_removal_cut_short_is_redone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small, big = transformer(ranks=2, layers=1, tp=1), transformer(ranks=8, layers=4, tp=2)
    real = graph_index.delete_range

    def failing(conn: Any, lo: int, hi: int, step: Any) -> None:
        def cut(what: str) -> None:
            if what == "ops":  # the edges are deleted, the nodes not yet
                raise StoreError("interrupted")
            step(what)

        real(conn, lo, hi, cut)

    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(big, name="big")
        s.ingest(small, name="small")
        s.cypher("MATCH (o:Op) RETURN count(o)")
        s.remove("small")  # what stays is over 8x what goes: deleted in place
        monkeypatch.setattr(graph_index, "delete_range", failing)
        with pytest.raises(StoreError, match="interrupted"):
            s.cypher("MATCH (o:Op) RETURN count(o)")
        assert s.sql("SELECT dirty FROM graph_state").scalar() is True
        monkeypatch.undo()
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and len(sql["Op"]) == big.num_ops
        assert _views(s)[2] == {"big": big.num_ops}


def test_files_a_build_killed_in_its_checkpoint_left_do_not_stop_the_next(tmp_path: Path) -> None:
    """A build killed while Ladybug checkpoints leaves files beside ``graph``, and its state
    dirty; the next build starts over without them (Ladybug refuses to open beside another
    database's log)."""
    a = transformer(ranks=4, layers=1, tp=2)
    store = tmp_path / "s"
    with EmbeddedStore(store) as s:
        s.ingest(a, name="a")
        s.cypher("MATCH (o:Op) RETURN count(o)")
        s.warehouse.execute("UPDATE graph_state SET dirty = true")
    # another database's log, as a killed checkpoint leaves it (written, then the process dies)
    code = (
        "import os, sys, ladybug\n"
        "c = ladybug.Connection(ladybug.Database(sys.argv[1], auto_checkpoint=False))\n"
        "c.execute('CREATE NODE TABLE N(id INT64, PRIMARY KEY(id))')\n"
        "c.execute('CREATE (:N {id: 1})')\n"
        "os._exit(0)\n"
    )
    assert _run(code, str(tmp_path / "other")) == 0
    (tmp_path / "other.wal").rename(store / "graph.wal.checkpoint")
    for lock in ("graph.checkpoint.apply.lock", "graph.checkpoint.intent.lock"):
        (store / lock).touch()
    with EmbeddedStore(store) as s:
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == a.num_ops
        graph, sql = _graph_vs_sql(s)
        assert graph == sql
    assert sorted(f.name for f in store.iterdir() if f.name.startswith("graph")) == ["graph"]


def test_a_graph_removed_by_hand_is_built_again(tmp_path: Path) -> None:
    a = transformer(ranks=4, layers=1, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.cypher("MATCH (o:Op) RETURN count(o)")
    (tmp_path / "s" / "graph").unlink()
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:
        assert _views(s)[2] == {"a": a.num_ops}
        graph, sql = _graph_vs_sql(s)
        assert graph == sql


# ---------------------------------------------------------------- removal: start over or delete


def _graph_dump(s: EmbeddedStore) -> list[list[dict[str, object]]]:
    """Every op with every property, and every edge with its properties, in a fixed order."""
    return [
        s.cypher("MATCH (o:Op) RETURN o.* ORDER BY o.uid").to_pylist(),
        s.cypher(
            "MATCH (a:Op)-[r:DEP]->(b:Op) RETURN a.uid, b.uid, r.kind ORDER BY a.uid, b.uid, r.kind"
        ).to_pylist(),
        s.cypher(
            "MATCH (a:Op)-[r:MSG]->(b:Op) RETURN a.uid, b.uid, r.tag, r.comm_size ORDER BY a.uid, b.uid"
        ).to_pylist(),
        s.cypher("MATCH (a:Op)-[r:BECOMES]->(b:Op) RETURN a.uid, b.uid ORDER BY a.uid, b.uid").to_pylist(),
        s.cypher("MATCH (t:Trace) RETURN t.* ORDER BY t.name").to_pylist(),
    ]


def test_removal_rebuilds_or_deletes_and_keeps_every_other_edge(tmp_path: Path) -> None:
    small = transformer(ranks=4, layers=1, tp=2)
    big = transformer(ranks=8, layers=16, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(small, name="small")
        expand_stored(s, "small", "ring", name="small-ring")  # BECOMES edges small -> small-ring
        before, dump = _views(s), _graph_dump(s)  # expand stored the algorithms too
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and sql["BECOMES"] > 0 and sql["MSG"] > 0 and "small-ring" in before[0]
        kept_ops = sum(before[0].values())
        s.ingest(big, name="big")
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == kept_ops + big.num_ops
        # what stays (small, small-ring, the algorithms) is far smaller than big: built over
        s.remove("big")
        steps: list[tuple[str, int, int]] = []
        assert s.index(lambda stage, done, total: steps.append((stage, done, total))) is True
        assert not any("removing" in st for st, _, _ in steps)
        assert steps[-1] == ("graph index: loaded", kept_ops, kept_ops)  # every op kept, loaded again
        assert _graph_vs_sql(s) == (graph, sql)  # the same uids and edges as before big came
        assert _views(s) == before
        assert _graph_dump(s) == dump  # the graph built over from the warehouse is the same graph
        s.ingest(big, name="big")
        s.cypher("MATCH (o:Op) RETURN count(o)")
        # what stays (big above all) is over 8x small-ring: deleted in place, its BECOMES edges with it
        ring_ops = before[0]["small-ring"]
        assert (kept_ops - ring_ops + big.num_ops) >= 8 * ring_ops
        s.remove("small-ring")
        steps.clear()
        s.index(lambda stage, done, total: steps.append((stage, done, total)))
        stages = [st for st, _, _ in steps]
        assert "graph index: removing DEP edges" in stages and "graph index: removing ops" in stages
        assert all(total == ring_ops for _, _, total in steps)  # only what goes is worked on
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and sql["BECOMES"] == 0 and sql["DEP"] > 0 and sql["MSG"] > 0
        left = {n: ops for n, ops in before[0].items() if n != "small-ring"} | {"big": big.num_ops}
        assert _views(s) == (left, left, left, sum(left.values()))


def test_a_content_under_two_names_is_one_set_of_nodes(tmp_path: Path) -> None:
    trace = transformer(ranks=4, layers=1, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(trace, name="a")
        s.ingest(trace, name="b")
        assert _views(s)[2] == {"a": trace.num_ops, "b": trace.num_ops}
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == trace.num_ops
        s.remove("a")  # the content stays: only its Trace node goes
        assert s.cypher("MATCH (t:Trace) RETURN t.name AS n").to_pylist() == [{"n": "b"}]
        graph, sql = _graph_vs_sql(s)
        assert graph == sql and len(graph["Op"]) == trace.num_ops
