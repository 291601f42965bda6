"""A recorded trace's own timeline, read back with the spec-based reader of test_timeline.py.

Every expectation is taken from the trace itself, independently of the module: the
recording's windows (``params["windows"]``), each op's Kineto record (``kineto_event``:
``tid``, ``args.stream``, ``ts``, ``dur``), the ctrl edges from CPU ops to device ops, and
:func:`etstore.analysis.critical_path`.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.analysis import critical_path
from etstore.cli import main
from etstore.errors import OptionError
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace, decode_attrs
from etstore.report.recorded_timeline import recorded_timeline, write_recorded_timeline

from ..conftest import ROOT
from .test_timeline import _timed_trace, read_trace_events

RECORDINGS = {
    "dlrm_8r": ROOT / "examples" / "dlrm_8r",  # 8 ranks, NCCL: ET + Kineto
    "gloo_cuda_2r": ROOT / "tests" / "data" / "torch_ddp_cuda_gloo_2r",  # gloo on CUDA tensors
}


class Recording(NamedTuple):
    """A recording read as a trace, and its timeline file written by the CLI."""

    trace: Trace
    events: list[dict[str, Any]]
    other: dict[str, Any]
    kineto: dict[tuple[int, int], tuple[dict[str, Any], bool]]
    """(rank, id) → (the op's Kineto record, whether it is a device op), for ops that have one."""


@pytest.fixture(scope="module", params=sorted(RECORDINGS))
def recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """The trace, and its timeline written by the CLI from the recording's directory."""
    source = RECORDINGS[request.param]
    trace = read_pytorch_et(source)
    out = tmp_path_factory.mktemp("recorded") / f"{request.param}.json"
    nowhere = out.parent / "no-store"
    assert main(["--store", str(nowhere), "timeline", str(source), "--out", str(out)]) == 0
    assert not nowhere.exists()  # reading files leaves no store behind
    kineto = {}
    for rank, ident, blob, cpu in zip(
        *(trace.ops[c].to_pylist() for c in ("rank", "id", "attrs", "is_cpu_op")), strict=True
    ):
        text = decode_attrs(blob).get("kineto_event")
        if text:
            kineto[(rank, ident)] = (json.loads(text), cpu is False)
    return Recording(trace, read_trace_events(out), json.loads(out.read_text())["otherData"], kineto)


def _rank_slices(events: list[dict[str, Any]], trace: Trace) -> list[dict[str, Any]]:
    ranks = set(trace.ranks)
    return [e for e in events if e["ph"] == "X" and e["pid"] in ranks]


def _track_names(events: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def test_time_starts_at_the_recording_and_spans_its_window(
    recording: Recording,
) -> None:
    trace, events = recording.trace, recording.events
    timed = [e for e in events if e["ph"] in ("X", "s", "f")]
    assert min(e["ts"] for e in timed) == 0
    windows = trace.params["windows"]
    span = max(end for _, end in windows.values()) - min(start for start, _ in windows.values())
    assert max(e["ts"] + e.get("dur", 0) for e in timed) == pytest.approx(span, abs=1.0)


def test_ops_without_time_are_not_drawn_but_counted(
    recording: Recording,
) -> None:
    trace, events = recording.trace, recording.events
    slices = _rank_slices(events, trace)
    assert not [e for e in events if e["ph"] == "X" and e["ts"] == 0 and e["dur"] == 0]
    kineto = recording.kineto
    assert sorted((e["pid"], e["args"]["id"]) for e in slices) == sorted(kineto)  # one slice per recorded op
    untimed = trace.num_ops - len(kineto)
    assert untimed > 0  # the ET's process and thread nodes
    other = recording.other
    assert other["not_drawn"] == {"ops": untimed, "types": {"METADATA_NODE": untimed}}
    assert other["origin_us"] == min(rec["ts"] for rec, _ in kineto.values())
    # each slice is the op's Kineto record, from the recording's start
    origin = other["origin_us"]
    for e in slices[:: max(len(slices) // 500, 1)]:
        rec, _ = kineto[(e["pid"], e["args"]["id"])]
        assert e["ts"] == pytest.approx(rec["ts"] - origin, abs=1e-3) and e["dur"] == pytest.approx(
            rec["dur"]
        )


def test_one_process_per_rank_one_track_per_thread_and_stream(
    recording: Recording,
) -> None:
    trace, events = recording.trace, recording.events
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {p: n for p, n in procs.items() if p in trace.ranks} == {r: f"rank {r}" for r in trace.ranks}
    names = _track_names(events)
    want: dict[int, set[str]] = defaultdict(set)
    lane_of: dict[tuple[int, int], str] = {}
    for (rank, ident), (rec, device) in recording.kineto.items():
        lane = f"stream {rec['args']['stream']}" if device else f"thread {rec['tid']}"
        want[rank].add(lane)
        lane_of[(rank, ident)] = lane
    for rank in trace.ranks:
        assert {n for (p, _), n in names.items() if p == rank} == want[rank]
    assert len(names) == len(set(names))  # one track per (rank, name)
    assert all(
        names[(e["pid"], e["tid"])] == lane_of[(e["pid"], e["args"]["id"])]
        for e in _rank_slices(events, trace)
    )
    # a track's slices nest (each either follows the one it is not in, or lies inside it)
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in _rank_slices(events, trace):
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6
            stack.append(end)


def test_a_launch_flow_per_cpu_to_device_edge(recording: Recording) -> None:
    trace, events = recording.trace, recording.events
    device = {
        (r, i): c is False
        for r, i, c in zip(*(trace.ops[k].to_pylist() for k in ("rank", "id", "is_cpu_op")), strict=True)
    }
    launches = {
        (r, s, d)
        for r, s, d, kind in zip(
            *(trace.deps[c].to_pylist() for c in ("rank", "src", "dst", "kind")), strict=True
        )
        if kind == "launch" and not device[(r, s)] and device[(r, d)]
    }
    flows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            flows[e["id"]][e["ph"]] = e
    assert len(launches) > 100 and len(flows) == len(launches)
    assert all(set(f) == {"s", "f"} and f["s"]["cat"] == "launch" for f in flows.values())
    slices = {(e["pid"], e["args"]["id"]): e for e in _rank_slices(events, trace)}
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in slices.values():
        by_track[(e["pid"], e["tid"])].append(e)
    ends: dict[tuple[int, int, float], list[dict[str, Any]]] = defaultdict(list)
    for f in flows.values():
        ends[(f["f"]["pid"], f["f"]["tid"], f["f"]["ts"])].append(f["s"])
    for rank, src, dst in launches:
        op, kernel = slices[(rank, src)], slices[(rank, dst)]
        starts = ends[(rank, kernel["tid"], kernel["ts"])]  # the flow ends at the kernel's start
        inside = [s for s in starts if s["tid"] == op["tid"] and op["ts"] <= s["ts"] <= op["ts"] + op["dur"]]
        assert inside, (rank, src, dst)
        # and starts where the launching op is the innermost slice of its thread
        deeper = [
            c
            for c in by_track[(rank, op["tid"])]
            if c is not op and op["ts"] <= c["ts"] and c["ts"] + c["dur"] <= op["ts"] + op["dur"]
        ]
        free = [s for s in inside if not any(c["ts"] < s["ts"] < c["ts"] + c["dur"] for c in deeper)]
        assert free or sum(c["dur"] for c in deeper) >= op["dur"], (rank, src, dst)


def test_the_critical_path_is_a_track(recording: Recording) -> None:
    trace, events = recording.trace, recording.events
    procs = {e["args"]["name"]: e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    pid = procs["critical path"]
    assert pid not in trace.ranks
    steps = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
    assert len({e["tid"] for e in steps}) == 1
    path = critical_path(trace)
    assert sum(e["dur"] for e in steps) == pytest.approx(path.length_micros, abs=1e-6)
    assert path.length_micros > 1000
    steps.sort(key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in itertools.pairwise(steps))
    want = [
        (r, i)
        for r, i, d in zip(
            *(path.path[c].to_pylist() for c in ("rank", "id", "duration_micros")), strict=True
        )
        if d
    ]
    assert [(e["args"]["rank"], e["args"]["id"]) for e in steps if e["dur"]] == want
    on_path = {
        (e["pid"], e["args"]["id"]) for e in _rank_slices(events, trace) if "critical_path_step" in e["args"]
    }
    assert set(want) <= on_path


# ---------------------------------------------------------------- traces without Kineto records


def test_a_timed_trace_is_rebased_to_its_start(tmp_path: Path) -> None:
    ops = _timed_trace().ops
    late = _timed_trace().replace(
        ops=ops.set_column(
            ops.schema.get_field_index("start_time_micros"),
            "start_time_micros",
            pc.add(ops["start_time_micros"], pa.scalar(1_700_000_000_000_000, pa.uint64())),
        )
    )
    path = write_recorded_timeline(late, tmp_path / "late")
    events = read_trace_events(path)
    slices = sorted(
        (e["pid"], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X" and e["pid"] < 2
    )
    assert slices == [(0, "fwd", 0, 10), (0, "send", 10, 5), (1, "fwd", 0, 12), (1, "recv", 12, 8)]
    assert sorted((e["ph"], e["pid"], e["ts"]) for e in events if e["ph"] in "sf") == [
        ("f", 1, 12.0),
        ("s", 0, 10.0),
    ]
    # send (5 µs) then its receive (8 µs): 13 µs, longer than either fwd
    cp = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert [(e["name"], e["ts"], e["dur"]) for e in cp] == [("send", 10, 5), ("recv", 15, 8)]
    assert json.loads(path.read_text())["otherData"]["origin_us"] == 1_700_000_000_000_000
    assert recorded_timeline(late)["otherData"]["layout"] == "op types"


def test_a_trace_without_timestamps(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"trace 'timed' has no timestamps"):
        write_recorded_timeline(_timed_trace(stamps=False), tmp_path / "x")
    assert not (tmp_path / "x.json").exists()
