"""Expanded collectives under both execution models (``SimConfig.expanded_slots``, issue 30 item 5).

``"astra"`` runs an expanded trace as ASTRA-sim's workload layer runs the exported ``.et``:
each send on its NPU's one communication slot until its message arrives, each reduction on
its one compute slot, receives on none (``HardwareResource::occupy``). ``"collective"`` (the
default) runs the steps as inside their collective node: no slot, the block holding the
communication slot where the trace records its blocks.

Reference values: ASTRA-sim analytical 518bd513ae110428cd62eb60efc0f3993fd53c70 (both
backends; astra-network-analytical 599a047, chakra f37c2bb), run as

    AstraSim_Analytical_Congestion_{Unaware,Aware} --workload-configuration=<prefix>
      --comm-group-configuration=<prefix>.comm_groups.json (``empty`` where the export wrote none)
      --system-configuration=tests/rt_template/inputs/system_cfg.json
      --network-configuration=examples/network/analytical/Ring_<N>npus.yml (or Switch, below)
      --remote-memory-configuration=tests/rt_template/inputs/remote_memory_cfg.json

on the files ``write_astra_et(<case>, prefix)`` writes for the cases below (``_CASES``); a
rank's value is its ``sys[r] finished, T cycles`` line. ASTRA-sim runs a zero-duration
reduction for 1 ns, so etstore runs them with ``reduction_mem_accesses=0`` and
``copy_mem_accesses=0`` (docs/simulator.md, "Cost model").
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import duckdb
import numpy as np
import pyarrow.compute as pc
import pytest

from etstore.algorithms.expand import expand
from etstore.app.runs import record_run
from etstore.cli import main
from etstore.errors import ConfigError
from etstore.formats.comm_groups import write_astra_et
from etstore.formats.et import read_et
from etstore.model import Trace, ops_table
from etstore.sim import SimConfig, _loop, _loopprep, _slots, engine, read_comm_groups, simulate
from etstore.sim.sweep import collective_workload
from etstore.store.warehouse import Warehouse
from etstore.topology import Topology
from etstore.workloads import transformer

ASTRA = SimConfig(reduction_mem_accesses=0, copy_mem_accesses=0, expanded_slots="astra")
MIB = 1 << 20
# a 256 KiB share of 1 MiB over a 50 GiB/s link: floor(262144 / 53.687 B/ns) ns
SER_256K = math.floor(262144 / (50 * 2**30 / 1e9))


def _all_gather(n: int, size: int = MIB) -> Trace:
    return expand(collective_workload("allgather", n, size), {"allgather": "direct"}).trace


def _all_to_all(n: int) -> Trace:
    return expand(collective_workload("alltoall", n, MIB), {"alltoall": "alltoall-direct"}).trace


def _transformer() -> Trace:
    w = transformer(ranks=8, layers=2, tp=2)
    return expand(w, {"allreduce": "ring", "allgather": "ring", "reducescatter": "ring"}).trace


def _ns(text: str) -> list[int]:
    return [int(x) for x in text.split()]


_CASES: dict[str, tuple[Callable[[], Trace], str]] = {
    "direct all-gather, 16 ranks": (lambda: _all_gather(16), "ring:16"),
    "direct all-to-all, 8 ranks": (lambda: _all_to_all(8), "ring:8"),
    "transformer tp 2 x dp 4, 2 layers, ring": (_transformer, "ring:8"),
    # issue 30 item 5's case: Switch_16npus.yml (Ring_16npus.yml with topology [ Switch ])
    "direct all-gather, 4 MiB, switch of 16": (lambda: _all_gather(16, 4 * MIB), "switch:16"),
}

# per rank, ns: ASTRA-sim 518bd51 on the exported files (see the module docstring)
_REFERENCE = {
    ("direct all-gather, 16 ranks", "unaware"): [50300] * 16,
    ("direct all-gather, 16 ranks", "aware"): _ns(
        "119160 124320 121600 126760 122820 125540 120380 131640 "
        "124320 132860 129200 127980 134080 132420 134140 134140"
    ),
    ("direct all-to-all, 8 ranks", "unaware"): [25087] * 8,
    ("direct all-to-all, 8 ranks", "aware"): _ns("52820 62143 59702 62143 59702 57261 54820 62143"),
    ("transformer tp 2 x dp 4, 2 layers, ring", "unaware"): _ns(
        "40226126 39708126 40226126 39708126 39287627 39708126 40226126 39249126"
    ),
    ("transformer tp 2 x dp 4, 2 layers, ring", "aware"): _ns(
        "51515251 51514752 51515251 51514752 49639252 51514752 51515251 49639751"
    ),
    ("direct all-gather, 4 MiB, switch of 16", "unaware"): [88230] * 16,
    ("direct all-gather, 4 MiB, switch of 16", "aware"): _ns(
        "161460 229808 166342 171224 176106 180988 185870 190752 "
        "195634 200516 205398 210280 215162 220044 229808 229808"
    ),
}


def _exported(trace: Trace, prefix: Path) -> tuple[Trace, dict[str, list[int]] | None]:
    """The trace as ASTRA-sim reads it back from its exported files, and the group file's groups."""
    write_astra_et(trace, prefix)
    groups = prefix.with_name(prefix.name + ".comm_groups.json")
    return read_et(str(prefix)), (read_comm_groups(groups) if groups.exists() else None)


@pytest.mark.parametrize("congestion", ["unaware", "aware"])
@pytest.mark.parametrize("case", list(_CASES))
def test_the_astra_model_reproduces_astra_sim_on_the_exported_files(
    tmp_path: Path, case: str, congestion: str
) -> None:
    make, spec = _CASES[case]
    trace, groups = _exported(make(), tmp_path / "x")
    config = dataclasses.replace(ASTRA, congestion=congestion)
    res = simulate(trace, Topology.from_spec(spec), config=config, groups=groups)
    assert res.ranks["total_ns"].to_pylist() == [float(x) for x in _REFERENCE[case, congestion]]


def test_direct_all_gather_by_hand() -> None:
    """4 ranks on a ring of 50 GiB/s, 500 ns links; each rank sends its 256 KiB share to 3 peers, in
    node-id order to ranks +1, +2 (two hops), +3 (one hop the other way). On the comm slot one
    after the other (each ends when it arrives); without a slot side by side."""
    x = _all_gather(4)
    serial = (500 + SER_256K) + (1000 + SER_256K) + (500 + SER_256K)
    assert serial == 16646  # ASTRA-sim 518bd51 on the exported files, every rank
    assert simulate(x, Topology.ring(4), config=ASTRA).total_ns == serial
    aware = dataclasses.replace(ASTRA, congestion="aware")
    assert simulate(x, Topology.ring(4), config=aware).ranks["total_ns"].to_pylist() == [
        21528.0,
        26410.0,
        26410.0,
        26410.0,
    ]  # ASTRA-sim 518bd51 aware, by rank
    collective = dataclasses.replace(ASTRA, expanded_slots="collective")
    assert simulate(x, Topology.ring(4), config=collective).total_ns == 1000 + SER_256K == 5882


def _compute_beside_ring() -> Trace:
    """Per rank of 2: a 20 µs compute op (id 1) and a 1 MiB all-reduce (id 2) that does not wait
    for it, expanded to the ring: send, receive, reduce, send, receive (ids 3..7)."""
    ops = ops_table(
        {
            "rank": [0, 1, 0, 1],
            "id": [1, 1, 2, 2],
            "type": ["COMP_NODE", "COMP_NODE", "COMM_COLL_NODE", "COMM_COLL_NODE"],
            "name": ["fwd", "fwd", "ar", "ar"],
            "duration_micros": [20, 20, 0, 0],
            "comm_type": [None, None, "ALL_REDUCE", "ALL_REDUCE"],
            "comm_size": [None, None, MIB, MIB],
        }
    )
    return expand(Trace(ops, name="w"), {"allreduce": "ring"}).trace


def test_a_reduction_waits_for_the_compute_slot_under_astra() -> None:
    """A 512 KiB message: 500 + floor(524288 / 53.687) = 10,265 ns; a reduction 1 ns. Under
    "collective" the reduction runs beside the compute op: 10,265 + 1 + 10,265 = 20,531 ns.
    Under "astra" it takes the compute slot, which ``fwd`` (lower id) holds until 20,000 ns:
    20,000 + 1 + 10,265 = 30,266 ns."""
    x = _compute_beside_ring()
    msg = 500 + math.floor(524288 / (50 * 2**30 / 1e9))
    assert msg == 10265
    res = simulate(x, Topology.ring(2), config=ASTRA)
    assert res.total_ns == 20000 + 1 + msg == 30266
    reduce = res.ops.filter(pc.equal(res.ops["name"], "reduce_tb0_s1")).to_pylist()
    assert [(r["ready_ns"], r["start_ns"], r["end_ns"]) for r in reduce] == [(10265.0, 20000.0, 20001.0)] * 2
    collective = dataclasses.replace(ASTRA, expanded_slots="collective")
    assert simulate(x, Topology.ring(2), config=collective).total_ns == 2 * msg + 1 == 20531


def test_astra_runs_a_stored_expansion_as_its_exported_files(tmp_path: Path) -> None:
    """Under "astra" the blocks ``expand`` records play no part: the stored trace and its files
    read back take the same time. Under "collective" the stored trace's blocks hold the comm
    slot one collective at a time, and the files, which lose the record, do not."""
    w = transformer(ranks=4, layers=1, tp=2)
    x = expand(w, {"allreduce": "ring"}).trace
    assert "collective_blocks" in x.params
    back, groups = _exported(x, tmp_path / "x")
    topo = Topology.ring(4)
    stored = simulate(x, topo, config=ASTRA)
    files = simulate(back, topo, config=ASTRA, groups=groups)
    assert stored.ranks["total_ns"].to_pylist() == files.ranks["total_ns"].to_pylist()
    collective = dataclasses.replace(ASTRA, expanded_slots="collective")
    node = simulate(w, topo, config=collective, algorithms={"ALL_REDUCE": "ring"})
    assert simulate(x, topo, config=collective).total_ns == node.total_ns


_QUEUED = {
    "direct all-gather on ring:16": (lambda: _all_gather(16), "ring:16"),
    "direct all-gather on mesh2d:4x4": (lambda: _all_gather(16), "mesh2d:4x4"),
    "transformer on ring:16 (native rings; dp messages queue)": (
        lambda: transformer(ranks=16, layers=2, tp=4),
        "ring:16",
    ),
    "transformer on switch:16": (lambda: transformer(ranks=16, layers=2, tp=4), "switch:16"),
}


@pytest.mark.needs_extension("etstore.sim._simloop")
@pytest.mark.parametrize("hops", [None, "cut-through"])
@pytest.mark.parametrize("case", list(_QUEUED))
def test_both_loops_agree_on_queued_links(
    monkeypatch: pytest.MonkeyPatch, case: str, hops: str | None
) -> None:
    """Messages meet at links (congestion-aware, multi-hop). The Python reference schedules every
    link's free item; the C loop schedules one only when a message waits for it, where the
    reference has it (in the heap, or in the running round). Same times, link by link."""
    make, spec = _QUEUED[case]
    x, topo = make(), Topology.from_spec(spec)
    config = dataclasses.replace(ASTRA, congestion="aware", hops=hops)
    native = simulate(x, topo, config=config)
    monkeypatch.setattr(_loop, "_simloop", None)
    monkeypatch.setattr(engine, "DEFER_COLLECTIVES", False)
    python = simulate(x, topo, config=config)
    assert np.array_equal(native.ops["end_ns"].to_numpy(), python.ops["end_ns"].to_numpy())
    assert native.links.equals(python.links)
    assert native.events == python.events


def test_the_model_is_checked_recorded_and_chosen_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert SimConfig().expanded_slots == "collective"
    with pytest.raises(ConfigError, match="expanded_slots must be astra or collective, not 'mpi'"):
        SimConfig(expanded_slots="mpi")
    res = simulate(_all_gather(4), Topology.ring(4), config=ASTRA)
    path = tmp_path / "w.duckdb"
    with Warehouse(duckdb.connect(str(path))) as wh:
        rid = record_run(wh, res, trace_name="ag")
    with duckdb.connect(str(path)) as con:
        params = json.loads(
            con.execute("SELECT params FROM runs WHERE run_id = $r", {"r": rid}).fetchall()[0][0]
        )
    assert params["config"]["expanded_slots"] == "astra"
    write_astra_et(_all_gather(4), tmp_path / "ag")
    for model, want in (("astra", 16646.0), ("collective", 5882.0)):
        args = ["sim", str(tmp_path / "ag"), "--topo", "ring:4", "--no-record", "--format", "json"]
        code = main([*args, "--table", "summary", "--expanded-slots", model, "--reduction-mem-accesses", "0"])
        out = capsys.readouterr().out
        assert code == 0 and json.loads(out)[0]["total_ns"] == want


@pytest.mark.parametrize("module", [_slots, _loopprep])
def test_doctests(module: ModuleType) -> None:
    failed, tried = doctest.testmod(module)
    assert tried > 0 and failed == 0
