"""Progress of the long steps: the library callbacks' sequences and the CLI's bar on a terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

import pytest

from etstore.algorithms.expand import expand
from etstore.algorithms.synth import synthesize
from etstore.cli import main
from etstore.formats import read_trace
from etstore.sim import SimConfig, simulate
from etstore.store.embedded import EmbeddedStore
from etstore.topology import Topology
from etstore.workloads import transformer

Steps = list[tuple[str, int, int]]


def recorder() -> tuple[Steps, Callable[[str, int, int], None]]:
    steps: Steps = []

    def step(phase: str, done: int, total: int) -> None:
        steps.append((phase, done, total))

    return steps, step


def check_runs(steps: Steps) -> list[str]:
    """Each run of one phase: a fixed total, done monotone from its first value, ending at the
    total. Returns the phases in the order they ran."""
    order = []
    for phase, run in groupby(steps, key=lambda s: s[0]):
        got = list(run)
        totals = {t for _, _, t in got}
        dones = [d for _, d, _ in got]
        assert len(totals) == 1, (phase, got)
        assert dones == sorted(dones) and dones[0] >= 0, (phase, got)
        assert dones[-1] == got[0][2], (phase, got)
        order.append(phase)
    return order


def test_ingest_and_rm_progress(tmp_path: Path, custom_allreduce: Path) -> None:
    trace = read_trace(custom_allreduce)
    steps, step = recorder()
    with EmbeddedStore(tmp_path / "s") as store:
        info = store.ingest(trace, progress=step).trace
        assert check_runs(steps) == ["warehouse"]
        # 280 ops in ASTRA-sim's 8-NPU custom all-reduce (35 per rank files, counted by hand)
        totals = {phase: total for phase, _, total in steps}
        assert totals["warehouse"] == info.ops == 280
        built, build_step = recorder()
        assert store.index(progress=build_step)  # the graph index is built on demand, with progress
        assert all(phase.startswith("graph index: ") for phase, _, _ in built)
        assert built[-1][1:] == (280, 280) and {t for _, _, t in built} == {280}
        assert [d for _, d, _ in built] == sorted(d for _, d, _ in built)
        assert not store.index(progress=build_step)  # up to date: nothing to do
        removed, rm_step = recorder()
        store.remove(info.name, progress=rm_step)
        assert removed[0][0] == "warehouse" and removed[-1] == ("done", 1, 1)
        assert [d for _, d, _ in removed] == sorted(d for _, d, _ in removed)


def test_simulate_progress(custom_allreduce: Path) -> None:
    trace = read_trace(custom_allreduce)
    steps, step = recorder()
    result = simulate(trace, Topology.ring(8), progress=step)
    assert check_runs(steps) == ["build", "loop", "tables"]
    totals = {phase: total for phase, _, total in steps}
    # the custom ring's files are sends, receives and reductions only: the loop replays them as they are
    assert totals == {"build": 280, "loop": 280, "tables": 1} and result.sim_ops == 280


def test_long_loop_reports_between(tmp_path: Path) -> None:
    """A replay of about a second reports ops finished while the loop runs, not only at its ends."""
    trace = transformer(ranks=256, layers=8, tp=8)
    steps, step = recorder()
    result = simulate(trace, Topology.ring(256), config=SimConfig(congestion="aware"), progress=step)
    loop = [d for phase, d, _ in steps if phase == "loop"]
    if result.loop_s < 0.15:
        pytest.skip(f"the loop took {result.loop_s:.2f} s: too short to be polled")
    assert any(0 < d < result.sim_ops for d in loop), loop


def test_synth_progress() -> None:
    steps, step = recorder()
    res = synthesize("ring:4", coll="allgather", trials=8, buffer_bytes=4 << 20, progress=step)
    assert check_runs(steps) == ["trials", "schedule"]
    # a ring all-gather meets its bound (N-1 steps) on the first trial: one trial, then the jump
    assert res.ratio == 1.0 and res.trials == 1
    assert steps[:3] == [("trials", 0, 8), ("trials", 1, 8), ("trials", 8, 8)]
    steps.clear()
    res = synthesize("mesh2d:3x3", coll="allreduce", trials=3, buffer_bytes=9 << 20, progress=step)
    # a mesh's links go both ways: one pass of trials, one callback per trial run, then the total
    assert check_runs(steps) == ["trials", "schedule"]
    assert [d for phase, d, _ in steps if phase == "trials"] == [0, *range(1, res.trials + 1), 3]


def test_expand_progress() -> None:
    workload = transformer(ranks=4, layers=2, tp=2)
    steps, step = recorder()
    x = expand(workload, "ring", progress=step)
    assert check_runs(steps) == ["collectives", "algorithms", "place", "rewire"]
    totals = {phase: total for phase, _, total in steps}
    assert totals["collectives"] == workload.num_ops
    # every collective instance expanded: one summary row each
    assert totals["algorithms"] == totals["place"] == totals["rewire"] == x.collectives.num_rows > 0


def test_cli_bars_on_a_terminal(
    terminal: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, custom_allreduce: Path
) -> None:
    store = str(tmp_path / "s")
    assert main(["--store", store, "ingest", str(custom_allreduce), "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert "(warehouse)" in out and "280/280" in out
    name = "custom_allreduce"
    assert main(["--store", store, "sim", name, "--topo", "ring:8", "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    # the bar's last frame (drawn when it stops): the recording of the op timings, all done
    assert f"sim {name} (record)" in out and "280/280" in out and "eta" in out
    assert main(["--store", store, "synth", "--topo", "ring:4", "--coll", "allgather"]) == 0
    out, _ = capsys.readouterr()
    assert "synth allgather on" in out and "(store warehouse)" in out
    assert main(["--store", store, "workload", "--ranks", "4", "--layers", "1", "--ingest"]) == 0
    capsys.readouterr()
    assert main(["--store", store, "expand", "transformer", "--algo", "ring", "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert "expand transformer (store warehouse)" in out
    assert main(["--store", store, "cypher", "MATCH (o:Op) RETURN count(o) AS n", "--format", "json"]) == 0
    out, _ = capsys.readouterr()  # the first query builds the graph index, with a bar
    assert "cypher (graph index: loaded)" in out
    assert main(["--store", store, "rm", name]) == 0
    out, _ = capsys.readouterr()
    assert out.endswith(f"removed {name}\n") and "━" not in out  # one transaction: no bar


def test_cli_no_bar_when_piped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, custom_allreduce: Path
) -> None:
    store = str(tmp_path / "s")
    assert main(["--store", store, "ingest", str(custom_allreduce), "--format", "json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out)[0]["ops"] == 280  # stdout is the data alone
