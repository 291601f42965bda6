"""Communication calls of real recordings: one collective per c10d call, of the call's kind and
buffer, counted against the execution traces themselves; ranks that disagree are reported."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from etstore.cli import main
from etstore.formats import read_trace
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace
from etstore.testing import recorded_trace

DATA = Path(__file__).parent.parent / "data"


def _et(name: str, rank: int) -> list[dict[str, Any]]:
    with gzip.open(DATA / name / f"rank{rank}_et.json.gz", "rt") as f:
        return json.load(f)["nodes"]


def _input_bytes(node: dict[str, Any], which: int) -> int:
    """Bytes of the ``which``-th tensor argument ``[id, storage, offset, numel, itemsize, device]``."""
    found = [
        v for v, t in zip(node["inputs"]["values"], node["inputs"]["types"], strict=True) if "Tensor" in t
    ]
    t = found[which][0] if isinstance(found[which][0], list) else found[which]
    return int(t[3] * t[4])


def _colls(trace: Trace, rank: int) -> list[dict[str, Any]]:
    ops = trace.ops.filter(pc.and_(pc.equal(trace.ops["rank"], rank), pc.is_valid(trace.ops["comm_type"])))
    return sorted(ops.to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("name", ["torch_fsdp2_2r", "torch_fsdp2_4r"])
def test_fsdp2_reduce_scatters_are_reduce_scatters_of_the_calls_buffer(name: str) -> None:
    """gloo runs FSDP2's reduce-scatter as `gloo:all_reduce`; the call is what the program did."""
    t = recorded_trace(DATA / name)
    ranks = t.ranks
    assert "warnings" not in t.params["recognised"]
    for rank in ranks:
        nodes = _et(name, rank)
        calls = [n for n in nodes if n["name"] in ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")]
        calls.sort(key=lambda n: n["id"])
        want = [
            ("ALL_GATHER" if "allgather" in n["name"] else "REDUCE_SCATTER", _input_bytes(n, 1))
            for n in calls
        ]
        got = [(r["comm_type"], r["comm_size"]) for r in _colls(t, rank)]
        assert Counter(c for c, _ in want) == {"ALL_GATHER": 8, "REDUCE_SCATTER": 4}
        assert got == want
        # an all-gather moves one rank's share (its input), a reduce-scatter the whole buffer
        shares = {s for c, s in got if c == "ALL_GATHER"}
        wholes = {s for c, s in got if c == "REDUCE_SCATTER"}
        assert {s * len(ranks) for s in shares} == wholes


@pytest.mark.parametrize("name", ["torch_tp_2r", "torch_tp_4r", "torch_ddp_2r", "torch_ddp_4r"])
def test_each_c10d_call_is_one_collective(name: str) -> None:
    """Tensor parallel's functional all-reduce wraps `c10d::allreduce_`, and its second
    `gloo:all_reduce` sits under `wait_tensor`: still one collective per call, on every rank."""
    t = recorded_trace(DATA / name)
    assert "warnings" not in t.params["recognised"]
    for rank in t.ranks:
        nodes = _et(name, rank)
        calls = sorted(
            (n for n in nodes if n["name"] in ("c10d::allreduce_", "c10d::broadcast_")), key=lambda n: n["id"]
        )
        got = [(r["comm_type"], r["comm_size"]) for r in _colls(t, rank)]
        assert got == [
            ("ALL_REDUCE" if "allreduce" in n["name"] else "BROADCAST", _input_bytes(n, 0)) for n in calls
        ]


def test_gloo_records_run_on_the_worker_thread_lane() -> None:
    """A gloo record is the collective and keeps its own time, from where its worker could pick
    it up (the call's start, or the worker's previous op's end) to its recorded end; its
    caller's thread does not wait in line behind it, so the untraced time after the call stays
    with the caller's thread."""
    t = recorded_trace(DATA / "torch_ddp_2r")
    rows = {(r["rank"], r["id"]): r for r in t.ops.to_pylist()}
    deps = {(d["rank"], d["src"], d["dst"]) for d in t.deps.to_pylist()}
    for (rank, op_id), r in rows.items():
        if r["name"] == "gloo:all_reduce":
            event = json.loads(_kineto_event(r))
            assert r["type"] == "COMM_COLL_NODE"
            end = event["ts"] + event["dur"]
            assert abs(r["start_time_micros"] + r["duration_micros"] - end) <= 1
            assert r["duration_micros"] >= round(event["dur"])
            calls = [c for c in rows.values() if c["rank"] == rank and c["name"] == "c10d::allreduce_"]
            began = max(c["start_time_micros"] for c in calls if c["start_time_micros"] <= event["ts"])
            assert r["start_time_micros"] >= began  # picked up no earlier than its call began
            # no op of the caller's thread follows it in a chain: it is on its own lane
            followers = [rows[(rank, d)] for (rr, s, d) in deps if rr == rank and s == op_id]
            assert all(
                json.loads(_kineto_event(f))["tid"] != event["tid"] or "gloo" in f["name"]
                for f in followers
                if "kineto_event" in _attrs(f)
            )


def _attrs(row: dict[str, Any]) -> dict[str, str]:
    from etstore.model import decode_attrs

    return decode_attrs(row["attrs"])


def _kineto_event(row: dict[str, Any]) -> str:
    return _attrs(row)["kineto_event"]


def test_ranks_that_disagree_are_named_at_ingest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 1's all-reduce is twice the size of rank 0's: ingest says which call, on which rank."""
    for rank, floats in ((0, 8), (1, 16)):
        x = [10, 11, 0, floats, 4, "cpu"]
        nodes = [
            {
                "id": 1,
                "name": "[pytorch|profiler|execution_trace|thread]",
                "ctrl_deps": 0,
                "inputs": {"values": [], "shapes": [], "types": []},
                "outputs": {"values": [], "shapes": [], "types": []},
                "attrs": [],
            },
            {
                "id": 2,
                "name": "c10d::allreduce_",
                "ctrl_deps": 1,
                "inputs": {"values": [[x]], "shapes": [[]], "types": ["GenericList[Tensor(float)]"]},
                "outputs": {"values": [], "shapes": [], "types": []},
                "attrs": [{"name": "tid", "type": "uint64", "value": 1}],
            },
        ]
        (tmp_path / f"rank{rank}_et.json").write_text(
            json.dumps({"schema": "1.1.1-chakra.0.0.4", "nodes": nodes})
        )
    t = read_pytorch_et(tmp_path)
    assert t.params["recognised"]["warnings"] == [
        "group all: rank 1's collective #0 (node 2 'c10d::allreduce_') is ALL_REDUCE of 64 B, "
        "rank 0's (node 2) ALL_REDUCE of 32 B"
    ]
    code = main(["--store", str(tmp_path / "s"), "ingest", str(tmp_path), "--format", "json"])
    err = capsys.readouterr().err
    assert code == 0
    assert "warning: " in err and "rank 1's collective #0 (node 2 'c10d::allreduce_')" in err


@pytest.mark.parametrize("name", ["torch_fsdp2_2r", "torch_fsdp2_4r"])
def test_kineto_alone_counts_each_fsdp2_call_once(name: str) -> None:
    """The Kineto trace alone pairs gloo's worker records with their calls too, whatever
    collective the worker ran the call as."""
    from etstore.formats.kineto import read_kineto

    files = sorted((DATA / name).glob("rank*_kineto.json.gz"))
    t = read_kineto([(rank, path) for rank, path in enumerate(files)])
    per_rank = len(files)
    assert t.params["recognised"]["collectives"] == {
        "ALL_GATHER": 8 * per_rank,
        "REDUCE_SCATTER": 4 * per_rank,
    }


def test_a_capture_of_two_of_eight_ranks_ingests_and_simulation_names_the_rest(tmp_path: Path) -> None:
    """Ranks 0 and 1 of the DLRM job (ET + Kineto): a trace of those two, said so at ingest;
    analysis runs on them; a simulation names the ranks its collectives lack."""
    import shutil

    from etstore.analysis import critical_path
    from etstore.errors import SimulationError
    from etstore.sim import simulate
    from etstore.topology import Topology

    dlrm = Path(__file__).resolve().parents[2] / "examples" / "dlrm_8r"
    for f in [*dlrm.glob("dlrm_eg_[01].json.gz"), *dlrm.glob("worker[01]_*.json.gz")]:
        shutil.copy(f, tmp_path / f.name)
    t = read_trace(tmp_path)
    assert t.ranks == [0, 1] and t.params["world_size"] == 8  # Kineto's distributedInfo.world_size
    assert t.params["recognised"]["warnings"][0].startswith("ranks 0-1 of 8 recorded (none for ranks 2-7)")
    assert critical_path(t).length_micros > 0
    with pytest.raises(
        SimulationError, match=r"holds ranks \[0, 1\] of a world of 8: .* need ranks \[2, 3, 4, 5, 6, 7\]"
    ):
        simulate(t, Topology.from_spec("switch:8"))


def test_one_process_pair_needs_no_rank_in_its_names(tmp_path: Path, shared_fixture: Any) -> None:
    """A single-GPU ET + Kineto pair named without ranks is rank 0, linked."""
    import shutil

    src = shared_fixture("pytorch")
    shutil.copy(src / "linear_et.json.gz", tmp_path / "linear_et.json.gz")
    shutil.copy(src / "linear_kineto.json.gz", tmp_path / "linear_kineto.json.gz")
    t = read_trace(tmp_path)
    assert t.ranks == [0]
    assert t.params["durations"] == "kineto" and t.params["recognised"]["linked_fraction"] == 1.0
    assert "warnings" not in t.params["recognised"]


def test_a_file_without_rank_beside_ranked_ones_is_refused(tmp_path: Path, shared_fixture: Any) -> None:
    import shutil

    from etstore.errors import TraceFormatError

    src = shared_fixture("pytorch")
    shutil.copy(src / "linear_et.json.gz", tmp_path / "linear_et.json.gz")
    shutil.copy(src / "linear_kineto.json.gz", tmp_path / "rank1_kineto.json.gz")
    with pytest.raises(TraceFormatError, match=r"linear_et.json.gz: no rank in the file's metadata or name"):
        read_trace(tmp_path)


def test_a_call_whose_worker_record_is_missing_is_said_at_ingest() -> None:
    """gloo records each call's run on its worker thread; the old recording's ET ends before
    rank 0's last all-reduce ran there, so its call stands for it, and ingest says so; the
    complete recordings say nothing."""
    (line,) = read_pytorch_et(DATA / "pytorch_gloo").params["recognised"]["warnings"]
    assert line.startswith("rank 0: c10d::allreduce_ (ET node 469) has no record of its run")
    for name in ("torch_ddp_2r", "torch_ddp_4r", "torch_tp_2r", "torch_fsdp2_2r"):
        assert "warnings" not in recorded_trace(DATA / name).params["recognised"], name
