"""The interface itself: context manager, the warehouse and its schema (every backend); kind
checks and batch ingest (the embedded store: the one written)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from etstore.app.ingest_files import ingest_paths
from etstore.errors import OptionError, StoreError, TraceFormatError
from etstore.formats import read_et
from etstore.model import DepKind, Trace, TraceKind, deps_table, ops_table
from etstore.store import EmbeddedStore, Store, open_store
from etstore.store.schema import TRACE_TABLES
from etstore.store.tables import declared, table_set
from etstore.store.warehouse import Warehouse
from etstore.testing import Backend


def _tiny(name: str = "tiny", kind: str = "workload") -> Trace:
    ops = ops_table({"rank": [0, 0], "id": [1, 2], "name": ["a", "b"], "type": ["COMP_NODE", "COMP_NODE"]})
    return Trace(ops, deps=deps_table([0], [1], [2]), name=name, kind=kind)


def test_store_is_a_context_manager_with_a_warehouse(backend: Backend) -> None:
    backend.read()  # nothing published yet: the server is empty
    with open_store(backend.location) as store:
        assert isinstance(store, Store)
        wh = store.warehouse
        assert isinstance(wh, Warehouse)
        names = {r[0] for r in wh.query("SELECT table_name FROM information_schema.tables")}
        # every table and view exists from the first open, before anything is written: the
        # store's own and every feature's (measured runs, tuner runs, calibrations, ...)
        features = {t for name in declared() for t in (*table_set(name).tables, *table_set(name).views)}
        assert {"runs", "v_collective_busbw", "measurements", "v_tuner_best", "v_measured_vs_sim"} <= features
        assert {*TRACE_TABLES, "traces", *features} <= names
        with pytest.raises(AttributeError):
            store.warehouse = wh  # type: ignore[misc]


def test_unknown_kinds_are_refused(store: EmbeddedStore) -> None:
    with pytest.raises(StoreError, match="unknown kind 'weird'"):
        store.ingest(_tiny(kind="weird"))
    bad = _tiny()
    bad = replace(bad, deps=bad.deps.set_column(3, "kind", pa.array(["maybe"])))
    with pytest.raises(StoreError, match="dependency kind 'maybe'"):
        store.ingest(bad)
    assert store.traces() == []
    report = store.ingest(_tiny(kind=TraceKind.ALGORITHM))
    assert report.trace.kind == "algorithm" and type(report.trace.kind) is str
    assert store.sql("SELECT kind FROM traces").scalar() == "algorithm"
    assert store.sql("SELECT kind FROM deps").scalar() == DepKind.DATA.value


def test_batch_raise_names_the_file_and_what_landed(
    store: EmbeddedStore, rt_template: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.0.et"
    bad.write_bytes(b"")
    with pytest.raises(TraceFormatError) as err:
        ingest_paths(store, [rt_template, bad])
    assert str(err.value).startswith(str(bad))
    assert "stored before this failure: chakra_trace" in str(err.value)
    assert [t.name for t in store.traces()] == ["chakra_trace"]


def test_batch_skip_goes_on(
    store: EmbeddedStore, rt_template: Path, custom_allreduce: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.0.et"
    bad.write_bytes(b"")
    seen: list[tuple[str, str]] = []
    stats = ingest_paths(
        store,
        [rt_template, bad, custom_allreduce, rt_template],
        on_error="skip",
        progress=lambda path, stage, _done, _total: seen.append((path, stage)),
    )
    assert (stats.files_ok, stats.files_skipped) == (3, 1)
    assert stats.skipped[0][0] == str(bad) and "empty file" in stats.skipped[0][1]
    assert [r.created for r in stats.reports] == [True, True, False]
    expected = read_et(rt_template).num_ops * 2 + read_et(custom_allreduce).num_ops
    assert stats.ops == expected and stats.deps >= 0 and stats.missing >= 0
    assert (str(bad), "read") in seen and (str(custom_allreduce), "read") in seen


def test_batch_options(store: EmbeddedStore, rt_template: Path) -> None:
    with pytest.raises(OptionError, match="one trace"):
        ingest_paths(store, [rt_template, rt_template], name="x")
    with pytest.raises(OptionError, match="on_error"):
        ingest_paths(store, [rt_template], on_error="ignore")  # type: ignore[arg-type]
    stats = ingest_paths(store, [rt_template], name="named")
    assert stats.reports[0].trace.name == "named"
    assert store.traces()[0].name == "named"
