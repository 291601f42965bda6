"""Start-up benchmark: the whole ``etstore`` command as a user runs it, in a fresh process.

Prints one JSON line per command: ``{"metric", "median_wall_s", "median_cpu_s", "min_wall_s",
"max_wall_s", "runs", "budget_s", "machine"}``. Each run is a new process (the console
script next to this interpreter, else ``python -m etstore.cli``), timed from outside: wall
seconds by a monotonic clock around the child, CPU seconds (user + system) from the
kernel's accounting of the finished child. Medians are what to quote; CPU is robust to other
load on a shared machine, wall is what the user waits.

Commands (issue 16 items 3 and 5) and their budgets on this machine:

- ``python -c pass``: the interpreter alone, the floor under everything below;
- ``python -c "import numpy, pyarrow, pyarrow.compute"``: the array libraries every command
  that reads, builds or simulates a trace loads (the floor under ``synth`` and ``sim``);
- ``etstore --version`` and ``etstore --help``: ≤ 0.1 s;
- ``etstore ls`` on a small store (one 2-rank workload): ≤ 0.3 s;
- ``etstore synth --topo mesh2d:16x8 --coll allreduce`` with the default trials, the result
  stored: ≤ 0.2 s (the TACOS paper: 1.08 s at 128 NPUs). Every run gets its own copy of the
  small store, made outside the timing, so each run stores a new algorithm.

Usage::

    python bench/bench_startup.py            # 7 runs per command after one warm-up
    python bench/bench_startup.py --runs 15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MACHINE = (
    f"{platform.machine()} {os.cpu_count()} cpu, "
    f"{platform.python_implementation()} {platform.python_version()}"
)


def _etstore() -> list[str]:
    """How a user starts etstore: the console script beside this interpreter, if installed."""
    script = Path(sys.executable).parent / "etstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "etstore.cli"]


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child running ``argv`` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _measure(
    metric: str,
    argv: list[str],
    runs: int,
    budget_s: float | None,
    env: dict[str, str],
    prepare: Callable[[], None] = lambda: None,
) -> dict[str, object]:
    """Median wall and CPU of ``runs`` fresh processes after one warm-up; ``prepare`` runs untimed
    before each."""
    walls, cpus = [], []
    for i in range(runs + 1):
        prepare()
        wall, cpu = _timed(argv, env)
        if i:  # the first fills the OS page cache and the bytecode caches
            walls.append(wall)
            cpus.append(cpu)
    row: dict[str, object] = {
        "metric": metric,
        "median_wall_s": round(statistics.median(walls), 3),
        "median_cpu_s": round(statistics.median(cpus), 3),
        "min_wall_s": round(min(walls), 3),
        "max_wall_s": round(max(walls), 3),
        "runs": runs,
        "budget_s": budget_s,
        "machine": MACHINE,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed runs per command (after one warm-up)")
    args = ap.parse_args()

    from bench_sim import installed_env  # the bench's own set-up, not a measured import

    from etstore.store import EmbeddedStore
    from etstore.workloads import transformer

    et = _etstore()
    with tempfile.TemporaryDirectory(prefix="etstore-startup-") as tmp:
        small, run_store = Path(tmp) / "small", Path(tmp) / "run"
        with EmbeddedStore(small) as s:
            s.ingest(transformer(ranks=2, layers=1, tp=1), name="small")
        # bytecode cached as an installed package has it (the warm-up run writes it)
        env = {**installed_env(Path(tmp) / "pycache"), "ETSTORE_STORE": str(small)}

        def fresh_copy() -> None:
            shutil.rmtree(run_store, ignore_errors=True)
            shutil.copytree(small, run_store)

        _measure("python -c pass (interpreter floor)", [sys.executable, "-c", "pass"], args.runs, None, env)
        arrays = "import numpy, pyarrow, pyarrow.compute"
        _measure(f"python -c {arrays!r} (array floor)", [sys.executable, "-c", arrays], args.runs, None, env)
        _measure("etstore --version", [*et, "--version"], args.runs, 0.1, env)
        _measure("etstore --help", [*et, "--help"], args.runs, 0.1, env)
        _measure("etstore ls (small store)", [*et, "ls"], args.runs, 0.3, env)
        synth = [*et, "--store", str(run_store), "synth", "--topo", "mesh2d:16x8", "--coll", "allreduce"]
        _measure(
            "etstore synth --topo mesh2d:16x8 --coll allreduce (stored)",
            synth,
            args.runs,
            0.2,
            env,
            prepare=fresh_copy,
        )
        no_store = [*synth, "--no-store"]
        _measure("same, --no-store", no_store, args.runs, None, env)


if __name__ == "__main__":
    main()
