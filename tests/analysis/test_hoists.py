"""Overlap opportunities of recordings: hoists within lanes, legal by every dependency that is
not lane order, each measured by replay; applied, they realise exactly what was reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore import open_store
from etstore.analysis.hoists import find_hoists
from etstore.analysis.lanes import Hoist, apply_hoists, hoist_candidates, lanes_of, op_times
from etstore.analysis.rewrite import check_rewrite
from etstore.app.compare import compare
from etstore.app.opportunities import find_and_record
from etstore.app.overlap import find_opportunities
from etstore.app.rewrite import rewrite_stored
from etstore.cli import main
from etstore.errors import OptionError, RewriteError
from etstore.model import LANE_KINDS, Trace, deps_table, ops_table
from etstore.sim.replay import replay
from etstore.store.embedded import EmbeddedStore
from etstore.testing import recorded_trace

DATA = Path(__file__).parent.parent / "data"


def _hand() -> Trace:
    """One thread A, W, X, Y, Z, V; W waits for C on a worker thread; Y reads what W wrote,
    Z what Y wrote; X and V need nothing of W."""
    names = ["A", "W", "X", "Y", "Z", "V", "C", "D"]
    ops = ops_table(
        {
            "rank": [0] * 8,
            "id": list(range(8)),
            "name": names,
            "type": ["COMP_NODE"] * 8,
            "duration_micros": [10, 1, 10, 10, 10, 10, 100, 5],
        }
    )
    edges = [(0, 1, "thread"), (1, 2, "thread"), (2, 3, "thread"), (3, 4, "thread"), (4, 5, "thread")]
    edges += [(6, 7, "thread"), (6, 1, "wait"), (1, 3, "data"), (3, 4, "data")]
    s, d, k = zip(*edges, strict=True)
    return Trace(ops, deps_table(0, list(s), list(d), list(k)), name="hand", params={"execution": "recorded"})


def _off_lane(tr: Trace) -> list[tuple[int, int, str]]:
    rows = zip(*(tr.deps[c].to_pylist() for c in ("src", "dst", "kind")), strict=True)
    return sorted(r for r in rows if r[2] not in LANE_KINDS)


def test_hand_case_moves_exactly_the_independent_ops_that_fit_the_gap() -> None:
    t = _hand()
    lanes = lanes_of(t)
    start = np.asarray([0, 100, 101, 111, 121, 131, 0, 100], dtype=float) * 1e3
    end = start + np.asarray([10, 1, 10, 10, 10, 10, 100, 5], dtype=float) * 1e3
    (h,) = hoist_candidates(t, lanes, start, end)
    assert (h.before, h.moved, h.gap_ns, h.estimate_ns) == (1, (2, 5), 90e3, 20e3)
    out = apply_hoists(t, lanes, [h])
    edges = list(zip(*(out.deps[c].to_pylist() for c in ("src", "dst", "kind")), strict=True))
    lane = sorted((s, d) for s, d, k in edges if k == "thread")
    assert lane == [(0, 2), (1, 3), (2, 5), (3, 4), (5, 1), (6, 7)]  # A X V W Y Z; C D
    check_rewrite(t, out)
    # the other kinds are kept as they were
    assert _off_lane(out) == _off_lane(t)


def test_a_hoist_past_what_it_needs_is_refused_naming_the_op() -> None:
    t = _hand()
    lanes = lanes_of(t)
    bad = Hoist(before=1, moved=(3,), gap_ns=0, moved_ns=0)  # Y ahead of W
    with pytest.raises(
        RewriteError,
        match=r"rank 0: op 3 cannot move in front of op 1: it reads data written by op 1 \(data\)",
    ):
        apply_hoists(t, lanes, [bad])
    z = Hoist(before=1, moved=(2, 4), gap_ns=0, moved_ns=0)  # Z needs Y, which stays behind W
    with pytest.raises(
        RewriteError, match=r"op 4 cannot move in front of op 1: it reads data written by op 3"
    ):
        apply_hoists(t, lanes, [z])


@pytest.mark.parametrize("kind", ["overwrite", "data"])
def test_moving_an_op_ahead_of_a_real_dependency_in_its_lane_is_refused(kind: str) -> None:
    """On a GPU recording: take an edge of ``kind`` whose two ends share a lane and hoist the
    later one in front of the earlier one: the rewrite check names the dependency."""
    t = recorded_trace(DATA / "torch_ddp_cuda_gloo_2r")
    lanes = lanes_of(t)
    pick = [
        (int(s), int(d))
        for s, d, k in zip(lanes.src, lanes.dst, lanes.kind, strict=True)
        if k == kind and lanes.lane[s] == lanes.lane[d] >= 0
    ]
    if not pick:
        pytest.skip(f"no {kind} edge within one lane in this recording")
    s, d = pick[0]
    ids = t.ops["id"].to_numpy()
    why = {"overwrite": "overwrites bytes read by", "data": "reads data written by"}[kind]
    with pytest.raises(
        RewriteError,
        match=rf"op {ids[d]} cannot move in front of op {ids[s]}: it {why} op {ids[s]} \({kind}\)",
    ):
        apply_hoists(t, lanes, [Hoist(before=s, moved=(d,), gap_ns=0, moved_ns=0)])


@pytest.mark.parametrize("name", ["torch_ddp_cuda_gloo_2r", "torch_fsdp2_2r"])
def test_gains_add_up_to_what_applying_them_realises(name: str) -> None:
    t = recorded_trace(DATA / name)
    base, found = find_hoists(t)
    assert found, "the recording has idle lanes with independent work behind them"
    makespan = float(base.result.total_ns)
    assert 0 < sum(o.gain_ns for o in found) < makespan
    lanes = lanes_of(t)
    together = apply_hoists(t, lanes, [h for o in found for h in o.hoists])
    check_rewrite(t, together)
    after = replay(together)
    assert makespan - after.result.total_ns == pytest.approx(sum(o.gain_ns for o in found), abs=1e-6)
    alone = replay(apply_hoists(t, lanes, list(found[0].hoists)))
    assert makespan - alone.result.total_ns == pytest.approx(found[0].alone_gain_ns, abs=1e-6)
    # legal: in the replay of the rewrite every dependency that is not lane order still holds in time
    start, end = op_times(together, after.result.ops)
    lanes_after = lanes_of(together)
    held = ~lanes_after.on_lane
    assert (end[lanes_after.src[held]] <= start[lanes_after.dst[held]] + 1e-6).all()
    # each moved op now runs before the op it was moved in front of, in the same lane
    for o in found:
        for h in o.hoists:
            assert all(lanes.lane[m] == lanes.lane[h.before] for m in h.moved)
            assert all(start[m] < start[h.before] for m in h.moved)


def test_cli_overlap_rewrite_compare_realise_the_reported_gains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", str(tmp_path / "s")]
    assert main([*store, "ingest", str(DATA / "torch_ddp_cuda_gloo_2r"), "--name", "ddp"]) == 0
    capsys.readouterr()
    assert main([*store, "overlap", "ddp", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["kind"] == "overlap" and r["detail"]["measured"] for r in rows)
    assert main([*store, "rewrite", "ddp", "--opportunity", "1", "--name", "one", "--format", "json"]) == 0
    assert main([*store, "rewrite", "ddp", "--apply", "overlap", "--name", "all", "--format", "json"]) == 0
    capsys.readouterr()
    with open_store(tmp_path / "s", write=True) as s:
        one = compare(s, "ddp", "one")
        both = compare(s, "ddp", "all")
        assert one.topology == "as recorded"
    assert -one.diff_ns == pytest.approx(rows[0]["detail"]["alone_gain_ns"], abs=1e-6)
    assert -both.diff_ns == pytest.approx(sum(r["gain_ns"] for r in rows), abs=1e-6)
    assert main([*store, "rewrite", "ddp", "--opportunity", "99"]) == 1
    assert "has no opportunity 99 recorded" in capsys.readouterr().err
    assert main([*store, "rewrite", "ddp", "--apply", "reorder"]) == 1
    assert "is a recording: its ops move only within their thread or stream" in capsys.readouterr().err


def test_stored_rewrite_keeps_the_recording_replayable(store: EmbeddedStore) -> None:
    store.ingest(recorded_trace(DATA / "torch_fsdp2_2r"), name="fsdp")
    found = find_and_record(store, "fsdp", kinds=("overlap",))
    report = rewrite_stored(store, "fsdp", "overlap", opportunities=[1])
    out = store.load(report.trace.name)
    assert out.kind == "rewritten" and out.params["opportunities"] == [1] and out.params["parent"] == "fsdp"
    assert out.params["execution"] == "recorded"
    moved = json.loads(found["detail"][0].as_py())["moves"]
    assert out.params["changes"] == sum(len(m["moved"]) for m in moved)
    assert replay(out).steps.num_rows == replay(store.load("fsdp")).steps.num_rows
    assert isinstance(found, pa.Table)


def test_a_recording_is_measured_by_replay_not_read_from_a_run(store: EmbeddedStore) -> None:
    store.ingest(recorded_trace(DATA / "torch_ddp_2r"), name="ddp")
    with pytest.raises(
        OptionError, match="'ddp' is a recording: its opportunities are measured by replaying it"
    ):
        find_opportunities(store, "ddp", run_id=1)
