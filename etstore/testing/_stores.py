"""Stores and servers for tests: recorded runs, a server holding what a store published, backends."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from etstore.app.publish import publish
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace, deps_table, ops_table
from etstore.store import EmbeddedStore, Store, open_store
from etstore.store._neo4j_bolt import Bolt
from etstore.store._neo4j_target import parse_url

# ---------------------------------------------------------------- stores


@dataclass(frozen=True)
class RecordedStore:
    """What a store of recorded simulation runs holds (the report tests' fixture store).

    Its directory, the run ids (congestion unaware, aware), the sweep id and the trace name.
    """

    path: Path
    runs: tuple[int, int]
    sweep: int
    trace: str


def clear_server(url: str) -> None:
    """Delete every node and relationship of the Neo4j server at ``url`` (a test server shared
    between cases), in transactions of 10,000 nodes; its constraints and indexes stay."""
    bolt = Bolt(parse_url(url), read_only=False)
    try:
        bolt.run("MATCH (n) CALL { WITH n DETACH DELETE n } IN TRANSACTIONS OF 10000 ROWS", write=True)
    finally:
        bolt.close()


class Backend:
    """A writable embedded store, and what it holds as a backend under test reads it: the store
    itself (``url`` None), or the Neo4j server at ``url`` it is published to (the contract
    suite, ``tests/store/contract/``)."""

    def __init__(self, kind: str, store: EmbeddedStore, url: str | None) -> None:
        self.kind = kind
        self.store = store
        """Where a case writes (always embedded)."""
        self.url = url
        self._reader: Store | None = None

    @property
    def location(self) -> str:
        """What ``open_store`` opens to read this backend: the directory, or the server's URL."""
        return self.url if self.url is not None else str(self.store.path)

    def read(self) -> Store:
        """The store to read from, holding what ``store`` holds now (published first on Neo4j)."""
        if self.url is None:
            return self.store
        publish(self.store, self.url, prune=True)
        if self._reader is None:
            self._reader = open_store(self.url)
        return self._reader

    def close(self) -> None:
        """Close the reader and the store."""
        if self._reader is not None:
            self._reader.close()
        self.store.close()


def serve(url: str, directory: Path, traces: dict[str, Trace]) -> None:
    """Make the test server at ``url`` hold ``traces`` (by name) and nothing else: emptied, then
    published to from a new store in ``directory``."""
    clear_server(url)
    with EmbeddedStore(directory) as store:
        for name, trace in traces.items():
            store.ingest(trace, name=name)
        publish(store, url)


@cache
def recorded_trace(path: Path) -> Trace:
    """A recording (PyTorch ET + Kineto directory) read once per process: linking a pair per
    rank takes a good part of a second, and many tests read the same few. Do not change it."""
    return read_pytorch_et(path)


def two_chains() -> Trace:
    """Rank 0: A (100 µs) → B (200 µs), the critical path; rank 1: C (50) → D (50); nothing
    between the ranks (GPU ops): a straggler or a scaled class moves the makespan by hand."""
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "name": ["A", "B", "C", "D"],
            "type": ["COMP_NODE"] * 4,
            "duration_micros": [100, 200, 50, 50],
            "is_cpu_op": [False] * 4,
        }
    )
    return Trace(ops=ops, deps=deps_table([0, 1], [1, 1], [2, 2], "data"), name="chains")
