"""Dependency kinds of recorded traces (``DEP.kind``): each edge of the execution model says why
it holds, checked against what the ops are (CPU or device, stream, thread) and the recording's
own times; a Chakra file gets them as ``ctrl``; Cypher finds them by kind."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etstore.formats.et import read_et
from etstore.formats.export import export_trace
from etstore.model import DEP_KINDS, LANE_KINDS, chakra_deps, deps_table, op_rows
from etstore.store.embedded import EmbeddedStore
from etstore.testing import recorded_trace

DATA = Path(__file__).parent.parent / "data"


@pytest.mark.parametrize("name", ["torch_ddp_cuda_gloo_2r", "torch_ddp_2r", "torch_fsdp2_cuda_1r"])
def test_each_kind_joins_what_it_says(name: str) -> None:
    t = recorded_trace(DATA / name)
    d = t.deps
    kinds = d["kind"].to_pylist()
    assert set(kinds) <= set(DEP_KINDS) - {"ctrl"}
    rank = d["rank"].to_numpy().astype(np.int64)
    src = op_rows(t.ops, rank, d["src"].to_numpy())
    dst = op_rows(t.ops, rank, d["dst"].to_numpy())
    cpu = np.asarray([c is not False for c in t.ops["is_cpu_op"].to_pylist()])
    start = t.ops["start_time_micros"].to_numpy().astype(np.int64)
    kind = np.asarray(kinds, dtype=object)
    counts = Counter(kinds)
    gpu = not cpu.all()
    assert counts["thread"] > 0 and counts["data"] > 0
    # a thread runs CPU ops in the order it started them
    th = kind == "thread"
    assert cpu[src[th]].all() and cpu[dst[th]].all()
    assert (start[src[th]] <= start[dst[th]]).all()
    # the group chain joins communication ops only, in issue order
    gr = kind == "group"
    comm = t.ops["comm_type"].is_valid().to_numpy(zero_copy_only=False)
    assert comm[src[gr]].all() and comm[dst[gr]].all()
    if gpu:
        # a launch is a CPU op (the runtime call's op) before the device op it launched
        la = (kind == "launch") & ~cpu[dst]
        assert la.sum() > 0 and cpu[src[la]].all() and (start[src[la]] <= start[dst[la]]).all()
        # a stream orders device activities, one after the other in time
        st = kind == "stream"
        assert st.sum() > 0 and not cpu[src[st]].any() and not cpu[dst[st]].any()
        assert (start[src[st]] <= start[dst[st]]).all()
        # every device op is launched (or began before the ET did: the previous step's tail)
        launched = set(dst[kind == "launch"].tolist())
        device = np.flatnonzero(~cpu)
        assert len(set(device.tolist()) - launched) <= 0.1 * len(device)
    # a wait releases its op: what it waited for started before it ended
    wa = kind == "wait"
    assert wa.sum() > 0
    assert (start[src[wa]] <= start[dst[wa]] + t.ops["duration_micros"].to_numpy()[dst[wa]]).all()


def test_lane_kinds_are_the_ones_a_rewrite_may_move_past() -> None:
    assert {"thread", "stream"} == LANE_KINDS
    assert set(DEP_KINDS) > LANE_KINDS


def test_export_writes_chakra_kinds_and_keeps_each_kinds_order(tmp_path: Path) -> None:
    t = recorded_trace(DATA / "torch_ddp_cuda_gloo_2r")
    export_trace(t, tmp_path / "x", format="et", verbatim=True)
    back = read_et(tmp_path / "x")
    assert set(back.deps["kind"].to_pylist()) == {"data", "ctrl"}
    assert back.deps.num_rows == t.deps.num_rows
    # per destination: the data deps in order, then the other kinds, each kind in its own order
    want = chakra_deps(t.deps).sort_by(
        [("rank", "ascending"), ("dst", "ascending"), ("kind", "ascending"), ("pos", "ascending")]
    )
    got = back.deps.sort_by(
        [("rank", "ascending"), ("dst", "ascending"), ("kind", "ascending"), ("pos", "ascending")]
    )
    assert want.select(["rank", "src", "dst", "kind"]).equals(got.select(["rank", "src", "dst", "kind"]))


def test_chakra_deps_by_hand() -> None:
    d = deps_table(0, [7, 1, 2, 3, 4], [9, 9, 9, 9, 9], ["thread", "wait", "data", "launch", "thread"])
    out = chakra_deps(d)
    ctrl = sorted(
        (p, s)
        for s, k, p in zip(*(out[c].to_pylist() for c in ("src", "kind", "pos")), strict=True)
        if k == "ctrl"
    )
    # thread edges (7, 4) first, then launch (3), then wait (1): DEP_KINDS order
    assert [s for _, s in ctrl] == [7, 4, 3, 1]
    assert out.filter(pa.compute.equal(out["kind"], "data"))["src"].to_pylist() == [2]


def test_cypher_finds_kinds_in_the_store(store: EmbeddedStore) -> None:
    t = recorded_trace(DATA / "torch_ddp_cuda_gloo_2r")
    name = store.ingest(t, name="ddp").trace.name
    rows = store.cypher(
        "MATCH (t:Trace {name: $t}), (a:Op)-[d:DEP]->(b:Op) WHERE b.trace_id = t.trace_id "
        "RETURN d.kind AS kind, count(*) AS n",
        {"t": name},
    ).to_arrow()
    got = dict(zip(rows["kind"].to_pylist(), rows["n"].to_pylist(), strict=True))
    assert got == dict(Counter(t.deps["kind"].to_pylist()))
    sql = store.sql("SELECT kind, count(*) AS n FROM deps WHERE trace = 'ddp' GROUP BY kind").to_arrow()
    assert dict(zip(sql["kind"].to_pylist(), sql["n"].to_pylist(), strict=True)) == got
    assert json.dumps(sorted(got))  # kinds are plain strings


def _tensors(values: list) -> list[list]:
    out = []
    for v in values:
        if isinstance(v, list) and len(v) == 6 and all(isinstance(x, int) for x in v[:5]):
            out.append(v)
        elif isinstance(v, list):
            out.extend(_tensors(v))
    return out


def _bytes(t: list) -> tuple[int, int, int]:
    return t[1], t[2] * t[4], (t[2] + t[3]) * t[4]


def test_each_weight_update_comes_after_the_reads_of_that_weight() -> None:
    """SGD updates each weight in place (``aten::add_``); a rewrite must not move the update
    ahead of a forward op that read the weight: an ``overwrite`` edge says so."""
    import gzip

    t = recorded_trace(DATA / "torch_ddp_2r")
    with gzip.open(DATA / "torch_ddp_2r" / "rank0_et.json.gz", "rt") as f:
        nodes = {n["id"]: n for n in json.load(f)["nodes"]}
    d = t.deps.filter(pa.compute.equal(t.deps["rank"], 0)).to_pylist()
    over = {(e["src"], e["dst"]) for e in d if e["kind"] == "overwrite"}
    updates = [
        n for n in nodes.values() if n["name"] == "aten::add_" and "Tensor(a!) self" in str(n.get("attrs"))
    ]
    checked = 0
    for u in updates:
        s, lo, hi = _bytes(_tensors(u["outputs"]["values"])[0])
        earlier = [e for (e, x) in over if x == u["id"]]
        assert earlier, u["id"]
        for e in earlier:  # each one read (or wrote) bytes the update writes
            touched = [
                _bytes(x) for x in _tensors(nodes[e]["inputs"]["values"] + nodes[e]["outputs"]["values"])
            ]
            assert any(ts == s and a < hi and b > lo for ts, a, b in touched), (e, u["id"])
        checked += 1
    assert checked >= 8
