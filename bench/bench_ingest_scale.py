"""Ingest at scale (issue 33): `etstore ingest DIR` of 1M, 10M and 100M-op multi-rank traces.

Each size is a directory of per-rank ``.et`` files written by ``bench/gen_et.py`` (6,100 ops
per rank: 164, 1,640 and 16,384 ranks), cached under ``bench/out/ingest_scale/``. Each run
is the whole command in a fresh process into a fresh store (what a user waits for: start-up,
recognising the files, decoding, storing); its wall time and peak RSS come from the child's
own resource usage (``os.wait4``). One JSON line per run, then one per size: ops, seconds,
ops/s, peak RSS, the store's size on disk, the rate's ratio to the 1M rate, and the marginal
rate (the ops added since the size before over the seconds added: equal marginal rates mean
time linear in ops, whatever the fixed costs).

Usage::

    python bench/bench_ingest_scale.py                      # 1M and 10M
    python bench/bench_ingest_scale.py --sizes 100M         # 16,384 ranks (~9.6 GB of files)
    python bench/bench_ingest_scale.py --sizes 1M,10M --repeat 3

The generated files stay for the next run (``--clean`` removes each size's after it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPS_PER_RANK = 6100
SIZES = {"1M": 164, "10M": 1640, "100M": 16384}  # ranks


def _generate(out: Path, ranks: int) -> None:
    """The size's files, unless a complete set is there already."""
    done = out.with_name(f"{out.name}.json")  # beside the files: a directory holds one trace
    if done.is_file() and json.loads(done.read_text()).get("ranks") == ranks:
        return
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    cmd = [sys.executable, str(HERE / "gen_et.py"), str(out), "--ranks", str(ranks)]
    cmd += ["--ops-per-rank", str(OPS_PER_RANK)]
    got = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    got.pop("metric", None)
    got["generate_s"] = round(time.perf_counter() - started, 1)
    done.write_text(json.dumps(got))
    print(json.dumps({"metric": "ingest_scale_input", **got}), flush=True)


def _etstore() -> str:
    found = shutil.which("etstore", path=str(Path(sys.executable).parent))
    return found or "etstore"


def ingest_once(files: Path, where: Path) -> dict[str, float]:
    """``etstore --store WHERE ingest FILES`` in a child process: wall s, peak RSS, ops."""
    store = where / "store"
    cmd = [_etstore(), "--store", str(store), "ingest", str(files), "--format", "json"]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise SystemExit(f"ingest failed ({child.returncode}): {err.read().decode()[-2000:]}")
        row = json.loads(out.read())[0]
    disk = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    shutil.rmtree(store)
    return {
        "ops": row["ops"],
        "seconds": seconds,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "store_mib": disk / (1 << 20),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,10M", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "ingest_scale")
    ap.add_argument("--clean", action="store_true", help="remove each size's files after its runs")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        ap.error(f"unknown size(s) {', '.join(unknown)}; expected {', '.join(SIZES)}")
    base_rate = None
    previous: tuple[int, float] | None = None  # ops and seconds of the size before
    for size in sizes:
        files = args.out / size
        _generate(files, SIZES[size])
        runs = []
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory(dir=args.out, prefix="store-") as where:
                run = ingest_once(files, Path(where))
            runs.append(run)
            line = {"metric": "ingest_scale_run", "size": size, "run": i, **_rounded(run)}
            print(json.dumps(line), flush=True)
        seconds = statistics.median(r["seconds"] for r in runs)
        ops = runs[0]["ops"]
        rate = ops / seconds
        base_rate = base_rate or (rate if size == "1M" else None)
        # the rate of the ops added since the size before: fixed costs (start-up, the first
        # part) cancel out, so equal marginal rates mean time linear in ops
        marginal = None if previous is None else (ops - previous[0]) / (seconds - previous[1])
        previous = (ops, seconds)
        print(
            json.dumps(
                {
                    "metric": "ingest_scale",
                    "size": size,
                    "ops": ops,
                    "ranks": SIZES[size],
                    "value": round(rate),
                    "unit": "ops/s",
                    "n": len(runs),
                    "seconds": round(seconds, 2),
                    "peak_rss_mib": round(statistics.median(r["peak_rss_mib"] for r in runs)),
                    "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 1),
                    "store_mib": round(runs[0]["store_mib"]),
                    "rate_vs_1M": None if base_rate is None else round(rate / base_rate, 2),
                    "marginal_ops_per_s": None if marginal is None else round(marginal),
                    "budget": "peak RSS <= 4096 MiB at 100M",
                    "machine": f"{os.cpu_count()} cores",
                }
            ),
            flush=True,
        )
        if args.clean:
            shutil.rmtree(files)
    return 0


def _rounded(run: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in run.items()}


if __name__ == "__main__":
    sys.exit(main())
