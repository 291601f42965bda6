"""Sweeps and what-if grids fanned out: the same rows as the serial sweep whether the points run
here or as Ray tasks on a local Ray instance, in the serial order; a point that fails is reported
with what it was and why, and every other point is kept."""

from __future__ import annotations

import doctest
import importlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from etstore.algorithms import generate, synthesize
from etstore.app.fanout import Failed, failures, fanout
from etstore.app.sweeps import run_sensitivity, run_sweep
from etstore.errors import SimulationError
from etstore.sim import SimConfig
from etstore.sim.perturb import parse_knob
from etstore.sim.sweep import sensitivity, sweep
from etstore.topology import Topology
from etstore.workloads import transformer

ray = pytest.importorskip("ray")

TOPOS = ["ring:8,bw=50,lat=500", "mesh2d:4x2,bw=100,lat=700"]
SIZES = [1024, 65536, 1 << 20, 16 << 20]


def _synth(topo: Any, coll: str) -> Any:
    return synthesize(topo, coll=coll, chunks_per_npu=1, seed=3).trace


def _without_wall(t: pa.Table) -> pa.Table:
    return t.drop_columns(["wall_s"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray instance of two worker CPUs for the module (fanout joins it, never stops it)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_docstring_examples() -> None:
    for name in ("etstore.app.fanout", "etstore.sim.sweep"):
        failed, tried = doctest.testmod(importlib.import_module(name))
        assert tried > 0 and failed == 0, name


def test_serial_fanout_gives_the_sweep_rows_in_order() -> None:
    algos = {"ring": "ring", "direct": "direct", "synth": _synth}
    expected = sweep(SIZES, algos, TOPOS, config=SimConfig(congestion="aware"))
    with fanout() as fan:
        got = run_sweep(fan, SIZES, algos, TOPOS, config=SimConfig(congestion="aware"))
    assert got.failed == ()
    assert _without_wall(got.points).equals(_without_wall(expected))
    assert got.points.num_rows == len(TOPOS) * len(algos) * len(SIZES)


def test_ray_sweep_equals_the_serial_sweep_bit_for_bit(cluster: None) -> None:
    algos = {"ring": "ring", "direct": "direct", "synth": _synth}
    phases: list[tuple[str, int, int]] = []
    with fanout("local") as fan:
        assert fan.engine == "ray" and fan.workers == 2
        got = run_sweep(fan, SIZES, algos, TOPOS, progress=lambda *p: phases.append(p))
    expected = sweep(SIZES, algos, TOPOS)
    assert got.failed == ()
    # every float compared exactly: the same functions of the same inputs, wherever they ran
    assert _without_wall(got.points).equals(_without_wall(expected))
    # progress came back as the workers finished: synthesis once per cell, then all the points
    points = [p for p in phases if p[0] == "points"]
    assert points[-1] == ("points", 24, 24) and len(points) > 1
    assert [p[1] for p in points] == sorted(p[1] for p in points)
    assert ("algorithms", 2 * 3, 2 * 3) in phases


def test_ray_sensitivity_equals_the_serial_grid(cluster: None) -> None:
    trace = transformer(ranks=8, layers=2, tp=2)
    topos = [Topology.from_spec(t) for t in TOPOS]
    knob, values = parse_knob("slow:3=1,1.5,2,4", seed=0)
    expected = sensitivity(trace, topos, knob, values)
    with fanout("local") as fan:
        got = run_sensitivity(fan, trace, topos, knob, values)
    assert got.failed == ()
    assert [(p.topology.name, p.value) for p in got.points] == [(p.topology.name, p.value) for p in expected]
    for a, b in zip(got.points, expected, strict=True):
        assert a.result.total_ns == b.result.total_ns
        assert a.result.ops.equals(b.result.ops) and a.result.ranks.equals(b.result.ranks)


@pytest.mark.parametrize("engine", [None, "local"], ids=["serial", "ray"])
def test_a_failing_point_is_reported_and_the_rest_kept(engine: str | None, cluster: None) -> None:
    four = generate("ring", coll="allreduce", ranks=4)  # runs on 4 NPUs only

    def broken(topo: Any, coll: str) -> Any:
        raise SimulationError(f"no algorithm for {topo.name}")

    algos: dict[str, Any] = {"ring": "ring", "four": four, "broken": broken}
    topos = ["ring:4,bw=50,lat=500", "ring:8,bw=50,lat=500"]
    with fanout(engine) as fan:
        got = run_sweep(fan, [1024, 4096], algos, topos)
    assert [f.point for f in got.failed] == [
        "ring:4,bw=50,lat=500 / broken",
        "ring:8,bw=50,lat=500 / broken",
        "ring:8,bw=50,lat=500 / four / 1024 B",
        "ring:8,bw=50,lat=500 / four / 4096 B",
    ]
    assert "no algorithm for ring:4" in got.failed[0].message
    assert "has 4 ranks but the ALL_REDUCE group has 8" in got.failed[2].message
    kept = got.points.select(["topology", "algorithm", "size_bytes"]).to_pylist()
    assert [(r["topology"][:6], r["algorithm"], r["size_bytes"]) for r in kept] == [
        ("ring:4", "ring", 1024),
        ("ring:4", "ring", 4096),
        ("ring:4", "four", 1024),
        ("ring:4", "four", 4096),
        ("ring:8", "ring", 1024),
        ("ring:8", "ring", 4096),
    ]
    alone = sweep([1024, 4096], {"ring": "ring", "four": four}, ["ring:4,bw=50,lat=500"])
    assert _without_wall(got.points.slice(0, 4)).equals(_without_wall(alone))


def _crash_on_two(item: int, _shared: Any) -> int:
    if item == 2:
        raise MemoryError("point two ran out")
    return item * item


def test_fanout_keeps_order_and_says_which_item_failed(cluster: None) -> None:
    for engine in (None, "local"):
        with fanout(engine) as fan:
            out = fan.map(_crash_on_two, list(range(9)))
        assert [r for r in out if not isinstance(r, Failed)] == [0, 1, 9, 16, 25, 36, 49, 64]
        assert failures(out) == [Failed(2, "MemoryError: point two ran out")]


def _square_or_refuse(item: int, _shared: Any) -> int:
    if item == 5:
        from etstore.errors import TraceFormatError

        raise TraceFormatError(f"rank{item}.et: truncated")
    return item * item


@pytest.mark.parametrize("engine", [None, "local"], ids=["serial", "ray"])
def test_stream_yields_in_order_within_its_window_and_raises_the_first_failure(
    engine: str | None, cluster: None
) -> None:
    from etstore.errors import TraceFormatError

    taken: list[int] = []

    def items() -> Iterator[int]:
        for i in range(9):
            taken.append(i)
            yield i

    with fanout(engine) as fan:
        got = []
        stream = fan.stream(_square_or_refuse, items(), window=2)
        for value in stream:
            got.append(value)
            # what was read ahead of the consumer: the window, never the whole input
            assert len(taken) <= len(got) + 2
            if len(got) == 3:
                break
        stream.close()
        assert got == [0, 1, 4]
        with pytest.raises(TraceFormatError, match=r"^rank5\.et: truncated$"):
            list(fan.stream(_square_or_refuse, range(9), window=3))
