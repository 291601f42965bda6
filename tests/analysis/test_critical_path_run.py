"""``etstore critical-path``: a recorded simulation run's path (``--run``), and the bar on a terminal.

The run cases are worked out by hand on ``ring:2`` (50 GiB/s, 500 ns per message; a
1 MiB message takes 500 + 1048576 / 53.687 = 20031 ns, tests/app/test_overlap.py):

* ``hand_workload`` (etstore.testing): on each rank fwd 0–10000, the 1 MiB all-reduce
  –65100, indep –85100, apply –90100, stats –120100, send_act 120100–140131 (it lands
  then), final 140131–141131. Both ranks end together; the walk starts at the first
  (rank 0) and steps back to what ended last before each op: final's two inputs, the
  send and the receive, both end at 140131, and the dependency listed first (the send)
  wins. So the path is rank 0's fwd, all-reduce, indep, apply, stats, send_act, final:
  141131 ns, the makespan.
* a message across ranks: rank 0 computes A (5 µs) then sends 1 MiB; rank 1 posts the
  receive at 0 and computes B (3 µs) after it. A 0–5000, the message 5000–25031, B
  25031–28031: the path is A, the send, the receive (reached by the message), B, 28031 ns.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from etstore.algorithms.expand import expand
from etstore.analysis import critical_path
from etstore.app.runs import record_run
from etstore.cli import main
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import simulate
from etstore.store import EmbeddedStore
from etstore.testing import hand_workload
from etstore.topology import parse_topology
from etstore.workloads import transformer


def _recorded(tmp_path: Path, trace: Trace) -> tuple[str, int]:
    """A store holding ``trace`` and one run of it on ``ring:2``: (store path, run id)."""
    path = tmp_path / "s"
    with EmbeddedStore(path) as store:
        store.ingest(trace, name=trace.name)
        run = record_run(store.warehouse, simulate(trace, parse_topology("ring:2")), trace_name=trace.name)
    return str(path), run


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main([*args, "--format", "json"]) == 0
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return rows


def _message_across_ranks() -> Trace:
    ops = ops_table(
        {
            "rank": [0, 0, 1, 1],
            "id": [1, 2, 1, 2],
            "name": ["A", "S", "R", "B"],
            "type": ["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE"],
            "duration_micros": [5, 0, 0, 3],
            "comm_dst": [None, 1, None, None],
            "comm_src": [None, None, 0, None],
            "comm_tag": [None, 7, 7, None],
            "comm_size": [None, 1 << 20, 1 << 20, None],
        }
    )
    return Trace(ops, deps=deps_table([0, 1], [1, 1], [2, 2]), name="across")


def test_run_path_of_the_hand_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store, run = _recorded(tmp_path, hand_workload())
    base = ("--store", store, "critical-path", "--run", str(run))
    path = _json(capsys, *base)
    assert [(p["rank"], p["name"]) for p in path] == [
        (0, n) for n in ("fwd", "grad_allreduce", "indep", "apply", "stats", "send_act", "final")
    ]
    assert [p["via"] for p in path] == ["start"] + ["dep"] * 6
    assert [(p["start_ns"], p["end_ns"]) for p in path] == [
        (0, 10000),
        (10000, 65100),
        (65100, 85100),
        (85100, 90100),
        (90100, 120100),
        (120100, 140131),
        (140131, 141131),
    ]
    (summary,) = _json(capsys, *base, "--table", "summary", "hand")
    assert summary == {
        "run": run,
        "trace": "hand",
        "length_ns": 141131.0,
        "makespan_ns": 141131.0,
        "ops": 7,
    }
    assert _json(capsys, *base, "--table", "ranks") == [{"rank": 0, "ops": 7, "held_ns": 141131.0}]


def test_run_path_follows_the_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store, run = _recorded(tmp_path, _message_across_ranks())
    base = ("--store", store, "critical-path", "--run", str(run))
    path = _json(capsys, *base)
    assert [(p["rank"], p["name"], p["via"]) for p in path] == [
        (0, "A", "start"),
        (0, "S", "dep"),
        (1, "R", "msg"),
        (1, "B", "dep"),
    ]
    assert [p["end_ns"] for p in path] == [5000, 25031, 25031, 28031]
    (summary,) = _json(capsys, *base, "--table", "summary")
    assert summary["length_ns"] == summary["makespan_ns"] == 28031.0
    # the receive waited from 0 for the message: it holds the path only once the send is done
    assert _json(capsys, *base, "--table", "ranks") == [
        {"rank": 0, "ops": 2, "held_ns": 25031.0},
        {"rank": 1, "ops": 2, "held_ns": 3000.0},
    ]
    assert main(["--store", store, "critical-path", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "critical path of run" in out and "length 28.031 µs over 4 ops; makespan 28.031 µs" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), r"name a stored trace, or a simulation run with --run ID"),
        (("--run", "99"), r"no run 99 in the metrics \(latest runs: 1\)"),
        (("other", "--run", "1"), r"run 1 simulated 'across', not 'other'"),
        (("--run", "1", "--rank", "0"), r"--rank weighs one rank of a stored trace"),
    ],
)
def test_run_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    store, _ = _recorded(tmp_path, _message_across_ranks())
    assert main(["--store", store, "critical-path", *args]) == 1
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_bar_on_a_terminal_none_when_piped(
    terminal: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = expand(transformer(ranks=4, tp=2, layers=3), "ring").trace
    with EmbeddedStore(tmp_path / "s") as store:
        store.ingest(trace, name="w")
    args = ["--store", str(tmp_path / "s"), "critical-path", "w", "--format", "json", "--limit", "0"]
    assert main(args) == 0
    out, _ = capsys.readouterr()
    # the bar's frames: the path counts the trace's ops as the streamed solve places them; its
    # last frame (drawn when it stops) is the path's ops read
    assert "critical-path w (path)" in out and f"0/{trace.num_ops}" in out
    assert out.rstrip().rfind("(path ops)") > out.rfind("(path)") and "1/1" in out
    monkeypatch.setenv("CI", "true")
    assert main(args) == 0
    out, _ = capsys.readouterr()
    rows = json.loads(out)  # piped or under CI: stdout is the data alone
    assert sum(r["duration_micros"] for r in rows) == critical_path(trace).length_micros


@pytest.mark.slow
def test_a_million_op_expanded_trace_in_seconds() -> None:
    # 998,056 ops, 46,798 generations deep (bench/bench_critical_path.py's input at 1M): the
    # code before took 62 s here, most of it clearing an array of every op once per generation
    trace = expand(transformer(ranks=8, tp=2, layers=5198, seed=0), "ring").trace
    t0 = time.perf_counter()
    cp = critical_path(trace)
    assert time.perf_counter() - t0 < 20
    assert cp.path.num_rows == 46786 and cp.per_rank["ops"].to_pylist() == [46798] * 8
