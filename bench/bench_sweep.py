"""Sweeps fanned out: a 256-point bus-bandwidth sweep serial vs on Ray, and Ray's cost per point.

Prints one JSON line per measurement: ``{"metric", "value", "unit", ...}``.

* ``sweep_serial_s`` / ``sweep_ray_s``: the same 256 points (4 algorithms × 2 topologies × 32
  sizes, 64 NPUs) by :func:`etstore.app.sweeps.run_sweep` in this process and on a local Ray
  instance using every core; ``sweep_ray_s`` excludes starting Ray (``ray_start_s``, paid once
  per command) and ``ratio`` is serial / Ray. The rows are checked equal (``wall_s`` aside).
* ``ray_overhead_per_point_ms``: a 256-item map of a function that does nothing, on Ray, per
  item (batched as the sweeps batch them), and ``ray_overhead_per_task_ms`` one item per task.

Anchor: the serial sweep in the same run. Medians of ``--repeat`` runs.

Usage::

    python bench/bench_sweep.py [--repeat 3]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etstore.app.fanout import Fanout, fanout
from etstore.app.sweeps import run_sweep

MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}"
ALGOS = {"ring": "ring", "direct": "direct", "halving-doubling": "halving-doubling", "tree": "tree"}
TOPOS = ["mesh2d:8x8,bw=50,lat=500", "torus2d:8x8,bw=50,lat=500"]
SIZES = [1024 * 2**i for i in range(32)][:32]


def emit(metric: str, value: float, unit: str, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": round(value, 4), "unit": unit, "machine": MACHINE, **extra}))


def _nothing(item: int, _shared: Any) -> int:
    return item


def _timed_sweep(fan: Fanout) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = run_sweep(fan, SIZES, ALGOS, TOPOS)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    serial, ray_s, start_s, per_point, per_task = [], [], [], [], []
    with fanout() as fan:
        for _ in range(args.repeat):
            wall, expected = _timed_sweep(fan)
            serial.append(wall)
    assert expected.points.num_rows == 256 and not expected.failed
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        with fanout("local") as fan:
            start_s.append(time.perf_counter() - t0)
            fan.map(_nothing, list(range(64)))  # workers up before timing
            wall, got = _timed_sweep(fan)
            ray_s.append(wall)
            keep = [c for c in got.points.column_names if c != "wall_s"]
            assert got.points.select(keep).equals(expected.points.select(keep)), "Ray rows differ"
            t0 = time.perf_counter()
            fan.map(_nothing, list(range(256)))
            per_point.append((time.perf_counter() - t0) / 256 * 1e3)
            one = Fanout("ray", 256 * 4, fan.where)  # as many batches as items: one item per task
            t0 = time.perf_counter()
            one.map(_nothing, list(range(256)))
            per_task.append((time.perf_counter() - t0) / 256 * 1e3)
            workers = fan.workers
    med = statistics.median
    emit("sweep_serial_s", med(serial), "s", points=256, runs=serial)
    ratio = med(serial) / med(ray_s)
    emit("sweep_ray_s", med(ray_s), "s", points=256, workers=workers, runs=ray_s, ratio=ratio)
    emit("ray_start_s", med(start_s), "s", runs=start_s)
    emit("ray_overhead_per_point_ms", med(per_point), "ms", items=256, runs=per_point)
    emit("ray_overhead_per_task_ms", med(per_task), "ms", items=256, runs=per_task)


if __name__ == "__main__":
    main()
