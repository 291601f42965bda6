"""Report benchmark: HTML report generation time and size for a 64-rank, ~1M-op run.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", "budget"}``.
Budget (issue 8): < 10 s and < 20 MB of HTML for a 64-rank, 1M-op run.

Input: ``etstore.workloads.transformer(ranks=64, layers=2232, tp=8)`` (1,000,256 ops:
compute, tensor-parallel all-gather / reduce-scatter, data-parallel all-reduce, a
send/recv exchange) in the embedded store, simulated once on an 8×8 mesh and
recorded; the store is cached in ``bench/out/report-store``. Collectives replay a
duration set from their size (ring time at 50 GB/s) rather than expanding into
per-chunk messages, which would need ~10^8 sub-ops; the report reads the same
tables either way. Only ``write_report`` is timed (wall clock, after the store is
open), three times; the best is reported, with the median (``median_s``) and every
run (``runs_s``).

Usage::

    python bench/bench_report.py               # 64 ranks, 2232 layers (~1M ops)
    python bench/bench_report.py --layers 200  # smaller
    python bench/bench_report.py --ranks 256 --layers 2 --topo ring:256   # many ranks, few ops
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etstore.app.runs import record_run
from etstore.model import Trace
from etstore.report import write_report
from etstore.sim import SimConfig, simulate
from etstore.store import EmbeddedStore
from etstore.topology import GIB, Topology, parse_topology
from etstore.workloads import transformer

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
OUT = Path(__file__).resolve().parent / "out"
BUDGET_S = 10.0
BUDGET_MB = 20.0


def emit(metric: str, value: float, unit: str, n: int, **extra: object) -> None:
    print(
        json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}),
        flush=True,
    )


def workload(layers: int, ranks: int = 64) -> Trace:
    """The transformer step with each collective's duration set to its ring time at 50 GB/s (µs)."""
    tr = transformer(ranks=ranks, layers=layers, tp=8, name=f"bench-report-{layers}")
    ops = tr.ops
    is_coll = pc.equal(ops["type"], "COMM_COLL_NODE").to_numpy(zero_copy_only=False)
    size = pc.fill_null(ops["comm_size"], 0).to_numpy().astype(np.float64)
    ring_us = 2 * size / (50 * GIB) * 1e6 + 5.0
    dur = np.where(is_coll, np.round(ring_us), ops["duration_micros"].to_numpy())
    col = ops.schema.get_field_index("duration_micros")
    ops = ops.set_column(col, "duration_micros", pa.array(dur.astype(np.int64), ops.schema.field(col).type))
    return tr.replace(ops=ops)


def prepare(layers: int, ranks: int = 64, topo: str | None = None) -> tuple[Path, int, int]:
    """The cached store with the run recorded: (store path, run id, ops)."""
    default = ranks == 64 and topo is None
    tag = re.sub(r"[^A-Za-z0-9]+", "-", topo or "")
    path = OUT / (f"report-store-{layers}" if default else f"report-store-{ranks}r-{layers}-{tag}")
    marker = path / "run.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        return path, int(info["run_id"]), int(info["ops"])
    shutil.rmtree(path, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    tr = workload(layers, ranks)
    replay = {c: "replay" for c in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER")}
    t = time.perf_counter()
    network = Topology.mesh([8, 8]) if topo is None else parse_topology(topo)
    result = simulate(tr, network, config=SimConfig(), algorithms=replay, groups=tr.params["comm_groups"])
    print(f"# simulated {tr.num_ops:,} ops in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    with EmbeddedStore(path) as store:
        store.ingest(tr)
        run_id = record_run(store.warehouse, result, trace_name=tr.name)
    marker.write_text(json.dumps({"run_id": run_id, "ops": tr.num_ops}))
    return path, run_id, tr.num_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2232, help="transformer layers (2232: ~1M ops)")
    ap.add_argument("--ranks", type=int, default=64, help="ranks (a multiple of 8; default 64)")
    ap.add_argument("--topo", default=None, help="topology spec (default: an 8x8 mesh)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path, run_id, n = prepare(args.layers, args.ranks, args.topo)
    out = OUT / f"report-{path.name.removeprefix('report-store-')}.html"
    times = []
    with EmbeddedStore(path, read_only=True) as store:
        con = store.warehouse
        for _ in range(args.repeat):
            t = time.perf_counter()
            write_report(con, [run_id], out)
            times.append(time.perf_counter() - t)
    size_mb = out.stat().st_size / 1e6
    emit(
        "report_s",
        round(min(times), 3),
        "s",
        n,
        budget=BUDGET_S,
        median_s=round(statistics.median(times), 3),
        runs_s=[round(x, 3) for x in times],
        ranks=args.ranks,
    )
    emit("report_html_mb", round(size_mb, 2), "MB", n, budget=BUDGET_MB)
    ok = min(times) < BUDGET_S and size_mb < BUDGET_MB
    print(
        f"# report of {n:,} ops: {min(times):.2f} s (budget {BUDGET_S:.0f} s), {size_mb:.1f} MB "
        f"(budget {BUDGET_MB:.0f} MB): {'within budget' if ok else 'OVER BUDGET'}; {out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
