"""Simulator benchmarks: simulated events per second, and the published bus-bandwidth sweep.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.
Budget (DESIGN.md): >= 1M simulated events/s. Anchor: ASTRA-sim (C++) replays a
64-rank ring all-reduce of 20,160 send/recv/compute nodes in 0.2-0.4 s here.

Events are the items the event loop processes: an op finishing, or a message
arriving (plus one per link hop with the congestion-aware model). ``events_per_s``
uses the CPU time of the loop alone (``time.process_time``, robust to other
processes on a shared machine); ``wall_s`` is the whole ``simulate`` call,
preparation and metrics included.

Usage::

    python bench/bench_sim.py                # everything
    python bench/bench_sim.py --skip-sweep   # events/s only
    python bench/bench_sim.py --ops 200000   # a smaller synthetic workload
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etstore.collectives.generators import generate
from etstore.model import Trace, deps_table, ops_table
from etstore.sim import SimConfig, collective_workload, simulate, sweep
from etstore.topology import Topology

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "astra-sim"


def emit(metric: str, value: float, unit: str, n: int, **extra: object) -> None:
    print(
        json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}),
        flush=True,
    )


def expanded_allreduce(n: int = 64, size: int = 64 << 20) -> Trace:
    """The ring all-reduce as plain send/recv/compute nodes: 5(n-1) nodes per rank (20,160 at n=64)."""
    alg = generate("ring", coll="allreduce", ranks=n)
    col = alg.ops.schema.get_field_index("comm_size")
    ops = alg.ops.set_column(col, "comm_size", pa.array(np.full(alg.num_ops, size // n), pa.int64()))
    return alg.replace(ops=ops, kind="expanded", name=f"ring-allreduce-{n}-expanded")


def synthetic_workload(ranks: int, blocks: int, seed: int = 0) -> Trace:
    """``ranks × 4·blocks`` ops: per block a compute, a send to the next rank, a receive
    from the previous one and a compute that needs both (a pipeline-parallel pattern)."""
    rng = np.random.default_rng(seed)
    per = 4 * blocks
    r = np.repeat(np.arange(ranks), per)
    local = np.tile(np.arange(per), ranks)
    pos, blk = local % 4, local // 4
    kinds = np.array(["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE"])[pos]
    dur = np.where(pos == 0, rng.integers(1, 20, len(r)), np.where(pos == 3, rng.integers(1, 5, len(r)), 0))
    comm = (pos == 1) | (pos == 2)
    size = (blk % 16 + 1) << 14

    def opt(values: np.ndarray, mask: np.ndarray, typ: pa.DataType) -> pa.Array:
        return pa.array(values, typ, mask=~mask)

    ops = ops_table(
        {
            "rank": r.astype(np.int32),
            "id": local.astype(np.uint64),
            "type": kinds,
            "duration_micros": dur.astype(np.uint64),
            "comm_dst": opt((r + 1) % ranks, pos == 1, pa.int32()),
            "comm_src": opt((r - 1) % ranks, pos == 2, pa.int32()),
            "comm_tag": opt(blk, comm, pa.int32()),
            "comm_size": opt(size, comm, pa.int64()),
        }
    )
    base = np.arange(ranks * blocks) * 4
    rank_of = base // per
    nxt = (base % per) + 4 < per
    src = np.concatenate([base, base, base + 2, base, (base + 3)[nxt]]) % per
    dst = np.concatenate([base + 1, base + 2, base + 3, base + 3, (base + 4)[nxt]]) % per
    rk = np.concatenate([rank_of, rank_of, rank_of, rank_of, rank_of[nxt]])
    return Trace(ops=ops, deps=deps_table(rk, src, dst), name=f"synthetic-{ranks}x{per}")


def measure(
    name: str, trace: Trace, topo: Topology, config: SimConfig, repeat: int = 3, **kw: object
) -> None:
    """Simulate ``repeat`` times; emit the median events/s and wall (and the run's overloaded links)."""
    walls, rates = [], []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        res = simulate(trace, topo, config=config, **kw)  # type: ignore[arg-type]
        walls.append(time.perf_counter() - t0)
        rates.append(res.events_per_s)
    wall = statistics.median(walls)
    common = {
        "congestion": config.congestion,
        "ops": trace.num_ops,
        "sim_ops": res.sim_ops,
        "events": res.events,
        "loop_cpu_s": round(res.loop_s, 4),
        "wall_s": round(wall, 4),
        "total_ns": res.total_ns,
        "overloaded_links": res.overloaded.num_rows,
        "repeat": len(walls),
    }
    emit(f"sim.{name}.events_per_s", round(statistics.median(rates)), "events/s", res.events, **common)
    emit(f"sim.{name}.wall_s", round(wall, 4), "s", trace.num_ops, **common)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000, help="ops of the synthetic workload (default 1M)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--sizes", default="1M,16M,256M", help="sweep sizes (K/M/G suffixes, powers of 2)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is reported")
    args = ap.parse_args()

    rt = SHARED / "tests" / "rt_template" / "inputs"
    if rt.exists():
        from etstore.ingest.et import read_et
        from etstore.sim import read_network_config, read_system_config

        cfg = read_system_config(rt / "system_cfg.json")
        res = simulate(
            read_et(rt / "workload" / "chakra_trace"),
            read_network_config(rt / "network_cfg.yml").topology,
            config=cfg,
        )
        emit("sim.rt_template.total_ns", res.total_ns, "ns", 8, reference_ns=117780)

    ring64 = Topology.ring(64)
    exp = expanded_allreduce()
    for cong in ("unaware", "aware"):
        measure("expanded_allreduce_64", exp, ring64, SimConfig(congestion=cong), args.repeat)
    native = collective_workload("allreduce", 64, 64 << 20)
    for cong in ("unaware", "aware"):
        measure("native_allreduce_64", native, ring64, SimConfig(congestion=cong), args.repeat)
    work = synthetic_workload(64, max(1, args.ops // (64 * 4)))
    for cong in ("unaware", "aware"):
        measure("workload_1m", work, ring64, SimConfig(congestion=cong), args.repeat)

    if args.skip_sweep:
        return
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s) for s in args.sizes.split(",")]
    topos = [
        Topology.mesh([8, 8], latency_ns=500, bandwidth_gb_per_s=50),
        Topology.mesh([4, 4, 4], latency_ns=500, bandwidth_gb_per_s=50),
    ]
    algos: dict[str, object] = {"ring": "ring", "native": "native"}
    try:
        from etstore.collectives.generators import generate  # noqa: F401

        algos["direct"] = "direct"
    except ImportError:
        pass
    try:
        from etstore.collectives.synth import synthesize

        def synthesized(topo: Topology, coll: str) -> Trace:
            t0 = time.perf_counter()
            out = synthesize(topo, coll="allreduce").trace
            emit(
                "synth.allreduce.s",
                round(time.perf_counter() - t0, 3),
                "s",
                topo.num_npus,
                topology=topo.name,
            )
            return out

        algos["synthesized"] = synthesized
    except ImportError:
        pass
    for cong in ("unaware", "aware"):
        pts = sweep(sizes, algos, topos, collective="allreduce", config=SimConfig(congestion=cong))  # type: ignore[arg-type]
        for row in pts.to_pylist():
            emit(
                "sweep.allreduce.busbw",
                round(row["busbw_gb_per_s"], 3),
                "GB/s (2^30)",
                row["num_npus"],
                topology=row["topology"],
                algorithm=row["algorithm"],
                congestion=cong,
                size_bytes=row["size_bytes"],
                time_ns=row["time_ns"],
                wall_s=round(row["wall_s"], 3),
            )


if __name__ == "__main__":
    main()
