"""Critical path on hand-checked DAGs and cross-checked with networkx on the real trace."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from etstore.dag import break_cycles, trace_edges
from etstore.errors import EtstoreError, OptionError, UnknownTraceError
from etstore.ingest import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.query import PATH_COLUMNS, critical_path, path_table


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
