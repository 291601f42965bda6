"""Several real ``etstore`` processes on one store: writers wait for each other, readers never fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etstore.errors import StoreError
from etstore.formats.comm_groups import write_astra_et
from etstore.store import EmbeddedStore
from etstore.store._lock import StoreLock
from etstore.workloads import transformer

_SCRIPT = Path(sys.executable).parent / "etstore"
CLI = [sys.executable, str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "etstore.cli"]
WRITERS = 6


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CI": "true", "ETSTORE_WAIT": "300", **extra}


def _start(store: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "--store", str(store), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
    )


_READER_LOOP = """
import subprocess, sys, time
cli, store, stop, args = sys.argv[1:5]
runs = failures = 0
from pathlib import Path
while not Path(stop).exists():
    p = subprocess.run([sys.executable, "-m", "etstore.cli", "--store", store, *args.split("\\x1f")],
                       capture_output=True, text=True)
    runs += 1
    if p.returncode != 0:
        failures += 1
        sys.stderr.write(p.stderr)
print(runs, failures)
"""


def test_parallel_writers_and_readers(tmp_path: Path) -> None:
    store = tmp_path / "s"
    inputs = []
    for i in range(WRITERS):  # six different traces: each must land once
        prefix = tmp_path / "in" / f"t{i}"
        write_astra_et(transformer(ranks=8, layers=4 + i, tp=2, name=f"t{i}"), prefix)
        inputs.append(prefix)
    with EmbeddedStore(store) as s:  # a store that exists, so readers have something to read
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="seed")
    stop = tmp_path / "stop"
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", _READER_LOOP, "", str(store), str(stop), "\x1f".join(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for args in (
            ["ls", "--format", "csv"],
            ["sql", "SELECT trace, count(*) FROM ops GROUP BY 1"],
            ["cypher", "MATCH (t:Trace), (o:Op) WHERE o.trace_id = t.trace_id RETURN t.name, count(o)"],
        )
    ]
    # the writers start while this process writes, so they overlap however fast each one is
    with EmbeddedStore(store, purpose="test"):
        writers = [_start(store, "ingest", str(p)) for p in inputs]
        assert writers[0].stderr is not None
        first = writers[0].stderr.readline()  # returns once that writer waits for this process
    assert first.startswith(f"etstore: waiting for PID {os.getpid()} (test) to finish writing"), first
    results = [w.communicate(timeout=600) for w in writers]
    results[0] = (results[0][0], first + results[0][1])
    stop.touch()
    read = [r.communicate(timeout=600) for r in readers]
    for w, (_out, err) in zip(writers, results, strict=True):
        assert w.returncode == 0, err
        assert "Traceback" not in err
    waited = [err for _, err in results if "waiting for PID" in err]
    assert waited, "no writer had to wait: the test did not overlap them"
    assert all("to finish writing" in err.splitlines()[0] for err in waited)
    for out, err in read:
        runs, failures = map(int, out.split())
        assert runs >= 1 and failures == 0, err
    with EmbeddedStore(store, read_only=True) as s:
        listed = {t.name: t.ops for t in s.traces()}
        expected = {f"t{i}": transformer(ranks=8, layers=4 + i, tp=2).num_ops for i in range(WRITERS)}
        assert listed == {"seed": transformer(ranks=2, layers=1, tp=1).num_ops, **expected}
        by_sql = s.sql("SELECT trace AS t, count(*) AS n FROM ops GROUP BY 1").to_pylist()
        assert {r["t"]: r["n"] for r in by_sql} == listed
        by_graph = s.cypher(
            "MATCH (x:Trace), (o:Op) WHERE o.trace_id = x.trace_id RETURN x.name AS t, count(o) AS n"
        ).to_pylist()
        assert {r["t"]: r["n"] for r in by_graph} == listed


def test_a_writer_gives_up_after_the_wait_limit_in_one_line(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with EmbeddedStore(store, purpose="test") as s:  # this process writes; another comes
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
        started = time.monotonic()
        p = _start(store, "--wait", "1", "rm", "a")
        _out, err = p.communicate(timeout=60)
        took = time.monotonic() - started
    assert p.returncode == 1 and took >= 1.0
    lines = err.strip().splitlines()
    assert lines[0] == f"etstore: waiting for PID {os.getpid()} (test) to finish writing {store} ..."
    assert lines[1] == (
        f"etstore: error: {store}: gave up after 1 s waiting for PID {os.getpid()} (test) to finish "
        f"writing {store}; nothing was done (set ETSTORE_WAIT to wait longer)"
    )
    assert len(lines) == 2
    with EmbeddedStore(store, read_only=True) as s:
        assert [t.name for t in s.traces()] == ["a"]


def test_a_reader_waits_for_the_writer_then_sees_its_work(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with EmbeddedStore(store, purpose="test") as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
        p = _start(store, "ls", "--format", "csv", env=_env(ETSTORE_WAIT="60"))
        time.sleep(1.5)  # the reader is waiting now
        assert p.poll() is None
        s.ingest(transformer(ranks=2, layers=2, tp=1), name="b")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert err.startswith(f"etstore: waiting for PID {os.getpid()} (test) to finish writing {store} ...")
    assert [line.split(",")[0] for line in out.splitlines()[1:]] == ["a", "b"]


def test_a_writer_waits_for_readers_and_names_them(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with EmbeddedStore(store) as s:
        s.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
    with EmbeddedStore(store, read_only=True):
        p = _start(store, "--wait", "0.8", "rm", "a")
        _, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert f"waiting for PID {os.getpid()} (reading) to finish reading {store}" in err


def test_wait_limit_from_the_environment_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETSTORE_WAIT", "soon")
    with pytest.raises(StoreError, match=r"ETSTORE_WAIT='soon': expected a number of seconds >= 0"):
        EmbeddedStore(tmp_path / "s")
    monkeypatch.setenv("ETSTORE_WAIT", "nan")
    with pytest.raises(StoreError, match=r"ETSTORE_WAIT='nan'"):
        EmbeddedStore(tmp_path / "s")
    monkeypatch.delenv("ETSTORE_WAIT")
    with pytest.raises(StoreError, match=r"wait limit -1 s: expected a number of seconds >= 0"):
        EmbeddedStore(tmp_path / "s", wait_s=-1)
    with pytest.raises(StoreError, match=r"wait limit nan s: expected a number of seconds >= 0"):
        EmbeddedStore(tmp_path / "s", wait_s=float("nan"))


def test_one_process_may_open_a_store_twice(tmp_path: Path) -> None:
    """Nested opens share the process's lock instead of waiting for themselves."""
    store = tmp_path / "s"
    with EmbeddedStore(store, wait_s=0) as w:
        w.ingest(transformer(ranks=2, layers=1, tp=1), name="a")
        with EmbeddedStore(store, read_only=True, wait_s=0) as r:
            assert [t.name for t in r.traces()] == ["a"]
        assert (store / "journal.json").exists()  # the writer is still open
    assert not (store / "journal.json").exists()
    assert StoreLock._held == {}
