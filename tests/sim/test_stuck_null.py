"""No input makes the simulator loop forever (issue 35 item 4).

A collective whose ``duration_micros`` is NULL and that the simulator replays (broadcast,
reduce, ...) gave the loop a NaN end time; the native loop's round "every item of the
earliest time" then popped nothing, forever. Each case runs in a child process with a
timeout, so a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from etstore.errors import ConfigError
from etstore.sim import SimConfig

_TIMEOUT_S = 120
_LOOPS = ["native", "python"]

_PRELUDE = """
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimulationError, _loop, engine, simulate
from etstore.topology import Topology
if {python!r}:
    _loop._simloop = None
    engine.DEFER_COLLECTIVES = False
"""


def _run(code: str, loop: str) -> str:
    """stdout of ``code`` in a fresh interpreter with the chosen loop; fails on a hang or an error."""
    if loop == "native":
        pytest.importorskip("etstore.sim._simloop")
    src = textwrap.dedent(_PRELUDE).format(python=loop == "python") + textwrap.dedent(code)
    try:
        done = subprocess.run(
            [sys.executable, "-c", src], capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the simulator did not finish within {_TIMEOUT_S} s ({loop} loop)")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("loop", _LOOPS)
@pytest.mark.parametrize("comm_type", ["BROADCAST", "REDUCE", "GATHER"])
def test_a_replayed_collective_without_a_duration_finishes(loop: str, comm_type: str) -> None:
    """An absent duration is 0, as ASTRA-sim's feeder reads it (proto3 ``duration_micros``): the
    replayed collective takes 0 ns, and the compute op after it 1 ns."""
    out = _run(
        f"""
        ops = ops_table({{
            "rank": [0, 1, 2, 3, 0, 1, 2, 3], "id": [1, 1, 1, 1, 2, 2, 2, 2],
            "type": ["COMM_COLL_NODE"] * 4 + ["COMP_NODE"] * 4, "name": ["c"] * 4 + ["after"] * 4,
            "comm_type": [{comm_type!r}] * 4 + [None] * 4, "comm_size": [4096] * 4 + [None] * 4,
            "duration_micros": [None] * 8,
        }})
        res = simulate(Trace(ops, deps_table([0, 1, 2, 3], [1] * 4, [2] * 4), name="w"), Topology.ring(4))
        print(res.total_ns, res.collectives["time_ns"].to_pylist())
        """,
        loop,
    )
    assert out.split() == ["1.0", "[0.0]"]


@pytest.mark.parametrize("loop", _LOOPS)
def test_a_time_that_is_not_a_number_stops_the_loop_naming_the_op(loop: str) -> None:
    """Whatever gives an event a NaN time (here a duration spoiled after the inputs were built),
    both loops stop and the error names the op in one line."""
    out = _run(
        """
        inner = engine.loop_inputs
        def spoiled(built, config):
            inputs = inner(built, config)
            inputs.dur[1] = float("nan")
            return inputs
        engine.loop_inputs = spoiled
        ops = ops_table({
            "rank": [0, 0, 0], "id": [1, 2, 3], "type": ["COMP_NODE"] * 3, "name": ["a", "b", "c"],
            "duration_micros": [1, 2, 3],
        })
        try:
            simulate(Trace(ops, deps_table([0, 0], [1, 2], [2, 3]), name="w"), Topology.ring(2))
        except SimulationError as exc:
            print(exc)
            print(exc.stuck.to_pylist())
        """,
        loop,
    )
    message, stuck = out.splitlines()
    assert message == (
        "simulation of 'w' cannot go on: the next event, rank 0 id 2 (COMP_NODE 'b'), has a time that "
        "is not a number (a duration or a message time that is NaN)"
    )
    assert "'id': 2, 'name': 'b'" in stuck and "'state': 'started'" in stuck


@pytest.mark.parametrize(
    "field", ["duration_unit_ns", "min_comp_ns", "endpoint_delay_ns", "message_overhead_ns"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_times_of_the_config_must_be_finite(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be a finite number >= 0, not {value}"):
        SimConfig().replace(**{field: value})
    with pytest.raises(ConfigError, match="local_mem_bw_gb_per_s must be a finite number > 0"):
        SimConfig(local_mem_bw_gb_per_s=value)
