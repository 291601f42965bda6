"""The contract suite runs unchanged against every backend that is reachable here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.store import Store, open_store

BACKENDS = ["embedded", "neo4j"]


@pytest.fixture(params=BACKENDS)
def backend_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "embedded":
        with open_store(tmp_path / "store") as s:  # type: ignore[attr-defined]
            yield s
        return
    url = os.environ.get("ETSTORE_TEST_NEO4J")
    if not url:
        pytest.skip(
            "no Neo4j server: set ETSTORE_TEST_NEO4J=neo4j://user:pass@127.0.0.1:7687 (scripts/neo4j.sh)"
        )
    s = open_store(url)
    try:
        for t in s.traces():
            s.remove(t.name)
        yield s
    finally:
        s.close()
