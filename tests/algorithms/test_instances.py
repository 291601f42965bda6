"""One instance finder and one algorithm cut, shared by ``expand`` and the simulator.

The k-th ``COMM_COLL_NODE`` of a group on each member rank, counted in node-id order
(ASTRA-sim's issue order, not the file's), is instance k on both paths; the simulator's
templates are the parts ``expand`` stamps, sized by the same rule.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etstore.algorithms import generate
from etstore.algorithms._instances import CARRIERS, EVERY, GIVEN, find_collectives, given_groups
from etstore.algorithms._parts import buffer_bytes, chunk_bytes, part_bytes, prepare
from etstore.algorithms.expand import expand
from etstore.errors import ConfigError, SimulationError, TemplateError
from etstore.model import Trace, ops_table
from etstore.sim import _templates as tpl
from etstore.sim import simulate
from etstore.sim._algorithms import group_members, sim_collectives
from etstore.topology import Topology

# rank 1 lists its collectives in reverse id order: file order and issue order differ there
_SIZES = [1 << 20, 1 << 16, 1 << 18]


def _shuffled(**params: object) -> Trace:
    ops = ops_table(
        {
            "rank": [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],
            "id": [1, 2, 3, 3, 2, 1, 1, 2, 3, 1, 2, 3],
            "type": ["COMM_COLL_NODE"] * 12,
            "comm_type": ["ALL_REDUCE", "ALL_GATHER", "ALL_REDUCE"] * 4,
            "comm_size": _SIZES + _SIZES[::-1] + _SIZES * 2,
            "pg_name": ["a", "b", "a"] * 4,
        }
    )
    return Trace(ops, name="shuffled", params=params)


def _colls(rank: list[int], ids: list[int], **cols: list[object]) -> Trace:
    n = len(rank)
    base: dict[str, object] = {
        "rank": rank,
        "id": ids,
        "type": ["COMM_COLL_NODE"] * n,
        "comm_type": ["ALL_REDUCE"] * n,
        "comm_size": [64] * n,
    }
    base.update(cols)
    return Trace(ops_table(base), name="t")


def test_instances_count_a_rank_s_collectives_in_node_id_order() -> None:
    w = _shuffled()
    colls = find_collectives(w, None)
    # instance 0 is every rank's lowest-id "a" collective, whatever row it sits in
    assert colls.ninst == 3 and colls.inst_seq.tolist() == [0, 0, 1]
    assert [str(t) for t in colls.inst_type] == ["ALL_REDUCE", "ALL_GATHER", "ALL_REDUCE"]
    assert colls.size[colls.first_of].tolist() == _SIZES
    nodes, starts = colls.by_instance()
    first = nodes[starts[0] : starts[1]]
    assert colls.rank[first].tolist() == [0, 1, 2, 3] and colls.ids[first].tolist() == [1, 1, 1, 1]
    assert (colls.size[first] == 1 << 20).all()
    # the simulator's instances are the finder's, members in the order the groups give them
    insts = sim_collectives(_shuffled(comm_groups={"a": [2, 0, 3, 1], "b": [3, 2, 1, 0]}), None)
    assert [(i.pg, i.seq, i.type, i.size, i.group) for i in insts] == [
        ("a", 0, "ALL_REDUCE", 1 << 20, (2, 0, 3, 1)),
        ("b", 0, "ALL_GATHER", 1 << 16, (3, 2, 1, 0)),
        ("a", 1, "ALL_REDUCE", 1 << 18, (2, 0, 3, 1)),
    ]
    assert insts[0].rows == [0, 5, 6, 9]  # one row per member, ascending rank


def test_expand_pairs_the_collectives_the_simulator_pairs() -> None:
    groups = {"a": [2, 0, 3, 1], "b": [3, 2, 1, 0]}
    w = _shuffled(comm_groups=groups)
    x = expand(w, "ring")
    summary = x.collectives.to_pylist()
    assert [(r["coll_seq"], r["pg_name"], r["comm_size"]) for r in summary] == [
        (0, "a", 1 << 20),
        (0, "b", 1 << 16),
        (1, "a", 1 << 18),
    ]
    # rank 1's blocks lie in its file's order; they still take the comm slot in node-id order,
    # as every rank's do (in file order, rank 1 would wait in #1 while the others wait in #0)
    inside = simulate(w, Topology.ring(4), algorithms={"ALL_REDUCE": "ring", "ALL_GATHER": "ring"})
    assert simulate(x.trace, Topology.ring(4)).total_ns == pytest.approx(inside.total_ns, rel=1e-3)


def test_group_members_say_how_they_were_found() -> None:
    w = _colls([0, 1, 2, 3], [1, 1, 1, 1], pg_name=["g", "g", "", "0"])
    w = Trace(w.ops, name="t", params={"comm_groups": {"g": [1, 0]}})
    colls = find_collectives(w, given_groups(w, None))
    rules = dict(zip(colls.pg_names, colls.rule, strict=True))
    assert rules == {"g": GIVEN, "": EVERY, "0": EVERY}
    assert group_members(w, None) == {"g": (1, 0), "": (0, 1, 2, 3), "0": (0, 1, 2, 3)}
    assert find_collectives(w, None).rule[colls.pg_names.index("g")] == CARRIERS
    assert given_groups(w, {"x": [0]}) == {"x": [0]}  # given groups win over the trace's own


@pytest.mark.parametrize(
    ("trace", "groups", "error", "message"),
    [
        (
            _colls([0, 1], [1, 4], comm_type=["ALL_REDUCE", None]),
            None,
            SimulationError,
            r"trace 't': rank 1 node 4 is a COMM_COLL_NODE without comm_type",
        ),
        (
            _colls([0, 1], [1, 4], comm_type=["ALL_REDUCE", "ALL_GATHER"]),
            None,
            SimulationError,
            "collective #0 of group all is ALL_REDUCE of 64 bytes on one rank but rank 1 node 4 is "
            "ALL_GATHER",
        ),
        (
            _colls([0, 1], [1, 4], pg_name=["g", "g"]),
            {"g": [0, 2]},
            SimulationError,
            r"trace 't': rank 1 node 4 uses group 'g' whose members are \[0, 2\]",
        ),
        (
            _colls([0, 1], [1, 4], pg_name=["g", "h"]),
            {"g": [0]},
            ConfigError,
            r"rank 1 node 4: communicator group h not found in the communicator groups given \(g\)",
        ),
        (
            _colls([0, 1], [1, 4], pg_name=["g", "g"]),
            {"g": [0, 1, 2]},
            SimulationError,
            r"trace 't': collective #0 \(ALL_REDUCE\) of group g has no matching COMM_COLL_NODE on "
            r"rank\(s\) \[2\]",
        ),
    ],
)
def test_the_simulator_names_trace_rank_and_node(
    trace: Trace, groups: dict[str, list[int]] | None, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        simulate(trace, Topology.ring(4), groups=groups)


def test_a_recording_of_some_ranks_cannot_run_an_all_ranks_collective() -> None:
    w = _colls([0, 1], [1, 1])
    w = Trace(w.ops, name="part", params={"world_size": 4})
    with pytest.raises(
        SimulationError, match=r"holds ranks \[0, 1\] of a world of 4: .* need ranks \[2, 3\]"
    ):
        simulate(w, Topology.ring(4))


def test_the_first_bad_node_in_issue_order_is_named() -> None:
    # rank 0 lists id 9 (128 bytes) before id 2: id 2 is its collective #0, id 9 its #1
    w = _colls([0, 0, 1, 1], [9, 2, 1, 2], comm_size=[128, 64, 64, 64])
    with pytest.raises(
        SimulationError, match="#1 of group all is ALL_REDUCE of 128 bytes on one rank but rank 1 node 2"
    ):
        simulate(w, Topology.ring(2))


def test_templates_are_the_parts_expand_stamps() -> None:
    alg = generate("ring", coll="allgather", ranks=4, chunks=3)
    t = tpl.trace_template(
        alg,
        "ALL_GATHER",
        1000,
        duration_unit_ns=1000.0,
        local_mem_bw_gb_per_s=1600.0,
        reduction_mem_accesses=3,
        copy_mem_accesses=2,
        integer_ns=True,
    )
    parts = prepare(alg, "ring")
    assert t.starts.tolist() == parts.op_start.tolist()
    assert t.peer.tolist() == parts.peer.tolist() and t.tag.tolist() == parts.tag.tolist()
    assert buffer_bytes("ALL_GATHER", 1000, 4) == 4000
    assert t.size.tolist() == part_bytes(parts, 4000).tolist()
    sends = t.kind == tpl.K_SEND
    assert int(t.size[sends].sum()) % 4000 == 0  # every rank's chunks add up to whole buffers
    assert chunk_bytes(10, np.array([1, 1, 1]), np.array([3, 3, 3]), np.array([0, 1, 2])).tolist() == [
        3,
        3,
        4,
    ]
    arr = buffer_bytes(
        np.array(["ALL_GATHER", "ALL_REDUCE"], dtype=object), np.array([5, 5]), np.array([4, 4])
    )
    assert arr.tolist() == [20, 5]


def test_a_template_refuses_what_expand_refuses() -> None:
    alg = generate("ring", coll="allreduce", ranks=2)
    col = alg.ops["comm_dst"]
    wrong = pc.if_else(pc.is_valid(col), pa.scalar(7, col.type), col)
    bad = alg.replace(ops=alg.ops.set_column(alg.ops.schema.get_field_index("comm_dst"), "comm_dst", wrong))
    with pytest.raises(
        TemplateError, match=r"algorithm 'x': rank 0 node \d+ \(COMM_SEND_NODE\) names peer 7"
    ):
        tpl.trace_template(
            bad,
            "ALL_REDUCE",
            64,
            duration_unit_ns=1.0,
            local_mem_bw_gb_per_s=1.0,
            reduction_mem_accesses=3,
            copy_mem_accesses=2,
            integer_ns=True,
            label="x",
        )
