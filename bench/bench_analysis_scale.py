"""Analysis at scale (issue 33): `etstore critical-path` and `etstore breakdown` of stored 1M, 10M
and 100M-op traces, read a unit of ranks at a time.

Input: the traces of ``bench_ingest_scale.py`` (``bench/gen_et.py``, 6,100 ops per rank: 164,
1,640 and 16,384 ranks; the files cached under ``bench/out/ingest_scale/``), each ingested once
into a fresh store (``etstore ingest DIR``, untimed here) in a temporary directory that is
removed afterwards. Each run is the whole command in a fresh process (start-up, reading,
computing, printing); wall time and peak RSS come from the child's own resource usage
(``os.wait4``: the child's ``ru_maxrss``, which on Linux starts from this small parent's):

* ``critical_path``: ``etstore critical-path NAME --table summary --format json``;
* ``breakdown``: ``etstore breakdown NAME --table ranks --format json`` (per rank: the device
  activities and their launches, every op and dependency read);
* ``breakdown_collectives``: ``etstore breakdown NAME --table collectives --format csv``, every
  row written (to a temporary file): the instance aggregation and each unit's rows;
* with ``--in-memory``, the same analyses as the commands ran them before, for comparison: the
  whole trace loaded (``Store.load``), then ``critical_path`` (up to 10M ops) or ``breakdown``
  (1M only: it pairs collectives in time quadratic in their number) in a child.

One JSON line per run, then one per size and command: median, range, peak RSS.

Usage::

    python bench/bench_analysis_scale.py                       # 1M and 10M, 3 runs each
    python bench/bench_analysis_scale.py --sizes 100M --repeat 1
    python bench/bench_analysis_scale.py --sizes 1M --in-memory
    python bench/bench_analysis_scale.py --sizes 100M --repeat 1 --memory-budget 1GiB --clean
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_ingest_scale import SIZES, _etstore, _generate  # noqa: E402

PY = f"{platform.python_implementation()} {platform.python_version()}"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, {PY}"
NAME = "scale"
COMMANDS = {
    "critical_path": ["critical-path", NAME, "--table", "summary", "--format", "json"],
    "breakdown": ["breakdown", NAME, "--table", "ranks", "--format", "json"],
    "breakdown_collectives": ["breakdown", NAME, "--table", "collectives", "--format", "csv"],
}
IN_MEMORY = {  # what the commands ran before, and the largest size each is run at
    "critical_path": ("from etstore.analysis import critical_path as f", 11_000_000),
    "breakdown": ("from etstore.analysis.breakdown import breakdown as f", 1_100_000),  # quadratic
}
_IN_MEMORY = """
import sys
from etstore.store import EmbeddedStore
{imp}
with EmbeddedStore(sys.argv[1], read_only=True) as s:
    trace = s.load(sys.argv[2])
f(trace)
"""


def timed(cmd: list[str], out_path: Path, budget: str | None = None) -> dict[str, float]:
    """Run ``cmd`` in a child writing stdout to ``out_path`` (``ETSTORE_MEMORY_BUDGET=budget`` when
    given): wall s, CPU s, peak RSS MiB."""
    started = time.perf_counter()
    env = {**os.environ, "CI": "true"}
    if budget:
        env["ETSTORE_MEMORY_BUDGET"] = budget
    with out_path.open("wb") as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode()[-2000:]}")
    return {
        "seconds": seconds,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
    }


def ingest(files: Path, store: Path) -> float:
    """``etstore ingest FILES --name scale`` into ``store``; its wall seconds."""
    started = time.perf_counter()
    cmd = [_etstore(), "--store", str(store), "ingest", str(files), "--name", NAME, "--format", "json"]
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


def summary(
    size: str, ops: int, what: str, runs: list[dict[str, float]], budget: str | None
) -> dict[str, object]:
    seconds = [r["seconds"] for r in runs]
    peaks = [r["peak_rss_mib"] for r in runs]
    return {
        "metric": f"{what}_s",
        "size": size,
        "value": round(statistics.median(seconds), 2),
        "unit": "s",
        "n": ops,
        "runs": len(runs),
        "range_s": [round(min(seconds), 2), round(max(seconds), 2)],
        "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 1),
        "peak_rss_mib": round(statistics.median(peaks)),
        "peak_rss_range_mib": [round(min(peaks)), round(max(peaks))],
        "bytes_per_op": round(statistics.median(peaks) * (1 << 20) / ops),
        "memory_budget": budget or "default",
        "budget": "peak RSS <= 4096 MiB at 100M",
        "machine": MACHINE,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,10M", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "ingest_scale", help="the generated files")
    ap.add_argument(
        "--work", type=Path, default=None, help="where the temporary stores go (default: $TMPDIR)"
    )
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"of {', '.join(COMMANDS)}")
    ap.add_argument("--in-memory", action="store_true", help="also the whole-trace analyses")
    ap.add_argument(
        "--memory-budget",
        action="append",
        default=None,
        help="run the commands again with ETSTORE_MEMORY_BUDGET set to this (repeatable): it sets "
        "DuckDB's memory limit, so its cache of the blocks read, and how many ops are solved at once",
    )
    ap.add_argument("--clean", action="store_true", help="remove each size's generated files after its runs")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    for size in sizes:
        if size not in SIZES:
            ap.error(f"unknown size {size}; expected {', '.join(SIZES)}")
    for size in sizes:
        files = args.out / size
        _generate(files, SIZES[size])
        with tempfile.TemporaryDirectory(dir=args.work, prefix="etstore-bench-analysis-") as tmp:
            store = Path(tmp) / "store"
            ingest_s = ingest(files, store)
            ops = 6100 * SIZES[size]
            print(
                json.dumps(
                    {
                        "metric": "analysis_scale_input",
                        "size": size,
                        "ops": ops,
                        "ingest_s": round(ingest_s, 1),
                    }
                )
            )
            todo = [
                (what, [_etstore(), "--store", str(store), *COMMANDS[what]])
                for what in args.commands.split(",")
            ]
            for what, (imp, most) in IN_MEMORY.items():
                if args.in_memory and ops <= most:
                    code = _IN_MEMORY.format(imp=imp)
                    todo.append((f"{what}_in_memory", [sys.executable, "-c", code, str(store), NAME]))
            for budget in [None, *(args.memory_budget or [])]:
                for what, cmd in todo:
                    if budget and "in_memory" in what:
                        continue
                    runs = []
                    for i in range(args.repeat if "in_memory" not in what or ops < 2_000_000 else 1):
                        run = timed(cmd, Path(tmp) / "out", budget)
                        runs.append(run)
                        rounded = {k: round(v, 2) for k, v in run.items()}
                        line = {
                            "metric": f"{what}_run",
                            "size": size,
                            "run": i,
                            "memory_budget": budget,
                            **rounded,
                        }
                        print(json.dumps(line), flush=True)
                    print(json.dumps(summary(size, ops, what, runs, budget)), flush=True)
        if args.clean:  # the files and the note that they are complete
            shutil.rmtree(files)
            files.with_name(f"{files.name}.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
