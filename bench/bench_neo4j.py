"""Neo4j beside the embedded store: ingest ops/s and Cypher latencies on the same trace.

Uses the seeded synthetic trace of ``bench_ingest.py`` (written to ``bench/out`` on
first use), ingests it into a fresh embedded store and into the Neo4j server at
``--url`` / ``$ETSTORE_TEST_NEO4J`` (``scripts/neo4j.sh start`` prints one), then
times a point lookup by uid and a 5-hop dependency walk on each. Prints one JSON
line per measurement with a ``backend`` field. The bench trace is removed from the
server afterwards; nothing else there is touched.

    python bench/bench_neo4j.py [--ops 1000000] [--ranks 64] [--url neo4j://...] [--reps 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import OUT, emit, synthetic

from etstore.ingest import read_et, write_et
from etstore.model import Trace
from etstore.store import open_store

POINT = "MATCH (o:Op {uid: $u}) RETURN o.name, o.duration_micros"
WALK = "MATCH (o:Op {uid: $u})-[:DEP*5..5]->(x:Op) RETURN count(x)"


def measure(backend: str, store: Any, trace: Trace, reps: int) -> None:
    """Ingest ``trace`` into ``store`` and time the two queries; emits JSON lines."""
    t0 = time.perf_counter()
    report = store.ingest(trace, name=f"bench_{trace.num_ops}")
    seconds = time.perf_counter() - t0
    emit(
        "store_ingest_rate",
        trace.num_ops / seconds,
        "ops/s",
        trace.num_ops,
        backend=backend,
        seconds=round(seconds, 2),
        deps=trace.num_deps,
        messages=report.trace.messages,
    )
    name = report.trace.name
    base = int(store.sql("SELECT min(uid) FROM ops WHERE trace = $t", {"t": name}).scalar())
    for metric, query, budget in (("point_lookup", POINT, "< 1 ms"), ("walk_5_hops", WALK, "< 5 ms")):
        for i in range(10):  # warm caches and query plans
            store.cypher(query, {"u": base + (i * 104729) % trace.num_ops})
        t0 = time.perf_counter()
        for i in range(reps):
            store.cypher(query, {"u": base + (i * 7919) % trace.num_ops})
        emit(
            f"{metric}_latency",
            (time.perf_counter() - t0) / reps * 1e3,
            "ms",
            trace.num_ops,
            backend=backend,
            budget=budget,
        )
    t0 = time.perf_counter()
    store.remove(name)
    emit("remove", time.perf_counter() - t0, "s", trace.num_ops, backend=backend)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--url", default=os.environ.get("ETSTORE_TEST_NEO4J"))
    ap.add_argument("--skip-embedded", action="store_true")
    args = ap.parse_args()
    if not args.url:
        print("bench_neo4j: no server; pass --url or export ETSTORE_TEST_NEO4J=$(scripts/neo4j.sh start)")
        return 0
    src = OUT / f"ingest_{args.ops}_{args.ranks}"
    if not (src / "bench.0.et").exists():
        write_et(synthetic(args.ops, args.ranks), src / "bench")
    trace = read_et(src)
    tmp = Path(tempfile.mkdtemp(prefix="etstore-bench-"))
    try:
        if not args.skip_embedded:
            with open_store(tmp / "store", write=True) as store:  # type: ignore[attr-defined]
                measure("embedded", store, trace, args.reps)
        os.environ.setdefault("ETSTORE_WAREHOUSE", str(tmp / "warehouse"))
        with open_store(args.url, write=True) as store:  # type: ignore[attr-defined]
            stale = [t.name for t in store.traces() if t.name == f"bench_{trace.num_ops}"]
            for name in stale:
                store.remove(name)
            measure("neo4j", store, trace, args.reps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
