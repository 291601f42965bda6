"""The contract suite runs unchanged against every backend that is reachable here.

The Neo4j cases need ``ETSTORE_TEST_NEO4J=neo4j://user:pass@127.0.0.1:7687``;
``make test`` sets it by starting ``scripts/neo4j.sh`` whenever Java and Maven exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.store import Store, open_store
from etstore.testing import clear_store

BACKENDS = ["embedded", "neo4j"]


@pytest.fixture(params=BACKENDS)
def backend_location(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the backend under test lives: a fresh directory, or the test server (emptied)."""
    if request.param == "embedded":
        return str(tmp_path / "store")
    url = str(request.getfixturevalue("neo4j_url"))  # the server's URL, or a skip saying why
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    from etstore.store.neo4j import Neo4jStore

    with Neo4jStore(url, stale_after_s=0) as s:  # also sweeps what a failed test left loading
        clear_store(s)
    return url


@pytest.fixture
def backend_store(backend_location: str) -> Iterator[Store]:
    s = open_store(backend_location, write=True)
    try:
        yield s
    finally:
        s.close()
