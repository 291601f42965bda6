"""The native event loop (``_simloop``) against the Python reference ``_loop._run``.

Every case replays one workload twice with every collective expanded up front, once
per loop, and demands identical raw loop outputs (end and start times, remaining
in-degrees, event count, stop time, queues left, per-link loads: bit for bit) and
identical result tables, or the same :class:`SimulationError` message and ``.stuck``
table; then a third time with the native loop expanding collectives as they start
(``engine.DEFER_COLLECTIVES``, the default), which must give the same result tables.
The workloads are the shapes of ``test_engine.py`` plus random ones; the whole file
skips when the extension is not built.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etstore.algorithms.expand import expand
from etstore.algorithms.generators import generate
from etstore.formats.et import read_et
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, SimulationError, _loop, collective_workload, engine, read_network_config
from etstore.testing import p2p_trace as _p2p
from etstore.testing import slot_policy_trace as _policy_trace
from etstore.topology import Topology
from etstore.workloads import transformer

pytestmark = pytest.mark.needs_extension("etstore.sim._simloop")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_sim.py"


def _bench() -> Any:
    """bench/bench_sim.py as a module (its workload generators), without running it."""
    spec = importlib.util.spec_from_file_location("bench_sim", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replay(monkeypatch: pytest.MonkeyPatch, native: bool, run: Callable[[], Any]) -> tuple[Any, dict]:
    """(result or SimulationError, raw loop output) of one replay with the chosen loop."""
    seen: dict[str, Any] = {}
    name = "_run_native" if native else "_run_lists"
    inner = getattr(_loop, name)

    def spy(*args: Any) -> Any:
        out, loop_s = inner(*args)
        seen.update(_normalise(out))
        return out, loop_s

    with monkeypatch.context() as m:
        m.setattr(_loop, name, spy)
        m.setattr(engine, "DEFER_COLLECTIVES", False)
        if not native:
            m.setattr(_loop, "_simloop", None)
        try:
            res: Any = run()
        except SimulationError as exc:
            res = exc
    assert seen, f"{name} was not called"
    return res, seen


def _normalise(out: dict[str, Any]) -> dict[str, Any]:
    """Loop output in one comparable form (before simulate maps it back to trace order)."""
    norm: dict[str, Any] = {}
    for key in ("start", "end", "indeg", "lbusy", "lbytes", "lmsgs"):
        norm[key] = np.array(out[key], dtype=np.int64 if key in ("indeg", "lmsgs") else np.float64)
    norm["events"] = int(out["events"])
    norm["t"] = float(out["t"])
    for key in ("send_q", "recv_q"):  # dict order matters: it orders the stuck report
        norm[key] = [(int(k), [int(j) for j in q]) for k, q in out[key].items() if q]
    norm["waitq"] = [[int(j) for j in q] for q in out["waitq"]]
    return norm


def _assert_same(monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any]) -> Any:
    """Run with both loops; every output identical. Returns the native result (or its SimulationError)."""
    got, raw_c = _replay(monkeypatch, True, run)
    _assert_same_result(_deferred(run), got)
    want, raw_py = _replay(monkeypatch, False, run)
    assert raw_c.keys() == raw_py.keys()
    for key, ref in raw_py.items():
        val = raw_c[key]
        if isinstance(ref, np.ndarray):
            assert val.dtype == ref.dtype and val.shape == ref.shape, key
            assert val.tobytes() == ref.tobytes(), f"{key} differs at {np.flatnonzero(val != ref)[:5]}"
        else:
            assert val == ref, key
    _assert_same_result(got, want)
    return got


def _deferred(run: Callable[[], Any]) -> Any:
    """The result (or SimulationError) with collectives expanded as they start."""
    assert engine.DEFER_COLLECTIVES and _loop.native_loop()
    try:
        return run()
    except SimulationError as exc:
        return exc


def _assert_same_result(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, SimulationError):
        assert str(got) == str(want)
        assert got.stuck.equals(want.stuck)
    else:
        for table in ("ops", "ranks", "collectives", "links", "overloaded"):
            assert getattr(got, table).equals(getattr(want, table)), table
        assert (got.total_ns, got.events, got.sim_ops) == (want.total_ns, want.events, want.sim_ops)


CONFIGS = [
    pytest.param(SimConfig(congestion=c, scheduling_policy=p), id=f"{c}-{p.lower()}")
    for c in ("unaware", "aware")
    for p in ("FIFO", "LIFO")
]


def _p2p_ops(**cols: list[Any]) -> Trace:
    return Trace(ops_table(cols))


# ---------------------------------------------------------------- test_engine shapes


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize(
    ("size", "src", "dst", "npus"), [(1 << 20, 0, 1, 2), (1 << 20, 0, 6, 8), (12345, 3, 1, 4)]
)
def test_one_message(
    monkeypatch: pytest.MonkeyPatch, config: SimConfig, size: int, src: int, dst: int, npus: int
) -> None:
    _assert_same(
        monkeypatch, lambda: engine.simulate(_p2p(size, src, dst), Topology.ring(npus), config=config)
    )
    cfg = config.replace(integer_ns=False, message_overhead_ns=7.5)
    _assert_same(monkeypatch, lambda: engine.simulate(_p2p(size, src, dst), Topology.ring(npus), config=cfg))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("max_comp_ops", [1, 3, None])
def test_compute_chains_and_slots(
    monkeypatch: pytest.MonkeyPatch, config: SimConfig, max_comp_ops: int | None
) -> None:
    chain = Trace(
        ops_table(
            {"rank": [0] * 4, "id": [1, 2, 3, 4], "type": ["COMP_NODE"] * 4, "duration_micros": [2, 3, 0, 5]}
        ),
        deps=deps_table([0, 0, 0], [1, 2, 3], [2, 3, 4]),
    )
    parallel = Trace(
        ops_table(
            {
                "rank": [0, 0, 0, 0],
                "id": [1, 2, 3, 4],
                "type": ["COMP_NODE"] * 4,
                "duration_micros": [4, 4, 4, 4],
                "is_cpu_op": [False, False, True, False],
            }
        )
    )
    cfg = config.replace(max_comp_ops=max_comp_ops)
    for tr in (chain, parallel, _policy_trace()):
        _assert_same(monkeypatch, lambda tr=tr: engine.simulate(tr, Topology.ring(2), config=cfg))


@pytest.mark.parametrize("config", CONFIGS)
def test_matching_late_receives_and_overlap(monkeypatch: pytest.MonkeyPatch, config: SimConfig) -> None:
    late_recv = Trace(
        ops_table(
            {
                "rank": [0, 1, 1],
                "id": [1, 1, 2],
                "type": ["COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE"],
                "comm_dst": [1, None, None],
                "comm_src": [None, None, 0],
                "comm_tag": [3, None, 3],
                "comm_size": [1024, None, 1024],
                "duration_micros": [0, 50, 0],
            }
        ),
        deps=deps_table([1], [1], [2]),
    )
    nth = Trace(
        ops_table(
            {
                "rank": [0, 0, 1, 1],
                "id": [1, 2, 1, 2],
                "type": ["COMM_SEND_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_RECV_NODE"],
                "comm_dst": [1, 1, None, None],
                "comm_src": [None, None, 0, 0],
                "comm_tag": [0, 0, 0, 0],
                "comm_size": [1 << 24, 1 << 10, 1 << 24, 1 << 10],
            }
        ),
        deps=deps_table([0, 1], [1, 1], [2, 2]),
    )
    overlap = Trace(
        ops_table(
            {
                "rank": [0, 0, 0, 1],
                "id": [1, 2, 3, 1],
                "type": ["COMP_NODE", "COMM_SEND_NODE", "COMP_NODE", "COMM_RECV_NODE"],
                "duration_micros": [5, 0, 1, 0],
                "comm_dst": [None, 1, None, None],
                "comm_src": [None, None, None, 0],
                "comm_tag": [None, 0, None, 0],
                "comm_size": [None, 1 << 20, None, 1 << 20],
            }
        ),
        deps=deps_table([0], [2], [3]),
    )
    for tr in (late_recv, nth, overlap):
        _assert_same(monkeypatch, lambda tr=tr: engine.simulate(tr, Topology.ring(2), config=config))


@pytest.mark.parametrize("config", CONFIGS)
def test_collectives_native_generated_and_expanded(
    monkeypatch: pytest.MonkeyPatch, config: SimConfig
) -> None:
    n = 8
    work = collective_workload("allreduce", n, 8 << 20)
    _assert_same(monkeypatch, lambda: engine.simulate(work, Topology.ring(n), config=config))
    _assert_same(
        monkeypatch,
        lambda: engine.simulate(work, Topology.ring(n), config=config, algorithms={"ALL_REDUCE": "ring"}),
    )
    _assert_same(
        monkeypatch,
        lambda: engine.simulate(work, Topology.ring(n), config=config.replace(active_chunks_per_dimension=2)),
    )
    for coll in ("reducescatter", "allgather"):
        w = collective_workload(coll, n, 1 << 20)
        _assert_same(monkeypatch, lambda w=w: engine.simulate(w, Topology.mesh([2, 4]), config=config))
    alg = generate("ring", coll="allreduce", ranks=n)
    col = alg.ops.schema.get_field_index("comm_size")
    expanded = alg.replace(ops=alg.ops.set_column(col, "comm_size", [[(8 << 20) // n] * alg.num_ops]))
    _assert_same(monkeypatch, lambda: engine.simulate(expanded, Topology.ring(n), config=config))
    groups = Trace(
        ops_table(
            {
                "rank": [0, 1, 2, 3],
                "id": [1, 1, 1, 1],
                "type": ["COMM_COLL_NODE"] * 4,
                "comm_type": ["ALL_REDUCE"] * 4,
                "comm_size": [1 << 20] * 4,
                "pg_name": ["a", "a", "b", "b"],
            }
        )
    )
    _assert_same(monkeypatch, lambda: engine.simulate(groups, Topology.ring(4), config=config))
    replay = Trace(
        ops_table(
            {
                "rank": [0, 1],
                "id": [1, 1],
                "type": ["COMM_COLL_NODE"] * 2,
                "comm_type": ["BROADCAST"] * 2,
                "comm_size": [1024, 1024],
                "duration_micros": [3, 3],
            }
        )
    )
    _assert_same(monkeypatch, lambda: engine.simulate(replay, Topology.ring(2), config=config))


@pytest.mark.parametrize("congestion", ["unaware", "aware"])
def test_astra_sim_regression_case(
    monkeypatch: pytest.MonkeyPatch, congestion: str, rt_inputs: Path, custom_allreduce: Path
) -> None:
    from etstore.sim import read_system_config

    cfg = read_system_config(rt_inputs / "system_cfg.json").replace(congestion=congestion)
    net = read_network_config(rt_inputs / "network_cfg.yml")
    trace = read_et(rt_inputs / "workload" / "chakra_trace")
    res = _assert_same(monkeypatch, lambda: engine.simulate(trace, net.topology, config=cfg))
    assert res.total_ns == 117780.0
    algo = read_et(custom_allreduce / "custom_allreduce")
    _assert_same(monkeypatch, lambda: engine.simulate(algo, net.topology, config=cfg))
    _assert_same(
        monkeypatch,
        lambda: engine.simulate(trace, net.topology, config=cfg, algorithms={"ALL_REDUCE": algo}),
    )


@pytest.mark.parametrize("config", CONFIGS)
def test_shared_link_congestion(monkeypatch: pytest.MonkeyPatch, config: SimConfig) -> None:
    topo = Topology.from_links(4, [(0, 2), (1, 2), (2, 3)], latency_ns=100, bandwidth_gb_per_s=50)
    tr = _p2p_ops(
        rank=[0, 1, 3, 3],
        id=[1, 1, 1, 2],
        type=["COMM_SEND_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_RECV_NODE"],
        comm_dst=[3, 3, None, None],
        comm_src=[None, None, 0, 1],
        comm_tag=[0, 0, 0, 0],
        comm_size=[1 << 16] * 4,
    )
    res = _assert_same(monkeypatch, lambda: engine.simulate(tr, topo, config=config))
    if config.congestion == "aware":
        assert res.links["messages"].to_pylist() == [1, 1, 2]


# ---------------------------------------------------------------- stuck replays


@pytest.mark.parametrize("config", CONFIGS)
def test_stuck_receive_cycle_and_size_mismatch(monkeypatch: pytest.MonkeyPatch, config: SimConfig) -> None:
    orphan = Trace(
        ops_table(
            {
                "rank": [0, 1, 1, 1],
                "id": [1, 1, 2, 3],
                "name": ["c", "wait", "after", "other"],
                "type": ["COMP_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMM_RECV_NODE"],
                "duration_micros": [3, 0, 1, 0],
                "comm_src": [None, 0, None, 0],
                "comm_tag": [None, 7, None, 2],
                "comm_size": [None, 1024, None, 64],
            }
        ),
        deps=deps_table([1], [1], [2]),
        name="orphan",
    )
    err = _assert_same(monkeypatch, lambda: engine.simulate(orphan, Topology.ring(2), config=config))
    assert isinstance(err, SimulationError) and "no matching send" in str(err)
    loop = Trace(
        ops_table(
            {"rank": [0] * 3, "id": [1, 2, 3], "type": ["COMP_NODE"] * 3, "duration_micros": [1, 1, 1]}
        ),
        deps=deps_table([0, 0, 0], [1, 2, 3], [2, 3, 2]),
        name="loop",
    )
    sized = _p2p_ops(
        rank=[0, 1],
        id=[1, 1],
        type=["COMM_SEND_NODE", "COMM_RECV_NODE"],
        comm_dst=[1, None],
        comm_src=[None, 0],
        comm_tag=[0, 0],
        comm_size=[100, 200],
    )
    held = _p2p_ops(  # the first receive never completes and holds the only receive slot
        rank=[1, 1, 1, 1],
        id=[1, 2, 3, 4],
        type=["COMM_RECV_NODE"] * 4,
        comm_src=[0, 0, 0, 0],
        comm_tag=[7, 8, 9, 10],
        comm_size=[64] * 4,
    )
    cfg = config.replace(max_recv_ops=1)
    err = _assert_same(monkeypatch, lambda: engine.simulate(held, Topology.ring(2), config=cfg))
    assert isinstance(err, SimulationError) and err.stuck["state"].to_pylist().count("waiting") == 3
    for tr, cfg, what in (
        (loop, config, "dependency cycle"),
        (sized, config.replace(match_on_size=True), "no match"),
    ):
        err = _assert_same(
            monkeypatch, lambda tr=tr, cfg=cfg: engine.simulate(tr, Topology.ring(2), config=cfg)
        )
        assert isinstance(err, SimulationError) and what in str(err)


# ---------------------------------------------------------------- large and random


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bench_workloads_at_small_size(monkeypatch: pytest.MonkeyPatch, config: SimConfig, seed: int) -> None:
    bench = _bench()
    work = bench.synthetic_workload(16, 64, seed=seed)
    _assert_same(monkeypatch, lambda: engine.simulate(work, Topology.ring(16), config=config))
    _assert_same(monkeypatch, lambda: engine.simulate(work, Topology.mesh([4, 4]), config=config))
    if seed == 0:
        exp = bench.expanded_allreduce(16, 16 << 20)
        _assert_same(monkeypatch, lambda: engine.simulate(exp, Topology.mesh([4, 4]), config=config))


@st.composite
def _random_traces(draw: st.DrawFn) -> tuple[Trace, Topology, SimConfig]:
    """Small random traces with many simultaneous events: durations 0-2 us, few tags and sizes."""
    ranks = draw(st.integers(2, 4))
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "id", "type", "duration_micros", "is_cpu_op")}
    cols.update(comm_src=[], comm_dst=[], comm_tag=[], comm_size=[])
    src: list[int] = []
    dst: list[int] = []
    drank: list[int] = []
    for r in range(ranks):
        count = draw(st.integers(1, 8))
        # node ids in another order than the rows: the slot queues issue by node id
        nid = draw(st.permutations(range(count)))
        for i in range(count):
            typ = draw(st.sampled_from(["COMP_NODE", "COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"]))
            peer = (r + draw(st.integers(1, ranks - 1))) % ranks
            comm = typ != "COMP_NODE"
            cols["rank"].append(r)
            cols["id"].append(nid[i])
            cols["type"].append(typ)
            cols["duration_micros"].append(draw(st.integers(0, 2)) if not comm else 0)
            cols["is_cpu_op"].append(draw(st.booleans()) if not comm else False)
            cols["comm_dst"].append(peer if typ == "COMM_SEND_NODE" else None)
            cols["comm_src"].append(peer if typ == "COMM_RECV_NODE" else None)
            cols["comm_tag"].append(draw(st.integers(0, 1)) if comm else None)
            cols["comm_size"].append(draw(st.sampled_from([1 << 10, 1 << 16])) if comm else None)
            for j in draw(st.sets(st.integers(0, max(i - 1, 0)), max_size=2)) if i else ():
                drank.append(r)
                src.append(nid[j])
                dst.append(nid[i])
    if draw(st.booleans()) and len(dst):  # sometimes a back edge: a cycle or a longer wait
        k = draw(st.integers(0, len(dst) - 1))
        drank.append(drank[k])
        src.append(dst[k])
        dst.append(src[k])
    topo = draw(st.sampled_from([Topology.ring(4), Topology.mesh([2, 2]), Topology.fully_connected(4)]))
    config = SimConfig(
        congestion=draw(st.sampled_from(["unaware", "aware"])),
        scheduling_policy=draw(st.sampled_from(["FIFO", "LIFO"])),
        max_comp_ops=draw(st.sampled_from([1, 2, None])),
        max_comm_ops=draw(st.sampled_from([1, None])),
        max_recv_ops=draw(st.sampled_from([1, None])),
        integer_ns=draw(st.booleans()),
    )
    ops = ops_table(
        {
            **cols,
            "rank": pa.array(cols["rank"], pa.int32()),
            "comm_src": pa.array(cols["comm_src"], pa.int32()),
            "comm_dst": pa.array(cols["comm_dst"], pa.int32()),
            "comm_tag": pa.array(cols["comm_tag"], pa.int32()),
        }
    )
    return Trace(ops, deps=deps_table(drank, src, dst), name="random"), topo, config


@pytest.mark.parametrize("config", CONFIGS)
def test_transformer_workloads_issue_identically(monkeypatch: pytest.MonkeyPatch, config: SimConfig) -> None:
    # tensor- and data-parallel groups, overlappable all-reduces, sends and receives:
    # many ops wait for a slot at once
    trace = transformer(ranks=16, tp=4, layers=2)
    _assert_same(monkeypatch, lambda: engine.simulate(trace, Topology.ring(16), config=config))
    # expanded: every collective's block holds the comm slot through its acquire/release ops
    expanded = expand(trace, "direct").trace
    _assert_same(monkeypatch, lambda: engine.simulate(expanded, Topology.ring(16), config=config))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_random_traces())
def test_random_traces_replay_identically(
    monkeypatch: pytest.MonkeyPatch, case: tuple[Trace, Topology, SimConfig]
) -> None:
    trace, topo, config = case
    _assert_same(monkeypatch, lambda: engine.simulate(trace, topo, config=config))
