"""``stored_critical_path`` (a stored trace read a unit of ranks at a time) gives what
``critical_path(store.load(name))`` gives, table for table, on the recorded traces of
tests/data, the third-party traces of ../shared/fixtures (one with dependency cycles), an
expanded trace (messages back and forth between ranks) and a generated multi-rank trace; and
its peak memory does not grow with the number of ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from types import ModuleType

import pytest

from etstore.algorithms.expand import expand
from etstore.analysis import CriticalPath, critical_path
from etstore.app.critical_path import stored_critical_path
from etstore.cli import main
from etstore.errors import CycleError, UnknownTraceError
from etstore.formats import read_trace
from etstore.model import Trace
from etstore.store import EmbeddedStore
from etstore.workloads import transformer

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures"
RECORDINGS = sorted(
    p.name for p in (ROOT / "tests" / "data").iterdir() if p.name.startswith(("torch_", "etplus_"))
)
SHARED_TRACES = {
    "feeder": "chakra/feeder_tests_trace.0.et",  # one rank with dependency cycles
    "all_reduce_16": "astra-sim/examples/workload/microbenchmarks/all_reduce/16npus_1MB",
    "all_to_all_8": "astra-sim/examples/workload/microbenchmarks/all_to_all/8npus_1MB",
}
# (ops per unit, most ops solved at once): one unit; units never grouped; grouped where they wait
CUTS = ((None, None), (300, 0), (1, 0), (1, 2000))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, gen_et: ModuleType) -> Iterator[EmbeddedStore]:
    """One store holding every trace compared (read-only use)."""
    where = tmp_path_factory.mktemp("cp")
    gen_et.generate(where / "gen", ranks=24, ops_per_rank=200)
    traces: dict[str, Trace] = {name: read_trace(ROOT / "tests" / "data" / name) for name in RECORDINGS}
    traces["expanded"] = expand(transformer(ranks=8, tp=2, layers=12, seed=1), "ring").trace
    traces["gen"] = read_trace(where / "gen")
    for name, rel in SHARED_TRACES.items():
        if (SHARED / rel).exists():
            traces[name] = read_trace(SHARED / rel)
    with EmbeddedStore(where / "s") as s:
        for name, trace in traces.items():
            s.ingest(trace, name=name)
        yield s


def _assert_same(want: CriticalPath, got: CriticalPath) -> None:
    assert got.length_micros == want.length_micros
    assert got.dropped_edges == want.dropped_edges
    assert got.path.schema == want.path.schema
    assert got.path.equals(want.path), (want.path.slice(0, 5).to_pylist(), got.path.slice(0, 5).to_pylist())
    assert got.per_rank.equals(want.per_rank)


def _cut(**kw: int | None) -> dict[str, int]:
    return {k: v for k, v in kw.items() if v is not None}


@pytest.mark.parametrize("name", [*RECORDINGS, "expanded", "gen", *SHARED_TRACES])
def test_the_stored_path_is_the_loaded_one(store: EmbeddedStore, name: str) -> None:
    if name in SHARED_TRACES and not (SHARED / SHARED_TRACES[name]).exists():
        pytest.skip(f"fixture {SHARED_TRACES[name]} not available")
    want = critical_path(store.load(name))
    for unit, group in CUTS:
        _assert_same(want, stored_critical_path(store, name, **_cut(unit_ops=unit, max_group_ops=group)))
    rank = store.load(name).ranks[-1]
    _assert_same(critical_path(store.load(name), rank=rank), stored_critical_path(store, name, rank=rank))


def test_cycles_broken_or_refused_as_in_memory(store: EmbeddedStore) -> None:
    if not (SHARED / SHARED_TRACES["feeder"]).exists():
        pytest.skip("fixture chakra/feeder_tests_trace.0.et not available")
    loaded = store.load("feeder")
    with pytest.raises(CycleError) as refused:
        critical_path(loaded, on_cycle="raise")
    with pytest.raises(CycleError) as raised:
        stored_critical_path(store, "feeder", on_cycle="raise")
    assert str(raised.value) == str(refused.value)
    assert stored_critical_path(store, "feeder").dropped_edges == critical_path(loaded).dropped_edges > 0


def test_unknown_trace_and_rank(store: EmbeddedStore) -> None:
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        stored_critical_path(store, "nope")
    with pytest.raises(UnknownTraceError, match=r"trace 'gen' has no rank 99 \(ranks: \[0, 1,"):
        stored_critical_path(store, "gen", rank=99)


def test_progress_counts_the_ops_placed(store: EmbeddedStore) -> None:
    steps: list[tuple[str, int, int]] = []
    stored_critical_path(store, "gen", unit_ops=1000, progress=lambda *s: steps.append(s))
    phases = [phase for phase, _ in groupby(s[0] for s in steps)]
    assert phases == ["ranks", "path", "path ops"]
    placed = [(d, t) for p, d, t in steps if p == "path"]
    assert placed[-1] == (24 * 200, 24 * 200) and [d for d, _ in placed] == sorted(d for d, _ in placed)


def test_the_command_prints_the_stored_path(
    store: EmbeddedStore, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    want = critical_path(store.load("gen"))
    where = str(store.location)
    for table, rows in (("path", want.path.to_pylist()), ("ranks", want.per_rank.to_pylist())):
        argv = [
            "--store",
            where,
            "critical-path",
            "gen",
            "--table",
            table,
            "--format",
            "json",
            "--limit",
            "0",
        ]
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out) == rows


@pytest.mark.usefixtures("terminal")
def test_the_commands_draw_their_phases_on_a_terminal(
    store: EmbeddedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    where = str(store.location)
    assert main(["--store", where, "critical-path", "gen", "--table", "summary", "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert "critical-path gen (path ops)" in out  # the bar's last frame
    assert main(["--store", where, "breakdown", "gen", "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert "breakdown gen (ranks)" in out and f"{24 * 200}/{24 * 200}" in out


# ---------------------------------------------------------------- memory

# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent (this test process,
# which holds the traces it stored), while VmHWM is the new process's own high-water mark
_PEAK = """
import json, sys
from pathlib import Path
from etstore.app.critical_path import stored_critical_path
from etstore.app.breakdown import stored_breakdown
from etstore.store import EmbeddedStore
with EmbeddedStore(sys.argv[1], read_only=True) as s:
    cp = stored_critical_path(s, "w", unit_ops=int(sys.argv[2]))
    b = stored_breakdown(s, "w", unit_ops=int(sys.argv[2]))
    rows = sum(t.num_rows for t in b.collective_batches())
hwm = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
print(json.dumps({"peak_kib": int(hwm.split()[1]), "rows": rows}))
"""


def _peak_mib(store: Path, unit_ops: int) -> float:
    """Peak RSS (MiB) of both stored analyses of ``w`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(store), str(unit_ops)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout)["peak_kib"]) / 1024


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_peak_memory_does_not_grow_with_the_ranks(tmp_path: Path, gen_et: ModuleType) -> None:
    """4x the ranks (880k more ops: ≈ 390 MB more for the in-memory path at ≈ 440 bytes per op)
    within 64 MiB of the smaller trace's peak, both read in units of 100k ops (measured: 252-254
    MiB and 246 MiB). What could grow is DuckDB's cache of the blocks read and the collective
    instances (≈ 40 bytes each)."""
    peaks = []
    for ranks in (48, 192):
        gen_et.generate(
            tmp_path / f"w{ranks}", ranks=ranks, ops_per_rank=6100
        )  # no pool: gen_et may be stale
        with EmbeddedStore(tmp_path / f"s{ranks}") as s:
            s.ingest(read_trace(tmp_path / f"w{ranks}"), name="w")
        peaks.append(_peak_mib(tmp_path / f"s{ranks}", 100_000))
    assert peaks[1] - peaks[0] < 64, peaks
