"""The embedded store's streamed ingest loads its spooled graph with a pool that grows when
Ladybug reports it full, and leaves no spool behind."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from etstore.collectives.synth import synthesize
from etstore.dag import match_messages
from etstore.store import EmbeddedStore
from etstore.store import _streamed as streamed
from etstore.store._ladybug import LadybugGraph


def test_a_full_pool_is_doubled_and_the_load_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pools: list[int] = []
    real_open = LadybugGraph.open

    def recording_open(self: LadybugGraph, incoming: int = 0, *, pool: int | None = None) -> Any:
        if pool:
            pools.append(pool)
        return real_open(self, incoming, pool=pool)

    monkeypatch.setattr(LadybugGraph, "open", recording_open)
    monkeypatch.setattr(streamed, "_pool_for", lambda table, files: 8 << 20)  # too small for these edges
    r = synthesize("mesh2d:8x8", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:
        report = s.ingest_parts(r.trace_parts(max_ops=2000), name="x")
        assert report.trace.ops == r.num_ops == 8064
        messages = len(match_messages(r.trace).send_row)
        assert s.cypher("MATCH (:Op)-[m:MSG]->(:Op) RETURN count(m)").scalar() == messages == 4032
        assert s.cypher("MATCH (:Op)-[d:DEP]->(:Op) RETURN count(d)").scalar() == r.trace.num_deps
    assert pools[0] == 8 << 20 and 16 << 20 in pools  # Ladybug refused 8 MiB: the load went on in 16
    assert not list((tmp_path / "s").glob("spool-*"))


def test_a_checkpoint_short_of_pool_loads_its_table_again_in_a_larger_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a 3 MiB pool Ladybug refuses some CHECKPOINTs after their COPY succeeded, and the
    reopened database has lost that COPY's rows: the table is loaded again whole (its count
    back where it was), so the stored graph is complete. The statements go to the real
    engine; the wrapper only records which ones it refused."""
    refused: list[str] = []
    real_open = LadybugGraph.open

    class Recording:
        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return self._conn.execute(query, *args, **kwargs)
            except RuntimeError:
                refused.append(query.split()[0])
                raise

    def recording_open(self: LadybugGraph, incoming: int = 0, *, pool: int | None = None) -> Any:
        return Recording(real_open(self, incoming, pool=pool))

    first = synthesize("mesh2d:4x4", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:  # the tables hold rows before the load: counts start there
        s.ingest_parts(first.trace_parts(max_ops=200), name="first")
    monkeypatch.setattr(LadybugGraph, "open", recording_open)
    monkeypatch.setattr(streamed, "_pool_for", lambda table, files: 3 << 20)
    r = synthesize("mesh2d:8x8", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest_parts(r.trace_parts(max_ops=2016), name="x")
    assert "CHECKPOINT" in refused  # what this test is about happened
    monkeypatch.undo()
    with EmbeddedStore(tmp_path / "s", read_only=True) as s:  # reopened: what the checkpoints wrote
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == first.num_ops + r.num_ops == 480 + 8064
        deps = s.cypher("MATCH (:Op)-[d:DEP]->(:Op) RETURN count(d)").scalar()
        assert deps == first.trace.num_deps + r.trace.num_deps
        assert s.cypher("MATCH (:Op)-[m:MSG]->(:Op) RETURN count(m)").scalar() == 240 + 4032


def test_each_graph_table_loads_in_its_own_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes, then each edge table, each in a database opened with a pool sized for its own
    rows and closed after its checkpoint (so one load's memory is not under the next)."""
    opened: list[int] = []
    real_open, real_release = LadybugGraph.open, LadybugGraph.release
    released: list[int] = []

    def recording_open(self: LadybugGraph, incoming: int = 0, *, pool: int | None = None) -> Any:
        if self.conn is None:
            opened.append(pool or 0)
        return real_open(self, incoming, pool=pool)

    def recording_release(self: LadybugGraph) -> None:
        released.append(len(opened))
        real_release(self)

    monkeypatch.setattr(LadybugGraph, "open", recording_open)
    monkeypatch.setattr(LadybugGraph, "release", recording_release)
    sizes = {"Op": 64 << 20, "DEP": 96 << 20, "MSG": 128 << 20}
    monkeypatch.setattr(streamed, "_pool_for", lambda table, files: sizes[table])
    r = synthesize("mesh2d:4x4", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "s") as s:
        s.ingest_parts(r.trace_parts(max_ops=100), name="x")
        loads = [p for p in opened if p in sizes.values()]
        assert loads == [64 << 20, 96 << 20, 128 << 20]
        at = [opened.index(p) + 1 for p in loads]  # each load's opening is released before the next
        assert all(any(a <= n < b for n in released) for a, b in pairwise(at))
        assert s.cypher("MATCH (:Op)-[d:DEP]->(:Op) RETURN count(d)").scalar() == r.trace.num_deps


def test_a_store_path_with_glob_characters(tmp_path: Path) -> None:
    r = synthesize("mesh2d:3x3", coll="allgather", trials=1, seed=0)
    with EmbeddedStore(tmp_path / "st[1]" / "s") as s:
        held = s.warehouse  # a warehouse the caller holds keeps working across the ingest
        report = s.ingest_parts(r.trace_parts(max_ops=30), name="x")
        assert report.trace.ops == r.num_ops
        assert held.query("SELECT count(*) FROM ops WHERE trace = 'x'").scalar() == r.num_ops
        assert s.cypher("MATCH (o:Op) RETURN count(o)").scalar() == r.num_ops
