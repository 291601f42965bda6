"""ET+ files (Chakra's ``chakra_trace_link`` output, tests/data/etplus_*) read against the ET +
Kineto pairs they were made from: collectives once, device nodes as device ops, host ops their
exclusive time."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from etstore.errors import OptionError
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.sim.replay import replay

DATA = Path(__file__).resolve().parents[1] / "data"


def _nodes(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as f:
        return list(json.load(f)["nodes"])


@pytest.mark.parametrize(
    ("plus", "pair"), [("etplus_ddp_cuda_1r", "torch_ddp_cuda_1r"), ("etplus_ddp_2r", "torch_ddp_2r")]
)
def test_each_collective_is_counted_once_with_the_pairs_sizes(plus: str, pair: str) -> None:
    t, ref = read_pytorch_et(DATA / plus), read_pytorch_et(DATA / pair)
    assert t.ranks == ref.ranks
    assert t.params["recognised"]["collectives"] == ref.params["recognised"]["collectives"]

    def colls(trace: Any) -> list[tuple[int, str, int]]:
        o = trace.ops.to_pandas()
        o = o[o["type"] == "COMM_COLL_NODE"].sort_values(["rank", "start_time_micros"])
        return list(zip(o["rank"], o["comm_type"], o["comm_size"], strict=True))

    assert colls(t) == colls(ref)


def test_device_nodes_are_device_ops_launched_by_their_op_on_their_stream() -> None:
    path = DATA / "etplus_ddp_cuda_1r" / "rank0_et_plus.json.gz"
    nodes = _nodes(path)
    device = [n for n in nodes if n.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(device) == 82
    t = read_pytorch_et(path)
    ops = t.ops.to_pandas()
    gpu = ops[ops["is_cpu_op"] == False]  # noqa: E712
    assert len(gpu) == len(device)
    assert sorted(gpu["duration_micros"]) == sorted(round(d["inclusive_dur"]) for d in device)
    assert Counter(gpu["name"]) == Counter(d["name"] for d in device)
    # each is launched by the op its ctrl_deps names (the same name and rf_id: the linker renumbers)
    host = {n["id"]: n for n in nodes if n not in device}
    rf = {r["id"]: r for r in ops.to_dict("records")}
    deps = t.deps.to_pandas()
    for g in gpu.to_dict("records"):
        launchers = [rf[s] for s in deps[deps["dst"] == g["id"]]["src"] if rf[s]["is_cpu_op"]]
        assert len(launchers) == 1
    names = Counter(host[d["ctrl_deps"]]["name"] for d in device)
    got = Counter(
        rf[s]["name"]
        for g in gpu.to_dict("records")
        for s in deps[deps["dst"] == g["id"]]["src"]
        if rf[s]["is_cpu_op"]
    )
    assert got == names


def test_host_ops_last_their_exclusive_time_and_a_replay_is_refused() -> None:
    path = DATA / "etplus_ddp_cuda_1r" / "rank0_et_plus.json.gz"
    nodes = {n["id"]: n for n in _nodes(path)}
    t = read_pytorch_et(path)
    assert t.params["durations"] == "et+" and "execution" not in t.params
    timed = [r for r in t.ops.to_pylist() if r["is_cpu_op"] and r["id"] in nodes and "ts" in nodes[r["id"]]]
    assert len(timed) > 300
    for r in timed:
        n = nodes[r["id"]]
        assert r["duration_micros"] == round(n["exclusive_dur"])
        assert r["start_time_micros"] == round(n["ts"])
    with pytest.raises(OptionError, match=r"ET\+ .*replay the execution trace with its Kineto trace"):
        replay(t)
