"""Kineto traces alone, against counts taken straight from the source files.

Every expected number comes from a separate pass over the raw JSON here (``json`` from the
standard library, no etstore code): NCCL kernels and their ``In/Out msg nelems`` × dtype,
or the ``nccl:*`` annotations' ``Input Dims`` × ``Input type`` for traces older than
those kernel arguments; complete events and their durations.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from etstore.errors import TraceFormatError
from etstore.formats import read_et, read_trace, write_et
from etstore.formats.kineto import read_kineto
from etstore.model import decode_attrs
from etstore.proto import GlobalMetadata
from etstore.store import open_store

DLRM = "pytorch/dlrm_8r_kineto"
NCCL = "pytorch/hta/nccl_data.json.gz"
SIMPLE = "pytorch/hta/benchmark_simple_add_trace.json.gz"
ELEM = {
    "Float": 4,
    "float": 4,
    "long int": 8,
    "int": 4,
    "Half": 2,
    "c10::Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Byte": 1,
}
NCCL_OPS = {"allreduce": "ALL_REDUCE", "broadcast": "BROADCAST", "all_reduce": "ALL_REDUCE"}
NCCL_OPS |= {"all_to_all": "ALL_TO_ALL", "alltoall": "ALL_TO_ALL", "allgather": "ALL_GATHER"}


def _load(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ops(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]


def _hand_collectives(doc: dict[str, Any]) -> tuple[Counter[str], Counter[str]]:
    """(count, bytes) per collective, counted from the raw events.

    Newer traces annotate each NCCL kernel with its collective and message sizes; older
    ones only have the ``nccl:<op>`` annotation with its input tensor's shape and type,
    and each annotation launches one kernel.
    """
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    kernels = [e for e in _ops(doc) if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    if kernels and all("Collective name" in e["args"] for e in kernels):
        for e in kernels:
            a = e["args"]
            kind = NCCL_OPS[a["Collective name"]]
            count[kind] += 1
            size[kind] += a["In msg nelems"] * ELEM[a["dtype"]]
        return count, size
    for e in _ops(doc):
        if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:"):
            kind = NCCL_OPS[e["name"][5:]]
            count[kind] += 1
            size[kind] += math.prod(e["args"]["Input Dims"][0]) * ELEM[e["args"]["Input type"][0]]
    return count, size


def _collectives(trace: Any, rank: int) -> tuple[Counter[str], Counter[str]]:
    ops = trace.ops.filter(
        pc.and_(pc.equal(trace.ops["rank"], rank), pc.equal(trace.ops["type"], "COMM_COLL_NODE"))
    )
    count: Counter[str] = Counter(ops["comm_type"].to_pylist())
    size: Counter[str] = Counter()
    for kind, n in zip(ops["comm_type"].to_pylist(), ops["comm_size"].to_pylist(), strict=True):
        size[kind] += n
    return count, size


# ------------------------------------------------------------------ real traces


def test_dlrm_eight_ranks_match_the_files(shared_fixture: Any) -> None:
    folder = shared_fixture(DLRM)
    t = read_trace(folder)
    assert t.ranks == list(range(8)) and t.name == "dlrm_8r_kineto"
    totals: Counter[str] = Counter()
    for path in sorted(folder.iterdir()):
        doc = _load(path)
        rank = doc["distributedInfo"]["rank"]
        rank_num = int(re.match(r"worker(\d+)", path.name)[1])  # type: ignore[index]
        assert rank == rank_num
        want_count, want_size = _hand_collectives(doc)
        got_count, got_size = _collectives(t, rank)
        assert got_count == want_count and got_size == want_size, path.name
        totals.update(want_count)
        ops = t.ops.filter(pc.equal(t.ops["rank"], rank))
        events = _ops(doc)
        assert ops.num_rows == len(events)
        assert pc.sum(ops["duration_micros"]).as_py() == sum(round(e["dur"]) for e in events)
    assert totals == {"ALL_REDUCE": 24, "ALL_TO_ALL": 40}  # 3 all_reduce and 5 all_to_all per rank
    rec = t.params["recognised"]
    assert rec["format"] == "kineto" and rec["collectives"] == {"ALL_REDUCE": 24, "ALL_TO_ALL": 40}
    assert rec["ops"] == t.num_ops and 0.9 < rec["linked_fraction"] <= 1.0


def test_nccl_kernels_carry_sizes_and_process_groups(shared_fixture: Any) -> None:
    path = shared_fixture(NCCL)
    doc = _load(path)
    t = read_trace(path)
    want_count, want_size = _hand_collectives(doc)
    assert _collectives(t, 0) == (want_count, want_size)
    assert want_count == {"ALL_REDUCE": 15, "BROADCAST": 6}
    coll = t.ops.filter(pc.equal(t.ops["type"], "COMM_COLL_NODE"))
    assert set(coll["pg_name"].to_pylist()) == {"0"}
    assert set(coll["is_cpu_op"].to_pylist()) == {False}  # the kernels, not the CPU calls
    extra = decode_attrs(coll["attrs"][0].as_py())
    assert extra["pg_ranks"] == [0, 1]
    assert json.loads(extra["kineto_event"])["name"].startswith("ncclKernel_")
    assert t.params["process_groups"] == {
        "0": {"desc": "default_pg", "ranks": [0, 1], "backend": "cuda:nccl"}
    }
    assert t.params["world_size"] == 2
    # durations are the events' own, rounded to whole µs
    events = _ops(doc)
    assert t.num_ops == len(events)
    total = pc.sum(t.ops["duration_micros"]).as_py()
    assert abs(total - sum(e["dur"] for e in events)) <= 0.5 * len(events)


def test_every_kernel_waits_for_its_launch(shared_fixture: Any) -> None:
    path = shared_fixture(SIMPLE)
    doc = _load(path)
    events = _ops(doc)
    t = read_trace(path)
    launches = {e["args"]["correlation"]: i for i, e in enumerate(events) if e.get("cat") == "cuda_runtime"}
    want = sorted(
        (launches[e["args"]["correlation"]], i)
        for i, e in enumerate(events)
        if e.get("cat") == "kernel" and e["args"]["correlation"] in launches
    )
    data = t.deps.filter(pc.equal(t.deps["kind"], "data"))
    assert sorted(zip(data["src"].to_pylist(), data["dst"].to_pylist(), strict=True)) == want
    assert len(want) == 4
    kernels = t.ops.filter(pc.equal(t.ops["is_cpu_op"], False))
    assert kernels.num_rows == sum(e.get("cat") == "kernel" for e in events)
    assert t.params["recognised"]["linked_fraction"] == 1.0


def test_control_order_within_each_thread(shared_fixture: Any) -> None:
    """Each ctrl edge stays on one (pid, tid) lane and points forward in time."""
    path = shared_fixture(SIMPLE)
    events = _ops(_load(path))
    t = read_trace(path)
    ctrl = t.deps.filter(pc.equal(t.deps["kind"], "ctrl"))
    assert ctrl.num_rows > 0
    for s, d in zip(ctrl["src"].to_pylist(), ctrl["dst"].to_pylist(), strict=True):
        a, b = events[s], events[d]
        assert (a["pid"], a["tid"]) == (b["pid"], b["tid"])
        assert a["ts"] <= b["ts"]
    # lanes with one top-level event chain: every event but the lane's first waits for one
    lanes = Counter((e["pid"], e["tid"]) for e in events)
    assert ctrl.num_rows <= len(events) - len(lanes)


def test_ingest_export_ingest_keeps_everything(shared_fixture: Any, tmp_path: Path) -> None:
    t = read_trace(shared_fixture(DLRM))
    write_et(t, tmp_path / "et" / "dlrm")
    back = read_et(tmp_path / "et")
    for table in ("ops", "deps"):
        assert getattr(back, table).equals(getattr(t, table)), table
    assert back.meta.equals(t.meta)
    meta = GlobalMetadata.FromString(back.meta["metadata"][3].as_py())
    attrs = {a.name: a for a in meta.attr}
    assert attrs["source_format"].string_val == "kineto" and attrs["rank"].int64_val == 3
    document = json.loads(attrs["kineto_document"].string_val)
    assert document["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 8}
    with open_store(tmp_path / "store", write=True) as store:
        report = store.ingest(t, name="dlrm")
        loaded = store.load("dlrm")
        assert report.trace.params["recognised"]["collectives"] == {"ALL_REDUCE": 24, "ALL_TO_ALL": 40}
    assert loaded.ops.equals(t.ops) and loaded.num_deps == t.num_deps


def test_raw_events_survive_per_op(shared_fixture: Any) -> None:
    path = shared_fixture(SIMPLE)
    events = _ops(_load(path))
    t = read_trace(path)
    raw = [json.loads(decode_attrs(b)["kineto_event"]) for b in t.ops["attrs"].to_pylist()]
    assert raw == events


# ------------------------------------------------------------------ bad inputs


def _write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _kineto(rank: int | None, world: int | None) -> dict[str, Any]:
    info = {} if rank is None else {"rank": rank, **({} if world is None else {"world_size": world})}
    return {
        "schemaVersion": 1,
        "distributedInfo": info,
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 2}
        ],
    }


def test_truncated_json(tmp_path: Path, shared_fixture: Any) -> None:
    path = tmp_path / "cut.pt.trace.json"
    path.write_bytes(gzip.decompress(shared_fixture(SIMPLE).read_bytes())[:2000])
    with pytest.raises(TraceFormatError, match=r"cut\.pt\.trace\.json: not valid JSON"):
        read_trace(path)


def test_not_a_kineto_document(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"x\.json: not a Kineto trace"):
        read_kineto(_write(tmp_path / "x.json", {"schemaVersion": 1, "traceEvents": 3}))


def test_event_without_time(tmp_path: Path) -> None:
    doc = _kineto(0, 1)
    del doc["traceEvents"][0]["ts"]
    with pytest.raises(TraceFormatError, match=r"traceEvents\[0\] \('aten::add'\) has no numeric 'ts'"):
        read_kineto(_write(tmp_path / "t.json", doc))


def test_a_missing_rank_is_named(tmp_path: Path) -> None:
    """A capture of some ranks is a trace of those ranks; the ingest says which are missing."""
    for r in (0, 2):
        _write(tmp_path / f"worker{r}.pt.trace.json", _kineto(r, 3))
    t = read_trace(tmp_path)
    assert t.ranks == [0, 2]
    assert t.params["recognised"]["warnings"][0].startswith("ranks 0, 2 of 3 recorded (none for ranks 1)")


def test_a_file_of_another_world_size(tmp_path: Path) -> None:
    _write(tmp_path / "worker0.pt.trace.json", _kineto(0, 2))
    _write(tmp_path / "worker1.pt.trace.json", _kineto(1, 4))
    with pytest.raises(
        TraceFormatError, match=r"worker1\.pt\.trace\.json: distributedInfo\.world_size is 4 but"
    ):
        read_trace(tmp_path)


def test_two_files_claiming_one_rank(tmp_path: Path) -> None:
    _write(tmp_path / "a0.pt.trace.json", _kineto(0, 2))
    _write(tmp_path / "a1.pt.trace.json", _kineto(0, 2))  # the metadata wins over the name
    with pytest.raises(
        TraceFormatError, match=r"a1\.pt\.trace\.json: rank 0 also given by .*a0\.pt\.trace\.json"
    ):
        read_trace(tmp_path)


def test_ranks_from_names_when_metadata_is_silent(tmp_path: Path) -> None:
    for r in (1, 0):
        _write(tmp_path / f"rank{r}_kineto.json", _kineto(None, None))
    t = read_trace(tmp_path)
    assert t.ranks == [0, 1] and t.num_ops == 2


# ------------------------------------------------------------------ gloo (CPU) and point-to-point

GLOO = Path(__file__).resolve().parents[1] / "data" / "pytorch_gloo"


@pytest.mark.parametrize("rank", [0, 1])
def test_gloo_collectives_count_once_with_their_sizes(rank: int) -> None:
    """gloo runs on a worker thread: the c10d call and its gloo: record make one collective.

    Hand count: the ``c10d::<op>_`` calls of the file and their first tensor's elements;
    every tensor of this recording is 4 bytes an element (float32 gradients, int32
    broadcasts; tests/data/pytorch_gloo/README.md).
    """
    path = GLOO / f"rank{rank}_kineto.json.gz"
    doc = _load(path)
    want_count: Counter[str] = Counter()
    want_size: Counter[str] = Counter()
    for e in _ops(doc):
        if e["name"] in ("c10d::allreduce_", "c10d::broadcast_"):
            kind = NCCL_OPS[e["name"][6:-1]]
            want_count[kind] += 1
            want_size[kind] += math.prod(e["args"]["Input Dims"][0][0]) * 4
    t = read_trace(path)
    assert _collectives(t, rank) == (want_count, want_size)
    assert want_count == {"ALL_REDUCE": 2, "BROADCAST": 2} and want_size["ALL_REDUCE"] == 2 * 2704
    coll = t.ops.filter(pc.equal(t.ops["type"], "COMM_COLL_NODE"))
    assert set(coll["name"].to_pylist()) == {"gloo:all_reduce", "gloo:broadcast"}  # the execution records
    assert set(coll["pg_name"].to_pylist()) == {"0"}  # the one group of distributedInfo.pg_config


def _event(
    name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: Any
) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_send_and_recv_with_peer_and_tag(tmp_path: Path) -> None:
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2},
        "traceEvents": [
            _event(
                "c10d::send",
                10,
                50,
                **{"Concrete Inputs": ["", "", "0", "7"], "Input Dims": [[[256]], [], [], []]},
            ),
            _event("gloo:send", 12, 40, **{"Input Dims": [[256]], "Input type": ["c10::BFloat16"]}),
            _event("c10d::recv_", 100, 50, **{"Concrete Inputs": ["", "", "0", "9"]}),
            _event(
                "record_param_comms",
                101,
                45,
                **{"Collective name": "recv", "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Long"},
            ),
        ],
    }
    t = read_trace(_write(tmp_path / "p2p.json", doc))
    comm = t.ops.filter(pc.is_valid(t.ops["comm_src"])).to_pylist()
    assert [
        (r["name"], r["type"], r["comm_src"], r["comm_dst"], r["comm_tag"], r["comm_size"]) for r in comm
    ] == [
        ("gloo:send", "COMM_SEND_NODE", 1, 0, 7, 512),
        ("record_param_comms", "COMM_RECV_NODE", 0, 1, 9, 64),
    ]
    assert t.params["recognised"]["p2p"] == {"COMM_RECV_NODE": 1, "COMM_SEND_NODE": 1}


def test_new_nccl_kernel_names_without_arguments(tmp_path: Path) -> None:
    """NCCL >= 2.19 kernel names; the size comes from the launching call's record_param_comms."""
    rpc = {
        "Collective name": "reduce_scatter_tensor",
        "In msg nelems": 64,
        "Out msg nelems": 8,
        "dtype": "Half",
    }
    doc = {
        "traceEvents": [
            _event("record_param_comms", 10, 30, **rpc),
            _event("cudaLaunchKernel", 15, 5, cat="cuda_runtime", correlation=42),
            _event("ncclDevKernel_ReduceScatter_Sum_f16_RING_LL", 20, 9, tid=3, cat="kernel", correlation=42),
        ]
    }
    t = read_trace(_write(tmp_path / "rs.json", doc))
    rows = t.ops.to_pylist()
    assert [r["type"] for r in rows] == ["COMP_NODE", "COMP_NODE", "COMM_COLL_NODE"]
    assert (rows[2]["comm_type"], rows[2]["comm_size"], rows[2]["is_cpu_op"]) == (
        "REDUCE_SCATTER",
        128,
        False,
    )
    deps = set(
        zip(t.deps["src"].to_pylist(), t.deps["dst"].to_pylist(), t.deps["kind"].to_pylist(), strict=True)
    )
    assert deps == {(1, 2, "data")}  # the launch; the runtime call nests in record_param_comms
