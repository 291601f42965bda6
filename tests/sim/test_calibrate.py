"""Calibration: fitting a topology's free parameters to a measured curve (etstore/sim/calibrate.py),
read from and stored in the warehouse (etstore/app/calibrate.py).

Evidence: a round trip (a curve the simulator produced, written as a nccl-tests log,
fitted from another start, gives its parameters back), the real 8-GPU A100 all-reduce
log of tests/data/nccl_tests (checked against the closed-form least-squares line through
its times and the native ring's closed-form latency), every error path, the stored rows
and view, the report figure and the CLI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from etstore.app.calibrate import calibrate, load_calibration, measured_curve
from etstore.app.measured import store_measured_run
from etstore.app.runs import record_run, record_sweep
from etstore.cli import main
from etstore.errors import OptionError, SimulationError, StoreError, UnknownTraceError
from etstore.formats.nccl_tests import read_nccl_tests
from etstore.model import Trace
from etstore.report import write_report
from etstore.report.measured import measured_busbw_figures
from etstore.sim import SimConfig, simulate, sweep
from etstore.sim._lsq import column_status, nonneg_lstsq, pulled_lstsq
from etstore.sim.sweep import collective_workload
from etstore.store import EmbeddedStore
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "nccl_tests"
ALLREDUCE = DATA / "superbench_nccl_allreduce.log"
BROADCAST = DATA / "superbench_nccl_broadcast.log"
ALLGATHER = DATA / "superbench_nccl_allgather.log"
MIB = 1 << 20


@pytest.fixture
def warehouse() -> Warehouse:
    wh = Warehouse(duckdb.connect())
    wh.create_schema()
    return wh


def _ingest(wh: Warehouse, path: Path) -> str:
    return store_measured_run(wh, read_nccl_tests(path)).name


# ---------------------------------------------------------------- a log the simulator wrote


def _nccl_time(us: float) -> str:
    """A time as nccl-tests prints it: %7.0f from 10 ms, %7.1f from 100 µs, else %7.2f."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    return f"{us:7.1f}" if us >= 100.0 else f"{us:7.2f}"


def _write_log(path: Path, ranks: int, sizes: list[int], times_us: list[float]) -> Path:
    """An all_reduce_perf log of the current layout (redop, root, #wrong) with these times."""
    lines = [
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus {ranks} minBytes {sizes[0]} maxBytes {sizes[-1]} step: 4(factor) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
        *(
            f"#  Rank {r:2d} Group  0 Pid   100 on    node-a device {r:2d} [0x00] SIM GPU"
            for r in range(ranks)
        ),
        "#",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
        "     (us)  (GB/s)  (GB/s)       ",
    ]
    factor = 2 * (ranks - 1) / ranks
    for size, us in zip(sizes, times_us, strict=True):
        t = _nccl_time(us)
        algbw = size / float(t) / 1e3
        cells = f"{t} {algbw:7.2f} {algbw * factor:7.2f}      0"
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {cells}  {cells}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#"]
    path.write_text("\n".join(lines) + "\n")
    return path


SIZES = [1 << k for k in range(16, 31, 2)]  # 64 KiB .. 1 GiB, x4


def _simulated_log(tmp_path: Path, spec: str, mem_bw: float, algorithm: str = "native") -> Path:
    topo = Topology.from_spec(spec)
    cfg = SimConfig(local_mem_bw_gb_per_s=mem_bw)
    times = [
        simulate(
            collective_workload("allreduce", topo.num_npus, s),
            topo,
            config=cfg,
            algorithms={"allreduce": algorithm},
        ).total_ns
        / 1e3
        for s in SIZES
    ]
    return _write_log(tmp_path / "sim_ar.log", topo.num_npus, SIZES, times)


@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_round_trip_recovers_latency_and_bandwidth(
    tmp_path: Path, warehouse: Warehouse, algorithm: str
) -> None:
    run = _ingest(warehouse, _simulated_log(tmp_path, "ring:8,bw=120,lat=2000", 400.0, algorithm))
    cal = calibrate(warehouse, run, "ring:8", algorithm=algorithm, local_mem_bw_gb_per_s=400.0)
    params = {q.name: q for q in cal.params}
    assert params["lat_ns[0]"].start == 500 and params["bw_gb_per_s[0]"].start == 50
    assert params["lat_ns[0]"].value == pytest.approx(2000, rel=0.01)
    assert params["bw_gb_per_s[0]"].value == pytest.approx(120, rel=0.01)
    assert params["lat_ns[0]"].status == params["bw_gb_per_s[0]"].status == "fitted"
    assert params["local_mem_bw_gb_per_s"].status == "fixed"
    assert cal.spec.startswith("ring:8,bw=1") and cal.local_mem_bw_gb_per_s == 400.0
    assert np.abs(cal.error_after).max() < 0.002 < np.abs(cal.error_before).min()
    assert cal.rounds <= 3


def test_link_and_reduction_bandwidth_are_not_separable_on_one_curve(
    tmp_path: Path, warehouse: Warehouse
) -> None:
    # both cost per byte on every size: the fit recovers their sum, keeps their starting ratio, says so
    run = _ingest(warehouse, _simulated_log(tmp_path, "ring:8,bw=120,lat=2000", 400.0))
    cal = calibrate(warehouse, run, "ring:8")
    params = {q.name: q for q in cal.params}
    assert params["bw_gb_per_s[0]"].status == params["local_mem_bw_gb_per_s"].status == "not separable"
    assert params["lat_ns[0]"].status == "fitted"
    assert params["lat_ns[0]"].value == pytest.approx(2000, rel=0.01)
    # started 50 and 50: moved by one factor
    assert params["bw_gb_per_s[0]"].value == pytest.approx(params["local_mem_bw_gb_per_s"].value, rel=1e-4)
    assert np.abs(cal.error_after).max() < 0.002


def test_a_parameter_of_no_effect_keeps_its_start(tmp_path: Path, warehouse: Warehouse) -> None:
    # the ring all-gather reduces nothing: the reduction bandwidth changes no time
    topo = Topology.from_spec("ring:4,bw=80,lat=1000")
    times = [
        simulate(collective_workload("allgather", 4, s), topo, algorithms={"allgather": "ring"}).total_ns
        / 1e3
        for s in SIZES
    ]
    log = _write_log(tmp_path / "ag.log", 4, SIZES, times)
    run = _ingest(warehouse, log)
    cal = calibrate(warehouse, run, "ring:4", algorithm="ring", collective="allgather")
    params = {q.name: q for q in cal.params}
    assert params["local_mem_bw_gb_per_s"].status == "no effect"
    assert params["local_mem_bw_gb_per_s"].value == 50.0
    assert params["bw_gb_per_s[0]"].value == pytest.approx(80, rel=0.01)
    assert params["lat_ns[0]"].value == pytest.approx(1000, rel=0.01)


# ---------------------------------------------------------------- two nodes: an axis hidden at the start

TWO_NODES = "ring:8+ring:2,bw=200/5,lat=700/3000"  # 8 GPUs a node at 200 GB/s, 5 GB/s between the nodes


def test_two_nodes_fit_the_link_between_them(tmp_path: Path, warehouse: Warehouse) -> None:
    # At the start (50 GB/s on both axes) axis 0 hides axis 1: the 4 chunks pipelined over the two
    # axes wait on axis 0 only, so axis 1's slope is 0 at every size. It binds once it is slow
    # enough (5 GB/s after 200 within a node: the bottleneck of the large sizes). The fit must find
    # that, not report axis 1 as "no effect" and keep its start (the old fit: 50 GB/s, 8% off).
    run = _ingest(warehouse, _simulated_log(tmp_path, TWO_NODES, 200.0))
    cal = calibrate(warehouse, run, "ring:8+ring:2,lat=700/3000", local_mem_bw_gb_per_s=200.0)
    params = {q.name: q for q in cal.params}
    assert params["bw_gb_per_s[1]"].start == 50
    assert params["bw_gb_per_s[0]"].status == params["bw_gb_per_s[1]"].status == "fitted"
    assert params["bw_gb_per_s[1]"].value == pytest.approx(5, rel=0.02)
    assert params["bw_gb_per_s[0]"].value == pytest.approx(200, rel=0.1)  # it moves the large sizes by 1/4
    assert np.abs(cal.error_after).max() < 0.005


def test_two_nodes_with_every_parameter_free(tmp_path: Path, warehouse: Warehouse) -> None:
    # the latencies free too: the curve is reproduced with every axis-1 parameter fitted. (Other
    # values reproduce it as well: bw 99/9.1, lat 596/3894 gives these sizes' times to 0.1%.)
    run = _ingest(warehouse, _simulated_log(tmp_path, TWO_NODES, 200.0))
    cal = calibrate(warehouse, run, "ring:8+ring:2", local_mem_bw_gb_per_s=200.0)
    params = {q.name: q for q in cal.params}
    assert {params[n].status for n in ("lat_ns[1]", "bw_gb_per_s[1]")} == {"fitted"}
    assert params["bw_gb_per_s[1]"].value < 20  # the bottleneck of the large sizes
    assert np.abs(cal.error_after).max() < 0.005


def test_a_link_hidden_where_the_fit_ends_is_not_binding(warehouse: Warehouse) -> None:
    # The real 2-node DGX A100 log (16 ranks): no line a + b S fits its protocol switches, and the
    # best one found keeps axis 1 hidden behind axis 0: the descent restarted from where axis 1
    # binds ends with a larger error. Axis 1 still changes times when slow enough, so its status
    # says so ("not binding": any value at least this fast fits as well), not "no effect".
    run = _ingest(warehouse, DATA / "deepops_network_operator_allreduce.md")
    cal = calibrate(warehouse, run, "ring:8+ring:2", min_size_bytes=2 * MIB, record=False)
    params = {q.name: q for q in cal.params}
    assert params["lat_ns[1]"].status == params["bw_gb_per_s[1]"].status == "not binding"
    assert params["bw_gb_per_s[1]"].value == 50.0
    assert np.abs(cal.error_after[cal.fitted]).max() < 0.12
    slower = cal.spec.replace("/50,", "/5,")
    assert slower != cal.spec
    big = collective_workload("allreduce", 16, 1 << 30)
    cfg = SimConfig(local_mem_bw_gb_per_s=cal.local_mem_bw_gb_per_s)
    times = [simulate(big, Topology.from_spec(s), config=cfg).total_ns for s in (cal.spec, slower)]
    assert times[1] > 2 * times[0]


# ---------------------------------------------------------------- the real 8-GPU all-reduce log


def _log_curve() -> tuple[np.ndarray, np.ndarray]:
    """Sizes above 1 MiB and out-of-place times, read from the log text by regex (not the reader)."""
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+float\s+sum\s+([\d.]+)", ALLREDUCE.read_text(), re.M)
    s = np.array([int(a) for a, _ in rows], dtype=float)
    t = np.array([float(b) for _, b in rows])
    keep = s > MIB
    return s[keep], t[keep]


def test_real_ring_allreduce_fits_within_ten_percent_above_one_mib(warehouse: Warehouse) -> None:
    run = _ingest(warehouse, ALLREDUCE)
    cal = calibrate(warehouse, run, "ring:8", algorithm="native", min_size_bytes=MIB + 1)
    above = cal.size_bytes > MIB
    assert above.sum() == 13 and (cal.fitted == above).all()
    assert np.abs(cal.error_after[above]).max() < 0.10
    assert cal.summary()["max_error_before_pct"] > 1000  # 50 GB/s, 500 ns: ten times too slow
    # the native ring's time is a line a + b S; the relative least-squares line through the log's times:
    s, t = _log_curve()
    a, b = np.linalg.lstsq(np.stack([1 / t, s / t], 1), np.ones_like(t), rcond=None)[0]
    assert cal.after_us[above] == pytest.approx(a + b * s, rel=0.005)
    # 4 chunks one after another, each 15 endpoint delays (10 ns) and 14 link latencies: a = 4(150 + 14 lat)
    lat = {q.name: q.value for q in cal.params}["lat_ns[0]"]
    assert lat == pytest.approx((a * 1e3 - 600) / 56, rel=0.005)


def test_real_log_at_one_mib_is_beyond_any_ring_line(warehouse: Warehouse) -> None:
    # 74.8 µs at 1 MiB, 93.5 at 2 MiB, 162 at 8 MiB, 63,896 at 8 GiB: no line a + b S is within 10%
    # of all of them (the best minimax line misses by 12%); NCCL changes protocol and channels there.
    run = _ingest(warehouse, ALLREDUCE)
    cal = calibrate(warehouse, run, "ring:8", min_size_bytes=MIB, record=False)
    assert cal.summary()["max_error_after_pct"] > 10.0


# ---------------------------------------------------------------- storing and reuse


def test_stored_rows_view_and_reuse(warehouse: Warehouse) -> None:
    run = _ingest(warehouse, ALLREDUCE)
    cal = calibrate(warehouse, run, "ring:8", min_size_bytes=2 * MIB)
    assert cal.name == "superbench_nccl_allreduce-native" and cal.calibration_id == 1
    again = calibrate(warehouse, run, "ring:8", min_size_bytes=2 * MIB)
    assert again.name == "superbench_nccl_allreduce-native-2"
    rows = warehouse.query(
        "SELECT size_bytes, fitted, measured_busbw_gb_per_s, sim_after_time_us, error_after_pct "
        "FROM v_measured_vs_sim WHERE calibration_id = 1 ORDER BY size_bytes"
    ).to_pylist()
    assert len(rows) == 32  # the sizes above 0 bytes
    two = next(r for r in rows if r["size_bytes"] == 2 * MIB)
    assert two["fitted"] and two["measured_busbw_gb_per_s"] == pytest.approx(
        39.26, abs=0.01
    )  # the log's busbw
    eight = rows[-1]
    assert eight["measured_busbw_gb_per_s"] == pytest.approx(235.26, abs=0.01)
    # the stored spec and reduction bandwidth reproduce the fitted times
    stored = load_calibration(warehouse, cal.name)
    res = simulate(
        collective_workload("allreduce", 8, 8 << 30),
        stored.topology(),
        config=stored.config(),
        algorithms={"allreduce": "native"},
    )
    assert res.total_ns / 1e3 == pytest.approx(eight["sim_after_time_us"], rel=1e-9)
    assert stored.spec == cal.spec and Topology.from_spec(cal.spec).name == cal.spec


# ---------------------------------------------------------------- one unit, measured and simulated


def _replayed(size_bytes: int, time_us: int) -> Trace:
    """An 8-rank all-reduce of nccl-tests size ``size_bytes`` whose nodes last ``time_us`` (replayed)."""
    work = collective_workload("allreduce", 8, size_bytes)
    at = work.ops.schema.get_field_index("duration_micros")
    ops = work.ops.set_column(at, "duration_micros", pa.array([time_us] * 8, pa.uint64()))
    return Trace(ops=ops, name=f"replayed-{size_bytes}", kind="workload")


def test_a_simulation_taking_the_measured_time_has_the_measured_busbw(warehouse: Warehouse) -> None:
    # Each out-of-place row of the real log whose time is whole µs (the node duration's unit),
    # replayed for exactly that time: the simulated collective takes the measured time, so its
    # busbw in `collectives` is the log's own (ratio 1, within the log's 4-5 printed digits).
    # With the simulator's rates in GB = 2^30 the ratio was 10^9 / 2^30 = 0.931.
    _ingest(warehouse, ALLREDUCE)
    rows = warehouse.query(
        "SELECT size_bytes, time_us FROM measurements "
        "WHERE NOT in_place AND size_bytes >= $mib AND time_us = round(time_us) ORDER BY size_bytes",
        {"mib": MIB},
    ).to_pylist()
    assert [r["size_bytes"] for r in rows] == [4 * MIB, 8 * MIB, 16 * MIB, 2 << 30, 4 << 30, 8 << 30]
    for r in rows:
        res = simulate(
            _replayed(r["size_bytes"], int(r["time_us"])),
            Topology.ring(8),
            algorithms={"allreduce": "replay"},
        )
        record_run(warehouse, res)
    pairs = warehouse.query(
        """SELECT m.size_bytes, m.algbw_gb_per_s AS m_algbw, c.algbw_gb_per_s AS s_algbw,
               m.busbw_gb_per_s AS m_busbw, c.busbw_gb_per_s AS s_busbw
        FROM measurements m JOIN collectives c
            ON c.size_bytes = m.size_bytes AND c.group_size = m.ranks AND c.comm_type = m.collective
            AND c.time_ns = m.time_us * 1e3
        WHERE NOT m.in_place ORDER BY m.size_bytes"""
    ).to_pylist()
    assert [p["size_bytes"] for p in pairs] == [r["size_bytes"] for r in rows]
    for p in pairs:
        assert p["s_algbw"] / p["m_algbw"] == pytest.approx(1.0, abs=1e-3), p
        assert p["s_busbw"] / p["m_busbw"] == pytest.approx(1.0, abs=1e-3), p
    assert pairs[-1]["s_busbw"] == pytest.approx(235.26, abs=0.005)  # the log's busbw at 8 GiB


def test_measured_vs_sim_view_and_the_simulators_tables_share_one_unit(warehouse: Warehouse) -> None:
    # The view computes its busbw from times as nccl-tests does; the calibrated network, swept
    # through the simulator at the fitted sizes, must give the same busbw in `sweep_points`, and
    # the measured and simulated busbw of a size are in the inverse ratio of their times.
    run = _ingest(warehouse, ALLREDUCE)
    cal = calibrate(warehouse, run, "ring:8", min_size_bytes=2 * MIB)
    stored = load_calibration(warehouse, cal.name)
    sizes = [2 * MIB, 64 * MIB, 1 << 30, 8 << 30]
    record_sweep(warehouse, sweep(sizes, ["native"], [stored.topology()], config=stored.config()))
    rows = warehouse.query(
        """SELECT v.size_bytes, v.measured_time_us, v.sim_after_time_us, v.measured_busbw_gb_per_s,
               v.sim_after_busbw_gb_per_s, s.time_ns, s.busbw_gb_per_s AS sweep_busbw,
               m.busbw_gb_per_s AS log_busbw
        FROM v_measured_vs_sim v
        JOIN sweep_points s ON s.size_bytes = v.size_bytes AND s.num_npus = v.ranks
        JOIN measurements m ON m.run_id = v.measured_run_id AND m.size_bytes = v.size_bytes AND NOT m.in_place
        WHERE v.calibration_id = $c ORDER BY v.size_bytes""",
        {"c": cal.calibration_id},
    ).to_pylist()
    assert [r["size_bytes"] for r in rows] == sizes
    for r in rows:
        assert r["time_ns"] / 1e3 == pytest.approx(r["sim_after_time_us"], rel=1e-9)
        assert r["sweep_busbw"] == pytest.approx(r["sim_after_busbw_gb_per_s"], rel=1e-9)
        assert r["measured_busbw_gb_per_s"] == pytest.approx(r["log_busbw"], rel=1e-3)
        assert r["sweep_busbw"] / r["log_busbw"] == pytest.approx(
            r["measured_time_us"] / r["sim_after_time_us"], rel=1e-3
        )


def test_measured_curve_prefers_out_of_place_and_skips_empty_sizes(warehouse: Warehouse) -> None:
    _ingest(warehouse, ALLREDUCE)
    curve = measured_curve(warehouse, 1)
    assert curve.run == "superbench_nccl_allreduce" and not curve.in_place
    assert curve.size_bytes[0] == 4 and len(curve.size_bytes) == 32
    assert curve.time_us[-1] == 63896.0


# ---------------------------------------------------------------- bad input


def test_unknown_run(warehouse: Warehouse) -> None:
    with pytest.raises(UnknownTraceError, match=r"no measured run 'nope' \(none stored"):
        calibrate(warehouse, "nope", "ring:8")


def test_a_collective_the_algorithm_cannot_run(warehouse: Warehouse) -> None:
    run = _ingest(warehouse, BROADCAST)
    with pytest.raises(
        SimulationError, match=r"algorithm 'native' cannot simulate BROADCAST of \d+ B on ring:8"
    ):
        calibrate(warehouse, run, "ring:8")
    with pytest.raises(SimulationError, match="generator 'tree' does not implement 'broadcast'"):
        calibrate(warehouse, run, "ring:8", algorithm="tree")
    assert warehouse.query("SELECT count(*) FROM calibrations").scalar() == 0
    # the ring generator's pipelined chain broadcast does run it: at 8 GiB, bandwidth-bound,
    # the fit comes within 15% of the measured time
    cal = calibrate(warehouse, run, "ring:8", algorithm="ring")
    assert cal.collective == "BROADCAST" and cal.size_bytes[-1] == 8 << 30
    assert cal.after_us[-1] == pytest.approx(cal.measured_us[-1], rel=0.15)
    assert warehouse.query("SELECT count(*) FROM calibrations").scalar() == 1


def test_nothing_free(warehouse: Warehouse) -> None:
    run = _ingest(warehouse, ALLREDUCE)
    with pytest.raises(OptionError, match=r"'ring:8,bw=100,lat=1000' gives every latency .* nothing to fit"):
        calibrate(warehouse, run, "ring:8,bw=100,lat=1000", local_mem_bw_gb_per_s=100.0)


def test_other_bad_requests(warehouse: Warehouse) -> None:
    run = _ingest(warehouse, ALLREDUCE)
    with pytest.raises(OptionError, match="ran on 8 ranks; topology 'ring:4' has 4 NPUs"):
        calibrate(warehouse, run, "ring:4")
    with pytest.raises(OptionError, match="has no size between 17 B and 31 B"):
        calibrate(warehouse, run, "ring:8", min_size_bytes=17, max_size_bytes=31)
    gather = _ingest(warehouse, ALLGATHER)
    with pytest.raises(OptionError, match="does not say which collective it measured"):
        calibrate(warehouse, gather, "ring:8")
    calibrate(warehouse, run, "ring:8", name="mine", min_size_bytes=1 << 30)
    with pytest.raises(StoreError, match="calibration 'mine' already exists"):
        calibrate(warehouse, run, "ring:8", name="mine", min_size_bytes=1 << 30)
    with pytest.raises(UnknownTraceError, match="no calibration 'other'"):
        load_calibration(warehouse, "other")


# ---------------------------------------------------------------- the linear algebra


def test_nonneg_lstsq_against_a_hand_solution() -> None:
    # min (x - 1)^2 + (y + 2)^2 with x, y >= 0: x = 1, y = 0
    x = nonneg_lstsq(np.eye(2), np.array([1.0, -2.0]))
    assert x.tolist() == [1.0, 0.0]
    # an overdetermined line through (1, 2), (2, 3), (3, 4): 1 + 1 t
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nonneg_lstsq(a, np.array([2.0, 3.0, 4.0])) == pytest.approx([1.0, 1.0])


def test_a_column_of_no_effect_stays_at_its_anchor() -> None:
    # x0 fits 2 u0 = 4; u1 changes nothing: pulled to its anchor (where the fit left it), else to 1
    a, b = np.array([[2.0, 0.0], [2.0, 0.0]]), np.array([4.0, 4.0])
    effect = np.array([True, False])
    assert pulled_lstsq(a, b, np.zeros(2), [], effect, 1e-6) == pytest.approx([2.0, 1.0])
    moved = pulled_lstsq(a, b, np.zeros(2), [], effect, 1e-6, anchor=np.array([1.0, 7.5]))
    assert moved == pytest.approx([2.0, 7.5])


def test_column_status() -> None:
    a = np.array([[1.0, 2.0, 0.0, 1.0], [1.0, 2.0, 0.0, 5.0], [1.0, 2.0, 0.0, 2.0]])
    assert column_status(a) == ["not separable", "not separable", "no effect", "fitted"]


# ---------------------------------------------------------------- report and CLI


def test_report_figure(warehouse: Warehouse) -> None:
    assert measured_busbw_figures(warehouse) == []
    run = _ingest(warehouse, ALLREDUCE)
    (measured,) = measured_busbw_figures(warehouse)
    assert "Measured bus bandwidth" in measured.layout.title.text and len(measured.data) == 1
    assert measured.layout.xaxis.type == "log"
    calibrate(warehouse, run, "ring:8", min_size_bytes=2 * MIB)
    (fig,) = measured_busbw_figures(warehouse)
    assert "Measured vs simulated" in fig.layout.title.text
    assert [t.name.rsplit(" · ", 1)[1] for t in fig.data] == ["measured", "before fit", "after fit"]
    sizes = list(fig.data[0].x)
    assert fig.data[0].y[sizes.index(8 << 30)] == pytest.approx(235.26, abs=0.01)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    assert main(["--store", store, "ingest", str(ALLREDUCE)]) == 0
    capsys.readouterr()
    system = tmp_path / "system.json"
    code = main(
        ["--store", store, "calibrate", "superbench_nccl_allreduce", "--topo", "ring:8", "--min-size", "2MiB",
         "--write-system-config", str(system)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    spec = re.search(r"fitted spec: (\S+)", out)
    assert spec and spec.group(1).startswith("ring:8,bw=")
    assert "not separable" in out and "v_measured_vs_sim" in out
    assert json.loads(system.read_text()).keys() == {"local-mem-bw"}
    # the printed spec and the written system config reproduce the fit through `etstore sweep`
    assert main(["--store", store, "sweep", "--topo", spec.group(1), "--algo", "native", "--sizes", "8GiB",
                 "--system-config", str(system), "--no-record", "--format", "json"]) == 0  # fmt: skip
    (point,) = json.loads(capsys.readouterr().out)  # one row per point
    with EmbeddedStore(tmp_path / "s") as s:
        after = s.sql(
            "SELECT sim_after_time_us FROM v_measured_vs_sim WHERE size_bytes = 8589934592"
        ).scalar()
    assert point["time_ns"] / 1e3 == pytest.approx(after, rel=1e-6)
    calibrate_1 = ["--store", store, "calibrate", "1", "--topo", "ring:8", "--no-record", "--format", "json"]
    code = main([*calibrate_1, "--table", "summary"])
    (doc,) = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["calibration"] is None
    assert main(calibrate_1) == 0 and len(json.loads(capsys.readouterr().out)) == 32  # the points
    assert main(["--store", store, "calibrate", "nope", "--topo", "ring:8"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("etstore: error: no measured run 'nope'") and err.count("\n") == 1
    # `etstore runs` lists the measured run and its one recorded calibration (--no-record kept none)
    assert main(["--store", store, "runs", "--format", "json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["id"]) for r in runs] == [("measured", 1), ("calibration", 1)]
    with EmbeddedStore(tmp_path / "s") as s:
        before, after_pct = (
            s.sql("SELECT rms_error_before_pct, rms_error_after_pct FROM calibrations")
            .to_arrow()
            .to_pylist()[0]
            .values()
        )
    assert runs[1]["summary"] == (
        f"of superbench_nccl_allreduce, {spec.group(1)}, RMS error {before:.1f}% -> {after_pct:.1f}%"
    )


# ---------------------------------------------------------------- docs/measured.md


def _doc_sql() -> list[str]:
    doc = (ROOT / "docs" / "measured.md").read_text()
    section = doc.split("## Calibration", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, re.S)


def test_the_calibration_section_has_examples() -> None:
    assert len(_doc_sql()) >= 3 and "v_measured_vs_sim" in "".join(_doc_sql())


@pytest.mark.parametrize("sql", _doc_sql(), ids=lambda s: s.split("\n")[0][:40])
def test_documented_sql_returns_rows(warehouse: Warehouse, sql: str) -> None:
    run = _ingest(warehouse, ALLREDUCE)
    calibrate(warehouse, run, "ring:8", min_size_bytes=2 * MIB)
    assert len(warehouse.query(sql)), f"example returned no rows:\n{sql}"


def test_the_report_shows_the_calibration(tmp_path: Path) -> None:
    with EmbeddedStore(tmp_path / "s") as store:
        run = _ingest(store.warehouse, ALLREDUCE)
        calibrate(store.warehouse, run, "ring:8", min_size_bytes=2 * MIB)
        topo = Topology.from_spec("ring:8")
        rid = record_run(
            store.warehouse, simulate(collective_workload("allreduce", 8, MIB), topo), trace_name="ar"
        )
        out = write_report(store.warehouse, [rid], tmp_path / "r.html")
    assert "Measured vs simulated bus bandwidth per calibration" in out.read_text()
