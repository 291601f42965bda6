"""A Python handle on a store and the commands beside it: the README's ``open_store(...)`` without
``with`` holds no writer lock, and a writer handle never outlives its object or its interpreter."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import etstore
from etstore.errors import StoreError
from etstore.workloads import transformer

# another process waits at most this long (seconds): a test waiting on a lock fails instead of hanging
_WAIT_S = "2"


def _etstore(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``etstore ARGV`` in its own process, and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "etstore.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ETSTORE_WAIT": _WAIT_S},
    )
    return done, time.monotonic() - started


def _stored(path: Path) -> Path:
    with etstore.open_store(path, write=True) as store:
        store.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
    return path


def test_open_store_is_read_only_and_commands_beside_it_do_not_wait(tmp_path: Path) -> None:
    path = _stored(tmp_path / "s")
    store = etstore.open_store(path)  # as the README had it: no `with`, open for as long as it lives
    try:
        assert store.read_only
        with pytest.raises(StoreError, match="is open read-only"):
            store.ingest(transformer(ranks=2, layers=1, tp=1), name="b")
        for argv in (
            ("ls", "--format", "csv"),
            ("sql", "SELECT count(*) AS n FROM traces", "--format", "csv"),
        ):
            done, seconds = _etstore("--store", str(path), *argv)
            assert done.returncode == 0 and "waiting" not in done.stderr, (argv, done.stderr)
            assert seconds < float(_WAIT_S) + 20, argv
        assert done.stdout == "n\n1\n"
    finally:
        store.close()


def test_a_read_only_open_that_creates_the_store_holds_it_as_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "new"
    with etstore.open_store(path) as store:  # nothing there yet: the open creates the store
        assert store.read_only and not (path / "journal.json").exists()
        done, _ = _etstore("--store", str(path), "ls", "--format", "csv")
        assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith("name,kind")
        assert store.cypher("MATCH (o:Op) RETURN count(*) AS n").to_pylist() == [{"n": 0}]
        assert store.sql("SELECT count(*) AS n FROM ops").to_pylist() == [{"n": 0}]
    written = sorted(p.name for p in path.iterdir())
    # the open made the store (its warehouse, and the listing a writer leaves); as a reader it
    # wrote nothing more: no graph, no journal
    assert written == ["listing.json", "lock", "lock.readers", "warehouse.duckdb"]


def test_a_dropped_writer_lets_the_next_writer_in_at_once(tmp_path: Path) -> None:
    path = _stored(tmp_path / "s")
    writer = etstore.open_store(path, write=True)
    writer.ingest(transformer(ranks=2, layers=2, tp=1), name="b")
    del writer  # never closed
    gc.collect()
    done, _ = _etstore("--store", str(path), "rm", "b")
    assert (done.returncode, done.stdout) == (0, "removed b\n"), done.stderr
    assert done.stderr == ""  # neither "waiting for PID ..." nor "recovering from an interrupted ..."


_LEFT_OPEN = """
import sys
import etstore
from etstore.workloads import transformer
store = etstore.open_store(sys.argv[1], write=True)
store.ingest(transformer(ranks=2, layers=2, tp=1), name="b")
"""  # and the interpreter exits with the writer open


def test_a_writer_open_at_exit_leaves_nothing_to_recover(tmp_path: Path) -> None:
    path = _stored(tmp_path / "s")
    left = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert left.returncode == 0, left.stderr
    assert not (path / "journal.json").exists()
    done, _ = _etstore("--store", str(path), "ls", "--format", "csv")
    assert done.returncode == 0 and done.stderr == ""
    assert [line.split(",")[0] for line in done.stdout.splitlines()] == ["name", "a", "b"]
