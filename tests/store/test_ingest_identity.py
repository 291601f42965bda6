"""The embedded ingest computes a trace's identity beside the warehouse write when no stored
content has its kind and counts, and before it otherwise: either way the catalog and the
``traces`` rows record the same identity, and known content is found again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from etstore.store import EmbeddedStore
from etstore.store._identity import identity, may_be_stored
from etstore.store.catalog import ContentRecord
from etstore.workloads import transformer


def _stored_identities(s: EmbeddedStore) -> dict[str, tuple[str, str]]:
    """name -> (the catalog's content hash, the ``traces.content_hash`` SQL shows)."""
    sql = {r["name"]: r["content_hash"] for r in s.sql("SELECT name, content_hash FROM traces").to_pylist()}
    return {n.name: (c.content_hash, sql[n.name]) for n, c in s.catalog.names()}


def test_identity_computed_beside_the_load_is_recorded_and_found_again(tmp_path: Path) -> None:
    first = transformer(ranks=2, layers=1, tp=1)
    # the same shape (ops, deps, ranks) with other durations: other content, equal counts
    durations = first.ops["duration_micros"]
    other = replace(
        first,
        ops=first.ops.set_column(
            first.ops.schema.get_field_index("duration_micros"),
            "duration_micros",
            pc.add(durations, pa.scalar(1, durations.type)),
        ),
    )
    assert (other.num_ops, other.num_deps) == (first.num_ops, first.num_deps)
    with EmbeddedStore(tmp_path / "s") as s:
        assert not may_be_stored(first, [])  # an empty store: hashed beside the write
        a = s.ingest(first, name="a")
        assert may_be_stored(other, [c for _, c in s.catalog.names()])  # equal counts: hashed first
        b = s.ingest(other, name="b")
        again = s.ingest(first, name="a-again")
        got = _stored_identities(s)
        assert got["a"] == (identity(first), identity(first))
        assert got["b"] == (identity(other), identity(other))
        assert identity(first) != identity(other)
        assert a.created and b.created and b.same_as is None
        assert again.created and again.same_as == "a" and got["a-again"] == got["a"]
        assert [c.content_hash for c in s.catalog.contents()] == [identity(first), identity(other)]
        assert s.sql("SELECT count(*) FROM contents").scalar() == 2  # a-again stored no content
        # the two contents keep their own durations (hand-made: every duration of b is one more)
        total = "SELECT sum(duration_micros) FROM ops WHERE trace = $t"
        assert s.sql(total, {"t": "b"}).scalar() == s.sql(total, {"t": "a"}).scalar() + first.num_ops


def test_only_content_of_the_same_kind_and_counts_may_be_the_same() -> None:
    trace = transformer(ranks=2, layers=1, tp=1)
    kind, ops, deps = str(trace.kind), trace.num_ops, trace.num_deps

    def rec(kind: str, ops: int, deps: int) -> ContentRecord:
        return ContentRecord(content_hash="h", kind=kind, ops=ops, deps=deps)

    assert may_be_stored(trace, [rec("algorithm", ops, deps), rec(kind, ops, deps)])
    assert not may_be_stored(trace, [rec("algorithm", ops, deps)])  # another kind
    assert not may_be_stored(trace, [rec(kind, ops + 1, deps), rec(kind, ops, deps - 1)])
