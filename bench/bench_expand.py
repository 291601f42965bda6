"""Expansion benchmark: a 64-rank workload's all-reduces replaced by a 64-rank ring.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

Input (fixed seed): ``etstore.workloads.transformer(ranks=64, tp=1, layers=L)``, one
data-parallel ALL_REDUCE per layer on all 64 ranks, so ``L`` collective instances and
``64·L`` COMM_COLL nodes; the algorithm is ``generate("ring", coll="allreduce",
ranks=64)`` (315 ops per rank, 20,160 in all). Timed:

* ``expand_ops_per_s``: one :func:`etstore.algorithms.expand.expand` call in memory
  (select, stamp every rank's part, rewire deps, lineage), best of ``--repeat`` after a
  warm-up; ops written = ops of the expanded trace.
* ``expand_store_ops_per_s`` (unless ``--no-store``): expansion plus the embedded store's
  ``ingest(trace, parent=, lineage=)`` (DuckDB + Ladybug + BECOMES edges), once, into a
  fresh store that already holds the workload.

Budget (issue 7): ≥ 1M ops/s written.

Usage::

    python bench/bench_expand.py
    python bench/bench_expand.py --layers 64 --repeat 5 --no-store
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from etstore.algorithms import generate  # noqa: E402
from etstore.algorithms.expand import expand  # noqa: E402
from etstore.store import EmbeddedStore  # noqa: E402
from etstore.workloads import transformer  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
BUDGET_OPS_PER_S = 1_000_000


def emit(metric: str, value: float, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=128, help="collective instances (one all-reduce per layer)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-store", action="store_true", help="skip the expand + store measurement")
    args = ap.parse_args()

    work = transformer(ranks=args.ranks, tp=1, layers=args.layers, seed=0, name="bench-work")
    ring = generate("ring", coll="allreduce", ranks=args.ranks)
    expand(work, ring)  # warm-up (imports, first allocations)
    best = float("inf")
    result = None
    for _ in range(args.repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = expand(work, ring)
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    ops = result.trace.num_ops
    common = {
        "ranks": args.ranks,
        "collectives": result.collectives.num_rows,
        "coll_nodes": result.lineage.num_rows // (ring.num_ops // args.ranks),
        "workload_ops": work.num_ops,
        "deps": result.trace.num_deps,
        "budget": BUDGET_OPS_PER_S,
    }
    emit("expand_ops_per_s", round(ops / best), "ops/s", ops, seconds=round(best, 3), **common)

    if not args.no_store:
        with (
            tempfile.TemporaryDirectory(prefix="etstore-bench-expand-") as tmp,
            EmbeddedStore(Path(tmp) / "store") as store,
        ):
            store.ingest(work, name="work")
            gc.collect()
            t0 = time.perf_counter()
            x = expand(store.load("work"), ring)
            t1 = time.perf_counter()
            report = store.ingest(x.trace, name="work-ring", parent="work", lineage=x.lineage)
            t2 = time.perf_counter()
            assert report.created and report.trace.ops == ops
            emit(
                "expand_store_ops_per_s",
                round(ops / (t2 - t0)),
                "ops/s",
                ops,
                seconds=round(t2 - t0, 3),
                expand_s=round(t1 - t0, 3),
                ingest_s=round(t2 - t1, 3),
                lineage=x.lineage.num_rows,
                **common,
            )


if __name__ == "__main__":
    main()
