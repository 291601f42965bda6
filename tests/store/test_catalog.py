"""The embedded catalog on its own: names are unique even between processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from etstore.errors import StoreError
from etstore.store.catalog import Catalog, ContentRecord, NameRecord


def test_a_name_taken_meanwhile_is_a_store_error(tmp_path: Path) -> None:
    one = Catalog(tmp_path / "catalog.sqlite")
    other = Catalog(tmp_path / "catalog.sqlite")  # a second process's view of the same file
    seq = one.add_content(ContentRecord(content_hash="h", kind="workload")).seq
    assert seq is not None
    one.commit_content(seq, NameRecord(name="a", trace_id=seq), ops=3)
    with pytest.raises(StoreError, match="'a' was taken by another ingest meanwhile"):
        other.add_name(NameRecord(name="a", trace_id=seq))
    second = other.add_content(ContentRecord(content_hash="g", kind="workload")).seq
    assert second is not None
    with pytest.raises(StoreError, match="'a' was taken"):
        other.commit_content(second, NameRecord(name="a", trace_id=second))
    assert [n.name for n, _ in one.names()] == ["a"]
    assert [c.seq for c in one.stale()] == [second]  # left loading: the next open sweeps it
    one.engine.dispose()
    other.engine.dispose()
