"""MSCCL-IR → algorithm DAG benchmark: ring all-reduce at 16 / 32 / 64 / 128 ranks.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

Input: ring all-reduce XML in the shape of ASTRA-sim's ``custom_allreduce.xml`` (only
``s``/``rrc``/``r`` steps, 4N-4 per GPU, so the public collectiveapi converter reads the
same file), written by ``bench/data/msccl_ring.py`` into ``bench/out/``. Timed: one
``read_msccl_xml`` call (read the file, parse, build the columnar trace with every node
and dependency), best of ``--repeat`` after a warm-up; ``cpu_ms`` is process time.

Anchors: the published converter's times 259 / 398 / 1485 / 7662 ms, and the public
converter measured on this kind of machine, 120 / 220 / 910 / 4260 ms (≈ N^2.3; it also
embeds the whole XML into every rank's file). Budget (DESIGN.md): 128 ranks < 80 ms in
memory, < 0.4 s stored, linear in the number of steps.

Extra rows at 128 ranks: the same algorithm from ``generate("ring")`` written with fused
steps (2N-1 per GPU), the checker, both writers, and (unless ``--no-store``) the
embedded store's ingest: read, parse and store into a fresh store (DuckDB and Ladybug
opened, loaded and checkpointed, the catalog row ready), in a fresh process as
``etstore ingest`` runs, best of ``--repeat``, with the median, CPU time and the
store's close beside it.

Usage::

    python bench/bench_msccl.py
    python bench/bench_msccl.py --ranks 16 32 --repeat 3 --no-store
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "data"))

from msccl_ring import write as write_ring_xml  # noqa: E402

from etstore.algorithms import check_algorithm, generate  # noqa: E402
from etstore.formats import write_algorithm_et, write_msccl_xml  # noqa: E402
from etstore.formats.msccl_xml import read_msccl_xml  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
PUBLISHED_MS = {16: 259, 32: 398, 64: 1485, 128: 7662}
MEASURED_CONVERTER_MS = {16: 120, 32: 220, 64: 910, 128: 4260}
BUDGET_MS = {128: 80}
OUT = ROOT / "bench" / "out"


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, float, float, float]:
    """Result, best wall ms, median wall ms, best CPU ms over ``repeat`` runs."""
    walls, cpus = [], []
    result = None
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        result = fn()
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return result, min(walls), statistics.median(walls), min(cpus)


def row(metric: str, value: float, unit: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"metric": metric, "value": round(value, 3), "unit": unit, "n": n, "machine": MACHINE, **extra}


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-store", action="store_true", help="skip the embedded-store ingest row")
    ap.add_argument("--store-only", type=int, metavar="RANKS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.store_only:
        print(json.dumps(store_row(args.store_only, args.repeat)), flush=True)
        return
    read_msccl_xml(write_ring_xml(OUT, 8))  # warm-up: imports, pyarrow kernels
    series: list[tuple[float, float]] = []
    last = None
    for n in args.ranks:
        path = write_ring_xml(OUT, n)
        trace, best, median, cpu = timed(lambda path=path: read_msccl_xml(path), args.repeat)
        steps = n * (4 * n - 4)
        r = row(
            "msccl_xml_to_dag_ms",
            best,
            "ms",
            n,
            median_ms=round(median, 3),
            cpu_ms=round(cpu, 3),
            steps=steps,
            ops=trace.num_ops,
            deps=trace.num_deps,
            bytes=path.stat().st_size,
            us_per_step=round(best * 1e3 / steps, 3),
            anchor_published_ms=PUBLISHED_MS.get(n),
            anchor_converter_measured_ms=MEASURED_CONVERTER_MS.get(n),
        )
        if n in PUBLISHED_MS:
            r["speedup_vs_published"] = round(PUBLISHED_MS[n] / best, 1)
            r["speedup_vs_converter_measured"] = round(MEASURED_CONVERTER_MS[n] / best, 1)
        if n in BUDGET_MS:
            r["budget_ms"] = BUDGET_MS[n]
            r["within_budget"] = best < BUDGET_MS[n]
        print(json.dumps(r), flush=True)
        series.append((steps, best))
        last = (n, trace)
    if len(series) >= 2:
        print(
            json.dumps(
                row(
                    "msccl_xml_to_dag_growth_exponent",
                    slope(series),
                    "b in time ∝ steps^b",
                    args.ranks[-1],
                    sizes=args.ranks,
                    anchor_converter="≈ N^2.3 (steps^1.15)",
                )
            ),
            flush=True,
        )
    if last is None:
        return
    n, trace = last
    with tempfile.TemporaryDirectory() as tmp:
        fused = generate("ring", coll="allreduce", ranks=n)
        fused_path = write_msccl_xml(fused, Path(tmp) / "fused.xml")
        t2, best, _, cpu = timed(lambda: read_msccl_xml(fused_path), args.repeat)
        print(
            json.dumps(
                row(
                    "msccl_xml_fused_to_dag_ms",
                    best,
                    "ms",
                    n,
                    cpu_ms=round(cpu, 3),
                    steps=n * (2 * n - 1),
                    ops=t2.num_ops,
                    deps=t2.num_deps,
                )
            ),
            flush=True,
        )
        _, best, _, _ = timed(lambda: generate("ring", coll="allreduce", ranks=n), 3)
        print(json.dumps(row("generate_ring_allreduce_ms", best, "ms", n, ops=fused.num_ops)), flush=True)
        report, best, _, _ = timed(lambda: check_algorithm(trace), 3)
        print(
            json.dumps(
                row(
                    "check_algorithm_ms",
                    best,
                    "ms",
                    n,
                    ok=report.ok,
                    ops=report.ops,
                    messages=report.messages,
                    depth=report.depth,
                )
            ),
            flush=True,
        )
        # 4N-4 steps per threadblock exceed the interpreter's 256 at N > 65: write it anyway
        _, best, _, _ = timed(lambda: write_msccl_xml(trace, Path(tmp) / "out.xml", check_limits=False), 3)
        print(json.dumps(row("write_msccl_xml_ms", best, "ms", n, steps=n * (4 * n - 4))), flush=True)
        _, best, _, _ = timed(
            lambda: write_algorithm_et(trace, Path(tmp) / "et" / "ring", coll_size=1 << 20), 3
        )
        print(json.dumps(row("write_algorithm_et_ms", best, "ms", n, files=n)), flush=True)
        if not args.no_store:  # in a fresh process, as `etstore ingest` runs it
            cmd = [sys.executable, __file__, "--store-only", str(n), "--repeat", str(args.repeat)]
            print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout, end="", flush=True)


def store_row(n: int, repeat: int) -> dict[str, Any]:
    """Read + parse + ingest into a fresh embedded store, best of ``repeat``."""
    from etstore.store import EmbeddedStore

    path = write_ring_xml(OUT, n)
    read_msccl_xml(path)  # warm-up: imports, pyarrow kernels
    walls, cpus, closes = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeat):  # a fresh store each time: nothing to deduplicate against
            with EmbeddedStore(Path(tmp) / f"store{rep}") as store:
                c0, w0 = time.process_time(), time.perf_counter()
                store.ingest(read_msccl_xml(path))
                walls.append((time.perf_counter() - w0) * 1e3)
                cpus.append((time.process_time() - c0) * 1e3)
                w0 = time.perf_counter()
            closes.append((time.perf_counter() - w0) * 1e3)
    best = min(walls)
    return row(
        "msccl_xml_to_store_ms",
        best,
        "ms",
        n,
        median_ms=round(statistics.median(walls), 3),
        cpu_ms=round(min(cpus), 3),
        close_ms=round(statistics.median(closes), 3),
        budget_ms=400,
        within_budget=best < 400,
        note="read + parse + embedded store ingest (engines opened, both loaded, graph checkpointed, "
        "catalog ready) into a fresh store, in a fresh process; best of --repeat",
    )


if __name__ == "__main__":
    main()
