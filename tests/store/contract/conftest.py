"""The contract suite runs unchanged against every backend that is reachable here.

The Neo4j cases need ``ETSTORE_TEST_NEO4J=neo4j://user:pass@127.0.0.1:7687``;
``make test`` sets it by starting ``scripts/neo4j.sh`` whenever Java and Maven exist.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.store import Store, open_store

BACKENDS = ["embedded", "neo4j"]
NEO4J_ENV = "ETSTORE_TEST_NEO4J"


def neo4j_url() -> str:
    """The test server's URL, or a skip saying why there is none."""
    url = os.environ.get(NEO4J_ENV)
    if url:
        return url
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"Neo4j cases need {' and '.join(missing)} (JDK 17, Maven 3.8+) to run a local server")
    pytest.skip(f"no Neo4j server: run `make test`, or export {NEO4J_ENV}=$(scripts/neo4j.sh start)")


def wipe(store: Store) -> None:
    for t in store.traces():
        store.remove(t.name)


@pytest.fixture(params=BACKENDS)
def backend_location(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the backend under test lives: a fresh directory, or the test server (emptied)."""
    if request.param == "embedded":
        return str(tmp_path / "store")
    url = neo4j_url()
    monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
    from etstore.store.neo4j import Neo4jStore

    with Neo4jStore(url, stale_after_s=0) as s:  # also sweeps what a failed test left loading
        wipe(s)
    return url


@pytest.fixture
def backend_store(backend_location: str) -> Iterator[Store]:
    s = open_store(backend_location)
    try:
        yield s
    finally:
        s.close()
