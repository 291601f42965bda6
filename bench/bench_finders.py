"""Opportunity finders at scale: seconds per finder on synthetic expanded traces of 1M and 6M ops.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

Input (fixed seed): ``etstore.workloads.transformer(hidden=1024, seq_tokens=512)`` with an
issue-order chain on each rank (every op waits for the one before it by a ``ctrl`` edge, as one
stream issues them; the chained workload of ``tests/analysis/test_rewrite.py``), expanded:

* ``ring`` (tp 2): every collective by ``ring`` (8 ranks, 5,200 layers: 998,440 ops; 256
  ranks, 38 layers: 6,266,112 ops). No collective is left, so the overlap finder has nothing
  to look at; the reorder finder frees every send of an expanded collective.
* ``mixed`` (tp 4): reduce-scatters and all-gathers by ``ring:2`` (two chunks a rank), the
  gradient all-reduces kept (8 ranks, 3,560 layers: 996,840 ops; 64 ranks, 2,670 layers:
  5,981,120 ops): all three finders find.

Each trace is stored (embedded store) and simulated once on ``ring:<ranks>`` (the run gives
the finders their timings); one graph query is timed on its own (``first_graph_query_s``:
what the first Cypher of a fresh store costs), then each finder runs alone
(``find_opportunities(kinds=[k], measure=False)``: the estimates, no measured gains)
``--repeat`` times; the median is printed with the opportunities found, the median CPU time
of this process (``cpu_s``: DuckDB's threads count too) and the load average after.

No external anchor: the reference is the finders' own earlier figures (``bench/README.md``).

Usage::

    python bench/bench_finders.py                      # ring and mixed at 1M ops
    python bench/bench_finders.py --size 6m --workload ring --repeat 1
    python bench/bench_finders.py --size 100k --kinds reorder
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from etstore.algorithms.expand import expand  # noqa: E402
from etstore.app.overlap import OPPORTUNITY_KINDS, find_opportunities  # noqa: E402
from etstore.app.runs import record_run  # noqa: E402
from etstore.model import Trace, deps_table  # noqa: E402
from etstore.sim import simulate  # noqa: E402
from etstore.store import EmbeddedStore  # noqa: E402
from etstore.topology import parse_topology  # noqa: E402
from etstore.workloads import transformer  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"

# (ranks, layers) per workload and size: about 100k, 1M and 6M expanded ops
SIZES = {
    "ring": {"100k": (8, 520), "1m": (8, 5200), "6m": (256, 38)},
    "mixed": {"100k": (8, 356), "1m": (8, 3560), "6m": (64, 2670)},
}
TP = {"ring": 2, "mixed": 4}
ALGORITHMS = {"ring": ("ring", None), "mixed": ("ring:2", "comm_type != 'ALL_REDUCE'")}


def emit(metric: str, value: float, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}))


def timed(call: Callable[[], pa.Table], repeat: int) -> tuple[float, float, pa.Table]:
    """``call()`` ``repeat`` times: the median wall and CPU seconds, and the last result."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        table = call()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return round(statistics.median(wall), 2), round(statistics.median(cpu), 2), table


def _load() -> float:
    """The 1-minute load average: the machine is shared, and wall times move with it (the
    ``cpu_s`` beside them, this process's CPU time, moves less)."""
    return round(os.getloadavg()[0], 2)


def chained(ranks: int, layers: int, tp: int) -> Trace:
    """The synthetic transformer with every op of a rank waiting for the one before it (ctrl)."""
    t = transformer(ranks=ranks, layers=layers, tp=tp, hidden=1024, seq_tokens=512)
    ids = t.ops["id"].to_numpy()
    rank, src, dst = [], [], []
    for r, (a, b) in t.rank_slices().items():
        rank.append(np.full(b - a - 1, r, dtype=np.int32))
        src.append(ids[a : b - 1])
        dst.append(ids[a + 1 : b])
    chain = deps_table(np.concatenate(rank), np.concatenate(src), np.concatenate(dst), "ctrl")
    return t.replace(deps=pa.concat_tables([t.deps, chain]), name="chained")


def run(workload: str, size: str, kinds: list[str], repeat: int) -> None:
    ranks, layers = SIZES[workload][size]
    alg, where = ALGORITHMS[workload]
    work = chained(ranks, layers, TP[workload])
    done = expand(work, alg, where=where)
    trace = done.trace
    common = {"workload": workload, "ranks": ranks, "tp": TP[workload], "layers": layers}
    with (
        tempfile.TemporaryDirectory(prefix="etstore-bench-finders-") as tmp,
        EmbeddedStore(Path(tmp) / "s") as s,
    ):
        t0 = time.perf_counter()
        s.ingest(work, name="w")
        s.ingest(trace, name="wx", parent="w", lineage=done.lineage)
        emit("ingest_s", round(time.perf_counter() - t0, 1), "s", trace.num_ops, **common)
        del work, done
        res = simulate(trace, parse_topology(f"ring:{ranks}"))
        run_id = record_run(s.warehouse, res, trace_name="wx")
        del res
        t0 = time.perf_counter()
        s.cypher("MATCH (o:Op) RETURN count(*) AS n")
        emit("first_graph_query_s", round(time.perf_counter() - t0, 2), "s", trace.num_ops, **common)
        for kind in kinds:
            wall, cpu, table = timed(
                lambda k=kind: find_opportunities(s, "wx", run_id=run_id, kinds=[k], measure=False), repeat
            )
            emit(
                f"find_{kind}_s",
                wall,
                "s",
                trace.num_ops,
                found=table.num_rows,
                runs=repeat,
                cpu_s=cpu,
                load=_load(),
                **common,
            )
        if len(kinds) > 1:  # what `etstore overlap --estimates` runs: every finder in one call
            wall, cpu, table = timed(
                lambda: find_opportunities(s, "wx", run_id=run_id, kinds=kinds, measure=False), repeat
            )
            emit(
                "find_all_s",
                wall,
                "s",
                trace.num_ops,
                found=table.num_rows,
                runs=repeat,
                cpu_s=cpu,
                load=_load(),
                **common,
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    emit("peak_rss_mib", peak, "MiB", trace.num_ops, **common)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["100k", "1m", "6m"], default="1m")
    ap.add_argument("--workload", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--kinds", default=",".join(OPPORTUNITY_KINDS), help="finders to run, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="runs per finder (the median is printed)")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for workload in SIZES if args.workload == "all" else [args.workload]:
        run(workload, args.size, kinds, args.repeat)


if __name__ == "__main__":
    main()
