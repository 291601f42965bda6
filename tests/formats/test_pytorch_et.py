"""PyTorch execution traces alone: node mapping, collectives counted by hand, round trip, errors."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import expand
from etstore.errors import TraceFormatError
from etstore.formats import read_et
from etstore.formats.export import export_trace
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import Trace, decode_attrs
from etstore.sim import simulate
from etstore.testing import assert_trace_equal
from etstore.topology import default_topology, parse_topology

GLOO = Path(__file__).parent.parent / "data" / "pytorch_gloo"

# the names record_param_comms gives collectives, and the Chakra comm_type each means
_COLL = {
    "allreduce": "ALL_REDUCE",
    "all_to_all": "ALL_TO_ALL",
    "all_to_allv": "ALL_TO_ALL",
    "all_gather": "ALL_GATHER",
    "allgather": "ALL_GATHER",
    "broadcast": "BROADCAST",
}


def _load(path: Path) -> dict[str, Any]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _io(node: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    if isinstance(node.get("inputs"), dict):
        return node["inputs"]["values"], node["inputs"]["types"]
    return node["inputs"], node["input_types"]


def _hand_collectives(path: Path) -> list[tuple[str, int]]:
    """(comm_type, input bytes) of every non-wait record_param_comms, in id order: an independent count.

    A tensor argument is ``[id, storage, offset, numel, itemsize, device]``; newer schemas
    also carry ``in_msg_nelems`` and ``dtype`` attributes, which must agree.
    """
    out = []
    for node in sorted(_load(path)["nodes"], key=lambda n: n["id"]):
        if node["name"] != "record_param_comms":
            continue
        values, types = _io(node)
        name = values[types.index("String")]
        if name == "wait":
            continue
        buf = values[0]
        tensors = buf if isinstance(buf[0], list) else [buf]
        nbytes = sum(t[3] * t[4] for t in tensors)
        attrs = {a["name"]: a["value"] for a in node.get("attrs", [])}
        if "in_msg_nelems" in attrs:
            assert attrs["in_msg_nelems"] * {"Float": 4, "Long": 8}[attrs["dtype"]] == nbytes
        out.append((_COLL[name], nbytes))
    return out


def _trace_collectives(trace: Trace, rank: int) -> list[tuple[str, int]]:
    ops = trace.ops.filter(pc.and_(pc.equal(trace.ops["rank"], rank), pc.is_valid(trace.ops["comm_type"])))
    return list(zip(ops["comm_type"].to_pylist(), ops["comm_size"].to_pylist(), strict=True))


def _rank_ops(trace: Trace, rank: int) -> pa.Table:
    return trace.ops.filter(pc.equal(trace.ops["rank"], rank))


# ---------------------------------------------------------------- DLRM, 8 ranks, schema 1.0.1


_CACHE: dict[str, Trace] = {}


@pytest.fixture
def dlrm(pt: Path) -> Trace:
    """The 8-rank DLRM ET, read once per session (reading is the slow part)."""
    if "dlrm" not in _CACHE:
        _CACHE["dlrm"] = read_pytorch_et(pt / "dlrm_8r_et")
    return _CACHE["dlrm"]


def test_dlrm_collectives_per_rank_match_a_hand_count(dlrm: Trace, pt: Path) -> None:
    assert dlrm.ranks == list(range(8))
    for rank in range(8):
        hand = _hand_collectives(pt / "dlrm_8r_et" / f"dlrm_eg_{rank}.json")
        assert Counter(t for t, _ in hand) == {"ALL_TO_ALL": 5, "ALL_REDUCE": 3}
        assert _trace_collectives(dlrm, rank) == hand
    # the all-reduced gradient buckets: 394241, 112 and 226960 floats on every rank
    assert [s for t, s in _trace_collectives(dlrm, 3) if t == "ALL_REDUCE"] == [
        394241 * 4,
        112 * 4,
        226960 * 4,
    ]


def test_dlrm_every_node_is_an_op_with_its_source_json(dlrm: Trace, pt: Path) -> None:
    for rank in (0, 7):
        nodes = _load(pt / "dlrm_8r_et" / f"dlrm_eg_{rank}.json")["nodes"]
        ops = _rank_ops(dlrm, rank)
        assert ops.num_rows == len(nodes)
        assert sorted(ops["id"].to_pylist()) == sorted(n["id"] for n in nodes)
        by_id = {n["id"]: n for n in nodes}
        for op_id, blob in zip(ops["id"].to_pylist(), ops["attrs"].to_pylist(), strict=True):
            assert json.loads(decode_attrs(blob)["pytorch_et_node"]) == by_id[op_id]
        types = Counter(ops["type"].to_pylist())
        roots = sum(n["name"].startswith("[pytorch|profiler|execution_graph|") for n in nodes)
        assert types["METADATA_NODE"] == roots == 3  # the process and its two threads
        assert types["COMM_COLL_NODE"] == 8
        assert types["COMP_NODE"] == len(nodes) - 3 - 8


def test_dlrm_report_says_durations_are_absent(dlrm: Trace) -> None:
    assert dlrm.params["durations"] == "absent"
    assert dlrm.params["recognised"] == {
        "format": "pytorch-et",
        "ops": dlrm.num_ops,
        "collectives": {"ALL_REDUCE": 24, "ALL_TO_ALL": 40},
        "linked_fraction": None,
    }
    assert int(pc.sum(dlrm.ops["duration_micros"]).as_py()) == 0
    assert dlrm.params["schemas"] == ["1.0.1"]


def test_dependencies_point_forward_and_chain_each_thread(dlrm: Trace, pt: Path) -> None:
    deps = dlrm.deps
    assert dlrm.num_missing == 0
    assert bool(pc.all(pc.less(deps["src"], deps["dst"])).as_py())  # entry order: acyclic
    rank0 = deps.filter(pc.equal(deps["rank"], 0))
    ctrl = rank0.filter(pc.equal(rank0["kind"], "ctrl"))
    nodes = _load(pt / "dlrm_8r_et" / "dlrm_eg_0.json")["nodes"]
    for tid in (1, 2):  # each thread's executing nodes, consecutive in id order
        ids = sorted(n["id"] for n in nodes if n["tid"] == tid and not n["name"].startswith("[pytorch"))
        pairs = set(zip(ctrl["src"].to_pylist(), ctrl["dst"].to_pylist(), strict=True))
        assert all((a, b) in pairs for a, b in itertools.pairwise(ids))


def test_dlrm_round_trips_through_et(dlrm: Trace, tmp_path: Path) -> None:
    # as stored (the default export is the form ASTRA-sim runs: METADATA nodes dropped, ...)
    export_trace(dlrm, tmp_path / "dlrm", format="et", verbatim=True)
    assert_trace_equal(dlrm, read_et(tmp_path / "dlrm"))


def test_dlrm_simulates_and_expands(dlrm: Trace) -> None:
    result = simulate(dlrm, parse_topology(default_topology(dlrm)))
    assert result.collectives.num_rows == 8  # 5 all-to-all + 3 all-reduce instances over 8 ranks
    assert result.total_ns > 0
    ex = expand(dlrm, "ring", where="comm_type = 'ALL_REDUCE'")
    assert ex.collectives.num_rows == 3
    assert sorted(ex.collectives["comm_size"].to_pylist()) == [112 * 4, 226960 * 4, 394241 * 4]
    left = ex.trace.ops.filter(pc.equal(ex.trace.ops["comm_type"], "ALL_REDUCE"))
    assert left.num_rows == 0


# ---------------------------------------------------------------- other schemas


def test_chakra_1_0_2_all_gathers_and_process_group(pt: Path) -> None:
    path = pt / "1.0.2-chakra.0.0.4.json"
    t = read_pytorch_et(path)
    hand = _hand_collectives(path)
    assert hand == [("ALL_GATHER", 4)] * 10  # one float each
    assert _trace_collectives(t, 0) == hand
    # the record's process-group id (82149104) is the backend_id of pg "0" in ## process_group:init ##
    assert set(t.ops.filter(pc.is_valid(t.ops["comm_type"]))["pg_name"].to_pylist()) == {"0"}
    assert t.params["comm_groups"] == {"0": [0, 1]}
    assert t.num_ops == len(_load(path)["nodes"]) == 263


def test_resnet_1_1_0_collectives_from_attributes(pt: Path) -> None:
    path = pt / "resnet_et.json.gz"
    t = read_pytorch_et(path)
    hand = _hand_collectives(path)
    assert Counter(k for k, _ in hand) == {"ALL_REDUCE": 15, "BROADCAST": 6}
    assert _trace_collectives(t, 0) == hand
    assert t.params["schemas"] == ["1.1.0-chakra.0.0.4"]
    assert t.num_ops == 14392


def test_simple_add_without_communication(pt: Path) -> None:
    t = read_pytorch_et(pt / "hta" / "benchmark_simple_add_et.json.gz")
    assert t.num_ops == 38
    assert t.params["recognised"]["collectives"] == {}
    assert t.num_deps > 0


# ---------------------------------------------------------------- our own gloo recording


def test_gloo_recording_collectives_from_the_model_sizes() -> None:
    t = read_pytorch_et(sorted(GLOO.glob("rank*_et.json.gz")))
    params = (16 * 32 + 32) + (32 * 4 + 4)  # Linear(16, 32) and Linear(32, 4): weights + biases
    assert t.ranks == [0, 1]
    for rank in (0, 1):
        colls = _trace_collectives(t, rank)
        # DDP's bucket rebuild broadcasts 5 and 1 int32 once, then one all-reduce per step
        bucket = ("ALL_REDUCE", params * 4)
        assert colls == [("BROADCAST", 5 * 4), ("BROADCAST", 1 * 4), bucket, bucket]
        comm = _rank_ops(t, rank).filter(pc.is_valid(_rank_ops(t, rank)["comm_type"]))
        assert set(comm["pg_name"].to_pylist()) == {"0"}
    assert t.params["comm_groups"] == {"0": [0, 1]}
    assert t.params["recognised"]["collectives"] == {"ALL_REDUCE": 4, "BROADCAST": 4}
    # rank 0 lost its second gloo:all_reduce record (see the fixture's README): the c10d call stands in
    names = _rank_ops(t, 0).filter(pc.is_valid(_rank_ops(t, 0)["comm_type"]))["name"].to_pylist()
    assert names == ["gloo:broadcast", "gloo:broadcast", "gloo:all_reduce", "c10d::allreduce_"]


def test_gloo_recording_simulates_and_expands() -> None:
    t = read_pytorch_et(sorted(GLOO.glob("rank*_et.json.gz")))
    result = simulate(t, parse_topology(default_topology(t)))
    assert result.collectives.num_rows == 4
    ex = expand(t, "ring", where="comm_type = 'ALL_REDUCE'")
    size = 676 * 4
    # ring all-reduce over n ranks sends 2 (n - 1) / n of the buffer per rank: 2 (n - 1) S in all
    assert [(c["comm_size"], c["group_size"], c["bytes_sent"]) for c in ex.collectives.to_pylist()] == [
        (size, 2, 2 * (2 - 1) * size)
    ] * 2


# ---------------------------------------------------------------- a hand-built ET


def _node(id_: int, name: str, parent: int, ins: list[Any] = (), outs: list[Any] = (), tid: int = 1) -> dict:
    def io(args: list[Any]) -> dict[str, Any]:
        return {"values": [v for v, _ in args], "shapes": [[] for _ in args], "types": [t for _, t in args]}

    return {
        "id": id_,
        "name": name,
        "ctrl_deps": parent,
        "inputs": io(list(ins)),
        "outputs": io(list(outs)),
        "attrs": [
            {"name": "rf_id", "type": "uint64", "value": id_},
            {"name": "tid", "type": "uint64", "value": tid},
        ],
    }


def _hand_et(tmp_path: Path) -> Path:
    x = [10, 11, 0, 8, 4, "cpu"]  # 8 floats
    y = [12, 13, 0, 8, 4, "cpu"]
    nodes = [
        _node(1, "[pytorch|profiler|execution_trace|process]", 0, tid=0),
        _node(2, "[pytorch|profiler|execution_trace|thread]", 1),
        _node(3, "aten::ones", 2, outs=[(x, "Tensor(float)")]),
        _node(
            4,
            "c10d::send",
            2,
            ins=[([x], "GenericList[Tensor(float)]"), ("<Object>", "Object"), (1, "Int"), (7, "Int")],
        ),
        _node(
            5,
            "record_param_comms",
            4,
            ins=[
                ([x], "GenericList[Tensor(float)]"),
                (3, "Int"),
                (["0", "default_pg"], "Tuple[String,String]"),
                (1, "Int"),
                ("send", "String"),
                ([], "GenericList[]"),
                ([], "GenericList[]"),
            ],
        ),
        _node(6, "gloo:send", 5, ins=[(x, "Tensor(float)")]),
        _node(
            7, "aten::add", 2, ins=[(x, "Tensor(float)"), (x, "Tensor(float)")], outs=[(y, "Tensor(float)")]
        ),
        _node(8, "aten::relu", 2, ins=[(y, "Tensor(float)")], outs=[(y, "Tensor(float)")]),
    ]
    path = tmp_path / "hand_et.json"
    path.write_text(json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes[::-1]}))
    return path


def test_hand_built_send_and_dependencies(tmp_path: Path) -> None:
    t = read_pytorch_et(_hand_et(tmp_path))
    ops = {r["id"]: r for r in t.ops.to_pylist()}
    assert [ops[i]["type"] for i in range(1, 9)] == ["METADATA_NODE"] * 2 + ["COMP_NODE"] * 2 + [
        "COMM_SEND_NODE"
    ] + ["COMP_NODE"] * 3
    send = ops[5]
    assert (send["comm_dst"], send["comm_tag"], send["comm_size"], send["pg_name"]) == (1, 7, 32, "0")
    edges = set(
        zip(t.deps["src"].to_pylist(), t.deps["dst"].to_pylist(), t.deps["kind"].to_pylist(), strict=True)
    )
    data = {(s, d) for s, d, k in edges if k == "data"}
    ctrl = {(s, d) for s, d, k in edges if k == "ctrl"}
    # x is written by aten::ones only (a send does not write its buffer); y by aten::add
    assert data == {(3, 4), (3, 5), (3, 6), (3, 7), (7, 8)}
    assert ctrl == {(3, 4), (4, 5), (5, 6), (6, 7), (7, 8)}  # thread 1 in entry order
    assert t.params["recognised"]["collectives"] == {"SEND": 1}


# ---------------------------------------------------------------- bad input


def test_truncated_json(tmp_path: Path, pt: Path) -> None:
    bad = tmp_path / "cut_et.json"
    bad.write_bytes((pt / "1.0.2-chakra.0.0.4.json").read_bytes()[:5000])
    with pytest.raises(TraceFormatError, match=r"cut_et\.json: not valid JSON \(truncated or corrupt\)"):
        read_pytorch_et(bad)


def test_truncated_gzip(tmp_path: Path, pt: Path) -> None:
    bad = tmp_path / "cut_et.json.gz"
    bad.write_bytes((pt / "linear_et.json.gz").read_bytes()[:3000])
    with pytest.raises(TraceFormatError, match=r"cut_et\.json\.gz: .*truncated gzip"):
        read_pytorch_et(bad)


def test_et_without_nodes(tmp_path: Path) -> None:
    empty = tmp_path / "empty_et.json"
    empty.write_text(json.dumps({"schema": "1.0.1", "pid": 1, "nodes": []}))
    with pytest.raises(TraceFormatError, match=r"empty_et\.json: the PyTorch execution trace has no nodes"):
        read_pytorch_et(empty)


def test_not_an_et(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"workload_graph": []}))
    with pytest.raises(
        TraceFormatError, match=r"other\.json: not a PyTorch execution trace \(expected a 'nodes'"
    ):
        read_pytorch_et(other)


def test_node_without_id_and_repeated_id(tmp_path: Path) -> None:
    path = tmp_path / "bad_et.json"
    path.write_text(json.dumps({"nodes": [{"name": "aten::add"}]}))
    with pytest.raises(
        TraceFormatError, match=r"bad_et\.json: node 0: expected an object with an integer 'id'"
    ):
        read_pytorch_et(path)
    path.write_text(json.dumps({"nodes": [{"id": 3, "name": "a"}, {"id": 3, "name": "b"}]}))
    with pytest.raises(TraceFormatError, match=r"bad_et\.json: node id 3 appears twice"):
        read_pytorch_et(path)


def test_two_files_of_one_rank(tmp_path: Path, pt: Path) -> None:
    copy = tmp_path / "copy_et.json"
    copy.write_bytes((pt / "dlrm_8r_et" / "dlrm_eg_0.json").read_bytes())
    with pytest.raises(TraceFormatError, match=r"execution trace of rank 0 also given by"):
        read_pytorch_et([pt / "dlrm_8r_et" / "dlrm_eg_0.json", copy])


def test_missing_path() -> None:
    with pytest.raises(TraceFormatError, match=r"nowhere_et\.json: no such file or directory"):
        read_pytorch_et("nowhere_et.json")


def test_ops_sorted_by_rank_and_id(dlrm: Trace) -> None:
    rank = dlrm.ops["rank"].to_numpy()
    ids = dlrm.ops["id"].to_numpy()
    assert np.all(np.diff(rank) >= 0)
    same = np.diff(rank) == 0
    assert np.all(np.diff(ids.astype(np.int64))[same] > 0)
