"""The graph index bulk-loads each large table in a database opening of its own, with a pool
sized for its rows that grows when Ladybug reports it full, and leaves no spool behind; a
streamed trace stored in a store whose path has glob characters is indexed whole.

The statements go to the real engine; the wrappers below only record what was opened,
released and copied, and with which pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from etstore.algorithms.synth import synthesize
from etstore.app.expand import expand_stored
from etstore.dag import match_messages
from etstore.store import EmbeddedStore
from etstore.store import _graph_load as graph_load
from etstore.store._ladybug import LadybugGraph
from etstore.workloads import transformer

_READY = "SELECT trace_id FROM contents WHERE status = 'ready'"


def _counts(s: EmbeddedStore) -> tuple[dict[str, int], dict[str, int]]:
    """Nodes and edges by Cypher beside what the warehouse holds of the ready contents."""
    graph = {"Op": int(s.cypher("MATCH (o:Op) RETURN count(o)").scalar())}
    graph |= {
        rel: int(s.cypher(f"MATCH ()-[r:{rel}]->() RETURN count(r)").scalar())
        for rel in ("DEP", "MSG", "BECOMES")
    }
    sql = {
        t: int(s.sql(f"SELECT count(*) FROM {table} WHERE trace_id IN ({_READY})").scalar())
        for t, table in (("Op", "trace_ops"), ("DEP", "trace_deps"), ("MSG", "trace_messages"))
    }
    sql["BECOMES"] = int(
        s.sql(
            f"SELECT count(*) FROM trace_lineage WHERE trace_id IN ({_READY}) "
            f"AND parent_trace_id IN ({_READY})"
        ).scalar()
    )
    return graph, sql


class _Log:
    """What the graph index did with Ladybug: ``("open", pool)``, ``("release",)``, and each
    statement run, with whether Ladybug refused it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[Any, ...]] = []
        real_open, real_release = LadybugGraph.open, LadybugGraph.release
        log = self

        class Recording:
            def __init__(self, conn: Any) -> None:
                self._conn = conn

            def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
                try:
                    got = self._conn.execute(query, *args, **kwargs)
                except RuntimeError as exc:
                    log.events.append(("refused", query, str(exc)))
                    raise
                log.events.append(("ran", query))
                return got

        def recording_open(graph: LadybugGraph, incoming: int = 0, *, pool: int | None = None) -> Any:
            if graph.conn is None:
                self.events.append(("open", pool))
            return Recording(real_open(graph, incoming, pool=pool))

        def recording_release(graph: LadybugGraph, *, keep_scratch: bool = False) -> None:
            if graph.conn is not None:
                self.events.append(("release",))
            real_release(graph, keep_scratch=keep_scratch)

        monkeypatch.setattr(LadybugGraph, "open", recording_open)
        monkeypatch.setattr(LadybugGraph, "release", recording_release)

    def openings(self) -> list[tuple[int | None, list[str], bool]]:
        """Each opening of the database: its pool, the statements it ran (``COPY`` as
        ``COPY <table>``; refused ones too) and whether it was closed again."""
        out: list[tuple[int | None, list[str], bool]] = []
        for e in self.events:
            if e[0] == "open":
                out.append((e[1], [], False))
            elif e[0] == "release":
                out[-1] = (out[-1][0], out[-1][1], True)
            elif e[1].startswith("COPY"):
                out[-1][1].append("COPY " + e[1].split("`")[1])
            else:
                out[-1][1].append(e[1].split()[0])
        return out

    def copies(self) -> list[tuple[int | None, list[str]]]:
        """The openings that copied a table: their pool and the tables copied."""
        got = [
            (pool, [x.split()[1] for x in ran if x.startswith("COPY")]) for pool, ran, _ in self.openings()
        ]
        return [(pool, tables) for pool, tables in got if tables]

    def refused(self) -> list[str]:
        """The first word of each statement Ladybug refused."""
        return [e[1].split()[0] for e in self.events if e[0] == "refused"]


def test_a_full_pool_is_doubled_and_the_load_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = synthesize("mesh2d:8x8", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:
        report = s.ingest_parts(r.trace_parts(max_ops=2000), name="x")
        assert report.trace.ops == r.num_ops == 8064
        log = _Log(monkeypatch)
        monkeypatch.setattr(graph_load, "_SMALL_POOL", 0)  # every table in an opening of its own
        monkeypatch.setattr(
            graph_load, "_pool_for", lambda table, files: 8 << 20
        )  # too small for these edges
        assert s.index() is True
        monkeypatch.undo()
        messages = len(match_messages(r.trace).send_row)
        assert s.cypher("MATCH (:Op)-[m:MSG]->(:Op) RETURN count(m)").scalar() == messages == 4032
        assert s.cypher("MATCH (:Op)-[d:DEP]->(:Op) RETURN count(d)").scalar() == r.trace.num_deps
        graph, sql = _counts(s)
        assert graph == sql
    pools = [pool for pool, _ in log.copies()]
    assert pools[0] == 8 << 20 and 16 << 20 in pools  # Ladybug refused 8 MiB: the load went on in 16
    assert "COPY" in log.refused()
    assert not [p for p in (tmp_path / "s").iterdir() if "spool" in p.name]


def test_a_checkpoint_short_of_pool_loads_its_table_again_in_a_larger_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a 3 MiB pool Ladybug refuses some CHECKPOINTs after their COPY succeeded, and the
    reopened database has lost that COPY's rows: the table is loaded again whole (its count
    back where it was), so the stored graph is complete."""
    first = synthesize("mesh2d:4x4", coll="allgather", trials=1, seed=0)
    r = synthesize("mesh2d:8x8", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:  # the tables hold rows before the load: counts start there
        s.ingest_parts(first.trace_parts(max_ops=200), name="first")
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == first.num_ops
        s.ingest_parts(r.trace_parts(max_ops=2016), name="x")
        log = _Log(monkeypatch)
        monkeypatch.setattr(graph_load, "_SMALL_POOL", 0)
        monkeypatch.setattr(graph_load, "_pool_for", lambda table, files: 3 << 20)
        assert s.index() is True
    monkeypatch.undo()
    assert "CHECKPOINT" in log.refused()  # what this test is about happened
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # reopened: what the checkpoints wrote
        assert s.index() is False  # the index is up to date: nothing is built again
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == first.num_ops + r.num_ops == 480 + 8064
        deps = s.cypher("MATCH (:Op)-[d:DEP]->(:Op) RETURN count(d)").scalar()
        assert deps == first.trace.num_deps + r.trace.num_deps
        assert s.cypher("MATCH (:Op)-[m:MSG]->(:Op) RETURN count(m)").scalar() == 240 + 4032


def test_each_large_table_loads_in_its_own_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table whose pool is over the small one loads in a database opened with a pool sized
    for its own rows and closed after its checkpoint (so one load's memory is not under the
    next); the small tables load in the opening at hand."""
    sizes = {"Op": 64 << 20, "DEP": 96 << 20, "MSG": 128 << 20}
    small = 16 << 20
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest(transformer(ranks=4, layers=1, tp=2), name="small")
        expand_stored(s, "small", "ring", name="small-ring")  # BECOMES edges too
        log = _Log(monkeypatch)
        monkeypatch.setattr(graph_load, "_SMALL_POOL", 32 << 20)
        monkeypatch.setattr(graph_load, "_pool_for", lambda table, files: sizes.get(table, small))
        assert s.index() is True
        monkeypatch.undo()
        graph, sql = _counts(s)
        assert graph == sql and sql["BECOMES"] > 0 and sql["MSG"] > 0
    assert log.copies() == [
        (64 << 20, ["Op"]),
        (96 << 20, ["DEP"]),
        (128 << 20, ["MSG"]),
        (small, ["Trace", "BECOMES"]),  # small tables share one opening
    ]
    for pool, ran, closed in log.openings():  # a large table's opening: load, checkpoint, close
        if pool in sizes.values():
            assert ran[-2:] == [ran[-2], "CHECKPOINT"] and ran[-2].startswith("COPY") and closed


def test_a_store_path_with_glob_characters(tmp_path: Path) -> None:
    r = synthesize("mesh2d:3x3", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "st[1]" / "s") as s:
        held = s.warehouse  # a warehouse the caller holds keeps working across the ingest
        report = s.ingest_parts(r.trace_parts(max_ops=30), name="x")
        assert report.trace.ops == r.num_ops
        assert held.query("SELECT count(*) FROM ops WHERE trace = 'x'").scalar() == r.num_ops
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == r.num_ops
        graph, sql = _counts(s)
        assert graph == sql and sql["DEP"] == r.trace.num_deps
    assert not [p for p in (tmp_path / "st[1]" / "s").iterdir() if "spool" in p.name]
