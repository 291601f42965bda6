"""The embedded store finishes a removal or an ingest cut short after (or before) its commit point,
from the catalog's states and from the journal a dead writer left; removals rebuild or delete."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from etstore.collectives.stored import expand_stored
from etstore.store import EmbeddedStore
from etstore.store._journal import Journal, JournalEntry
from etstore.store.catalog import ContentRecord
from etstore.workloads import transformer


def test_removal_cut_short_after_its_commit_point_is_finished(tmp_path: Path) -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(trace, name="a")
        s.ingest(trace, name="b")
        s.catalog.drop_name("a")  # the commit point of `rm a`, then a crash
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:
        assert [t.name for t in s.traces()] == ["b"]
    with EmbeddedStore(tmp_path / "s") as s:  # the next writable open finishes it
        assert s.sql("SELECT name FROM traces").to_pylist() == [{"name": "b"}]
        assert s.cypher("MATCH (o:Op) RETURN DISTINCT o.trace AS t").to_pylist() == [{"t": "b"}]
        assert s.cypher("MATCH (o:Op {trace: 'b'}) RETURN count(o)").scalar() == trace.num_ops


def test_content_left_loading_is_swept(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="kept")
        ghost = s.catalog.add_content(ContentRecord(content_hash="x", kind="workload", graph_name="ghost"))
        assert ghost.seq is not None
    with EmbeddedStore(tmp_path / "s") as s:
        assert s.catalog.content(ghost.seq) is None
        assert [t.name for t in s.traces()] == ["kept"]


# ---------------------------------------------------------------- journal recovery


def _dead_pid() -> int:
    """The PID of a process that has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _views(s: EmbeddedStore) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
    """(ls, SQL ops per name, graph ops per name, raw content rows)."""
    listed = {t.name: t.ops for t in s.traces()}
    by_sql = {
        r["t"]: r["n"] for r in s.sql("SELECT trace AS t, count(*) AS n FROM ops GROUP BY 1").to_pylist()
    }
    by_graph = {
        r["t"]: r["n"] for r in s.cypher("MATCH (o:Op) RETURN o.trace AS t, count(o) AS n").to_pylist()
    }
    return listed, by_sql, by_graph, int(s.sql("SELECT count(*) FROM trace_ops").scalar())


def test_read_only_open_rolls_back_an_ingest_whose_writer_died(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=4, layers=2, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
        seq = s.info("b").trace_id
        # b's data is in both engines, its commit never happened
        with closing(sqlite3.connect(tmp_path / "s" / "catalog.sqlite")) as db, db:
            assert db.execute("UPDATE contents SET status = 'loading' WHERE seq = ?", (seq,)).rowcount == 1
    # what a writer killed mid-ingest leaves: its journal
    entry = JournalEntry(pid=_dead_pid(), command="ingest", op="ingest", name="b", trace_id=seq)
    Journal(tmp_path / "s").write(entry)
    told: list[str] = []
    with EmbeddedStore(tmp_path / "s", read_only=True, notify=told.append) as s:
        assert s.recovered == (entry,)
        assert _views(s) == ({"a": a.num_ops}, {"a": a.num_ops}, {"a": a.num_ops}, a.num_ops)
    assert told == [
        f"recovering from an interrupted ingest of 'b' (PID {entry.pid}, ingest) in {tmp_path / 's'} ..."
    ]
    assert not (tmp_path / "s" / "journal.json").exists()
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # nothing left to do
        assert s.recovered == ()


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


def test_a_removal_cut_short_while_rebuilding_the_graph_is_redone(tmp_path: Path) -> None:
    a, b = transformer(ranks=2, layers=1, tp=1), transformer(ranks=8, layers=4, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(a, name="a")
        s.ingest(b, name="b")
    (tmp_path / "s" / "graph.rebuild").write_bytes(b"half a copy")  # the copy a kill cut short
    Journal(tmp_path / "s").write(JournalEntry(pid=_dead_pid(), command="rm", op="remove", name="b"))
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:
        assert _views(s) == ({"a": a.num_ops}, {"a": a.num_ops}, {"a": a.num_ops}, a.num_ops)
    assert not (tmp_path / "s" / "graph.rebuild").exists()


def test_files_a_rebuild_killed_in_its_checkpoint_left_do_not_stop_the_next(tmp_path: Path) -> None:
    """A rebuild killed while Ladybug checkpoints it leaves files beside ``graph.rebuild`` that
    name that database; Ladybug refused to open the next rebuild beside them."""
    small, big = transformer(ranks=4, layers=1, tp=2), transformer(ranks=8, layers=16, tp=2)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(small, name="small")
        s.ingest(big, name="big")
    # another database's log, as a killed checkpoint leaves it (written, then the process dies)
    code = (
        "import os, sys, ladybug\n"
        "c = ladybug.Connection(ladybug.Database(sys.argv[1], auto_checkpoint=False))\n"
        "c.execute('CREATE NODE TABLE N(id INT64, PRIMARY KEY(id))')\n"
        "c.execute('CREATE (:N {id: 1})')\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "other")], check=True, timeout=60)
    (tmp_path / "other.wal").rename(tmp_path / "s" / "graph.rebuild.wal.checkpoint")
    for lock in ("graph.rebuild.checkpoint.apply.lock", "graph.rebuild.checkpoint.intent.lock"):
        (tmp_path / "s" / lock).touch()
    with EmbeddedStore(tmp_path / "s") as s:
        s.remove("big")  # what stays is far smaller: the graph is rebuilt
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == small.num_ops
    assert sorted(f.name for f in (tmp_path / "s").iterdir() if f.name.startswith("graph.")) == []


# ---------------------------------------------------------------- removal: rebuild or delete


def _graph_counts(s: EmbeddedStore) -> dict[str, int]:
    return {
        rel: int(s.cypher(f"MATCH ()-[r:{rel}]->() RETURN count(r)").scalar())
        for rel in ("DEP", "MSG", "BECOMES")
    }


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
    ]


def test_removal_rebuilds_or_deletes_and_keeps_every_other_edge(tmp_path: Path) -> None:
    small = transformer(ranks=4, layers=1, tp=2)
    big = transformer(ranks=8, layers=16, tp=2)
    steps: list[tuple[str, int, int]] = []
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(small, name="small")
        expand_stored(s, "small", "ring", name="small-ring")  # BECOMES edges small -> small-ring
        kept, before, dump = _graph_counts(s), _views(s), _graph_dump(s)  # expand stored the algorithms too
        assert kept["BECOMES"] > 0 and "small-ring" in before[0]
        s.ingest(big, name="big")
        # what stays (small, small-ring, the algorithms) is far smaller than big: the graph is
        # rebuilt without it
        s.remove("big", progress=lambda stage, done, total: steps.append((stage, done, total)))
        assert not (tmp_path / "s" / "graph.rebuild").exists()
        assert (_graph_counts(s), _views(s)) == (kept, before)
        assert _graph_dump(s) == dump  # the graph rebuilt from the warehouse is the same graph
        s.ingest(big, name="big")
        # what stays (big above all) is over 8x small-ring: deleted in place, BECOMES edges with it
        deleted: list[str] = []
        s.remove("small-ring", progress=lambda stage, done, total: deleted.append(stage))
        assert "DEP edges" in deleted and "copy Op" not in deleted
        assert _graph_counts(s)["BECOMES"] == 0
        left = {n: ops for n, ops in before[0].items() if n != "small-ring"} | {"big": big.num_ops}
        assert _views(s) == (left, left, left, sum(left.values()))
    stages = [st for st, _, _ in steps]
    assert stages[0] == "warehouse" and "copy Op" in stages and stages[-1] == "done"
    assert all(total == 7 and 1 <= done <= 7 for _, done, total in steps)


_KILLED_MID_STREAM = """
import os, sys
from etstore.collectives.synth import synthesize
from etstore.store import EmbeddedStore

r = synthesize("mesh2d:3x3", coll="allgather", trials=1, seed=0)
def parts():
    for i, part in enumerate(r.trace_parts(max_ops=20)):
        if i == 3:  # two parts' rows committed and spooled: the process dies
            os._exit(9)
        yield part
with EmbeddedStore(sys.argv[1]) as s:
    s.ingest_parts(parts(), name="streamed")
"""


def test_streamed_ingest_killed_midway_is_swept(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with EmbeddedStore(store) as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="kept")
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_STREAM, str(store)], check=False)
    assert done.returncode == 9
    assert list(store.glob("spool-*/*.parquet"))  # what the dead writer left
    with EmbeddedStore(store) as s:  # the next open removes it
        assert [t.name for t in s.traces()] == ["kept"]
        assert s.sql("SELECT count(DISTINCT trace_id) FROM trace_ops").scalar() == 1
        assert s.cypher("MATCH (o:Op) RETURN DISTINCT o.trace AS t").to_pylist() == [{"t": "kept"}]
    assert not list(store.glob("spool-*"))
