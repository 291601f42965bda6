"""``stored_breakdown`` (a stored recording read a unit of ranks at a time, its collectives
aggregated in DuckDB) gives what ``breakdown(store.load(name))`` gives, table for table: on the
recordings of tests/data, their expansions (the replaced collectives come from the expansion's
record) and a generated multi-rank trace with thousands of collectives; ``etstore breakdown``
prints the collectives part by part, as it printed them whole."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from etstore.analysis.breakdown import Breakdown, breakdown
from etstore.app.breakdown import stored_breakdown
from etstore.app.expand import expand_stored
from etstore.cli import main
from etstore.cli._render import render
from etstore.errors import OptionError, UnknownTraceError
from etstore.formats import read_trace
from etstore.store import EmbeddedStore

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
DEVICE = ("etplus_ddp_cuda_1r", "torch_ddp_cuda_1r", "torch_ddp_cuda_gloo_2r", "torch_tp_cuda_gloo_2r")
CPU_ONLY = "torch_ddp_2r"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, gen_et: ModuleType) -> Iterator[EmbeddedStore]:
    """The recordings, two of them expanded (``<name>-expanded``), and a generated trace ``gen``."""
    where = tmp_path_factory.mktemp("bd")
    gen_et.generate(where / "gen", ranks=32, ops_per_rank=300)
    with EmbeddedStore(where / "s") as s:
        for name in (*DEVICE, CPU_ONLY):
            s.ingest(read_trace(DATA / name), name=name)
        for name in ("torch_ddp_cuda_gloo_2r", "torch_tp_cuda_gloo_2r"):
            expand_stored(s, name, "ring:2")
        s.ingest(read_trace(where / "gen"), name="gen")
        yield s


def _assert_same(want: Breakdown, got: Breakdown) -> None:
    for table in ("ranks", "kernels", "collectives"):
        a, b = getattr(want, table), getattr(got, table)
        assert b.schema == a.schema, table
        assert b.equals(a), (table, a.slice(0, 3).to_pylist(), b.slice(0, 3).to_pylist())


@pytest.mark.parametrize(
    "name", [*DEVICE, "torch_ddp_cuda_gloo_2r-expanded", "torch_tp_cuda_gloo_2r-expanded", "gen"]
)
def test_the_stored_breakdown_is_the_loaded_ones(store: EmbeddedStore, name: str) -> None:
    want = breakdown(store.load(name))
    for unit_ops in (10**9, 1000, 1):
        _assert_same(want, stored_breakdown(store, name, unit_ops=unit_ops).to_breakdown())


def test_the_generated_trace_has_every_kind_of_row(store: EmbeddedStore) -> None:
    got = stored_breakdown(store, "gen", unit_ops=1000)
    parts = list(got.collective_batches())
    assert len(parts) == 11  # 32 ranks of 300 ops, 3 ranks a unit: a part each
    assert sum(p.num_rows for p in parts) == 32 * 64  # 2 tensor-parallel, 1 data-parallel a layer
    assert got.ranks.num_rows == 32 and set(got.kernels["kernel_class"].to_pylist()) == {"COMPUTATION"}


def test_an_expansion_keeps_its_recordings_collectives(store: EmbeddedStore) -> None:
    """The replaced collectives come back from the expansion's record, with their own start times."""
    for name in ("torch_ddp_cuda_gloo_2r", "torch_tp_cuda_gloo_2r"):
        want = breakdown(store.load(name)).collectives
        assert stored_breakdown(store, f"{name}-expanded").to_breakdown().collectives.equals(want)


def test_nothing_to_break_down(store: EmbeddedStore) -> None:
    with pytest.raises(OptionError) as loaded:
        breakdown(store.load(CPU_ONLY))
    with pytest.raises(OptionError) as stored:
        stored_breakdown(store, CPU_ONLY)
    assert str(stored.value) == str(loaded.value)
    with pytest.raises(UnknownTraceError, match="no trace named 'nope'"):
        stored_breakdown(store, "nope")


def test_progress_counts_the_ops_read(store: EmbeddedStore) -> None:
    steps: list[tuple[str, int, int]] = []
    got = stored_breakdown(store, "gen", unit_ops=3000, progress=lambda *s: steps.append(s))
    list(got.collective_batches(progress=lambda *s: steps.append(s)))
    assert [s for s in steps if s[0] == "ranks"][-1] == ("ranks", 32 * 300, 32 * 300)
    assert [s for s in steps if s[0] == "collectives"][-1] == ("collectives", 4, 4)


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_the_command_prints_the_collectives_part_by_part_as_whole(
    store: EmbeddedStore, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    want = breakdown(store.load("gen")).collectives
    argv = ["--store", str(store.location), "breakdown", "gen", "--table", "collectives", "--format", fmt]
    for limit in (0, 5):
        assert main([*argv, "--limit", str(limit)]) == 0
        got = capsys.readouterr()
        shown = want if not limit else want.slice(0, limit)
        if fmt == "json":
            assert json.loads(got.out) == shown.to_pylist()
        expected = io.StringIO()
        if fmt != "table":
            render(shown, fmt, out=expected)
            assert got.out == expected.getvalue()
        else:
            assert "gen: collectives" in got.out and got.out.count("ALL_REDUCE") == (
                pa.compute.sum(pa.compute.equal(shown["comm_type"], "ALL_REDUCE")).as_py()
            )
        hidden = want.num_rows - shown.num_rows
        assert (f"… {hidden:,} more rows ({want.num_rows:,} in all)" in got.out + got.err) == bool(hidden)
