"""Synthesis benchmark: time and peak memory of TACOS-style synthesis up to 16,384 NPUs.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``,
then the fitted growth exponents (time ∝ N^b and memory ∝ N^b over the 2D-mesh series).

Every measurement runs in its own process, so ``peak_rss_mb`` is that process's peak
(``ru_maxrss``): one ``synthesize`` call (the greedy search, the compact schedule),
then — up to ``--trace-up-to`` NPUs (default 2,048) — building the algorithm trace from it
(``result.trace``: send/recv/reduce nodes and their dependencies). 1 GiB buffer, 1
chunk per NPU, seed 0. ``schedule_s``/``trace_s`` are process (CPU) times, robust to
other load; ``wall_s`` the whole child.

Budget (DESIGN.md and issue 16): 128-NPU All-Reduce < 0.1 s; 1024-NPU mesh All-Gather
< 10 s; 64×64 (4,096 NPUs) All-Gather ≤ 4 GB; a 16,384-NPU mesh All-Gather completes on
this 24 GB machine; growth well below cubic at equal schedule quality. Anchors: C++
TACOS measured on this kind of machine (2D-mesh All-Gather, 1 chunk/NPU): 0.12 / 0.85 /
7.9 / 68 s at 128 / 256 / 512 / 1024 NPUs (≈ N^3.2); the TACOS paper: 1.08 s at 128
NPUs and 40K NPUs in 2.52 h.

Usage::

    python bench/bench_synth.py                     # 2D meshes 128..4096, All-Gather (and All-Reduce
                                                    # up to 2,048)
    python bench/bench_synth.py --max-npus 16384    # adds 8,192 and 16,384 (≈ 40 min CPU, 6.6 GB)
    python bench/bench_synth.py --cli               # `etstore synth --topo mesh2d:16x8 --coll allreduce`
    python bench/bench_synth.py --one mesh2d:64x64 allgather --no-trace
    python bench/bench_synth.py --one mesh2d:64x64 allgather --parts 2097152   # trace in rank ranges
    python bench/bench_synth.py --stored mesh2d:32x32,mesh2d:64x32   # the stored command's peak RSS
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MACHINE = (
    f"{platform.machine()} {os.cpu_count()} cpu, "
    f"{platform.python_implementation()} {platform.python_version()}"
)
MESHES = [
    "mesh2d:16x8",
    "mesh2d:16x16",
    "mesh2d:32x16",
    "mesh2d:32x32",
    "mesh2d:64x32",
    "mesh2d:64x64",
    "mesh2d:128x64",
    "mesh2d:128x128",
]
TACOS_CPP_S = {128: 0.12, 256: 0.85, 512: 7.9, 1024: 68.0}
TACOS_PAPER = {"npus": 40_000, "s": 2.52 * 3600, "s_at_128": 1.08}
BUDGET = {("allreduce", 128, "schedule_s"): 0.1, ("allgather", 1024, "schedule_s"): 10.0}
RSS_BUDGET_MB = {4096: 4000.0}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def one(spec: str, coll: str, trials: int, trace: bool, parts: int | None = None) -> dict[str, object]:
    """Measure one synthesis in this process (the child side); ``parts``: build the trace as
    ``result.trace_parts(parts)``, dropping each part (a streamed store's ingest), not whole."""
    from etstore.algorithms.synth import synthesize
    from etstore.topology import parse_topology

    topo = parse_topology(spec)
    c0 = time.process_time()
    r = synthesize(topo, coll=coll, chunks_per_npu=1, trials=trials, seed=0)
    c1 = time.process_time()
    rss_schedule = _peak_rss_mb()
    row: dict[str, object] = {
        "n": topo.num_npus,
        "topology": spec,
        "collective": coll,
        "schedule_s": round(c1 - c0, 4),
        "schedule_peak_rss_mb": round(rss_schedule, 1),
        "schedule_mb": round(r.schedule.nbytes / 2**20, 1),
        "transfers": len(r.schedule),
        "trials_run": r.trials,
        "time_ns": r.time_ns,
        "lower_bound_ns": r.lower_bound_ns,
        "ratio": round(r.ratio, 6),
    }
    if trace and parts is not None:
        ops = count = biggest = 0
        for part in r.trace_parts(parts):
            ops, count = ops + part.num_ops, count + 1
            biggest = max(biggest, part.ops.nbytes + part.deps.nbytes)
            del part
        row["trace_s"] = round(time.process_time() - c1, 4)
        row.update(ops=ops, max_ops=parts, parts=count, biggest_part_mb=round(biggest / 2**20, 1))
    elif trace:
        ops = r.trace.num_ops
        row["trace_s"] = round(time.process_time() - c1, 4)
        row["ops"] = ops
        row["trace_mb"] = round((r.trace.ops.nbytes + r.trace.deps.nbytes) / 2**20, 1)
    row["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    return row


def _child(args: list[str], timeout_s: float) -> dict[str, object] | None:
    began = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout_s, check=True
        )
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout_s}
    except subprocess.CalledProcessError as exc:
        return {"error": exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else str(exc)}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["wall_s"] = round(time.perf_counter() - began, 3)
    return row


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) against log(N)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def sweep(max_npus: int, trace_up_to: int, trials: int, timeout_s: float, colls: list[str]) -> None:
    base = _child(["--one", "ring:4", "allgather", "--trials", "1", "--no-trace"], timeout_s)
    baseline_mb = float(base["peak_rss_mb"]) if base and "peak_rss_mb" in base else 0.0
    print(json.dumps({"metric": "interpreter_baseline_rss_mb", "value": baseline_mb, "unit": "MB",
                      "n": 4, "machine": MACHINE}), flush=True)  # fmt: skip
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for spec in MESHES:
        n = math.prod(int(x) for x in spec.split(":")[1].split("x"))
        if n > max_npus:
            continue
        for coll in colls:
            if coll != "allgather" and n > trace_up_to:
                continue  # the big series is All-Gather (the and TACOS's case)
            flags = ["--trials", str(trials)] + ([] if n <= trace_up_to else ["--no-trace"])
            row = _child(["--one", spec, coll, *flags], timeout_s) or {}
            row = {"metric": f"synth_{coll}_s", "value": row.get("schedule_s"), "unit": "s", "n": n,
                   "machine": MACHINE, **row}  # fmt: skip
            if coll == "allgather" and n in TACOS_CPP_S and row.get("schedule_s"):
                row["anchor_tacos_cpp_s"] = TACOS_CPP_S[n]
                row["speedup_vs_anchor"] = round(TACOS_CPP_S[n] / float(row["schedule_s"]), 1)
            if n == 128:
                row["anchor_tacos_paper_s"] = TACOS_PAPER["s_at_128"]
            if (coll, n, "schedule_s") in BUDGET and row.get("schedule_s") is not None:
                row["budget_s"] = BUDGET[(coll, n, "schedule_s")]
                row["within_budget"] = float(row["schedule_s"]) < BUDGET[(coll, n, "schedule_s")]
            if coll == "allgather" and n in RSS_BUDGET_MB and "peak_rss_mb" in row:
                row["rss_budget_mb"] = RSS_BUDGET_MB[n]
                row["within_rss_budget"] = float(row["peak_rss_mb"]) <= RSS_BUDGET_MB[n]
            print(json.dumps(row), flush=True)
            if row.get("schedule_s"):
                series.setdefault((coll, "time"), []).append((n, float(row["schedule_s"])))
                grown = float(row["schedule_peak_rss_mb"]) - baseline_mb
                if grown > 0:
                    series.setdefault((coll, "memory"), []).append((n, grown))
    for (coll, what), points in series.items():
        if len(points) < 2:
            continue
        b = fit_exponent(points)
        row = {
            "metric": f"synth_{coll}_{what}_exponent",
            "value": round(b, 2),
            "unit": f"b in {what} ∝ N^b"
            + (" (peak RSS above the interpreter's)" if what == "memory" else ""),
            "n": [int(n) for n, _ in points],
            "machine": MACHINE,
        }
        if coll == "allgather" and what == "time":
            n_top, t_top = points[-1]
            at_40k = t_top * (TACOS_PAPER["npus"] / n_top) ** b
            row.update(anchor_tacos_cpp=3.2, extrapolated_40k_npus_s=round(at_40k, 1),
                       anchor_tacos_paper_40k_s=TACOS_PAPER["s"])  # fmt: skip
        print(json.dumps(row), flush=True)


def cli(runs: int) -> None:
    """Wall and CPU time of the whole command as a user runs it, a fresh process and store each time.

    Medians of ``runs`` (the first run only warms the file cache). CPU time (user + system
    of the child) is the figure to compare on a loaded machine.
    """
    for store in (True, False):
        walls, cpus = [], []
        for i in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, "-m", "etstore.cli", "--store", f"{tmp}/st", "synth",
                       "--topo", "mesh2d:16x8", "--coll", "allreduce"]  # fmt: skip
                if not store:
                    cmd.append("--no-store")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                began = time.perf_counter()
                subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if i or runs == 1:  # the first run warms the file cache
                    walls.append(time.perf_counter() - began)
                    cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        print(json.dumps({
            "metric": "cli_synth_allreduce_128_s" + ("" if store else "_no_store"),
            "value": round(statistics.median(walls), 3), "unit": "s", "n": 128, "machine": MACHINE,
            "cpu_s": round(statistics.median(cpus), 3), "runs": len(walls), "budget_s": 0.2,
            "anchor_tacos_paper_s": TACOS_PAPER["s_at_128"],
        }), flush=True)  # fmt: skip


def stored(specs: list[str], timeout_s: float) -> None:
    """Wall time and peak RSS of ``etstore synth --topo SPEC --coll allgather --trials 1`` with
    its result stored (a fresh store each), each in its own process."""
    for spec in specs:
        with tempfile.TemporaryDirectory() as tmp:
            row = _child(["--stored-one", spec, f"{tmp}/st"], timeout_s)
        print(json.dumps({"spec": spec, **(row or {}), "budget_mb_at_4096_npus": 4096}), flush=True)


def _stored_one(spec: str, store: str) -> dict[str, object]:
    """The whole stored command in this process (its peak RSS is this process's)."""
    from etstore.cli import main as etstore_main

    code = etstore_main(["--store", store, "synth", "--topo", spec, "--coll", "allgather", "--trials", "1",
                         "--format", "json"])  # fmt: skip
    return {"metric": "stored_synth_allgather", "spec": spec, "exit": code,
            "peak_rss_mb": round(_peak_rss_mb(), 1), "machine": MACHINE}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-npus", type=int, default=4096)
    ap.add_argument(
        "--trace-up-to",
        type=int,
        default=2048,
        help="build the trace up to this many NPUs (at 4,096 it needs ≈ 12 GB)",
    )
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600.0, help="per measurement, seconds")
    ap.add_argument("--colls", default="allgather,allreduce")
    ap.add_argument("--cli", action="store_true", help="time the whole `etstore synth` command instead")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--one", nargs=2, metavar=("SPEC", "COLL"), help="measure one synthesis in this process")
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--parts", type=int, metavar="MAX_OPS", help="with --one: build the trace in parts")
    ap.add_argument("--stored", metavar="SPECS", help="comma-separated meshes: the stored command's peak RSS")
    ap.add_argument("--stored-one", nargs=2, metavar=("SPEC", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stored_one:
        print(json.dumps(_stored_one(*args.stored_one)), flush=True)
    elif args.stored:
        stored(args.stored.split(","), args.timeout)
    elif args.one:
        row = one(args.one[0], args.one[1], args.trials, not args.no_trace, args.parts)
        print(json.dumps(row), flush=True)
    elif args.cli:
        cli(args.runs)
    else:
        sweep(args.max_npus, args.trace_up_to, args.trials, args.timeout, args.colls.split(","))


if __name__ == "__main__":
    main()
