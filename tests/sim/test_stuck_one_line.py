"""A replay that gets stuck says so in one line, whatever the number of causes (issue 35, round 2,
item 7): the message used to list up to ten causes on lines of their own, and the CLI printed
them as a multi-line error. ``.stuck`` keeps every unfinished op."""

from __future__ import annotations

from pathlib import Path

import pytest

from etstore.cli import main
from etstore.errors import SimulationError
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import simulate
from etstore.store import open_store
from etstore.topology import Topology

RECEIVES = 7


def _orphans() -> Trace:
    """Rank 1 waits for seven messages rank 0 never sends, and two ops on rank 0 wait for each other."""
    n = RECEIVES
    ops = ops_table(
        {
            "rank": [0, 0, *[1] * n],
            "id": [100, 101, *range(n)],
            "name": ["a", "b", *[f"wait{i}" for i in range(n)]],
            "type": ["COMP_NODE", "COMP_NODE", *["COMM_RECV_NODE"] * n],
            "duration_micros": [1, 1, *[0] * n],
            "comm_src": [None, None, *[0] * n],
            "comm_tag": [None, None, *range(n)],
            "comm_size": [None, None, *[64] * n],
        }
    )
    return Trace(ops, deps=deps_table([0, 0], [100, 101], [101, 100]), name="orphans")


def test_a_stuck_replay_is_one_line_with_its_first_causes() -> None:
    with pytest.raises(SimulationError) as got:
        simulate(_orphans(), Topology.ring(2))
    msg = str(got.value)
    assert "\n" not in msg
    assert msg.startswith("simulation of 'orphans' stuck at t=0 ns: 9 of 9 ops never finished: ")
    assert "dependency cycle on rank 0: id 10" in msg  # the cycle first, then the receives
    assert msg.count("no matching send") == 2  # three causes of eight are named
    assert msg.endswith("no matching send; and 5 more (.stuck lists every op that never finished)")
    assert got.value.stuck.num_rows == 9


def test_the_cli_prints_it_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with open_store(tmp_path / "s", write=True) as s:
        s.ingest(_orphans())
    capsys.readouterr()
    assert main(["--store", str(tmp_path / "s"), "sim", "orphans", "--topo", "ring:2"]) == 1
    out, err = capsys.readouterr()
    assert (
        out == "" and err.count("\n") == 1 and err.startswith("etstore: error: simulation of 'orphans' stuck")
    )
