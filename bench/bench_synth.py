"""Synthesis benchmark: TACOS-style All-Gather and All-Reduce on 2D meshes and 3D tori.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``
and a final fit of the growth exponent (time ∝ N^b over the 2D-mesh series).

Budget (DESIGN.md): 128-NPU All-Reduce < 0.1 s; 1024-NPU mesh All-Gather < 10 s;
growth well below cubic at equal schedule quality. Anchors: the TACOS paper reports
1.08 s for 128 NPUs; C++ TACOS measured on this kind of machine (All-Gather, 1
chunk/NPU, 2D mesh) takes 0.12 / 0.85 / 7.9 / 68 s at 128 / 256 / 512 / 1024 NPUs
(≈ N^3.2). Each measurement is one ``synthesize`` call (greedy search and the
algorithm trace), 1 GiB buffer, 1 chunk per NPU, seed 0, after one warm-up call;
``cpu_s`` is process time (robust to other load), ``wall_s`` wall-clock time.

Usage::

    python bench/bench_synth.py               # meshes 16..1024 and tori, AG and AR, trials=1
    python bench/bench_synth.py --max-npus 256
    python bench/bench_synth.py --trials 8    # the default trial budget (stops at the bound)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etstore.collectives.synth import synthesize
from etstore.topology import parse_topology

MACHINE = (
    f"{platform.machine()} {os.cpu_count()} cpu, "
    f"{platform.python_implementation()} {platform.python_version()}"
)
MESHES = [
    "mesh2d:4x4",
    "mesh2d:8x4",
    "mesh2d:8x8",
    "mesh2d:16x8",
    "mesh2d:16x16",
    "mesh2d:32x16",
    "mesh2d:32x32",
]
TORI = ["torus3d:4x4x4", "torus3d:8x4x4", "torus3d:8x8x4", "torus3d:8x8x8", "torus3d:16x8x8"]
TACOS_CPP_S = {128: 0.12, 256: 0.85, 512: 7.9, 1024: 68.0}
BUDGET_S = {("allreduce", 128): 0.1, ("allgather", 1024): 10.0}


def measure(spec: str, coll: str, trials: int) -> dict[str, object]:
    topo = parse_topology(spec)
    c0, w0 = time.process_time(), time.perf_counter()
    r = synthesize(topo, coll=coll, chunks_per_npu=1, trials=trials, seed=0)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    n = topo.num_npus
    row: dict[str, object] = {
        "metric": f"synth_{coll}_s",
        "value": round(cpu, 4),
        "unit": "s",
        "n": n,
        "machine": MACHINE,
        "topology": spec,
        "cpu_s": round(cpu, 4),
        "wall_s": round(wall, 4),
        "trials_run": r.trials,
        "transfers": len(r.schedule),
        "ops": r.trace.num_ops,
        "time_ns": r.time_ns,
        "lower_bound_ns": r.lower_bound_ns,
        "ratio": round(r.ratio, 6),
    }
    if coll == "allgather" and spec.startswith("mesh2d") and n in TACOS_CPP_S:
        row["anchor_tacos_cpp_s"] = TACOS_CPP_S[n]
        row["speedup_vs_anchor"] = round(TACOS_CPP_S[n] / cpu, 1)
    if n == 128:
        row["anchor_tacos_paper_s"] = 1.08
    if (coll, n) in BUDGET_S and spec.startswith("mesh2d"):
        row["budget_s"] = BUDGET_S[(coll, n)]
        row["within_budget"] = cpu < BUDGET_S[(coll, n)]
    return row


def fit_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(time) against log(N)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-npus", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--skip-tori", action="store_true")
    args = ap.parse_args()
    synthesize("ring:4", coll="allreduce")  # warm-up: imports, pyarrow kernels
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    specs = MESHES + ([] if args.skip_tori else TORI)
    for spec in specs:
        if parse_topology(spec).num_npus > args.max_npus:
            continue
        for coll in ("allgather", "allreduce"):
            row = measure(spec, coll, args.trials)
            print(json.dumps(row), flush=True)
            family = spec.split(":")[0]
            series.setdefault((family, coll), []).append((int(row["n"]), float(row["cpu_s"])))
    for (family, coll), points in series.items():
        big = [(n, t) for n, t in points if n >= 64]
        if len(big) >= 2:
            row = {
                "metric": f"synth_{coll}_growth_exponent",
                "value": round(fit_exponent(big), 2),
                "unit": "b in time ∝ N^b (N >= 64)",
                "n": [n for n, _ in big],
                "topology": family,
                "machine": MACHINE,
                "anchor_tacos_cpp": 3.2,
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
