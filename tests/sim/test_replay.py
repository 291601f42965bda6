"""Recorded traces replay as they ran: the DLRM step (8 ranks, NCCL) and our own recordings
(tests/data/TORCH_RECORDINGS.md) against their own Kineto times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from etstore.cli import main
from etstore.errors import OptionError
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace, decode_attrs
from etstore.sim import simulate
from etstore.sim.replay import collective_transfers, fit_network, replay
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT / "examples" / "dlrm_8r"
DATA = ROOT / "tests" / "data"
_CACHE: dict[str, Trace] = {}


@pytest.fixture
def dlrm() -> Trace:
    if "dlrm" not in _CACHE:
        _CACHE["dlrm"] = read_pytorch_et(DLRM)
    return _CACHE["dlrm"]


def _rows(trace: Trace, rank: int) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in trace.ops.filter(pc.equal(trace.ops["rank"], rank)).to_pylist()}


def _preds(trace: Trace, rank: int, op: int) -> list[int]:
    d = trace.deps
    mine = d.filter(pc.and_(pc.equal(d["rank"], rank), pc.equal(d["dst"], op)))
    return [int(x) for x in mine["src"].to_pylist()]


def _event(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(decode_attrs(row["attrs"])["kineto_event"])


def test_every_rank_replays_within_five_percent_of_its_measured_step(dlrm: Trace) -> None:
    out = replay(dlrm)
    steps = out.steps.to_pylist()
    assert [s["rank"] for s in steps] == list(range(8))
    assert {s["step"] for s in steps} == {"ProfilerStep#10"}
    for s in steps:
        assert abs(s["error_pct"]) <= 5.0, s
        assert s["error_pct"] == pytest.approx(
            100 * (s["simulated_us"] - s["measured_us"]) / s["measured_us"], abs=0.01
        )
    # measured: from the rank's ProfilerStep#10 start to the end of its last op, read from Kineto here
    profiler = dlrm.params["profiler_steps"]
    for s in steps:
        name, _, dur = profiler[str(s["rank"])][0]
        assert name == "ProfilerStep#10"
        # the rank's ops end within 1% before the profiler's own step end (untraced Python at its tail)
        assert 0.99 * dur <= s["measured_us"] <= dur
    assert out.network == "recorded" and out.label == "its recorded collectives"


def test_on_the_network_fitted_to_its_collectives_every_rank_is_within_five_percent(dlrm: Trace) -> None:
    out = replay(dlrm, fit=True)
    assert out.network == "fitted" and out.topology.name.startswith("switch:8,")
    assert "fitted to its collectives" in out.label
    for s in out.steps.to_pylist():
        assert abs(s["error_pct"]) <= 5.0, s


def test_a_slower_network_moves_the_step_by_no_more_than_its_collectives_slow_down(dlrm: Trace) -> None:
    fast = replay(dlrm, Topology.from_spec("switch:8,bw=500,lat=500"))
    slow = replay(dlrm, Topology.from_spec("switch:8,bw=2,lat=500"))
    f, s = fast.steps["simulated_us"].to_numpy(), slow.steps["simulated_us"].to_numpy()
    assert (s > f).all()  # the network is exposed on every rank
    # no rank can lose more than the time its own collectives took longer
    fc, sc = fast.collectives.to_pandas(), slow.collectives.to_pandas()
    for r in range(8):
        more = sc[sc["rank"] == r]["simulated_us"].sum() - fc[fc["rank"] == r]["simulated_us"].sum()
        assert 0 < s[r] - f[r] <= more + 1e-6


def test_a_blocking_synchronize_waits_for_the_copy_it_blocked_on_instead_of_lasting(dlrm: Trace) -> None:
    rows = _rows(dlrm, 1)
    syncs = [r for r in rows.values() if r["name"] == "cudaStreamSynchronize"]
    assert len(syncs) == 10
    # rank 1 blocked 6,561 µs in the synchronize behind a pageable host-to-device `aten::copy_`,
    # queued on the compute stream behind work that waited for the first all-to-all
    big = max(syncs, key=lambda r: _event(r)["dur"])
    assert round(_event(big)["dur"]) == 6561
    assert big["duration_micros"] <= 10  # only the part after the copy finished
    released = [rows[p] for p in _preds(dlrm, 1, big["id"]) if rows[p]["is_cpu_op"] is False]
    assert [r["name"] for r in released] == ["Memcpy HtoD (Pageable -> Device)"]
    copy_end = _event(released[0])["ts"] + _event(released[0])["dur"]
    sync = _event(big)
    assert sync["ts"] < copy_end <= sync["ts"] + sync["dur"] + 1
    # and the op around it no longer carries the wait
    copy_ops = [r for r in rows.values() if r["name"] == "aten::copy_" and _event(r)["dur"] > 6000]
    assert len(copy_ops) == 1 and copy_ops[0]["duration_micros"] < 100


def test_compute_waits_for_the_nccl_stream_it_was_held_by(dlrm: Trace) -> None:
    """The first all-to-all's kernel (stream 84) releases a kernel of the compute stream."""
    rows = _rows(dlrm, 1)
    nccl = min(
        (r for r in rows.values() if r["type"] == "COMM_COLL_NODE"), key=lambda r: r["start_time_micros"]
    )
    d = dlrm.deps
    succ = d.filter(pc.and_(pc.equal(d["rank"], 1), pc.equal(d["src"], nccl["id"])))["dst"].to_pylist()
    held = [
        rows[s] for s in succ if rows[s]["is_cpu_op"] is False and _event(rows[s])["args"]["stream"] != 84
    ]
    assert held, "no compute-stream activity waits for the NCCL kernel"
    end = _event(nccl)["ts"] + _event(nccl)["dur"]
    for h in held:
        assert end <= _event(h)["ts"] + 1 < end + 100


def test_the_main_thread_waits_for_the_autograd_thread_during_backward(dlrm: Trace) -> None:
    """The main thread records nothing for ≈ 3.4 ms inside `## backward ##` (it blocks in
    backward()); the op it resumes with waits for the autograd thread's op that ended just before."""
    rows = _rows(dlrm, 1)
    timed = [r for r in rows.values() if r["is_cpu_op"] and "kineto_event" in decode_attrs(r["attrs"])]
    main_tid = _event(next(r for r in timed if r["name"] == "## backward ##"))["tid"]
    main = sorted(
        (r for r in timed if _event(r)["tid"] == main_tid), key=lambda r: (r["start_time_micros"], r["id"])
    )
    ends = [_event(r)["ts"] + _event(r)["dur"] for r in main]
    gaps = [main[i + 1]["start_time_micros"] - ends[i] for i in range(len(main) - 1)]
    i = int(np.argmax(gaps))
    assert gaps[i] > 3000
    resumed = main[i + 1]
    waited = [rows[p] for p in _preds(dlrm, 1, resumed["id"])]
    other = [w for w in waited if "kineto_event" in decode_attrs(w["attrs"]) and _event(w)["tid"] != main_tid]
    assert len(other) == 1
    gap = _event(resumed)["ts"] - (_event(other[0])["ts"] + _event(other[0])["dur"])
    assert 0 <= gap <= 100
    # neither the op before the gap nor the one after it carries the 3.4 ms wait: the resumed
    # op's thread time starts at its release (its wake-up, then its own work)
    before = main[i]
    assert before["duration_micros"] < 1000
    assert resumed["duration_micros"] <= gap + round(_event(resumed)["dur"])


def test_the_network_fit_recovers_a_known_network() -> None:
    """Transfer parts simulated on a known switch are fitted back to its latency and bandwidth."""
    truth = Topology.from_spec("switch:8,bw=120,lat=2000")
    rows: dict[str, list[Any]] = {"comm_type": [], "size_bytes": [], "transfer_us": []}
    for coll, size in (
        ("ALL_REDUCE", 1 << 20),
        ("ALL_REDUCE", 4096),
        ("ALL_TO_ALL", 1 << 16),
        ("ALL_TO_ALL", 1 << 22),
    ):
        t = simulate(collective_workload(coll, 8, size), truth).total_ns / 1e3
        rows["comm_type"].append(coll)
        rows["size_bytes"].append(size)
        rows["transfer_us"].append(t)
    import pyarrow as pa

    fitted = fit_network(pa.table(rows), 8)
    (dim,) = fitted.dims
    assert dim.bandwidth_gb_per_s == pytest.approx(120, rel=0.01)
    assert dim.latency_ns == pytest.approx(2000, rel=0.01)


def test_transfer_parts_start_when_the_last_peer_arrived(dlrm: Trace) -> None:
    t = collective_transfers(dlrm).to_pandas()
    assert len(t) == 64 and set(t["seq"]) == set(range(8))
    first = t[t["seq"] == 0]
    # rank 7 arrived last at the first all-to-all: its kernel is almost all transfer
    assert first.set_index("rank")["measured_us"].idxmin() == 7
    assert (first["transfer_us"] <= first["measured_us"].min() + 1).all()
    assert np.all(t["transfer_us"] >= 1)


def test_a_trace_without_recorded_times_is_refused(dlrm: Trace) -> None:
    et_only = read_pytorch_et(sorted(DLRM.glob("dlrm_eg_*.json.gz")))
    with pytest.raises(OptionError, match="not recorded with timings"):
        replay(et_only)


def test_replay_command_json_rows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["--store", str(tmp_path / "s"), "replay", str(DLRM), "--format", "json"])
    out = capsys.readouterr()
    assert code == 0
    rows = json.loads(out.out)
    assert [set(r) for r in rows] == [{"rank", "step", "measured_us", "simulated_us", "error_pct"}] * 8
    assert "network: its recorded collectives" in out.err
    assert not (tmp_path / "s").exists()  # replaying files creates no store
    assert (
        main(["--store", str(tmp_path / "s"), "replay", str(DLRM), "--topo", "fitted", "--format", "json"])
        == 0
    )
    assert "fitted to its collectives" in capsys.readouterr().err
    code = main(["--store", str(tmp_path / "s"), "replay", str(DLRM), "--collectives", "--format", "json"])
    per = json.loads(capsys.readouterr().out)
    assert code == 0 and len(per) == 64
    assert {
        "measured_us",
        "transfer_us",
        "own_transfer_us",
        "simulated_us",
        "comm_type",
        "size_bytes",
    } <= set(per[0])
    # as it ran, each collective lasts from its start to its own recorded end after the last arrival
    for r in per:
        assert r["simulated_us"] >= r["own_transfer_us"] - 1


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("torch_*") if p.is_dir()))
def test_every_recording_replays_each_rank_and_step_within_five_percent(name: str) -> None:
    """CPU/gloo DDP, FSDP2 and tensor parallel at 2 and 4 ranks (on 2 cores and on 16), DDP at 8
    ranks; on a GPU, NCCL on one rank and gloo on CUDA tensors at 2 ranks: every profiler step
    of every rank, as it ran."""
    trace = read_pytorch_et(DATA / name)
    steps = replay(trace).steps.to_pylist()
    ranks = sorted(trace.ranks)
    n_steps = len(trace.params["profiler_steps"][str(ranks[0])])
    assert n_steps >= 2 and len(steps) == len(ranks) * n_steps
    for s in steps:
        assert abs(s["error_pct"]) <= 5.0, s


def test_one_rank_has_no_network_its_collectives_take_their_recorded_time() -> None:
    """NCCL with one rank: each all-reduce kernel is a local copy; no network is needed."""
    out = replay(read_pytorch_et(DATA / "torch_ddp_cuda_1r"))
    per = out.collectives.to_pylist()
    # DDP's 2 broadcasts of its first step, then one all-reduce per step
    assert [r["comm_type"] for r in per] == ["BROADCAST"] * 2 + ["ALL_REDUCE"] * 3
    for r in per:
        assert r["transfer_us"] == pytest.approx(max(1, r["measured_us"]))
        assert r["simulated_us"] == pytest.approx(r["own_transfer_us"], abs=1)


def test_a_broadcast_runs_on_the_network_not_as_its_recorded_wait() -> None:
    """DDP's first-step broadcasts: on a given network a broadcast of 20 bytes takes the network's
    time, whatever its recorded kernel waited for its root."""
    trace = read_pytorch_et(DATA / "torch_ddp_2r")
    out = replay(trace, Topology.from_spec("switch:2,bw=10,lat=1000"))
    bc = [r for r in out.collectives.to_pylist() if r["comm_type"] == "BROADCAST"]
    assert len(bc) == 4
    alone = (
        simulate(
            collective_workload("BROADCAST", 2, 20),
            Topology.from_spec("switch:2,bw=10,lat=1000"),
            algorithms={"BROADCAST": "ring"},
        ).total_ns
        / 1e3
    )
    assert 1.0 <= alone < 5.0  # one hop of 1 µs latency and 20 bytes
    # the late member's broadcast lasts the network's time; the early one's also its wait
    for seq in (0, 1):
        mine = sorted(r["simulated_us"] for r in bc if r["seq"] == seq)
        assert mine[0] == pytest.approx(alone, abs=0.01)


def _kineto(path: Path) -> list[dict[str, Any]]:
    import gzip

    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def test_gloo_on_cuda_tensors_the_collective_is_its_exchange_between_synchronize_and_copy_back() -> None:
    """gloo's worker synchronizes the copy to host, exchanges, then copies back to the device,
    all inside its ``gloo:all_reduce`` record: the collective op is the stretch between the
    synchronize and the copy, read from the Kineto file here."""
    trace = read_pytorch_et(DATA / "torch_ddp_cuda_gloo_2r")
    events = _kineto(DATA / "torch_ddp_cuda_gloo_2r" / "rank0_kineto.json.gz")
    records = sorted(
        (e for e in events if e["name"] == "gloo:all_reduce" and e["cat"] == "user_annotation"),
        key=lambda e: e["ts"],
    )
    ops = sorted(
        (r for r in _rows(trace, 0).values() if r["comm_type"] == "ALL_REDUCE"),
        key=lambda r: r["start_time_micros"],
    )
    assert len(records) == len(ops) == 3
    for rec, op in zip(records, ops, strict=True):
        inner = [e for e in events if e["tid"] == rec["tid"] and rec["ts"] < e["ts"] < rec["ts"] + rec["dur"]]
        sync = max(e["ts"] + e["dur"] for e in inner if e["name"] == "cudaStreamSynchronize")
        copy = min(e["ts"] for e in inner if e["name"] == "aten::copy_")
        assert abs(op["start_time_micros"] - sync) <= 1
        assert abs(op["start_time_micros"] + op["duration_micros"] - copy) <= 1


def test_a_stored_recordings_replay_is_a_run_the_report_shows_measured_beside_simulated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = ["--store", str(tmp_path / "s")]
    tp = str(DATA / "torch_tp_cuda_gloo_2r")
    assert main([*store, "ingest", tp, "--name", "tp"]) == 0
    capsys.readouterr()
    assert main([*store, "replay", "tp", "--no-record", "--format", "json"]) == 0
    assert "recorded as run" not in capsys.readouterr().err
    assert main([*store, "replay", "tp", "--format", "json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert "recorded as run 1" in out.err
    from etstore.store import open_store

    with open_store(tmp_path / "s") as s:
        (params,) = (
            s.warehouse.query("SELECT params FROM runs WHERE run_id = 1").to_arrow()["params"].to_pylist()
        )
    kept = json.loads(params)["user"]["replay"]
    assert kept["network"] == "recorded" and kept["steps"] == rows
    html_path = tmp_path / "r.html"
    assert main([*store, "report", "1", "--out", str(html_path)]) == 0
    page = html_path.read_text()
    assert "Recorded steps: measured beside simulated" in page
    for r in rows:  # each rank's measured step, as the table prints it
        assert f">{r['measured_us']:,.0f}<" in page and f">{r['simulated_us']:,.1f}<" in page


def test_compare_sets_a_recordings_measured_windows_beside_the_simulated(tmp_path: Path) -> None:
    from etstore.app.compare import compare
    from etstore.store import open_store

    trace = read_pytorch_et(DATA / "torch_tp_cuda_gloo_2r", name="tp")
    with open_store(tmp_path / "s", write=True) as s:
        s.ingest(trace)
        out = compare(s, "tp", "tp", "switch:2")
    rows = out.table.to_pylist()
    windows = trace.params["windows"]
    for r in rows:
        if r["rank"] is None:  # the total: the span of every rank's window
            lo, hi = min(w[0] for w in windows.values()), max(w[1] for w in windows.values())
            assert r["measured_a_ns"] == r["measured_b_ns"] == (hi - lo) * 1e3
        else:
            w = windows[str(r["rank"])]
            assert r["measured_a_ns"] == (w[1] - w[0]) * 1e3


def test_a_run_the_worker_did_not_record_replays_as_it_ran() -> None:
    """The old recording's ET ends before gloo's worker recorded rank 0's last all-reduce: a
    stand-in on no thread carries it, launched by its call, ending by the time its result was
    read, so the async call returns as it did (the call itself blocked before: +6%)."""
    trace = read_pytorch_et(DATA / "pytorch_gloo")
    runs = [r for r in trace.ops.to_pylist() if r["name"].endswith("(unrecorded run)")]
    assert [(r["rank"], r["comm_type"]) for r in runs] == [(0, "ALL_REDUCE")]
    steps = replay(trace).steps.to_pylist()
    assert len(steps) == 2 and all(abs(s["error_pct"]) <= 1.0 for s in steps), steps
