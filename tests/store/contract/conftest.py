"""The contract suite: what a store answers, the same on every backend that is reachable here.

Data always enters through an embedded store (``backend.store``): a Neo4j server holds what
``etstore publish`` sends, nothing else. ``backend.read()`` gives the store the reading
assertions run on: for ``embedded`` the same store, for ``neo4j`` the test server opened by
its URL after the store was published to it (with ``prune``, so it holds exactly what the
store holds). Contracts about writing (ingest errors, atomicity, streamed parts) take the
embedded ``store`` fixture only.

The Neo4j cases need ``ETSTORE_TEST_NEO4J=neo4j://user:pass@127.0.0.1:7687``;
``make test`` sets it by starting ``scripts/neo4j.sh`` whenever Java and Maven exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from etstore.store import EmbeddedStore
from etstore.testing import Backend, clear_server

BACKENDS = ["embedded", "neo4j"]


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    """A fresh store, and for ``neo4j`` the test server emptied (or a skip saying why there is none)."""
    url = None
    if request.param == "neo4j":
        url = str(request.getfixturevalue("neo4j_url"))
        monkeypatch.setenv("ETSTORE_WAREHOUSE", str(tmp_path / "warehouse"))
        clear_server(url)
    b = Backend(request.param, EmbeddedStore(tmp_path / "store"), url)
    try:
        yield b
    finally:
        b.close()
