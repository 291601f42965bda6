"""The embedded store finishes a removal or an ingest cut short after (or before) its commit point."""

from __future__ import annotations

from pathlib import Path

from etstore.store import EmbeddedStore
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
