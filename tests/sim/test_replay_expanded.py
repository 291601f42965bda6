"""An expanded recording replays against the steps its parent measured.

Its algorithms' sends and receives were never recorded, so it replays on the network fitted
to the recorded collectives it replaced; with every collective expanded into the algorithm
the fitted network is timed with (a ring), it tracks the parent's fitted replay.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from etstore.algorithms.expand import expand
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace
from etstore.sim.replay import TRANSFER_NAME, collective_transfers, replay

DATA = Path(__file__).resolve().parents[1] / "data"
_CACHE: dict[str, tuple[Trace, Trace]] = {}


def _pair(name: str) -> tuple[Trace, Trace]:
    """(the recording, its ring expansion)."""
    if name not in _CACHE:
        rec = read_pytorch_et(DATA / name)
        _CACHE[name] = (rec, expand(rec, "ring").trace)
    return _CACHE[name]


@pytest.mark.parametrize("name", ["torch_fsdp2_2r", "torch_tp_4r_16c", "torch_ddp_2r"])
def test_an_expanded_recording_replays_on_the_network_fitted_to_what_it_replaced(name: str) -> None:
    rec, exp = _pair(name)
    assert exp.params["profiler_steps"] == rec.params["profiler_steps"]
    fitted, got = replay(rec, fit=True), replay(exp)
    assert got.network == "fitted"
    assert got.topology.name == fitted.topology.name  # the same measured collectives, the same fit
    # the measured side is the parent's, step by step
    assert got.steps["measured_us"].to_pylist() == fitted.steps["measured_us"].to_pylist()
    a = np.asarray(fitted.steps["error_pct"].to_pylist(), dtype=float)
    b = np.asarray(got.steps["error_pct"].to_pylist(), dtype=float)
    # the ring steps on the fitted switch take what the fitted ring collective took, give or take
    # the per-step latency the collective node pays once
    assert np.abs(a - b).max() < 5.0, (a, b)
    # no recorded time is invented for a send or receive that was never recorded
    assert TRANSFER_NAME not in got.result.ops["name"].to_pylist()


def test_each_replaced_collective_is_timed_by_its_block() -> None:
    rec, exp = _pair("torch_fsdp2_2r")
    parent, rows = collective_transfers(rec), collective_transfers(exp)
    assert rows.num_rows == parent.num_rows and all(rows["expanded"].to_pylist())
    keys = ("rank", "id", "pg_name", "seq", "comm_type", "size_bytes", "measured_us", "transfer_us")
    assert (
        rows.select(keys)
        .sort_by([("rank", "ascending"), ("id", "ascending")])
        .equals(parent.select(keys).sort_by([("rank", "ascending"), ("id", "ascending")]))
    )
    got = replay(exp)
    sim = got.result.ops
    for row in got.collectives.to_pylist()[:4]:
        blocks = exp.params["collective_blocks"]
        b = next(
            i
            for i, (r, p) in enumerate(zip(blocks["rank"], blocks["parent_id"], strict=True))
            if (r, p) == (row["rank"], row["id"])
        )
        first, count = blocks["first_id"][b], blocks["ops"][b]
        mine = sim.filter(
            (np.asarray(sim["rank"]) == row["rank"])
            & (np.asarray(sim["id"]) >= first)
            & (np.asarray(sim["id"]) < first + count)
        )
        span = (max(mine["end_ns"].to_pylist()) - min(mine["start_ns"].to_pylist())) / 1e3
        assert row["simulated_us"] == pytest.approx(span, abs=1e-3)
