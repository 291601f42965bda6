"""ET + Kineto linking: durations from Kineto, kernels with launch edges, link fractions, errors."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from etstore.errors import TraceFormatError
from etstore.formats import read_et
from etstore.formats._torch_sync import SYNC_CALLS
from etstore.formats.export import export_trace
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace, chakra_deps, decode_attrs
from etstore.sim import simulate
from etstore.testing import assert_trace_equal
from etstore.topology import default_topology, parse_topology

GLOO = Path(__file__).parent.parent / "data" / "pytorch_gloo"
_DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}
_CACHE: dict[str, Trace] = {}


def _load(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


@pytest.fixture
def dlrm(pt: Path) -> Trace:
    """The 8-rank DLRM ET linked with its Kineto traces, read once."""
    if "dlrm" not in _CACHE:
        _CACHE["dlrm"] = read_pytorch_et(pt / "dlrm_8r_et", kineto=pt / "dlrm_8r_kineto")
    return _CACHE["dlrm"]


def _rank(trace: Trace, rank: int) -> list[dict[str, Any]]:
    return trace.ops.filter(pc.equal(trace.ops["rank"], rank)).to_pylist()


def _check_linked_times(trace: Trace, rank: int, kineto: dict[str, Any]) -> int:
    """Every linked op's Kineto record is an event of the file and its start is the event's; a
    compute op lasts its thread time: on its Kineto thread, from where the previous op left
    the thread (that op's end, or this op's start if it comes first) to where this one leaves
    it (less only where it waited on something else: blocking calls, cross-thread waits); a
    communication call its own event's time, from where its worker could pick it up. Returns
    the linked ET op count."""
    events = {
        (e["args"]["External id"], e["name"]): e
        for e in kineto["traceEvents"]
        if e.get("ph") == "X" and "External id" in e.get("args", {})
    }
    rows = _rank(trace, rank)
    lanes: dict[Any, list[tuple[int, int, dict[str, Any], dict[str, Any]]]] = {}
    linked = 0
    for r in rows:
        extra = decode_attrs(r["attrs"])
        if "kineto_event" in extra and r["is_cpu_op"]:
            event = json.loads(extra["kineto_event"])
            assert events[(event["args"]["External id"], event["name"])] == event
            assert event["name"] == r["name"]
            if r["type"] == "COMP_NODE":
                assert r["start_time_micros"] == round(event["ts"])
            else:  # a worker's record: from where the worker could pick it up to its end
                assert r["start_time_micros"] <= round(event["ts"])
                assert abs(r["start_time_micros"] + r["duration_micros"] - (event["ts"] + event["dur"])) <= 1
            lanes.setdefault((event["pid"], event["tid"]), []).append((round(event["ts"]), r["id"], r, event))
            linked += "pytorch_et_node" in extra
    exact = checked = 0
    for lane in lanes.values():
        lane.sort(key=lambda x: (x[0], x[1]))
        left = [min(ts + round(e["dur"]), nxt) for (ts, _, _, e), (nxt, _, _, _) in itertools.pairwise(lane)]
        for (_, _, r, _), was_left, leaves in zip(lane[1:-1], left[:-1], left[1:], strict=True):
            if r["type"] != "COMP_NODE":
                continue  # checked above
            checked += 1
            assert r["duration_micros"] <= leaves - was_left, r["name"]
            exact += r["duration_micros"] == leaves - was_left
    assert exact >= 0.95 * checked
    return linked


# ---------------------------------------------------------------- DLRM, 8 ranks, NCCL


def test_dlrm_links_every_op(dlrm: Trace, pt: Path) -> None:
    assert dlrm.params["durations"] == "kineto"
    rec = dlrm.params["recognised"]
    assert rec["linked_fraction"] == 1.0
    assert rec["collectives"] == {"ALL_REDUCE": 24, "ALL_TO_ALL": 40}
    for rank in (0, 5):
        kineto = _load(next((pt / "dlrm_8r_kineto").glob(f"worker{rank}_*.json")))
        nodes = _load(pt / "dlrm_8r_et" / f"dlrm_eg_{rank}.json")["nodes"]
        roots = sum(n["name"].startswith("[pytorch|") for n in nodes)
        assert _check_linked_times(dlrm, rank, kineto) == len(nodes) - roots


def test_dlrm_kernels_on_their_streams(dlrm: Trace, pt: Path) -> None:
    kineto = _load(next((pt / "dlrm_8r_kineto").glob("worker0_*.json")))
    device = [e for e in kineto["traceEvents"] if e.get("ph") == "X" and e.get("cat") in _DEVICE]
    nodes = _load(pt / "dlrm_8r_et" / "dlrm_eg_0.json")["nodes"]
    rows = _rank(dlrm, 0)
    gpu = [r for r in rows if r["is_cpu_op"] is False]
    # blocking calls are ops of their own: the 10 stream synchronizes inside the step (the device
    # synchronize after the last ET op is inside none)
    runtime = Counter(e["name"] for e in kineto["traceEvents"] if e.get("cat") == "cuda_runtime")
    assert (runtime["cudaStreamSynchronize"], runtime["cudaDeviceSynchronize"]) == (10, 1)
    blocking = Counter(r["name"] for r in rows if r["name"] in SYNC_CALLS)
    assert blocking == {"cudaStreamSynchronize": 10}
    assert len(rows) == len(nodes) + len(device) + 10
    assert len(gpu) == len(device) == 261  # 245 kernels + 16 memcpys
    assert sorted(r["duration_micros"] for r in gpu) == sorted(e["dur"] for e in device)
    # NCCL kernels carry the collective; the launching record_param_comms becomes compute
    comm = [r for r in gpu if r["type"] == "COMM_COLL_NODE"]
    assert Counter(r["name"].split("_")[1] for r in comm) == {"SendRecv": 5, "AllReduce": 3}
    assert [r["comm_size"] for r in comm if "AllReduce" in r["name"]] == [394241 * 4, 112 * 4, 226960 * 4]
    assert not [r for r in rows if r["is_cpu_op"] and r["type"] == "COMM_COLL_NODE"]


def test_dlrm_launch_edges_match_runtime_calls(dlrm: Trace, pt: Path) -> None:
    """Each kernel waits for a CPU op whose Kineto interval holds the kernel's launch call."""
    kineto = _load(next((pt / "dlrm_8r_kineto").glob("worker0_*.json")))
    launch = {
        e["args"]["correlation"]: e
        for e in kineto["traceEvents"]
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    rows = {r["id"]: r for r in _rank(dlrm, 0)}
    deps = dlrm.deps.filter(pc.equal(dlrm.deps["rank"], 0)).to_pylist()
    checked = 0
    for d in deps:
        src, dst = rows[d["src"]], rows[d["dst"]]
        if dst["is_cpu_op"] is False and src["is_cpu_op"]:
            event = json.loads(decode_attrs(dst["attrs"])["kineto_event"])
            call = launch[event["args"]["correlation"]]
            start = src["start_time_micros"]
            cpu_event = json.loads(decode_attrs(src["attrs"])["kineto_event"])
            assert start <= call["ts"] <= start + cpu_event["dur"]
            checked += 1
    assert checked > 200


def test_dlrm_linked_round_trips_and_simulates(dlrm: Trace, tmp_path: Path) -> None:
    # as stored (the default export is the form ASTRA-sim runs: METADATA nodes dropped, ...)
    export_trace(dlrm, tmp_path / "dlrm", format="et", verbatim=True)
    # a Chakra file has two dependency kinds: the recording's lane, launch and wait edges are ctrl
    assert set(dlrm.deps["kind"].to_pylist()) == {
        "data",
        "overwrite",
        "thread",
        "stream",
        "launch",
        "wait",
        "group",
    }
    assert_trace_equal(dlrm.replace(deps=chakra_deps(dlrm.deps)), read_et(tmp_path / "dlrm"))
    result = simulate(dlrm, parse_topology(default_topology(dlrm)))
    assert result.collectives.num_rows == 8
    # the linked compute is real now: rank 0's CPU self times alone sum to this many µs
    busy = sum(r["duration_micros"] for r in _rank(dlrm, 0) if r["is_cpu_op"])
    assert busy > 1000
    assert result.total_ns >= 1000 * max(r["duration_micros"] for r in _rank(dlrm, 0))


# ---------------------------------------------------------------- single-rank pairs


@pytest.mark.parametrize(
    ("et", "kineto", "device_events"),
    [
        ("linear_et.json.gz", "linear_kineto.json.gz", None),
        ("hta/benchmark_simple_add_et.json.gz", "hta/benchmark_simple_add_trace.json.gz", 4),
    ],
)
def test_single_rank_pairs_link(pt: Path, et: str, kineto: str, device_events: int | None) -> None:
    t = read_pytorch_et(pt / et, kineto=pt / kineto)
    doc = _load(pt / kineto)
    assert t.params["recognised"]["linked_fraction"] == 1.0
    nodes = _load(pt / et)["nodes"]
    roots = sum(n["name"].startswith("[pytorch|") for n in nodes)
    assert _check_linked_times(t, 0, doc) == len(nodes) - roots
    device = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in _DEVICE]
    if device_events is not None:
        assert len(device) == device_events
    # kept: the device events whose launch call lies in the ET's time span (its linked events'),
    # and those launched before it (or by no recorded call) that still ran once it began
    linked = [
        json.loads(decode_attrs(b)["kineto_event"])
        for b, cpu in zip(t.ops["attrs"].to_pylist(), t.ops["is_cpu_op"].to_pylist(), strict=True)
        if cpu
    ]
    lo, hi = min(e["ts"] for e in linked), max(e["ts"] + e["dur"] for e in linked)
    calls = {
        e["args"]["correlation"]: e["ts"]
        for e in doc["traceEvents"]
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }

    def kept(e: dict[str, Any]) -> bool:
        at = calls.get(e["args"].get("correlation"))
        if at is not None and lo <= at <= hi:
            return True
        return (at is None or at < lo) and e["ts"] + e["dur"] > lo

    inside = [e for e in device if kept(e)]
    blocking = [n for n in t.ops["name"].to_pylist() if n in SYNC_CALLS]  # blocking calls: ops of their own
    assert t.num_ops == len(nodes) + len(inside) + len(blocking)
    assert t.params["device_events"] == {"kept": len(inside), "in_kineto": len(device)}


def test_resnet_kineto_from_another_run_does_not_link(pt: Path) -> None:
    """The resnet 'pair' was profiled without DDP (no c10d or record_param_comms events, 30
    iterations): nothing may be linked to the ET's DDP step."""
    doc = _load(pt / "resnet_kineto.json.gz")
    names = {e.get("name") for e in doc["traceEvents"]}
    assert "DistributedDataParallel.forward" not in names and "record_param_comms" not in names
    t = read_pytorch_et(pt / "resnet_et.json.gz", kineto=pt / "resnet_kineto.json.gz")
    assert t.params["recognised"]["linked_fraction"] == 0.0
    assert all(
        "kineto_event" not in decode_attrs(b)
        for b, cpu in zip(t.ops["attrs"].to_pylist(), t.ops["is_cpu_op"].to_pylist(), strict=True)
        if cpu
    )


# ---------------------------------------------------------------- our own gloo recording


def test_gloo_recording_links_by_record_function_id() -> None:
    t = read_pytorch_et(GLOO)  # the directory: ETs and their Kineto traces together
    assert t.ranks == [0, 1]
    assert t.params["durations"] == "kineto"
    assert t.params["recognised"]["linked_fraction"] == 1.0
    for rank in (0, 1):
        kineto = _load(GLOO / f"rank{rank}_kineto.json.gz")
        by_rf = {
            e["args"]["Record function id"]: e
            for e in kineto["traceEvents"]
            if "Record function id" in e.get("args", {})
        }
        for r in _rank(t, rank):
            extra = decode_attrs(r["attrs"])
            if "kineto_event" not in extra:
                continue
            node = json.loads(extra["pytorch_et_node"])
            rf_id = {a["name"]: a["value"] for a in node["attrs"]}["rf_id"]
            assert json.loads(extra["kineto_event"]) == by_rf[rf_id]
        # the collective's duration: gloo's own record of the all-reduce (no children), from
        # where the worker could pick it up to its recorded end
        ar = next(r for r in _rank(t, rank) if r["name"] == "gloo:all_reduce")
        event = json.loads(decode_attrs(ar["attrs"])["kineto_event"])
        assert abs(ar["start_time_micros"] + ar["duration_micros"] - (event["ts"] + event["dur"])) <= 1
        assert ar["duration_micros"] >= round(event["dur"])
        assert ar["comm_size"] == 676 * 4
        assert _check_linked_times(t, rank, kineto) > 150


def test_gloo_recording_linked_round_trip(tmp_path: Path) -> None:
    t = read_pytorch_et(GLOO)
    # as stored (the default export is the form ASTRA-sim runs: METADATA nodes dropped, ...)
    export_trace(t, tmp_path / "gloo", format="et", verbatim=True)
    assert_trace_equal(t.replace(deps=chakra_deps(t.deps)), read_et(tmp_path / "gloo"))


# ---------------------------------------------------------------- bad input


def test_kineto_of_another_rank(pt: Path) -> None:
    with pytest.raises(
        TraceFormatError, match=r"worker1_.*: Kineto trace of rank 1, but .*dlrm_eg_0\.json is rank 0"
    ):
        read_pytorch_et(
            pt / "dlrm_8r_et" / "dlrm_eg_0.json",
            kineto=next((pt / "dlrm_8r_kineto").glob("worker1_*.json")),
        )


def test_kineto_rank_outside_the_ets(pt: Path) -> None:
    ets = {0: pt / "dlrm_8r_et" / "dlrm_eg_0.json", 1: pt / "dlrm_8r_et" / "dlrm_eg_1.json"}
    kinetos = [next((pt / "dlrm_8r_kineto").glob(f"worker{r}_*.json")) for r in (0, 5)]
    with pytest.raises(
        TraceFormatError, match=r"Kineto trace of rank 5, but the execution traces hold ranks \[0, 1\]"
    ):
        read_pytorch_et(ets, kineto=kinetos)


def test_kineto_truncated_or_not_kineto(pt: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut_kineto.json"
    cut.write_bytes(gzip.decompress((pt / "hta" / "benchmark_simple_add_trace.json.gz").read_bytes())[:1500])
    et = pt / "hta" / "benchmark_simple_add_et.json.gz"
    with pytest.raises(TraceFormatError, match=r"cut_kineto\.json: not valid JSON"):
        read_pytorch_et(et, kineto=cut)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"nodes": [{"id": 1}]}))
    with pytest.raises(
        TraceFormatError, match=r"other\.json: not a Kineto trace \(expected a 'traceEvents' list\)"
    ):
        read_pytorch_et(et, kineto=other)
