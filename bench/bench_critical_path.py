"""Critical path on a large expanded workload: seconds and peak memory at 1M and 6M ops.

Prints one JSON line per measurement: ``{"metric", "value", "unit", "n", "machine", ...}``.

Input (fixed seed): ``etstore.workloads.transformer(ranks=8, tp=2, layers=L)`` — the
``etstore workload`` defaults — with every collective expanded by the ``ring`` generator
(``etstore expand --algo ring``): ≈ 192 ops and ≈ 9 topological generations per layer,
so ``L`` ≈ 5,200 for 1M ops (≈ 48k generations deep) and ≈ 31,000 for 6M. Each size runs
in a fresh child process, which builds the trace, then times
:func:`etstore.analysis.critical_path` on it (all ranks, across messages; the per-rank
paths included), median of ``--repeat``:

* ``critical_path_s``: seconds per call;
* ``critical_path_peak_rss_mib``: the child's peak resident memory while it ran,
  measured from a high-water mark reset after the trace was built (Linux
  ``/proc/self/clear_refs``), so the trace's own memory counts but building it does not;
  ``trace_rss_mib`` is what the child held before the call;
* with ``--runs``, ``critical_path_run_s``: the trace stored in a fresh embedded store,
  simulated on ``switch:8`` and recorded, then the path through that run
  (:func:`etstore.report.schedule_critical_path`, what ``etstore critical-path --run``
  prints), median of ``--repeat``; storing and simulating are not timed;
* with ``--stored``, ``critical_path_stored_s`` and ``critical_path_stored_peak_rss_mib``: the
  trace stored in a fresh embedded store by one child, then
  :func:`etstore.app.critical_path.stored_critical_path` (what ``etstore critical-path NAME``
  runs: a unit of ranks at a time, the units whose messages go back and forth solved together
  up to the memory budget) timed in another, its peak from the store's open on; the store is
  removed afterwards. ``--unit-ops`` and ``--max-group-ops`` set the units and their grouping.

Budget (issue 30 item 6): 6M ops in under a minute.

Usage::

    python bench/bench_critical_path.py
    python bench/bench_critical_path.py --ops 1000000 --repeat 5 --runs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from etstore.algorithms.expand import expand  # noqa: E402
from etstore.analysis import critical_path  # noqa: E402
from etstore.app.critical_path import stored_critical_path  # noqa: E402
from etstore.app.runs import record_run  # noqa: E402
from etstore.model import Trace  # noqa: E402
from etstore.report import schedule_critical_path  # noqa: E402
from etstore.report._data import run_infos  # noqa: E402
from etstore.sim import simulate  # noqa: E402
from etstore.store import EmbeddedStore  # noqa: E402
from etstore.topology import parse_topology  # noqa: E402
from etstore.workloads import transformer  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
BUDGET_6M_S = 60.0
PROBE_LAYERS = 100


def emit(metric: str, value: float, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "n": n, "machine": MACHINE, **extra}))


def expanded_workload(ops: int) -> Trace:
    """The 8-rank, tp=2 transformer with every collective expanded by ``ring``, ≈ ``ops`` ops."""
    probe = expand(transformer(ranks=8, tp=2, layers=PROBE_LAYERS, seed=0), "ring").trace.num_ops
    layers = max(1, round(ops * PROBE_LAYERS / probe))
    return expand(transformer(ranks=8, tp=2, layers=layers, seed=0, name="bench-cp"), "ring").trace


def _status_mib(field: str) -> float:
    """A ``VmRSS``/``VmHWM`` line of ``/proc/self/status`` in MiB (NaN off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ≥ 4.0); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_path(trace: Trace, repeat: int) -> None:
    """Store, simulate and record ``trace``, then time the path through the run (one JSON line)."""
    with tempfile.TemporaryDirectory(prefix="etstore-bench-cp-") as tmp, EmbeddedStore(Path(tmp) / "s") as s:
        s.ingest(trace, name=trace.name)
        run_id = record_run(s.warehouse, simulate(trace, parse_topology("switch:8")), trace_name=trace.name)
        (run,) = run_infos(s.warehouse, [run_id])
        times: list[float] = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            path = schedule_critical_path(s.warehouse, run)
            times.append(time.perf_counter() - t0)
    length_ns = float(path["end_ns"][-1].as_py() - path["start_ns"][0].as_py())
    emit(
        "critical_path_run_s",
        round(statistics.median(times), 3),
        "s",
        trace.num_ops,
        path_ops=path.num_rows,
        length_ns=length_ns,
        makespan_ns=run.total_ns,
        all_s=[round(t, 3) for t in times],
    )


def child(ops: int, repeat: int, runs: bool) -> None:
    """Build the trace, then time the critical path ``repeat`` times (one JSON line per size)."""
    trace = expanded_workload(ops)
    gc.collect()
    held = _status_mib("VmRSS")
    reset = _reset_peak()
    times: list[float] = []
    cp = None
    for _ in range(repeat):
        cp = None
        gc.collect()
        t0 = time.perf_counter()
        cp = critical_path(trace)
        times.append(time.perf_counter() - t0)
    assert cp is not None
    peak = _status_mib("VmHWM") if reset else float("nan")
    common = {
        "ranks": trace.num_ranks,
        "deps": trace.num_deps,
        "path_ops": cp.path.num_rows,
        "length_micros": cp.length_micros,
        "runs": repeat,
    }
    n = trace.num_ops
    seconds = statistics.median(times)
    extra = {"budget_s": BUDGET_6M_S, "within_budget": seconds < BUDGET_6M_S} if n >= 6_000_000 else {}
    emit("critical_path_s", round(seconds, 3), "s", n, **common, **extra, all_s=[round(t, 3) for t in times])
    emit("critical_path_peak_rss_mib", round(peak, 1), "MiB", n, trace_rss_mib=round(held, 1))
    if runs:
        del cp
        run_path(trace, repeat)


def store_child(ops: int, where: str) -> None:
    """Build the trace and store it at ``where`` (untimed)."""
    trace = expanded_workload(ops)
    with EmbeddedStore(where) as s:
        s.ingest(trace, name="bench-cp")


def stored_child(where: str, repeat: int, unit_ops: int | None, max_group_ops: int | None) -> None:
    """Time :func:`stored_critical_path` of the stored trace (one JSON line each for time and peak)."""
    kw = {k: v for k, v in (("unit_ops", unit_ops), ("max_group_ops", max_group_ops)) if v is not None}
    with EmbeddedStore(where, read_only=True) as s:
        info = s.info("bench-cp")
        gc.collect()
        held = _status_mib("VmRSS")
        reset = _reset_peak()
        times: list[float] = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            cp = stored_critical_path(s, "bench-cp", **kw)
            times.append(time.perf_counter() - t0)
        peak = _status_mib("VmHWM") if reset else float("nan")
    common = {"ranks": info.ranks, "path_ops": cp.path.num_rows, "length_micros": cp.length_micros, **kw}
    seconds = statistics.median(times)
    emit(
        "critical_path_stored_s",
        round(seconds, 3),
        "s",
        info.ops,
        **common,
        all_s=[round(t, 3) for t in times],
    )
    emit("critical_path_stored_peak_rss_mib", round(peak, 1), "MiB", info.ops, opened_rss_mib=round(held, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="1000000,6000000", help="comma-separated trace sizes (ops)")
    ap.add_argument("--repeat", type=int, default=3, help="calls per size (the median is printed)")
    ap.add_argument("--runs", action="store_true", help="also the path through a simulated run of each size")
    ap.add_argument("--stored", action="store_true", help="also the path of the trace stored, read by units")
    ap.add_argument("--unit-ops", type=int, default=None, help="with --stored: ops per unit of ranks")
    ap.add_argument("--max-group-ops", type=int, default=None, help="with --stored: most ops solved at once")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stored-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.repeat, args.runs)
        return
    if args.store_child is not None:
        store_child(int(args.ops), args.store_child)
        return
    if args.stored_child is not None:
        stored_child(args.stored_child, args.repeat, args.unit_ops, args.max_group_ops)
        return
    for ops in (int(x) for x in args.ops.split(",")):
        cmd = [sys.executable, __file__, "--child", str(ops), "--repeat", str(args.repeat)]
        cmd += ["--runs"] if args.runs else []
        subprocess.run(cmd, check=True)
        sys.stdout.flush()
        if not args.stored:
            continue
        with tempfile.TemporaryDirectory(prefix="etstore-bench-cp-") as tmp:
            where = str(Path(tmp) / "s")
            subprocess.run([sys.executable, __file__, "--ops", str(ops), "--store-child", where], check=True)
            cmd = [sys.executable, __file__, "--stored-child", where, "--repeat", str(args.repeat)]
            for flag, value in (("--unit-ops", args.unit_ops), ("--max-group-ops", args.max_group_ops)):
                cmd += [flag, str(value)] if value is not None else []
            subprocess.run(cmd, check=True)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
