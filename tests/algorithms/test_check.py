"""Symbolic execution of algorithms: real fixtures pass, hand-made broken ones are named precisely."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from etstore.algorithms import CheckReport, check_algorithm, ensure_valid, generate
from etstore.errors import UnsatisfiableError
from etstore.formats.msccl_xml import parse_msccl_xml, read_msccl_xml
from etstore.model import Trace, deps_table, encode_attrs, ops_table
from etstore.testing import msccl_step, msccl_tb, two_rank_allreduce
from etstore.testing import trace_from_nodes as algo


def send(rank: int, id_: int, dst: int, off: int, **kw: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "id": id_,
        "type": "COMM_SEND_NODE",
        "name": f"send{id_}",
        "comm_dst": dst,
        "comm_tag": 0,
        "msg_chunk_cnt": 1,
        "chunk_offset": off,
        "total_chunk_cnt": 2,
        **kw,
    }


def recv(rank: int, id_: int, src: int, off: int, **kw: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "id": id_,
        "type": "COMM_RECV_NODE",
        "name": f"recv{id_}",
        "comm_src": src,
        "comm_tag": 0,
        "msg_chunk_cnt": 1,
        "chunk_offset": off,
        "total_chunk_cnt": 2,
        **kw,
    }


def comp(rank: int, id_: int, name: str, off: int, **kw: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "id": id_,
        "type": "COMP_NODE",
        "name": name,
        "msg_chunk_cnt": 1,
        "chunk_offset": off,
        "total_chunk_cnt": 2,
        **kw,
    }


# ---------------------------------------------------------------- what passes


@pytest.mark.shared_files("msccl/*.xml")
def test_every_msccl_fixture_passes(shared_file: Path) -> None:
    report = check_algorithm(read_msccl_xml(shared_file))
    assert report.ok, report.problems
    assert report.messages == report.sends == report.recvs
    assert report.modes


def test_custom_allreduce_report_pins_counts(custom_allreduce_xml: Path) -> None:
    r = check_algorithm(read_msccl_xml(custom_allreduce_xml))
    assert r == CheckReport(
        ok=True,
        problems=[],
        collective="allreduce",
        ranks=8,
        chunks=8,
        ops=280,
        sends=112,
        recvs=112,
        reduces=56,
        copies=0,
        messages=112,
        chunks_moved=112,
        depth=35,
        modes=("in-place",),
    )
    assert r.summary().startswith("ok: allreduce on 8 ranks")


def test_inplace_and_outofplace_are_both_checked_when_declared(shared_fixture: Callable[[str], Path]) -> None:
    r = check_algorithm(read_msccl_xml(shared_fixture("msccl/all-reduce-ring-simple.xml")))
    assert r.ok and r.modes == ("in-place", "out-of-place")


def test_hand_built_trace_without_attrs() -> None:
    nodes, edges = two_rank_allreduce()
    r = check_algorithm(algo(nodes, edges))
    assert r.ok, r.problems
    assert (r.sends, r.recvs, r.reduces, r.messages, r.depth) == (4, 4, 2, 4, 5)


def test_generated_algorithms_pass_for_several_sizes() -> None:
    for ranks in (2, 3, 4, 7, 8):
        for chunks in (1, 2):
            assert ensure_valid(generate("ring", coll="allreduce", ranks=ranks, chunks=chunks)).ok


def test_broadcast_and_reduce_with_inferred_root() -> None:
    # broadcast from 0 to 1 and 2 of one chunk
    nodes = [
        send(0, 0, 1, 0, total_chunk_cnt=1),
        send(0, 1, 2, 0, total_chunk_cnt=1),
        recv(1, 0, 0, 0, total_chunk_cnt=1),
        recv(2, 0, 0, 0, total_chunk_cnt=1),
    ]
    r = check_algorithm(algo(nodes, [], collective="broadcast", ngpus=3, nchunksperloop=1))
    assert r.ok and r.collective == "broadcast"
    # reduce to 0: both receives reduce into i[0], the second after the first
    nodes = [
        recv(0, 0, 1, 0, tb_id=0, local_time_step=0, total_chunk_cnt=1),
        comp(0, 1, "reduce", 0, tb_id=0, local_time_step=0, total_chunk_cnt=1),
        recv(0, 2, 2, 0, tb_id=1, local_time_step=0, total_chunk_cnt=1),
        comp(0, 3, "reduce", 0, tb_id=1, local_time_step=0, total_chunk_cnt=1),
        send(1, 0, 0, 0, total_chunk_cnt=1),
        send(2, 0, 0, 0, total_chunk_cnt=1),
    ]
    edges = [(0, 0, 1), (0, 2, 3), (0, 1, 2)]
    assert check_algorithm(algo(nodes, edges, collective="reduce", ngpus=3, nchunksperloop=1)).ok
    # without the ordering edge the two reductions race on i[0] only if they overwrite; they do not
    # overwrite here (each adds), so both orders agree
    assert check_algorithm(algo(nodes, edges[:2], collective="reduce", ngpus=3, nchunksperloop=1)).ok


# ---------------------------------------------------------------- what fails, and how it is named


def test_missing_reduction_names_rank_slot_and_missing_contribution() -> None:
    nodes, edges = two_rank_allreduce(reduce=False)
    r = check_algorithm(algo(nodes, edges))
    assert not r.ok
    assert any(
        p.startswith(
            "rank 0 output i[0] should hold the reduction of chunk 0 over all 2 ranks but holds "
            "chunk 0 of rank 1; missing chunk 0 of rank 0"
        )
        for p in r.problems
    ), r.problems


def test_double_reduction_is_reported_where_it_happens() -> None:
    nodes, edges = two_rank_allreduce()
    nodes.append(comp(0, 5, "reduce_again", 0))  # a standalone 're' of i[0] with itself
    edges.append((0, 4, 5))
    r = check_algorithm(algo(nodes, edges))
    assert any(
        "rank 0 reduce_again (id 5) reduces chunk 0 of rank 0 a second time" in p for p in r.problems
    ), r.problems


def test_recv_with_no_send() -> None:
    nodes, edges = two_rank_allreduce()
    nodes.append(recv(1, 5, 0, 0))
    edges.append((1, 4, 5))
    r = check_algorithm(algo(nodes, edges))
    assert r.problems[0] == (
        "rank 1 recv5 (id 5) has no matching send: rank 1 posts 3 receive(s) from rank 0 "
        "on tag 0, but rank 0 sends 2"
    )
    assert any("recv5 (id 5) waits forever" in p for p in r.problems)
    with pytest.raises(
        UnsatisfiableError,
        match=r"'hand' does not implement allreduce: rank 1 recv5 \(id 5\) has "
        "no matching send",
    ):
        ensure_valid(algo(nodes, edges))


def test_send_never_received() -> None:
    nodes, edges = two_rank_allreduce()
    nodes.append(send(0, 5, 1, 0))
    r = check_algorithm(algo(nodes, edges))
    assert (
        "rank 0 send5 (id 5) is never received: rank 0 sends 3 message(s) to rank 1 on tag 0, but rank 1 "
        "posts 2 receive(s)" in r.problems
    )


def test_cross_rank_deadlock_prints_the_wait_cycle() -> None:
    # both ranks receive before they send
    nodes = [recv(0, 0, 1, 1), send(0, 1, 1, 0), recv(1, 0, 0, 0), send(1, 1, 0, 1)]
    r = check_algorithm(algo(nodes, [(0, 0, 1), (1, 0, 1)], collective="allgather", nchunksperloop=2))
    assert any(p.startswith("deadlock: rank ") and "(each waits for the next)" in p for p in r.problems), (
        r.problems
    )
    assert "4 of 4 nodes never run, first rank 0 recv0 (id 0)" in r.problems


def test_dependency_cycle_inside_a_rank() -> None:
    nodes, edges = two_rank_allreduce()
    edges.append((0, 4, 0))  # the last node must finish before the first
    r = check_algorithm(algo(nodes, edges))
    assert any(p.startswith("deadlock: rank 0") for p in r.problems), r.problems


def test_size_mismatch_between_send_and_recv() -> None:
    nodes, edges = two_rank_allreduce()
    nodes[0]["msg_chunk_cnt"] = 2  # rank 0's first send carries two chunks
    nodes[0]["chunk_offset"] = 0
    r = check_algorithm(algo(nodes, edges))
    assert any(
        "rank 1 recv1 (id 1) expects 1 chunk(s) but the matching send (rank 0 send0 (id 0)) carries 2" in p
        for p in r.problems
    ), r.problems


def test_race_between_unordered_writes_is_reported() -> None:
    # all-gather of 2 ranks, in place in o: rank 0 copies its chunk over the slot it also receives into
    nodes = [
        comp(
            0,
            0,
            "copy",
            1,
            tb_id=1,
            local_time_step=0,
            attrs=encode_attrs(
                [
                    ("srcbuf", "string_val", "o"),
                    ("srcoff", "int64_val", 0),
                    ("dstbuf", "string_val", "o"),
                    ("dstoff", "int64_val", 1),
                ]
            ),
        ),  # o[0] -> o[1]
        recv(0, 1, 1, 1),
        send(1, 0, 0, 1),
        recv(1, 1, 0, 0),
        send(0, 2, 1, 0),
    ]
    attrs_trace = algo(nodes, [], collective="allgather", nchunksperloop=2)
    r = check_algorithm(attrs_trace)
    assert any("depends on execution order" in p and "rank 0 output o[1]" in p for p in r.problems), (
        r.problems
    )


def test_reading_a_slot_that_holds_no_data() -> None:
    nodes = [send(0, 0, 1, 1), recv(1, 0, 0, 1), send(1, 1, 0, 1), recv(0, 1, 1, 1)]
    r = check_algorithm(algo(nodes, [], collective="allgather", nchunksperloop=2))
    assert any("rank 0 send0 (id 0) reads o[1], which holds no data at that point" in p for p in r.problems)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"collective": ""}, r"cannot check: params\['collective'\] names no collective"),
        ({"collective": "allgather", "nchunksperloop": 3}, r"nchunksperloop=3 is not a multiple of ngpus=2"),
        ({"collective": "broadcast", "root": None}, r"cannot tell the root"),
    ],
)
def test_unusable_params(params: dict[str, Any], message: str) -> None:
    nodes, edges = two_rank_allreduce()
    p = {k: v for k, v in params.items() if v is not None}
    t = algo(nodes, edges, **p)
    r = check_algorithm(t)
    assert not r.ok
    assert any(__import__("re").search(message, x) for x in r.problems), r.problems


def test_bad_peers_and_missing_dependencies() -> None:
    nodes, edges = two_rank_allreduce()
    nodes[0]["comm_dst"] = 0  # rank 0 sends to itself
    r = check_algorithm(algo(nodes, edges))
    assert "rank 0 send0 (id 0): comm_dst=0 is not another rank in 0..1" in r.problems
    nodes, edges = two_rank_allreduce()
    t = algo(nodes, edges)
    t = t.replace(missing=deps_table([0], [99], [0]))
    assert any(
        "1 dependencies point to absent nodes, e.g. rank 0 node 0 waits for node 99" in p
        for p in check_algorithm(t).problems
    )


def test_two_threadblocks_on_one_connection(custom_allreduce_xml: Path) -> None:
    text = custom_allreduce_xml.read_text()
    # give gpu 0 a second threadblock that also sends to gpu 1 on channel 0
    extra = msccl_tb(1, 1, -1, msccl_step(0, "s")) + "\n"
    text = text.replace(
        '    </tb>\n  </gpu>\n  <gpu id="1"', "    </tb>\n" + extra + '  </gpu>\n  <gpu id="1"', 1
    )
    r = check_algorithm(parse_msccl_xml(text))
    assert any("rank 0: threadblocks 0 and 1 both send to rank 1 on channel 0" in p for p in r.problems), (
        r.problems
    )


def test_problem_list_is_capped(custom_allreduce_xml: Path) -> None:
    text = custom_allreduce_xml.read_text().replace('type="rrc"', 'type="r"')
    r = check_algorithm(parse_msccl_xml(text), max_problems=3)
    assert len(r.problems) == 4 and r.problems[-1].startswith("... and ")


def test_mutations_of_a_correct_algorithm_are_all_caught(custom_allreduce_xml: Path) -> None:
    """Each single-step change to the 8-rank ring is detected (the checker can fail)."""
    text = custom_allreduce_xml.read_text()
    lines = text.splitlines()
    step_lines = [i for i, ln in enumerate(lines) if "<step" in ln]
    mutants = 0
    for i in step_lines[::5]:
        ln = lines[i]
        for old, new in (
            ('type="rrc"', 'type="r"'),
            ('srcoff="3"', 'srcoff="4"'),
            ('type="s"', 'type="nop"'),
        ):
            if old in ln:
                mutated = ln.replace(old, new).replace('dstoff="3"', 'dstoff="4"')
                changed = "\n".join([*lines[:i], mutated, *lines[i + 1 :]])
                assert not check_algorithm(parse_msccl_xml(changed)).ok, (i, old)
                mutants += 1
    assert mutants >= 30


def test_empty_problems_means_ok() -> None:
    r = check_algorithm(algo(*two_rank_allreduce()))
    assert r.ok is (not r.problems)
    assert isinstance(r.problems, list)
    empty = Trace(
        ops=ops_table({"rank": pa.array([], pa.int32()), "id": pa.array([], pa.uint64())}, num_rows=0),
        params={"collective": "allreduce"},
    )
    assert not check_algorithm(empty).ok


# ---------------------------------------------------------------- collectives without postcondition


DATA = Path(__file__).resolve().parents[1] / "data" / "msccl"


def test_local_only_threadblocks_with_channel_minus_one_are_checked() -> None:
    # tests/data/msccl: each gpu reduces the peer's chunk from scratch in a threadblock
    # send="-1" recv="-1" chan="-1"
    r = check_algorithm(read_msccl_xml(DATA / "allreduce_2g_local_tb.xml"))
    assert r == CheckReport(
        ok=True,
        problems=[],
        collective="allreduce",
        ranks=2,
        chunks=2,
        ops=10,
        sends=4,
        recvs=4,
        reduces=2,
        copies=0,
        messages=4,
        chunks_moved=4,
        depth=5,
        modes=("in-place",),
    )
    assert r.postcondition and r.checked and r.verdict == "ok"


def test_a_custom_collective_gets_a_check_without_postcondition() -> None:
    # MSCCL's alltonext as msccl-tools writes it: coll="custom", 16 gpus
    r = check_algorithm(read_msccl_xml(DATA / "alltonext_forward_2n.xml"))
    assert r.ok and r.checked and not r.postcondition, r.problems
    assert (r.collective, r.ranks, r.sends, r.recvs, r.messages, r.modes) == (
        "custom",
        16,
        36,
        36,
        36,
        ("as written",),
    )
    assert r.summary().endswith(
        "checked as written (no postcondition for 'custom': matched messages and no deadlock only)"
    )


def test_a_custom_collective_still_fails_on_unmatched_messages_and_deadlocks() -> None:
    lines = (DATA / "alltonext_forward_2n.xml").read_text().splitlines()
    last = lines.index('    <tb id="1" send="-1" recv="14" chan="0">') + 1  # gpu 15 receives gpu 14's chunks
    dropped = check_algorithm(parse_msccl_xml("\n".join(lines[:last] + lines[last + 1 :])))
    assert not dropped.ok and dropped.hang == dropped.verdict
    assert re.fullmatch(
        r"rank 14 send_tb\d+_s0 \(id \d+\) is never received: rank 14 sends 1 message\(s\) to rank 15 "
        r"on tag 0, but rank 15 posts 0 receive\(s\)",
        dropped.verdict,
    ), dropped.problems
    nodes = [recv(0, 0, 1, 1), send(0, 1, 1, 0), recv(1, 0, 0, 0), send(1, 1, 0, 1)]
    stuck = check_algorithm(algo(nodes, [(0, 0, 1), (1, 0, 1)], collective="custom", nchunksperloop=2))
    assert stuck.verdict.startswith("deadlock: rank ") and not stuck.postcondition, stuck.problems


def test_any_collective_name_without_a_postcondition_is_checked_as_written() -> None:
    nodes, edges = two_rank_allreduce()
    r = check_algorithm(algo(nodes, edges, collective="allsum"))
    assert r.ok and not r.postcondition and r.modes == ("as written",), r.problems
    # a symbol reduced twice is still a problem, postcondition or not
    nodes, edges = two_rank_allreduce()
    nodes.append(comp(0, 5, "reduce_again", 0))
    edges.append((0, 4, 5))
    r = check_algorithm(algo(nodes, edges, collective="allsum"))
    assert any("rank 0 reduce_again (id 5) reduces chunk 0 of rank 0 a second time" in p for p in r.problems)
