"""Megatron-style tensor parallel (``tests/data/torch_tp_layers_2r``): two column-/row-wise pairs,
so a row-parallel layer's all-reduce feeds, through a ReLU, the next pair's column-parallel GEMM.

Each rank and step: the all-reduce of the first pair's output (1024 B) is read by the ReLU
(``aten::clamp_min``), whose output the second pair's local ``aten::addmm`` reads; the second
pair's (128 B) by the loss; backward, the all-reduce of the second pair's input gradient
(1024 B) by ``aten::threshold_backward``, whose output the first pair's row-wise ``aten::mm``s
(input and weight gradients) read.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from etstore.model import Trace
from etstore.testing import recorded_trace

DATA = Path(__file__).parent.parent / "data"
NAME = "torch_tp_layers_2r"


@pytest.fixture(scope="module")
def trace() -> Trace:
    return recorded_trace(DATA / NAME)


@cache
def _et(rank: int) -> dict[int, dict[str, Any]]:
    with gzip.open(DATA / NAME / f"rank{rank}_et.json.gz", "rt") as f:
        return {n["id"]: n for n in json.load(f)["nodes"]}


def _colls(trace: Trace, rank: int) -> list[dict[str, Any]]:
    """The collectives of ``rank``, in ET order."""
    ops = trace.ops.filter(pc.and_(pc.equal(trace.ops["rank"], rank), pc.is_valid(trace.ops["comm_type"])))
    return sorted(ops.to_pylist(), key=lambda r: r["id"])


def _readers(trace: Trace, rank: int) -> dict[int, set[int]]:
    """Each op's readers on ``rank``, through the stored data edges."""
    d = trace.deps.filter(pc.and_(pc.equal(trace.deps["rank"], rank), pc.equal(trace.deps["kind"], "data")))
    out: dict[int, set[int]] = {}
    for s, x in zip(d["src"].to_pylist(), d["dst"].to_pylist(), strict=True):
        out.setdefault(s, set()).add(x)
    return out


def _chains(
    et: dict[int, dict[str, Any]], readers: dict[int, set[int]], coll: int, via: str, gemm: str
) -> list[list[list[int]]]:
    """The input shapes of each ``gemm`` reading a ``via`` that reads collective ``coll``."""
    return [
        et[g]["inputs"]["shapes"]
        for v in sorted(readers.get(coll, ()))
        if et[v]["name"] == via
        for g in sorted(readers.get(v, ()))
        if et[g]["name"] == gemm
    ]


def test_three_all_reduces_per_step_of_the_calls_buffers(trace: Trace) -> None:
    assert trace.ranks == [0, 1]
    assert "warnings" not in trace.params["recognised"]
    for rank in trace.ranks:
        got = [(r["name"], r["comm_type"], r["comm_size"]) for r in _colls(trace, rank)]
        assert got == [("gloo:all_reduce", "ALL_REDUCE", n) for n in (1024, 128, 1024)] * 2
        # the buffer of each `c10d::allreduce_` call: [id, storage, offset, numel, itemsize, device]
        calls = [n for _, n in sorted(_et(rank).items()) if n["name"] == "c10d::allreduce_"]
        assert [c["inputs"]["values"][0][0][3] * 4 for c in calls] == [s for _, _, s in got]


def test_a_row_parallel_all_reduce_feeds_the_next_column_parallel_gemm_through_the_relu(trace: Trace) -> None:
    for rank in trace.ranks:
        colls = [r["id"] for r in _colls(trace, rank)]
        et, readers = _et(rank), _readers(trace, rank)
        for fwd, loss, bwd in (colls[:3], colls[3:]):
            # forward: relu(all-reduced [8, 32]) @ the column shard [32, 16] (+ its 16 biases)
            assert _chains(et, readers, fwd, "aten::clamp_min", "aten::addmm") == [
                [[16], [8, 32], [32, 16], [], []]
            ]
            assert "aten::mse_loss" in {et[x]["name"] for x in readers[loss]}
            # backward: the all-reduced input gradient through ReLU's backward into the row-wise
            # layer's input gradient ([8, 32] @ its [32, 16] shard) and weight gradient
            assert _chains(et, readers, bwd, "aten::threshold_backward", "aten::mm") == [
                [[8, 32], [32, 16]],
                [[32, 8], [8, 16]],
            ]
