"""Opportunity finders on a real expanded trace: the demo's DLRM with every collective expanded.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

Input: the shipped 8-rank DLRM recording (``examples/dlrm_8r``, PyTorch ET + Kineto), stored,
then every collective expanded as ``etstore demo`` does (all-reduce ``ring:2``, all-to-all
``direct``): ≈ 17,700 ops. One simulation on ``switch:8`` gives the timings; each finder
(``overlap``, ``chunk``, ``reorder``) then runs alone against that recorded run, best of
``--repeat``, with its estimates and with each opportunity simulated (the default), and
prints its seconds and the opportunities it found; then the recording's own opportunities
(hoists in its lanes, each replayed). No external anchor exists; the reorder finder's own
earlier figure (> 400 s, when a bypassed edge was put back once per path) is the reference
for its complexity.

Usage::

    python bench/bench_overlap.py
    python bench/bench_overlap.py --repeat 5
"""

from __future__ import annotations

import argparse
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

from etstore.app.expand import expand_stored  # noqa: E402
from etstore.app.overlap import OPPORTUNITY_KINDS, find_opportunities  # noqa: E402
from etstore.app.runs import record_run  # noqa: E402
from etstore.formats import read_trace  # noqa: E402
from etstore.sim import simulate  # noqa: E402
from etstore.store import EmbeddedStore  # noqa: E402
from etstore.topology import parse_topology  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
DLRM = ROOT / "examples" / "dlrm_8r"
TOPOLOGY = "switch:8,bw=50,lat=500"


def emit(metric: str, value: float, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per finder (the best is printed)")
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="etstore-bench-overlap-") as tmp,
        EmbeddedStore(Path(tmp) / "s") as s,
    ):
        s.ingest(read_trace(DLRM), name="dlrm")
        done = expand_stored(s, "dlrm", {"allreduce": "ring:2", "alltoall": "direct"})
        name = done.report.trace.name
        trace = s.load(name)
        run = record_run(s.warehouse, simulate(trace, parse_topology(TOPOLOGY)), trace_name=name)
        for kind in OPPORTUNITY_KINDS:
            for measure in (False, True):
                best, found = float("inf"), 0
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    found = find_opportunities(s, name, run_id=run, kinds=[kind], measure=measure).num_rows
                    best = min(best, time.perf_counter() - t0)
                metric = f"find_{kind}{'_measured' if measure else ''}_s"
                emit(metric, round(best, 3), "s", trace.num_ops, found=found, ranks=trace.num_ranks)
        # the recording itself: hoists in its lanes, each measured by replaying the step
        recorded = s.load("dlrm")
        best, found, gains = float("inf"), 0, 0.0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            table = find_opportunities(s, "dlrm", kinds=["overlap"])
            best = min(best, time.perf_counter() - t0)
            found, gains = table.num_rows, sum(table["gain_ns"].to_pylist())
        emit("find_recorded_overlap_s", round(best, 3), "s", recorded.num_ops, found=found, gain_ns=gains)


if __name__ == "__main__":
    main()
