"""A synthesized algorithm's trace built rank range by rank range equals the trace built whole."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest

from etstore.algorithms._synth_trace import build_parts, build_trace
from etstore.algorithms.synth import COLLECTIVES, SynthResult, synthesize
from etstore.errors import OptionError
from etstore.model import Trace

SPECS = ["mesh2d:3x3", "mesh2d:4x2", "torus2d:3x4,bw=50/100", "ring:5"]


def _whole(r: SynthResult) -> Trace:
    n, k = r.num_npus, r.chunks_per_npu
    total = k if r.collective in ("broadcast", "reduce") else n * k
    return build_trace(r.network, r.schedule, r.collective, n, k, total)


def _rank_range(part: Trace) -> tuple[int, int]:
    ranks = part.ops["rank"].to_numpy()
    return int(ranks[0]), int(ranks[-1]) + 1


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("coll", COLLECTIVES)
@pytest.mark.parametrize("spec", SPECS)
def test_parts_concatenate_to_the_whole_trace(spec: str, coll: str, k: int) -> None:
    r = synthesize(spec, coll=coll, chunks_per_npu=k, trials=2, seed=1, root=1)
    whole = _whole(r)
    n = r.num_npus
    per_rank = np.bincount(whole.ops["rank"].to_numpy(), minlength=n)
    assert per_rank.min() > 0
    for max_ops in (1, int(per_rank.max()) + 1, whole.num_ops // 3, 1 << 40):
        parts = list(r.trace_parts(max_ops))
        ranges = [_rank_range(p) for p in parts]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(b0 == a1 for (_, b0), (a1, _) in pairwise(ranges))  # consecutive, disjoint
        for p, (a, b) in zip(parts, ranges, strict=True):
            assert p.num_ops == per_rank[a:b].sum()  # whole ranks only
            assert b - a == 1 or p.num_ops <= max_ops
            if b < n:  # a part stops only where the next rank would not fit
                assert p.num_ops + per_rank[b] > max_ops
            deps_ranks = p.deps["rank"].to_numpy()
            assert ((deps_ranks >= a) & (deps_ranks < b)).all()
            same = (r.trace.name, "algorithm", "synth", r.trace.params)
            assert (p.name, p.kind, p.source, p.params) == same
        ops = pa.concat_tables([p.ops for p in parts]).combine_chunks()
        deps = pa.concat_tables([p.deps for p in parts]).combine_chunks()
        assert ops.equals(whole.ops.combine_chunks())
        assert deps.equals(whole.deps.combine_chunks())  # deps rank by rank: the whole is its parts
    assert len(list(r.trace_parts(1))) == n
    assert r.trace.ops.equals(whole.ops) and r.trace.deps.equals(whole.deps)


def test_parts_of_a_bigger_mesh_with_a_skewed_split() -> None:
    # 4x4 All-to-All has distinct per-rank op counts, so a mid max_ops cuts unevenly
    r = synthesize("mesh2d:4x4", coll="alltoall", chunks_per_npu=2, trials=1)
    whole = _whole(r)
    n, k = r.num_npus, r.chunks_per_npu
    total = n * k
    for max_ops in (97, 500, 1234):
        parts = list(build_parts(r.network, r.schedule, "alltoall", n, k, total, max_ops=max_ops))
        assert len(parts) > 1
        assert pa.concat_tables([p.ops for p in parts]).combine_chunks().equals(whole.ops.combine_chunks())
        deps = pa.concat_tables([p.deps for p in parts]).combine_chunks()
        assert deps.equals(whole.deps.combine_chunks())


def test_parts_are_built_lazily_and_leave_the_trace_unbuilt() -> None:
    r = synthesize("mesh2d:3x3", coll="allgather")
    parts = r.trace_parts(10)
    assert "trace" not in r.__dict__
    first = next(parts)
    assert _rank_range(first) == (0, 1)  # 8 ops per rank: one rank per part
    assert "trace" not in r.__dict__


def test_max_ops_must_be_positive() -> None:
    r = synthesize("ring:3", coll="allgather")
    with pytest.raises(OptionError, match="max_ops must be >= 1, got 0"):
        r.trace_parts(0)
