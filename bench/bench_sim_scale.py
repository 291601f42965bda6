"""Simulation at scale (issue 33): a transformer over thousands of ranks, its time and peak memory.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

The workload is ``etstore workload --ranks N --tp 8 --layers 8`` (``etstore.workloads.transformer``)
on a ring of N NPUs (50 GB/s, 500 ns links), the default system config, congestion-unaware:
the same workload ASTRA-sim ran in ``bench_sim.py --astra-only`` (bench/README.md, "ASTRA-sim
vs etstore on whole workloads"). Its data-parallel groups have N / 8 ranks, so every
all-reduce is a native ring of ``2 (N/8 - 1)`` steps per member and per chunk: the events grow
as N^2 / 8, and so does the time. Memory must not: it should follow the ops and the steps in
flight (docs/simulator.md, "Memory at scale").

Each N runs in a child process of its own (``--child``), so its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``) is its own; the child's address space is capped
(``--limit-gib``, default 12) so that a run that would not fit fails alone instead of
drawing the kernel's OOM killer onto the machine. Per N it reports the ops, the sub-ops the
collectives expand into, the loop's events, the wall time of ``simulate`` and of the
child, the peak RSS, the RSS the interpreter and its libraries hold before the trace is
built, and per op: peak RSS / ops, and (peak − that start) / ops. The anchor is
ASTRA-sim's 1,024-rank run of this workload: 471 MiB peak RSS for 62,464 ops, 7,907 bytes
per op; ``ratio_vs_astra`` is etstore's peak RSS per op over that.

Usage::

    python bench/bench_sim_scale.py                          # 1,024 and 4,096 ranks (about 2 min)
    python bench/bench_sim_scale.py --ranks 1024,4096,16384  # 16,384 on request (about 25 min)
    python bench/bench_sim_scale.py --ranks 4096 --tree /tmp/old  # another checkout (before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
ASTRA_RSS_MIB = 471  # ASTRA-sim analytical (unaware), this workload at 1,024 ranks (bench/README.md)
ASTRA_OPS = 62_464  # the workload's ops at 1,024 ranks
ASTRA_BYTES_PER_OP = ASTRA_RSS_MIB * 2**20 / ASTRA_OPS


def emit(metric: str, value: float, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}))


def _rss_mib() -> float:
    """Peak RSS of this process so far (Linux: ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(ranks: int, tree: Path) -> None:
    """One measurement in this process: build, simulate, print the figures as one JSON object."""
    sys.path.insert(0, str(tree))
    t_start = time.perf_counter()
    import etstore
    from etstore.sim import simulate
    from etstore.topology import Topology
    from etstore.workloads import transformer

    if not Path(etstore.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"etstore was imported from {etstore.__file__}, not from {tree}")

    rss_start = _rss_mib()
    t0 = time.perf_counter()
    trace = transformer(ranks=ranks, layers=8, tp=8)
    build_s = time.perf_counter() - t0
    rss_trace = _rss_mib()
    topo = Topology.from_spec(f"ring:{ranks},bw=50,lat=500")
    t0 = time.perf_counter()
    res = simulate(trace, topo)
    sim_s = time.perf_counter() - t0
    out = {
        "ranks": ranks,
        "ops": trace.num_ops,
        "sim_ops": res.sim_ops,
        "events": res.events,
        "total_ns": res.total_ns,
        "build_s": build_s,
        "sim_s": sim_s,
        "loop_s": res.loop_s,
        "child_s": time.perf_counter() - t_start,
        "rss_start_mib": rss_start,
        "rss_trace_mib": rss_trace,
        "rss_peak_mib": _rss_mib(),
    }
    print(json.dumps(out), flush=True)


def measure(ranks: int, tree: Path, limit_gib: float) -> dict[str, Any] | None:
    """Run :func:`child` in a fresh interpreter with its address space capped; its figures, or None."""
    limit = int(limit_gib * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(ranks), "--tree", str(tree)]
    run = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cap, cwd=tree)
    if run.returncode != 0:
        tail = run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
        emit("sim_scale_failed", run.returncode, "exit", ranks, error=tail[0], limit_gib=limit_gib)
        return None
    figures: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return figures


def report(f: dict[str, Any]) -> None:
    """The child's figures as JSON lines, per op against ASTRA-sim's anchor."""
    n, ops = f["ranks"], f["ops"]
    per_op = f["rss_peak_mib"] * 2**20 / ops
    growth = (f["rss_peak_mib"] - f["rss_start_mib"]) * 2**20 / ops
    wall = {k: round(f[k], 2) for k in ("loop_s", "child_s", "build_s")}
    rate = round(f["events"] / max(f["loop_s"], 1e-9))
    emit("sim_scale_wall", round(f["sim_s"], 2), "s", n, ops=ops, sim_ops=f["sim_ops"], events=f["events"],
         events_per_s=rate, total_ns=f["total_ns"], **wall)  # fmt: skip
    rss = {k: round(f[k], 1) for k in ("rss_start_mib", "rss_trace_mib")}
    emit("sim_scale_peak_rss", round(f["rss_peak_mib"], 1), "MiB", n, ops=ops, **rss)
    ratio = round(per_op / ASTRA_BYTES_PER_OP, 3)
    emit("sim_scale_rss_per_op", round(per_op), "B/op", n, ops=ops, growth_per_op=round(growth),
         astra_per_op=round(ASTRA_BYTES_PER_OP), ratio_vs_astra=ratio)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1024,4096", help="comma-separated rank counts (16384 on request)")
    ap.add_argument("--limit-gib", type=float, default=12.0, help="address-space cap of each child, GiB")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose etstore is measured")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.tree)
        return
    for ranks in [int(x) for x in args.ranks.split(",") if x]:
        figures = measure(ranks, args.tree, args.limit_gib)
        if figures is not None:
            report(figures)


if __name__ == "__main__":
    main()
