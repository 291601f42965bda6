"""The MSCCL-IR layer (:mod:`etstore.ir`) on hand-built step tables: validation, cycles, node semantics."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from etstore.algorithms import generate
from etstore.errors import TraceFormatError
from etstore.ir import STEP_TYPES, TYPE_CODE, StepTable, build_trace, node_semantics

HEADER = {"ngpus": 2, "nchunksperloop": 1, "coll": "allreduce"}


def steps(**over: Any) -> StepTable:
    """gpu 0: tb 0 sends to gpu 1, tb 1 receives from it; gpu 1 has no steps (``over`` replaces columns)."""
    cols: dict[str, Any] = {
        "rank": [0, 0],
        "tb": [0, 1],
        "s": [0, 0],
        "type": [TYPE_CODE["s"], TYPE_CODE["r"]],
        "srcbuf": [0, 0],
        "srcoff": [0, 0],
        "dstbuf": [0, 0],
        "dstoff": [0, 0],
        "cnt": [1, 1],
        "depid": [-1, -1],
        "deps": [-1, -1],
        "tb_rank": [0, 0],
        "tb_id": [0, 1],
        "tb_send": [1, -1],
        "tb_recv": [-1, 1],
        "tb_chan": [0, 0],
        "gpu_rank": [0, 1],
        "i_chunks": [1, 1],
        "o_chunks": [1, 1],
        "s_chunks": [0, 0],
    }
    cols.update(over)
    return StepTable.from_lists(**cols)


def test_two_steps_become_two_nodes_without_deps() -> None:
    t = build_trace(steps(), HEADER, name="x")
    assert t.ops["type"].to_pylist() == ["COMM_SEND_NODE", "COMM_RECV_NODE"]
    assert t.ops["name"].to_pylist() == ["send_tb0_s0", "recv_tb1_s0"]
    assert t.num_deps == 0 and t.params["collective"] == "allreduce"


def test_a_cross_threadblock_cycle_is_named_step_by_step() -> None:
    with pytest.raises(
        TraceFormatError,
        match=r"^x: dependency cycle on gpu 0: tb \d step 0 → tb \d step 0 → tb \d step 0 \(depid/deps",
    ):
        build_trace(steps(depid=[1, 0], deps=[0, 0]), HEADER, name="x")


def test_a_step_in_an_undeclared_threadblock_is_refused() -> None:
    with pytest.raises(TraceFormatError, match="gpu 0 tb 1: the threadblock is not declared"):
        build_trace(steps(tb_rank=[0], tb_id=[0], tb_send=[1], tb_recv=[-1], tb_chan=[0]), HEADER, name="x")


def test_a_buffer_range_outside_the_gpu_is_refused_with_its_location() -> None:
    with pytest.raises(TraceFormatError, match=r"^x\.xml:7: gpu 0 tb 0 step 0: srcbuf i\[0:2\] is outside"):
        build_trace(steps(cnt=[2, 1]), HEADER, name="x", locate=lambda kind, i: "x.xml:7")


def test_node_semantics_recovers_every_step_of_a_generated_ring() -> None:
    ring = generate("ring", coll="allreduce", ranks=4, chunks=2)
    sem = node_semantics(ring)
    assert sem.issues == [] and bool(np.all(sem.stype >= 0)) and bool(sem.explicit.all())
    _, first = np.unique(sem.group, return_index=True)
    # per rank and ring (4 × 2): send, N-2 receive-reduce-sends, the final reduce, N-2 forwards, a receive
    assert Counter(STEP_TYPES[t] for t in sem.stype[first].tolist()) == {
        "s": 8,
        "rrs": 16,
        "rrcs": 8,
        "rcs": 16,
        "r": 8,
    }
