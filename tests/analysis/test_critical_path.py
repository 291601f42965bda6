"""Critical path on hand-checked DAGs, cross-checked with networkx on the real trace and on
random DAGs, and identical to a one-op-at-a-time reference on a deep expanded trace."""

from __future__ import annotations

from itertools import groupby, pairwise
from pathlib import Path

import networkx as nx
import numpy as np
import pyarrow.compute as pc
import pytest

from etstore.algorithms.expand import expand
from etstore.analysis import PATH_COLUMNS, critical_path, path_table
from etstore.dag import (
    break_cycles,
    generations,
    heaviest_paths,
    longest_path,
    match_messages,
    trace_edges,
)
from etstore.errors import EtstoreError, OptionError, UnknownTraceError
from etstore.formats import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.workloads import transformer


def _diamond() -> Trace:
    # rank 0: a(5) → b(1) → d(2); a → c(7) → d ; rank 1: x(3) receives from a send on rank 0
    ops = ops_table(
        {
            "rank": [0, 0, 0, 0, 0, 1, 1],
            "id": [10, 11, 12, 13, 14, 0, 1],
            "name": ["a", "b", "c", "d", "send", "recv", "x"],
            "type": ["COMP_NODE"] * 4 + ["COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE"],
            "duration_micros": [5, 1, 7, 2, 0, 0, 30],
            "comm_dst": [None, None, None, None, 1, None, None],
            "comm_src": [None, None, None, None, None, 0, None],
            "comm_tag": [None, None, None, None, 9, 9, None],
        }
    )
    deps = deps_table([0, 0, 0, 0, 0, 1], [10, 10, 11, 12, 10, 0], [11, 12, 13, 13, 14, 1])
    return Trace(ops=ops, deps=deps, name="diamond")


def test_per_rank_path_takes_the_heavier_branch() -> None:
    cp = critical_path(_diamond(), rank=0)
    assert cp.length_micros == 5 + 7 + 2
    assert cp.path["name"].to_pylist() == ["a", "c", "d"]
    assert cp.path["start_micros"].to_pylist() == [0, 5, 12]


def test_cross_rank_path_follows_the_message() -> None:
    cp = critical_path(_diamond())
    assert cp.length_micros == 5 + 0 + 0 + 30
    assert cp.path["name"].to_pylist() == ["a", "send", "recv", "x"]
    assert cp.path["via"].to_pylist() == ["start", "dep", "msg", "dep"]
    assert cp.per_rank.to_pylist() == [
        {"rank": 0, "length_micros": 14.0, "ops": 3},
        {"rank": 1, "length_micros": 30.0, "ops": 2},
    ]


def test_path_table_columns_and_empty_path() -> None:
    ops = _diamond().ops
    path = path_table(ops, np.array([2, 0]), ["start", "dep"], end_us=np.array([7.0, 12.0]))
    assert path.column_names == [*PATH_COLUMNS, "end_us", "via"]
    assert path["name"].to_pylist() == ["c", "a"] and path["step"].to_pylist() == [0, 1]
    empty = path_table(ops, np.zeros(0, dtype=np.int64), [])
    assert empty.num_rows == 0 and empty.schema.field("id").type == ops.schema.field("id").type
    with pytest.raises(OptionError, match="a path of 2 steps needs 2 via entries, not 1"):
        path_table(ops, np.array([2, 0]), ["start"])


def test_unknown_rank() -> None:
    with pytest.raises(UnknownTraceError, match="no rank 7"):
        critical_path(_diamond(), rank=7)


def test_cycle_raise_mode_names_ops() -> None:
    t = _diamond()
    t = t.replace(deps=deps_table([0, 0, 0], [10, 11, 13], [11, 13, 10]))
    with pytest.raises(EtstoreError, match=r"dependency cycle \(rank 0 id 1"):
        critical_path(t, rank=0, on_cycle="raise")
    assert critical_path(t, rank=0).dropped_edges == 1


def test_matches_networkx_on_the_pytorch_trace(feeder: Path) -> None:
    trace = read_et(feeder)
    cp = critical_path(trace)
    src, dst = trace_edges(trace)
    keep = break_cycles(trace.num_ops, src, dst)
    w = trace.ops["duration_micros"].to_numpy().astype(float)
    g = nx.DiGraph()
    g.add_nodes_from(range(trace.num_ops))
    for s, d in zip(src[keep].tolist(), dst[keep].tolist(), strict=True):
        g.add_edge(s, d, weight=w[d])
    # node weights as edge weights into the node, plus the first node's own weight
    best = max(
        w[p[0]] + nx.path_weight(g, p, "weight") if len(p) > 1 else w[p[0]]
        for p in [nx.dag_longest_path(g, weight="weight", default_weight=0)]
    )
    lengths = dict.fromkeys(range(trace.num_ops), 0.0)
    for v in nx.topological_sort(g):
        lengths[v] = w[v] + max((lengths[u] for u in g.predecessors(v)), default=0.0)
    assert cp.length_micros == max(lengths.values())
    assert np.isclose(cp.length_micros, best)  # networkx's own longest path agrees
    assert cp.dropped_edges == int((~keep).sum()) > 0
    assert cp.path["duration_micros"].to_numpy().sum() == cp.length_micros


# ---------------------------------------------------------------- against references, progress


def _reference(
    n: int, src: list[int], dst: list[int], w: list[float]
) -> tuple[float, list[int], list[float]]:
    """The documented rule one op at a time in a topological order: a node's predecessor is the
    first in-edge (in the order given) whose source ends last; the path ends at the first row that
    ends last. Returns (length, path rows, finish per node)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src, dst, strict=True))
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(src, dst, strict=True):
        preds[d].append(s)
    finish, pred = [0.0] * n, [-1] * n
    for v in nx.topological_sort(g):
        best = -np.inf
        for u in preds[v]:
            if finish[u] > best:
                best, pred[v] = finish[u], u
        finish[v] = w[v] + (best if preds[v] else 0.0)
    if n == 0:
        return 0.0, [], []
    last = max(range(n), key=lambda v: (finish[v], -v))
    path = [last]
    while pred[path[-1]] >= 0:
        path.append(pred[path[-1]])
    return finish[last], path[::-1], finish


def _random_trace(rng: np.random.Generator, ranks: int, per_rank: int) -> Trace:
    """Random acyclic ranks (dependencies forward in a shuffled id order) with messages between
    them, each to a higher rank so that no cycle closes across ranks; durations are distinct
    powers of two, so every path weighs its own."""
    cols: dict[str, list[object]] = {
        k: [] for k in ("rank", "id", "name", "type", "duration_micros", "comm_src", "comm_dst", "comm_tag")
    }
    d_rank, d_src, d_dst = [], [], []
    exponent = rng.permutation(ranks * per_rank)
    for r in range(ranks):
        ids = rng.permutation(per_rank) * 2 + 1  # issue order differs from id (row) order
        for i in range(per_rank):
            kind = str(rng.choice(["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"], p=[0.6, 0.2, 0.2]))
            above, below = ranks - 1 - r, r
            if (kind == "COMM_SEND_NODE" and not above) or (kind == "COMM_RECV_NODE" and not below):
                kind = "COMP_NODE"
            cols["rank"].append(r)
            cols["id"].append(int(ids[i]))
            cols["name"].append(f"r{r}.{i}")
            cols["type"].append(kind)
            cols["comm_src"].append(int(rng.integers(0, r)) if kind == "COMM_RECV_NODE" else None)
            cols["comm_dst"].append(int(rng.integers(r + 1, ranks)) if kind == "COMM_SEND_NODE" else None)
            cols["comm_tag"].append(0 if kind != "COMP_NODE" else None)
            cols["duration_micros"].append(2 ** int(exponent[r * per_rank + i]))
        for _ in range(int(rng.integers(0, 2 * per_rank))):
            a, b = sorted(rng.choice(per_rank, 2, replace=False).tolist())
            d_rank.append(r)
            d_src.append(int(ids[a]))
            d_dst.append(int(ids[b]))
    return Trace(ops=ops_table(cols), deps=deps_table(d_rank, d_src, d_dst), name="random")


def _edges(trace: Trace) -> tuple[list[int], list[int]]:
    """Dependencies in table order, then matched messages: the edges critical_path weighs."""
    src, dst = trace_edges(trace)
    m = match_messages(trace)
    return np.concatenate([src, m.send_row]).tolist(), np.concatenate([dst, m.recv_row]).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_unique_longest_path_is_networkx_dag_longest_path(seed: int) -> None:
    # one path is heaviest; networkx weighs edges, so an edge weighs what its target op lasts
    # and a virtual source (-1) reaches every op
    rng = np.random.default_rng(seed)
    trace = _random_trace(rng, int(rng.integers(1, 4)), int(rng.integers(2, 14)))
    w = trace.ops["duration_micros"].to_numpy().astype(float)
    g = nx.DiGraph()
    g.add_weighted_edges_from((-1, v, w[v]) for v in range(trace.num_ops))
    g.add_weighted_edges_from((s, d, w[d]) for s, d in zip(*_edges(trace), strict=True))
    expected = nx.dag_longest_path(g, weight="weight")[1:]
    cp = critical_path(trace)
    assert cp.length_micros == sum(w[v] for v in expected)
    rows = list(zip(cp.path["rank"].to_pylist(), cp.path["id"].to_pylist(), strict=True))
    ops = trace.ops
    assert rows == [(ops["rank"][v].as_py(), ops["id"][v].as_py()) for v in expected]


def test_identical_to_the_reference_on_a_moderately_sized_expanded_trace() -> None:
    # 11,560 ops, 557 generations deep, durations with many ties: the path's ops, its `via`
    # and each rank's longest path are what the one-op-at-a-time reference finds
    trace = expand(transformer(ranks=8, tp=2, layers=60, seed=3), "ring").trace
    src, dst = _edges(trace)
    w = trace.ops["duration_micros"].to_numpy().astype(float).tolist()
    length, rows, _ = _reference(trace.num_ops, src, dst, w)
    cp = critical_path(trace)
    ops = trace.ops
    assert cp.length_micros == length and cp.path.num_rows == len(rows) > 500
    assert cp.path["id"].to_pylist() == [ops["id"][v].as_py() for v in rows]
    assert cp.path["rank"].to_pylist() == [ops["rank"][v].as_py() for v in rows]
    sent = set(zip(*(match_messages(trace)[:2]), strict=True))
    assert cp.path["via"].to_pylist()[1:] == ["msg" if (a, b) in sent else "dep" for a, b in pairwise(rows)]
    assert "msg" in cp.path["via"].to_pylist()
    dsrc, ddst = trace_edges(trace)
    for r, (a, b) in trace.rank_slices().items():
        inside = (dsrc >= a) & (dsrc < b)
        local = _reference(b - a, (dsrc[inside] - a).tolist(), (ddst[inside] - a).tolist(), w[a:b])
        row = cp.per_rank.filter(pc.equal(cp.per_rank["rank"], r)).to_pylist()[0]
        assert (row["length_micros"], row["ops"]) == (local[0], len(local[1]))


@pytest.mark.parametrize("seed", range(60))
def test_dag_passes_match_the_reference_with_ties_and_cycles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    src, dst = rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n)
    w = rng.integers(0, 3, n).astype(float)
    gen = generations(n, src, dst)
    g = nx.DiGraph(list(zip(src.tolist(), dst.tolist(), strict=True)))
    g.add_nodes_from(range(n))
    on_cycle = {v for c in nx.strongly_connected_components(g) if len(c) > 1 for v in c}
    on_cycle |= set(nx.nodes_with_selfloops(g))
    behind = on_cycle.union(*(nx.descendants(g, v) for v in on_cycle))
    assert {int(v) for v in np.flatnonzero(gen < 0)} == behind  # on a cycle or waiting behind one
    keep = break_cycles(n, src, dst)
    s, d = src[keep], dst[keep]
    length, rows, finish = longest_path(n, s, d, w)
    ref = _reference(n, s.tolist(), d.tolist(), w.tolist())
    assert (length, rows.tolist(), finish.tolist()) == (ref[0], ref[1], ref[2])


def test_heaviest_paths_on_a_given_layering_and_its_refusal() -> None:
    src, dst = np.array([0, 1, 0]), np.array([1, 2, 2])
    w = np.array([1.0, 2.0, 4.0])
    # a deeper layering than the graph needs serves as well; nodes with gen < 0 are left out
    finish, pred = heaviest_paths(np.array([0, 3, 7]), src, dst, w)
    assert finish.tolist() == [1.0, 3.0, 7.0] and pred.tolist() == [-1, 0, 1]
    finish, pred = heaviest_paths(np.array([0, -1, 2]), src, dst, w)
    assert finish.tolist() == [1.0, -np.inf, 5.0] and pred.tolist() == [-1, -1, 0]
    with pytest.raises(OptionError, match="does not go to a later generation"):
        heaviest_paths(np.array([0, 1, 1]), src, dst, w)


def _phases(steps: list[tuple[str, int, int]]) -> list[str]:
    """Each run of one phase: a fixed total, done rising to it; the phases in the order they ran."""
    order = []
    for phase, run in groupby(steps, key=lambda s: s[0]):
        got = list(run)
        assert len({t for _, _, t in got}) == 1, got
        dones = [d for _, d, _ in got]
        assert dones == sorted(dones) and dones[-1] == got[0][2], got
        order.append(phase)
    return order


def test_progress_names_each_phase_and_ends_each_at_its_total() -> None:
    trace = expand(transformer(ranks=4, tp=2, layers=20), "ring").trace
    steps: list[tuple[str, int, int]] = []
    cp = critical_path(trace, progress=lambda *s: steps.append(s))
    assert _phases(steps) == ["order", "path", "rank paths"]
    assert {t for _, _, t in steps} == {trace.num_ops}
    assert 10 < len(steps) < 400  # every 1% or so, not once per generation
    assert cp == critical_path(trace)  # reporting changes nothing
    steps.clear()
    critical_path(_cyclic(), progress=lambda *s: steps.append(s))
    assert _phases(steps) == ["order", "order without cycles", "path", "rank paths"]


def _cyclic() -> Trace:
    t = _diamond()
    return t.replace(deps=deps_table([0, 0, 0, 0], [10, 11, 13, 10], [11, 13, 10, 14]))
