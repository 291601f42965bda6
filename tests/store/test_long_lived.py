"""One process, many ingests: the embedded store must not hold on to what each load brought in.

Ladybug keeps loaded pages in its buffer pool until the database closes; a store open for
a long time (a notebook, a service) used to fill the pool after ~110 small ingests and fail
every later one. The store now releases the graph after each load.
"""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.algorithms import generate
from etstore.model import Trace
from etstore.store import open_store


def _variant(base: Trace, i: int) -> Trace:
    """The same algorithm with durations of ``i + 1`` µs: new content, hence a real load."""
    ops = base.ops
    col = ops.schema.get_field_index("duration_micros")
    durations = pa.array(np.full(ops.num_rows, i + 1, dtype=np.uint64))
    return base.replace(name=f"t{i}", ops=ops.set_column(col, "duration_micros", durations))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ingest_many(path: Path, count: int) -> list[float]:
    base = generate("ring", coll="allreduce", ranks=4)
    peaks = []
    with open_store(path, write=True) as store:
        for i in range(count):
            assert store.ingest(_variant(base, i)).created
            peaks.append(_rss_mib())
        assert len(store.traces()) == count
        assert store.sql("SELECT count(DISTINCT trace) AS n FROM ops").scalar() == count
    return peaks


def test_memory_stays_flat_over_many_ingests(tmp_path: Path) -> None:
    # before the fix each of these ingests added ~15 MiB of peak memory (buffer pool pages)
    peaks = _ingest_many(tmp_path / "s", 80)
    assert peaks[-1] - peaks[19] < 150, f"peak memory grew {peaks[-1] - peaks[19]:.0f} MiB over 60 ingests"


@pytest.mark.slow
def test_five_hundred_ingests_in_one_process(tmp_path: Path) -> None:
    peaks = _ingest_many(tmp_path / "s", 500)
    assert peaks[-1] - peaks[49] < 200
