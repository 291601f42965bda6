"""PyTorch trace ingest: the 8-rank DLRM run (execution traces + Kineto) read and stored.

Prints one JSON line per measurement (``metric``, ``value``, ``unit``, ``n``, ``median_s``,
``runs_s``, ``ratio_vs_anchor``, ``machine``); each figure is the median of ``--reps``
runs, because the machine is shared.

Anchor: decoding the same 16 JSON files with the standard library's ``json`` — the floor
any Python reader of these files pays before it looks at an event. Chakra's own pipeline
(``chakra_trace_link`` + ``chakra_converter``) is not installable from PyPI, so it is not
timed here; the decode rates of ``orjson`` (what the readers use when installed) and, if
present, ``simdjson`` are printed beside ``json``.

    python bench/bench_pytorch.py [--fixtures ../shared/fixtures/pytorch] [--reps 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_FIXTURES = HERE.parent.parent / "shared" / "fixtures" / "pytorch"
MACHINE = f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}"


def emit(metric: str, value: float, unit: str, n: int, runs: list[float], anchor: float | None) -> None:
    print(
        json.dumps(
            {
                "metric": metric,
                "value": round(value, 1),
                "unit": unit,
                "n": n,
                "median_s": round(statistics.median(runs), 4),
                "runs_s": [round(r, 4) for r in runs],
                "ratio_vs_anchor": None if anchor is None else round(value / anchor, 2),
                "machine": MACHINE,
            }
        ),
        flush=True,
    )


def timed(work: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    """Wall times of ``reps`` runs and the last result; the cyclic GC pauses during each run,
    as it does inside the readers (a decoded trace is millions of acyclic dicts and lists)."""
    runs, result = [], None
    for _ in range(reps):
        result = None
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            result = work()
            runs.append(time.perf_counter() - t)
        finally:
            gc.enable()
    return runs, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    et_dir, kineto_dir = args.fixtures / "dlrm_8r_et", args.fixtures / "dlrm_8r_kineto"
    if not et_dir.is_dir() or not kineto_dir.is_dir():
        print(f"bench_pytorch: no DLRM fixtures under {args.fixtures}; nothing measured", file=sys.stderr)
        return

    from etstore.formats import read_trace
    from etstore.store import open_store

    files = sorted(et_dir.glob("*.json")) + sorted(kineto_dir.glob("*.json"))
    blobs = [f.read_bytes() for f in files]
    mib = sum(len(b) for b in blobs) / 2**20

    runs, _ = timed(lambda: [json.loads(b) for b in blobs], args.reps)
    anchor = mib / statistics.median(runs)
    emit("decode_json", anchor, "MiB/s", len(files), runs, None)
    for module in ("orjson", "simdjson"):
        try:
            parser = __import__(module)
        except ImportError:
            print(f"bench_pytorch: {module} not installed; skipped", file=sys.stderr)
            continue
        loads = parser.loads if module == "orjson" else parser.Parser().parse
        runs, _ = timed(lambda loads=loads: [loads(b) for b in blobs], args.reps)
        emit(f"decode_{module}", mib / statistics.median(runs), "MiB/s", len(files), runs, anchor)

    with tempfile.TemporaryDirectory() as tmp:
        linked = Path(tmp) / "dlrm"
        linked.mkdir()
        for f in files:  # one directory: each rank's ET beside its Kineto trace, as users keep them
            (linked / f.name).symlink_to(f)
        for metric, spec in (
            ("read_et_alone", et_dir),
            ("read_kineto_alone", kineto_dir),
            ("read_linked", linked),
        ):
            runs, trace = timed(lambda spec=spec: read_trace(spec), args.reps)
            ops = trace.num_ops
            emit(metric, ops / statistics.median(runs), "ops/s", ops, runs, None)
        ingest_runs, ops = [], 0
        for i in range(args.reps):
            store_dir = Path(tmp) / f"store{i}"
            gc.collect()
            t = time.perf_counter()
            with open_store(store_dir, write=True) as store:
                ops = store.ingest(read_trace(linked)).trace.ops
            ingest_runs.append(time.perf_counter() - t)
            shutil.rmtree(store_dir)
        emit(
            "ingest_linked_end_to_end", ops / statistics.median(ingest_runs), "ops/s", ops, ingest_runs, None
        )


if __name__ == "__main__":
    main()
