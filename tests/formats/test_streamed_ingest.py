"""Chakra rank files read part by part (:func:`read_et_parts`) store what a whole read stores,
in memory that does not grow with the trace; a bad file mid-way leaves nothing behind.

The inputs are written by ``bench/gen_et.py`` (loaded from its path: bench/ is no package),
a real multi-rank trace from ../shared/fixtures, and an algorithm in the form ``export`` writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import etstore.formats.et_parts as et_parts
from etstore.algorithms.generators import generate
from etstore.app import ingest_files
from etstore.app.ingest_files import ingest_paths
from etstore.cli import main
from etstore.errors import OptionError, TraceFormatError
from etstore.formats import write_algorithm_et
from etstore.formats.et import encode_rank, read_et
from etstore.formats.et_parts import decode_batch, read_et_parts
from etstore.model import Trace
from etstore.proto import GlobalMetadata
from etstore.store import EmbeddedStore
from etstore.store.schema import CONTENT_TABLES

ROOT = Path(__file__).resolve().parents[2]


def _counted(parts: Iterable[Trace], seen: list[int]) -> Iterator[Trace]:
    """The parts, recording each one's ranks."""
    for part in parts:
        seen.append(part.meta.num_rows)
        yield part


def _stored(where: Path) -> dict[str, Any]:
    """Everything a store holds of its one content: the catalog row and every content table."""
    with EmbeddedStore(where, read_only=True) as s:
        got: dict[str, Any] = {
            "content": s.sql(
                "SELECT content_hash, kind, ranks, ops, deps, missing, messages, status FROM contents"
            ).to_arrow(),
            "traces": s.sql("SELECT name, kind, source, params, content_hash FROM traces").to_arrow(),
        }
        for table in CONTENT_TABLES:
            got[table] = s.sql(f"SELECT * FROM {table} ORDER BY ALL").to_arrow()
    return got


def _same_store(a: Path, b: Path) -> None:
    """Two stores hold the same content, row for row (the first differing table is named)."""
    left, right = _stored(a), _stored(b)
    for table, rows in left.items():
        assert rows.equals(right[table]), table


def _whole_and_parts(tmp_path: Path, spec: Path, part_ops: int) -> tuple[Path, Path, list[int]]:
    """``spec`` stored whole (``read_et`` + ``ingest``) and part by part; the parts' rank counts."""
    whole, parted, seen = tmp_path / "whole", tmp_path / "parts", []
    with EmbeddedStore(whole) as s:
        s.ingest(read_et(spec))
    with EmbeddedStore(parted) as s:
        s.ingest_parts(_counted(read_et_parts(spec, part_ops=part_ops), seen))
    return whole, parted, seen


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_parts_store_what_a_whole_read_stores(tmp_path: Path, gz: bool, gen_et: ModuleType) -> None:
    gen_et.generate(tmp_path / "w", ranks=16, ops_per_rank=500, gzip_output=gz)
    whole, parted, seen = _whole_and_parts(tmp_path, tmp_path / "w", part_ops=1800)
    assert len(seen) >= 4 and sum(seen) == 16 and max(seen) <= 4
    _same_store(whole, parted)
    content = _stored(parted)["content"].to_pylist()[0]
    assert (content["ranks"], content["ops"], content["missing"], content["messages"]) == (16, 8000, 16, 16)
    params = json.loads(_stored(parted)["traces"]["params"][0].as_py())
    assert params["comm_groups"] == gen_et.comm_groups(16, 8)  # the sidecar, as read_et reads it


def test_a_real_trace_in_parts(tmp_path: Path, shared_fixture: Any) -> None:
    spec = shared_fixture("astra-sim/examples/workload/microbenchmarks/all_reduce/16npus_1MB")
    whole, parted, seen = _whole_and_parts(tmp_path, spec, part_ops=1)
    assert seen == [1] * 16  # one rank per part: a part holds at least one rank file
    _same_store(whole, parted)


def test_an_algorithms_files_in_parts(tmp_path: Path) -> None:
    """The kind and params need every file: they are read once to tell, then again to store."""
    write_algorithm_et(generate("ring", coll="allreduce", ranks=8, chunks=2), tmp_path / "a" / "ring")
    parts = read_et_parts(tmp_path / "a", part_ops=1)
    assert parts.head.kind == "algorithm"
    assert dict(parts.head.params) == dict(read_et(tmp_path / "a").params)
    parts.close()
    whole, parted, seen = _whole_and_parts(tmp_path, tmp_path / "a", part_ops=1)
    assert seen == [1] * 8
    _same_store(whole, parted)


def test_files_that_stop_looking_like_an_algorithm(tmp_path: Path) -> None:
    """An algorithm's files but the last rank's metadata: a workload, told only by the last file."""
    write_algorithm_et(generate("ring", coll="allreduce", ranks=8, chunks=2), tmp_path / "a" / "ring")
    trace = read_et(tmp_path / "a")
    last = trace.ops.filter(trace.ops["rank"].to_numpy() == 7)
    deps = trace.deps.filter(trace.deps["rank"].to_numpy() == 7)
    other = GlobalMetadata(version="0.0.4").SerializeToString()
    (tmp_path / "a" / "ring.7.et").write_bytes(encode_rank(last, deps, other))
    assert read_et(tmp_path / "a").kind == "workload"
    assert read_et_parts(tmp_path / "a", part_ops=1).head.kind == "workload"
    whole, parted, _ = _whole_and_parts(tmp_path, tmp_path / "a", part_ops=1)
    _same_store(whole, parted)


def test_decode_batch_is_a_plain_function_of_its_files(tmp_path: Path, gen_et: ModuleType) -> None:
    """What a process pool or a cluster runs: ``(rank, path)`` pairs in, tables out."""
    gen_et.generate(tmp_path / "w", ranks=4, ops_per_rank=50)
    files = [(r, tmp_path / "w" / f"scale.{r}.et") for r in (2, 3)]
    batch = decode_batch(files)
    assert batch.meta["rank"].to_pylist() == [2, 3]
    assert batch.ops.num_rows == 100 and batch.missing.num_rows == 2  # each rank's dangling dependency
    assert set(batch.ops["rank"].to_pylist()) == {2, 3}


def test_a_map_fn_decodes_the_batches(tmp_path: Path, gen_et: ModuleType) -> None:
    gen_et.generate(tmp_path / "w", ranks=12, ops_per_rank=100)
    calls: list[int] = []

    def mapped(func: Any, batches: Any) -> Iterator[Any]:
        calls.append(len(batches))
        return map(func, batches)

    parts = read_et_parts(tmp_path / "w", part_ops=100, workers=1, map_fn=mapped)
    with EmbeddedStore(tmp_path / "s") as s:
        info = s.ingest_parts(parts).trace
    assert (info.ops, info.ranks) == (1200, 12)
    assert sum(calls) == 12 and max(calls) == 4  # a window of 4 batches at a time
    with pytest.raises(OptionError, match="read once"):
        list(parts)


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every multi-file ``.et`` input streams, in parts of at most 1,000 ops."""
    monkeypatch.setattr(ingest_files, "STREAM_BYTES", 0)
    monkeypatch.setattr(et_parts, "DEFAULT_PART_OPS", 1000)


@pytest.mark.usefixtures("streamed")
def test_ingest_streams_a_large_input_idempotently(tmp_path: Path, gen_et: ModuleType) -> None:
    gen_et.generate(tmp_path / "w", ranks=12, ops_per_rank=400)
    stages: list[tuple[str, int, int]] = []
    with EmbeddedStore(tmp_path / "s") as s:
        first = ingest_paths(
            s, [tmp_path / "w"], name="big", progress=lambda _p, st, d, t: stages.append((st, d, t))
        )
        again = ingest_paths(s, [tmp_path / "w"], name="big")
        other = ingest_paths(s, [tmp_path / "w"], name="copy")
        names = [t.name for t in s.traces()]
        contents = s.sql("SELECT count(*) FROM contents").scalar()
    assert first.reports[0].created and first.ops == 4800
    parts = [(d, t) for st, d, t in stages if st == "parts"]
    assert len(parts) >= 4 and parts[-1] == (4800, 4800)  # ops staged against the estimate, exact at the end
    assert [d for d, _ in parts] == sorted(d for d, _ in parts)
    assert stages[0][0] == "read"
    assert not again.reports[0].created  # the same content under the same name: already stored
    assert other.reports[0].same_as == "big"
    assert (names, contents) == (["big", "copy"], 1)
    with EmbeddedStore(tmp_path / "whole") as s:
        s.ingest(read_et(tmp_path / "w"), name="big")
        s.ingest(read_et(tmp_path / "w"), name="copy")
    _same_store(tmp_path / "whole", tmp_path / "s")


def _state(capsys: pytest.CaptureFixture[str], store: Path) -> tuple[list[Any], int, int]:
    """What ``etstore ls`` lists, and the op rows SQL sees, in views and in the content table."""
    assert main(["--store", str(store), "ls", "--format", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    with EmbeddedStore(store, read_only=True) as s:
        ops = int(s.sql("SELECT count(*) FROM ops").scalar())
        raw = int(s.sql("SELECT count(*) FROM trace_ops").scalar())
    return listing, ops, raw


@pytest.mark.usefixtures("streamed")
def test_a_corrupt_file_mid_way_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gen_et: ModuleType
) -> None:
    gen_et.generate(tmp_path / "w", ranks=24, ops_per_rank=400)
    bad = tmp_path / "w" / "scale.13.et"
    good = bad.read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # truncated in a node frame
    store = tmp_path / "s"
    assert main(["--store", str(store), "ingest", str(tmp_path / "w"), "--name", "w"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "truncated" in err
    assert not [t for t in threading.enumerate() if t.name.startswith("etstore-decode")]  # none left
    assert _state(capsys, store) == ([], 0, 0)  # the parts staged before the bad file are gone
    with EmbeddedStore(store) as s, pytest.raises(TraceFormatError, match=r"scale\.13\.et"):
        ingest_paths(s, [tmp_path / "w"])
    bad.write_bytes(good)
    assert main(["--store", str(store), "ingest", str(tmp_path / "w"), "--name", "w"]) == 0
    capsys.readouterr()
    listing, ops, raw = _state(capsys, store)
    assert [row["name"] for row in listing] == ["w"] and ops == raw == 24 * 400


_PEAK = """
import json, os, resource, sys
from etstore.cli import main
code = main(["--store", sys.argv[1], "ingest", sys.argv[2], "--format", "json"])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"code": code, "peak_kib": peak}), file=sys.stderr)
"""


def _peak_mib(files: Path, store: Path) -> float:
    """Peak RSS (MiB) of ``etstore ingest FILES`` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(store), str(files)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["code"] == 0, done.stderr
    assert json.loads(done.stdout)[0]["ops"] > 0
    shutil.rmtree(store)
    return float(last["peak_kib"]) / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is KiB on Linux")
def test_peak_memory_does_not_grow_with_the_trace(tmp_path: Path, gen_et: ModuleType) -> None:
    """4x the ranks (3.4M more ops, about 2 GiB more held whole at ~600 bytes per op) within
    200 MiB of the smaller trace's peak. Both are past the digest's 1,048,576 rows held whole
    (``etstore.digest``), which bounds what the smaller one holds too; what still grows is
    DuckDB's cache of the blocks written, ~14 MiB per 1M ops up to the store's 512 MB limit
    while it stages parts (measured: +80 to +110 MiB here)."""
    small, large = tmp_path / "small", tmp_path / "large"
    gen_et.generate(small, ranks=64, ops_per_rank=17_500)
    gen_et.generate(large, ranks=256, ops_per_rank=17_500, jobs=2)
    assert sum(p.stat().st_size for p in small.iterdir()) > ingest_files.STREAM_BYTES  # streamed as is
    peak_small = _peak_mib(small, tmp_path / "s")
    peak_large = _peak_mib(large, tmp_path / "s")
    assert peak_large - peak_small < 200, (peak_small, peak_large)


def test_rank_files_decoded_on_ray_store_what_a_whole_read_stores(tmp_path: Path, gen_et: ModuleType) -> None:
    """``ingest --ray``: the batches decode as Ray tasks on a local Ray instance (given absolute
    paths: a worker does not run in this directory), streamed in order into the store."""
    pytest.importorskip("ray")
    from etstore.app.fanout import fanout

    gen_et.generate(tmp_path / "w", ranks=12, ops_per_rank=400)
    whole = tmp_path / "whole"
    here = os.getcwd()
    os.chdir(tmp_path)  # a relative input, as a user types it (and as each trace's source says)
    try:
        with EmbeddedStore(whole) as s:
            s.ingest(read_et("w"))
        with fanout("local") as fan, EmbeddedStore(tmp_path / "ray") as s:
            stats = ingest_paths(s, ["w"], map_fn=fan.ordered_map)
    finally:
        os.chdir(here)
    assert stats.reports[0].trace.ops == 12 * 400
    _same_store(whole, tmp_path / "ray")
    done = subprocess.run(
        [sys.executable, "-m", "etstore.cli", "--store", str(tmp_path / "cli"), "ingest", "w", "--ray"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CI": "true"},
    )
    assert done.returncode == 0, done.stderr
    assert "etstore: rank files decoded on Ray: 1 node(s)" in done.stderr
    _same_store(whole, tmp_path / "cli")
