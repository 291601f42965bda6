"""One verdict for an algorithm: ``check``, the MSCCL-IR export and the simulator agree, in the same words.

The broken algorithms are the ASTRA-sim 8-rank ring (``ring_allreduce_xml(8)``, the
fixture's steps line for line) with one defect each, as the issue reported them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from etstore.algorithms import check_algorithm, ensure_valid
from etstore.errors import SimulationError, UnsatisfiableError
from etstore.formats import to_msccl_xml
from etstore.formats.msccl_xml import parse_msccl_xml, read_msccl_xml
from etstore.ir import run_verdict
from etstore.model import Trace
from etstore.sim import _algorithms as sim_algorithms
from etstore.sim import simulate
from etstore.sim.sweep import collective_workload
from etstore.testing import msccl_step, msccl_tb, ring_allreduce_xml, two_rank_allreduce
from etstore.testing import trace_from_nodes as algo
from etstore.topology import Topology

DATA = Path(__file__).resolve().parents[1] / "data" / "msccl"
RING = ring_allreduce_xml(8)


def _drop_last_receive(text: str) -> str:
    """The ring without its last ``r`` step (gpu 7's): rank 6's last send is never received."""
    lines = text.splitlines()
    last = max(i for i, ln in enumerate(lines) if 'type="r"' in ln)
    return "\n".join(lines[:last] + lines[last + 1 :]) + "\n"


def _two_threadblocks_on_one_connection(text: str) -> str:
    """gpu 0 gets a second threadblock sending to gpu 1 on channel 0, listed first and waiting for
    the ring's last step; gpu 1 a second one receiving it (the issue's file)."""
    lines = text.splitlines()
    g0 = lines.index('  <gpu id="0" i_chunks="8" o_chunks="0" s_chunks="0">')
    lines[g0 + 1] = lines[g0 + 1].replace('<tb id="0"', '<tb id="1"')
    lines.insert(g0 + 1, msccl_tb(0, 1, -1, msccl_step(0, "s", depid=1, deps=26)))
    g1_end = lines.index("  </gpu>", lines.index('  <gpu id="1" i_chunks="8" o_chunks="0" s_chunks="0">'))
    lines.insert(g1_end, msccl_tb(1, -1, 0, msccl_step(0, "r")))
    return "\n".join(lines) + "\n"


def _simulate(algorithm: Trace) -> float:
    return simulate(
        collective_workload("allreduce", 8, 1 << 20), Topology.ring(8), algorithms={"ALL_REDUCE": algorithm}
    ).total_ns


def _verdicts(algorithm: Trace) -> tuple[str, str, str]:
    """What check, export and the simulator say about ``algorithm`` (their error messages)."""
    report = check_algorithm(algorithm)
    assert not report.ok
    with pytest.raises(UnsatisfiableError) as export:
        to_msccl_xml(algorithm)
    with pytest.raises(SimulationError) as sim:
        _simulate(algorithm)
    return report.verdict, str(export.value), str(sim.value)


def test_a_correct_ring_passes_everywhere() -> None:
    ring = parse_msccl_xml(RING, name="ring")
    report = check_algorithm(ring)
    assert report.ok and report.verdict == "ok" and report.hang == "" and report.postcondition
    assert run_verdict(ring).headline == "ok"
    assert to_msccl_xml(ring).count("<step ") == RING.count("<step ")
    assert _simulate(ring) > 0


def test_two_threadblocks_on_one_connection_get_one_verdict() -> None:
    """Before: check failed without a deadlock, export said "the algorithm deadlocks", sim ran it."""
    broken = parse_msccl_xml(_two_threadblocks_on_one_connection(RING), name="twotb")
    check, export, sim = _verdicts(broken)
    assert check == (
        "rank 0: threadblocks 0 and 1 both send to rank 1 on channel 0; message order between them is "
        "undefined (one threadblock per peer and channel)"
    )
    assert check_algorithm(broken).hang == check
    assert export.startswith(f"cannot write 'twotb' as MSCCL-IR: {check}")
    assert "deadlock" not in export
    assert sim == f"algorithm 'twotb' cannot run to completion, so it has no simulated time: {check}"


def test_a_ring_with_a_dropped_receive_is_not_simulated_like_a_correct_ring() -> None:
    """Before: 96,215 ns on ASTRA-sim's network, the time of the correct ring, without a word."""
    broken = parse_msccl_xml(_drop_last_receive(RING), name="drop")
    check, export, sim = _verdicts(broken)
    assert check == (
        "rank 6 send_tb0_s26 (id 33) is never received: rank 6 sends 14 message(s) to rank 7 on tag 0, "
        "but rank 7 posts 13 receive(s)"
    )
    assert export == f"cannot write 'drop' as MSCCL-IR: {check}"
    assert sim.endswith(f"no simulated time: {check}")


def test_a_deadlock_is_named_as_one_with_where_by_all_three() -> None:
    # both ranks receive before they send, and rank 0 sends a message on tag 5: the deadlock is
    # the verdict although the unmatched send is found first, even with the list capped at one
    nodes, edges = two_rank_allreduce()
    for r in (0, 1):
        edges[edges.index((r, 0, 1))] = (r, 1, 0)
    nodes.append(
        {**nodes[0], "id": 9, "name": "extra", "comm_tag": 5, "tb_id": None, "local_time_step": None}
    )
    broken = algo(nodes, edges)
    report = check_algorithm(broken, max_problems=1)
    assert report.problems[0] == (
        "deadlock: rank 0 recv1 (id 1) → rank 1 send0 (id 0) → rank 1 recv1 (id 1) → rank 0 send0 (id 0) "
        "→ rank 0 recv1 (id 1) (each waits for the next)"
    )
    assert report.hang == report.verdict == report.problems[0]
    check, export, sim = _verdicts(broken)
    assert check == report.verdict
    full = check_algorithm(broken)
    assert "rank 0 extra (id 9) is never received" in full.problems[1]
    assert export.startswith(f"cannot write 'hand' as MSCCL-IR: {check} (+")
    assert sim.endswith(f"no simulated time: {check}")
    with pytest.raises(UnsatisfiableError, match=re.escape(f"'hand' does not implement allreduce: {check}")):
        ensure_valid(broken)


def test_an_algorithm_that_runs_but_computes_the_wrong_result_is_simulated_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # gpu 0 sends chunk 4 where the ring sends chunk 3: every message still meets its receive
    lines = RING.splitlines()
    i = next(k for k, ln in enumerate(lines) if 'type="s" srcbuf="i" srcoff="3"' in ln)
    lines[i] = lines[i].replace('srcoff="3"', 'srcoff="4"').replace('dstoff="3"', 'dstoff="4"')
    wrong = parse_msccl_xml("\n".join(lines), name="wrong")
    report = check_algorithm(wrong)
    assert not report.ok and report.hang == "" and run_verdict(wrong).ok
    with caplog.at_level(logging.WARNING, logger="etstore.sim._algorithms"):
        assert _simulate(wrong) == _simulate(parse_msccl_xml(RING, name="ring"))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"algorithm 'wrong' fails its check, simulated as written: {report.verdict} "
        f"(+{len(report.problems) - 1} more; etstore check lists them)"
    ]


def test_local_threadblocks_and_custom_collectives_pass_everywhere() -> None:
    for name in ("allreduce_2g_local_tb.xml", "alltonext_forward_2n.xml"):
        t = read_msccl_xml(DATA / name)
        assert check_algorithm(t).ok and run_verdict(t).ok, name
        again = parse_msccl_xml(to_msccl_xml(t))
        assert check_algorithm(again).ok, name
    local = read_msccl_xml(DATA / "allreduce_2g_local_tb.xml")
    assert _simulate_two(local) > 0


def _simulate_two(algorithm: Trace) -> float:
    return simulate(
        collective_workload("allreduce", 2, 1 << 20), Topology.ring(2), algorithms={"ALL_REDUCE": algorithm}
    ).total_ns


def test_an_algorithm_too_large_to_check_whole_still_gets_the_run_verdict(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sim_algorithms, "FULL_CHECK_WORDS", 0)
    broken = parse_msccl_xml(_drop_last_receive(RING), name="drop")
    refused = r"'drop' cannot run .*: rank 6 send_tb0_s26 \(id 33\) is never received"
    with (
        caplog.at_level(logging.INFO, logger="etstore.sim._algorithms"),
        pytest.raises(SimulationError, match=refused),
    ):
        _simulate(broken)
    assert "algorithm 'drop': too large to check whole before simulating, run verdict only" in caplog.messages
