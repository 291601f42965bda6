"""CLI for the simulator: `sim` and `sweep` record into the store's DuckDB; errors are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etstore.cli import main
from etstore.model import Trace, ops_table
from etstore.store import open_store


def run(capsys: pytest.CaptureFixture[str], store: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--store", str(store), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _sql(store: Path, query: str) -> list[dict]:
    with open_store(store, read_only=True) as s:
        return s.sql(query).to_pylist()


def test_sim_rt_template_reference_and_metrics_join_ops(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path, rt_inputs: Path
) -> None:
    inputs = rt_inputs
    s = tmp_path / "s"
    assert run(capsys, s, "ingest", str(rt_template))[0] == 0
    code, out, _ = run(
        capsys,
        s,
        "sim",
        "chakra_trace",
        "--network-config",
        str(inputs / "network_cfg.yml"),
        "--system-config",
        str(inputs / "system_cfg.json"),
        "--format",
        "json",
    )
    (doc,) = json.loads(out)  # the summary table: one row
    # ASTRA-sim's own regression reference for this case
    assert code == 0 and doc["total_ns"] == 117780 and doc["run_id"] == 1
    rows = _sql(
        s,
        "SELECT r.total_ns, count(*) AS n, max(t.end_ns) AS last FROM runs r "
        "JOIN op_timings t USING (run_id) "
        "JOIN ops o ON o.trace = t.trace AND o.rank = t.rank AND o.id = t.id GROUP BY r.total_ns",
    )
    assert rows == [{"total_ns": 117780.0, "n": 8, "last": 117780.0}]


def test_sim_one_message_closed_form_and_text_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [1, 1],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [1, None],
            "comm_src": [None, 0],
            "comm_tag": [7, 7],
            "comm_size": [1 << 20, 1 << 20],
        }
    )
    with open_store(s, write=True) as store:
        store.ingest(Trace(ops, name="one-message"))
    code, out, _ = run(capsys, s, "sim", "one-message", "--topo", "ring:2,bw=50,lat=500")
    # 500 ns latency + 1 MiB / 50 GiB/s = 500 + 19531.25 → 20031 ns on the integer clock
    assert code == 0 and "run 1: one-message on ring:2" in out and "20.031 µs simulated" in out
    code, out, _ = run(
        capsys, s, "sim", "one-message", "--topo", "ring:2", "--bw", "25", "--no-record", "--format", "json"
    )
    assert json.loads(out)[0]["total_ns"] == 500 + 39062 and json.loads(out)[0]["run_id"] is None
    assert _sql(s, "SELECT count(*) AS n FROM runs") == [{"n": 1}]


def test_sim_stuck_recv_is_one_line_and_records_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    ops = ops_table(
        {
            "rank": [0, 1],
            "id": [0, 0],
            "type": ["COMP_NODE", "COMM_RECV_NODE"],
            "duration_micros": [5, 0],
            "comm_src": [None, 0],
            "comm_tag": [None, 3],
            "comm_size": [None, 64],
        }
    )
    with open_store(s, write=True) as store:
        store.ingest(Trace(ops, name="stuck"))
    code, out, err = run(capsys, s, "sim", "stuck", "--topo", "ring:2")
    # one summary line, then the ops that never finished
    assert code == 1 and out == "" and err.startswith("etstore: error: simulation of 'stuck' stuck at")
    assert "rank 1 id 0 (COMM_RECV_NODE '') waits for a message from rank 0 (tag 3" in err
    code, _, err = run(capsys, s, "sim", "stuck", "--topo", "torus2d:1x1")
    assert code == 1 and err.count("\n") == 1
    code, _, err = run(capsys, s, "sim", "nope", "--topo", "ring:2")
    assert code == 1 and "no trace named 'nope'" in err
    assert _sql(s, "SELECT count(*) AS n FROM runs") == [{"n": 0}]


def test_sweep_records_bus_bandwidth_curves(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    s = tmp_path / "s"
    code, out, _ = run(
        capsys,
        s,
        "sweep",
        "--coll",
        "allreduce",
        "--sizes",
        "64KiB..16MiB:4",
        "--algo",
        "ring,direct",
        "--topo",
        "ring:8,bw=50,lat=500",
        "--format",
        "json",
    )
    points = json.loads(out)  # one row per point, each with its sweep's id
    assert code == 0 and len(points) == 2 * 5 and {p["sweep_id"] for p in points} == {1}
    rows = _sql(
        s,
        "SELECT algorithm, list(busbw_gb_per_s ORDER BY size_bytes) AS bw FROM sweep_points "
        "WHERE sweep_id = 1 GROUP BY algorithm ORDER BY algorithm",
    )
    assert [r["algorithm"] for r in rows] == ["direct", "ring"]
    for r in rows:  # latency amortises: bus bandwidth grows with size and stays under the link rate
        assert r["bw"] == sorted(r["bw"]) and 0 < r["bw"][-1] < 2 * 50
    code, _, err = run(capsys, s, "sweep", "--algo", "ring", "--topo", "ring:8", "--sizes", "1KiB..1B")
    assert code == 1 and "size range" in err and err.count("\n") == 1


def test_bad_inputs_are_one_line_errors_and_store_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    assert run(capsys, s, "workload", "--ranks", "4", "--tp", "2", "--layers", "1", "--ingest")[0] == 0
    assert run(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "2")[0] == 0
    cases = [
        (
            ("sim", "transformer", "--topo", "ring:4", "--algo", "transformer"),
            "is a workload trace, not an algorithm",
        ),
        (("sim", "transformer", "--topo", "ring:4", "--algo", "ring:2"), "--algo ring --chunks 2"),
        (("sim", "transformer", "--topo", "ring:4", "--algo", "nope"), "generators: ring"),
        (("sweep", "--algo", "ring", "--topo", "ring:4", "--sizes", "0"), "at least one byte"),
        (("check", "transformer"), "check needs an algorithm trace; 'transformer' is a workload"),
        (("compare", "transformer", "ring-allreduce-2r-1c", "--topo", "ring:4"), "need the same ranks"),
        (("workload", "--hidden", "-5", "--ingest"), "hidden must be at least 1"),
        (("export", "transformer", "--out", "/proc/etstore/x"), "/proc/etstore"),
        (("export", "ring-allreduce-2r-1c", "--gzip", "--out", str(tmp_path / "x")), "gzip applies only"),
        (("ingest", str(tmp_path), str(tmp_path), "--name", "x"), "as the files of one trace"),
    ]
    for argv, message in cases:
        code, _, err = run(capsys, s, *argv)
        assert code == 1 and err.startswith("etstore: error:") and err.count("\n") == 1, (argv, err)
        assert message in err, (argv, err)
    assert _sql(s, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
    assert _sql(s, "SELECT count(*) AS n FROM sweep_points") == [{"n": 0}]
    assert _sql(s, "SELECT count(*) AS n FROM traces") == [{"n": 2}]


def test_switch_dimension_is_timed_alike_from_spec_and_astra_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    s = tmp_path / "s"
    ops = ops_table(
        {
            "rank": [0, 3],
            "id": [0, 0],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [3, None],
            "comm_src": [None, 0],
            "comm_tag": [1, 1],
            "comm_size": [1 << 20, 1 << 20],
        }
    )
    with open_store(s, write=True) as store:
        store.ingest(Trace(ops, name="one-message"))
    net = tmp_path / "net.yml"
    net.write_text("topology: [ Switch ]\nnpus_count: [ 4 ]\nbandwidth: [ 100.0 ]\nlatency: [ 10.0 ]\n")
    totals = []
    for how in (("--network-config", str(net)), ("--topo", str(net)), ("--topo", "switch:4,bw=100,lat=10")):
        code, out, _ = run(capsys, s, "sim", "one-message", *how, "--no-record", "--format", "json")
        assert code == 0, out
        totals.append(json.loads(out)[0]["total_ns"])
    # two hops of 10 ns + 1 MiB at the full 100 GiB/s port (ASTRA-sim's analytical switch), not 100/3
    assert totals == [20 + 9765, 20 + 9765, 20 + 9765]


def test_hops_option_chooses_store_and_forward_or_cut_through(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 0 -> 2 on a ring of 4 (50 GB/s, 500 ns): two hops. Store-and-forward pays
    # 2 x floor(500 + 1 MiB / 50 GiB/s) = 2 x 20031; cut-through 2 x 500 + 19531 once.
    s = tmp_path / "s"
    ops = ops_table(
        {
            "rank": [0, 2],
            "id": [1, 1],
            "type": ["COMM_SEND_NODE", "COMM_RECV_NODE"],
            "comm_dst": [2, None],
            "comm_src": [None, 0],
            "comm_tag": [7, 7],
            "comm_size": [1 << 20, 1 << 20],
        }
    )
    with open_store(s, write=True) as store:
        store.ingest(Trace(ops, name="two-hops"))
    totals = {}
    for hops in ("store-and-forward", "cut-through"):
        code, out, _ = run(
            capsys, s, "sim", "two-hops", "--topo", "ring:4,bw=50,lat=500", "--congestion", "aware",
            "--hops", hops, "--no-record", "--format", "json",
        )  # fmt: skip
        assert code == 0
        totals[hops] = json.loads(out)[0]["total_ns"]
    assert totals == {"store-and-forward": 2 * 20031, "cut-through": 2 * 500 + 19531}


def test_sim_reads_a_bare_prefix_in_the_working_directory(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    rt_template: Path,
    rt_inputs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`etstore sim chakra_trace` beside chakra_trace.<rank>.et, as ASTRA-sim names a workload;
    with --no-record and no store there yet, none is created."""
    for f in rt_template.glob("chakra_trace.*.et"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.chdir(tmp_path)
    net = (
        "--network-config",
        str(rt_inputs / "network_cfg.yml"),
        "--system-config",
        str(rt_inputs / "system_cfg.json"),
    )
    code, out, err = run(
        capsys, tmp_path / "s", "sim", "chakra_trace", *net, "--no-record", "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)[0]["total_ns"] == 117780  # ASTRA-sim's own reference, as when stored first
    code, _, err = run(capsys, tmp_path / "s", "sim", "chakra", *net, "--no-record")
    assert code == 1 and err.startswith("etstore: error: no trace named 'chakra'")
    assert "no store exists yet" in err
    code, _, err = run(
        capsys,
        tmp_path / "s",
        "sweep",
        "--topo",
        "ring:4",
        "--algo",
        "ring",
        "--sizes",
        "1MiB",
        "--no-record",
    )
    assert code == 0, err
    code, _, err = run(capsys, tmp_path / "s", "calibrate", "run1", "--topo", "ring:4", "--no-record")
    assert (code, err) == (1, "etstore: error: no measured run 'run1': no store exists yet (--store)\n")
    assert not (tmp_path / "s").exists()
    (tmp_path / "f").write_text("")  # a file where the store would be: said, not taken for "no store"
    code, _, err = run(capsys, tmp_path / "f", "sim", "chakra_trace", *net, "--no-record")
    assert (code, err) == (1, f"etstore: error: {tmp_path / 'f'}: exists and is not a store directory\n")
    # once a store exists, its names come first, as without --no-record
    assert run(capsys, tmp_path / "s", "ingest", "chakra_trace", "--name", "chakra")[0] == 0
    code, out, err = run(capsys, tmp_path / "s", "sim", "chakra", *net, "--no-record", "--format", "json")
    assert code == 0 and json.loads(out)[0]["total_ns"] == 117780, err


# ---------------------------------------------------------------- ASTRA-sim's custom collectives


def _custom_system(tmp_path: Path) -> Path:
    """ASTRA-sim's custom_collective.json settings (FIFO, one split, local-mem-bw 50), without the
    custom-collective key itself (the algorithm is given with --algo instead)."""
    path = tmp_path / "custom_system.json"
    path.write_text('{"scheduling-policy": "FIFO", "preferred-dataset-splits": 1, "local-mem-bw": 50}')
    return path


def test_exported_custom_collective_ingests_as_an_algorithm(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path, rt_inputs: Path
) -> None:
    # what `export --coll-size` writes for ASTRA-sim's custom collectives comes back as an algorithm
    s = tmp_path / "s"
    assert run(capsys, s, "ingest", str(rt_template))[0] == 0
    assert (
        run(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "8", "--chunks", "2")[0] == 0
    )
    out_dir = tmp_path / "custom"
    code, _, _ = run(
        capsys, s, "export", "ring-allreduce-8r-2c", "--coll-size", "1MiB", "--out", f"{out_dir}/ring"
    )
    assert code == 0
    code, out, err = run(capsys, s, "ingest", str(out_dir), "--name", "exported-ring", "--format", "json")
    assert code == 0, err
    assert json.loads(out)[0]["kind"] == "algorithm"
    net = [
        "--network-config",
        str(rt_inputs / "network_cfg.yml"),
        "--system-config",
        str(_custom_system(tmp_path)),
    ]
    code, out, err = run(
        capsys, s, "sim", "chakra_trace", "--algo", "exported-ring", *net, "--format", "json"
    )
    assert code == 0, err
    code, ref, _ = run(
        capsys, s, "sim", "chakra_trace", "--algo", "ring-allreduce-8r-2c", *net, "--format", "json"
    )
    assert (
        json.loads(out)[0]["total_ns"] == json.loads(ref)[0]["total_ns"] == 51_590.0
    )  # 3 passes per reduction


def test_memory_passes_are_options_and_zero_is_astra_sim_s_custom_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rt_template: Path, rt_inputs: Path
) -> None:
    # ASTRA-sim analytical 518bd51 ran rt_template's 1 MiB all-reduce with this algorithm as its
    # custom collective (the files of `export ring-allreduce-8r-2c --coll-size 1MiB`, system as
    # _custom_system plus all-reduce-implementation-custom) in 24,087 ns: each reduction 1 ns
    s = tmp_path / "s"
    assert run(capsys, s, "ingest", str(rt_template))[0] == 0
    assert (
        run(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "8", "--chunks", "2")[0] == 0
    )
    net = [
        "--network-config",
        str(rt_inputs / "network_cfg.yml"),
        "--system-config",
        str(_custom_system(tmp_path)),
    ]
    free = ["--reduction-mem-accesses", "0", "--copy-mem-accesses", "0"]
    code, out, err = run(
        capsys, s, "sim", "chakra_trace", "--algo", "ring-allreduce-8r-2c", *net, *free, "--format", "json"
    )
    assert code == 0, err
    assert json.loads(out)[0]["total_ns"] == 24_087.0
    code, out, err = run(
        capsys,
        s,
        "sim",
        "chakra_trace",
        "--algo",
        "ring",
        "--chunks",
        "2",
        *net,
        "--reduction-mem-accesses",
        "1",
    )
    assert code == 0, err
    with pytest.raises(SystemExit) as exited:  # argparse's usage error: exit 2, one line on stderr
        run(capsys, s, "sim", "chakra_trace", *net, "--reduction-mem-accesses", "-1")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "expected a whole number of memory passes (0 or more), got '-1'" in err


def test_a_trace_on_a_larger_topology_says_where_its_ranks_ran(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gloo = Path(__file__).resolve().parents[1] / "data" / "torch_ddp_cuda_gloo_2r"
    args = ["--store", str(tmp_path / "s"), "sim", str(gloo), "--no-record", "--format", "json"]
    assert main([*args, "--topo", "ring:8"]) == 0
    err = capsys.readouterr().err
    assert (
        "placement: 2 ranks on a topology of 8 NPUs: ranks 0..1 on NPUs 0..1; the other 6 NPUs run nothing"
        in err
    )
    assert main([*args, "--topo", "ring:2"]) == 0
    assert "placement" not in capsys.readouterr().err


def test_a_one_npu_spec_runs_as_the_one_npu_yaml_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--topo ring:1` (one NPU, no link) was refused while a 1-NPU ASTRA-sim YAML ran."""
    one = Path(__file__).resolve().parents[1] / "data" / "torch_ddp_cuda_1r"
    yml = tmp_path / "one.yml"
    yml.write_text("topology: [ Ring ]\nnpus_count: [ 1 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    base = [
        "--store",
        str(tmp_path / "s"),
        "sim",
        str(one),
        "--no-record",
        "--table",
        "summary",
        "--format",
        "json",
    ]
    totals = []
    for net in (["--topo", "ring:1"], ["--topo", "switch:1"], ["--network-config", str(yml)]):
        assert main([*base, *net]) == 0
        totals.append(json.loads(capsys.readouterr().out)[0]["total_ns"])
    assert totals[0] == totals[1] == totals[2] > 0


def test_an_algorithm_without_sizes_is_timed_at_a_size_not_replayed_at_zero_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A generated algorithm's messages carry chunks, not bytes: `sim` of it would move nothing
    and report a time that means nothing, so it says how to time it (one line, nothing
    recorded); `sweep` times it at a size."""
    s = tmp_path / "s"
    assert (
        run(capsys, s, "algo", "gen", "ring", "--coll", "allreduce", "--ranks", "4", "--chunks", "1")[0] == 0
    )
    code, out, err = run(capsys, s, "sim", "ring-allreduce-4r-1c", "--topo", "ring:4")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "is an algorithm whose messages carry no size" in err and "etstore sweep --algo" in err
    assert _sql(s, "SELECT count(*) AS n FROM runs") == [{"n": 0}]
    code, _, _ = run(
        capsys, s, "sweep", "--algo", "ring-allreduce-4r-1c", "--sizes", "1MiB", "--topo", "ring:4"
    )
    assert code == 0 and _sql(s, "SELECT count(*) AS n FROM sweep_points") == [{"n": 1}]
