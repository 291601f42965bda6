"""Data flow by storage and byte range, on real recordings: DDP's bucket, the DLRM's collectives."""

from __future__ import annotations

import doctest
import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from etstore.formats import _torch_flow
from etstore.formats._torch_flow import storage_flow
from etstore.formats.pytorch_et import read_pytorch_et

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "tests" / "data" / "torch_ddp_2r"


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(_torch_flow)
    assert tried > 0 and failed == 0


def _data_paths(trace: Any, rank: int) -> dict[int, set[int]]:
    """Each op's data-edge descendants on ``rank``."""
    succ: dict[int, list[int]] = defaultdict(list)
    for d in trace.deps.to_pylist():
        if d["rank"] == rank and d["kind"] == "data":
            succ[d["src"]].append(d["dst"])
    out: dict[int, set[int]] = {}

    def reach(op: int) -> set[int]:
        if op not in out:
            out[op] = set()
            for s in succ[op]:
                out[op] |= {s} | reach(s)
        return out[op]

    for op in list(succ):
        reach(op)
    return out


def test_every_bucket_writer_feeds_its_all_reduce() -> None:
    """DDP copies each gradient, divided by the world size, into its slice of the bucket
    (`aten::mul` with a bucket view as output); the step's all-reduce must wait for all four."""
    t = read_pytorch_et(DDP)
    for rank in t.ranks:
        with gzip.open(DDP / f"rank{rank}_et.json.gz", "rt") as f:
            nodes = sorted(json.load(f)["nodes"], key=lambda n: n["id"])
        calls = [n for n in nodes if n["name"] == "c10d::allreduce_"]
        bucket = calls[0]["inputs"]["values"][0][0][1]  # the storage id of the call's tensor
        writers = [
            n["id"]
            for n in nodes
            if n["name"] == "aten::mul"
            and any(isinstance(v, list) and v[1:2] == [bucket] for v in n["outputs"]["values"])
        ]
        assert len(writers) == 8  # 4 slices, 2 steps
        colls = sorted(
            r["id"] for r in t.ops.to_pylist() if r["rank"] == rank and r["comm_type"] == "ALL_REDUCE"
        )
        paths = _data_paths(t, rank)
        for step, coll in enumerate(colls):
            mine = [w for w in writers if (w < coll) and (step == 0 or w > colls[step - 1])]
            assert len(mine) == 4
            assert all(coll in paths.get(w, set()) for w in mine), (rank, step)
        # one step's all-reduce does not feed the next one's directly: the bucket was written in between
        assert not [
            d
            for d in t.deps.to_pylist()
            if d["rank"] == rank and d["kind"] == "data" and (d["src"], d["dst"]) == (colls[0], colls[1])
        ]


def test_a_reused_tensor_id_on_another_storage_links_nothing() -> None:
    first = [5, 1, 0, 4, 4, "cpu"]
    again = [5, 2, 0, 4, 4, "cpu"]  # the same tensor id, a new storage
    src, dst, *_ = storage_flow(
        ["aten::ones", "aten::zeros", "aten::sum"],
        np.full(3, -1),
        [[], [], [again]],
        [[first], [again], []],
        [False] * 3,
    )
    assert list(zip(src.tolist(), dst.tolist(), strict=True)) == [(1, 2)]


def test_a_child_reads_what_was_there_before_its_parent_returned() -> None:
    """`_c10d_functional::wait_tensor` returns the tensor its nested `gloo:all_reduce` filled: the
    record reads the all-reduce's input as the call left it, and consumers read the record's; the
    wait itself, which returns its input, reads and writes nothing (a gloo worker's copy back
    that runs during it, on another thread, is no reader of a write by the wait)."""
    buf = [9, 3, 0, 32, 4, "cpu"]
    names = ["c10d::allreduce_", "_c10d_functional::wait_tensor", "gloo:all_reduce", "aten::mse_loss"]
    parents = np.asarray([-1, -1, 1, -1])
    src, dst, *_ = storage_flow(
        names, parents, [[buf], [buf], [buf], [buf]], [[buf], [buf], [], []], [False, False, True, False]
    )
    assert sorted(zip(src.tolist(), dst.tolist(), strict=True)) == [(0, 2), (2, 3)]


def test_every_dlrm_collective_has_data_in_and_its_readers_out() -> None:
    """With tensor ids, none of the 64 NCCL collectives had a data edge (bucket views). Now each
    depends on what wrote its input, and each one whose buffers a later op reads feeds it (the
    last two all-to-alls of a rank send the next batch's features: nothing in this step reads
    them, which a scan of the ET's later tensor arguments confirms)."""
    from etstore.formats._torch_et_nodes import parse_nodes, tensors

    files = sorted((ROOT / "examples" / "dlrm_8r").glob("dlrm_eg_*.json.gz"))
    t = read_pytorch_et(files)
    ins: set[tuple[int, int]] = set()
    outs: set[tuple[int, int]] = set()
    for d in t.deps.to_pylist():
        if d["kind"] == "data":
            ins.add((d["rank"], d["dst"]))
            outs.add((d["rank"], d["src"]))
    colls = [(r["rank"], r["id"]) for r in t.ops.to_pylist() if r["type"] == "COMM_COLL_NODE"]
    assert len(colls) == 64 and all(c in ins for c in colls)
    unread = [c for c in colls if c not in outs]
    assert len(unread) == 16
    for rank, op in unread:
        with gzip.open(files[rank], "rt") as f:
            et = parse_nodes(json.load(f), files[rank])
        row = int(np.flatnonzero(et.ids == op)[0])
        storages = {t[1] for t in tensors(*et.inputs[row])}
        later = [
            et.names[r]
            for r in range(row + 1, len(et.names))
            if et.names[r] not in _torch_flow.NO_READ_OPS
            and storages & {t[1] for t in tensors(*et.inputs[r])}
            and not _inside(et.parent_row, r, row)
        ]
        assert later == [], (rank, op, later[:3])


def _inside(parent_row: np.ndarray, r: int, row: int) -> bool:
    """Whether ``r`` is nested in ``row`` (one of its own records)."""
    p = int(parent_row[r])
    while p >= 0:
        if p == row:
            return True
        p = int(parent_row[p])
    return False
