"""Neo4j beside the embedded store: what a publish costs, and Cypher latencies on the same trace.

Uses the seeded synthetic trace of ``bench_ingest.py`` (written to ``bench/out`` on first
use), ingests it into a fresh embedded store (timed), publishes that store to the Neo4j
server at ``--url`` / ``$ETSTORE_TEST_NEO4J`` (``scripts/neo4j.sh start`` prints one;
timed: ops, edges and the lossless payload), times a reader's first SQL (its local copy
filled from the payload), then a point lookup by uid and a 5-hop dependency walk on the
store and on the server read through its URL. Prints one JSON line
per measurement with a ``backend`` field. Afterwards the bench trace is removed from the
store and the removal published (``--prune``, timed); nothing else on the server is touched.

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

from etstore.app.publish import publish
from etstore.formats import read_et, write_et
from etstore.model import Trace
from etstore.store import EmbeddedStore, open_store

POINT = "MATCH (o:Op {uid: $u}) RETURN o.name, o.duration_micros"
WALK = "MATCH (o:Op {uid: $u})-[:DEP*5..5]->(x:Op) RETURN count(x)"


def queries(backend: str, store: Any, name: str, ops: int, reps: int) -> None:
    """Time the two queries on ``store`` (uids spread over trace ``name``); emits JSON lines."""
    base = int(store.sql("SELECT min(uid) FROM ops WHERE trace = $t", {"t": name}).scalar())
    for metric, query, budget in (("point_lookup", POINT, "< 1 ms"), ("walk_5_hops", WALK, "< 5 ms")):
        for i in range(10):  # warm caches and query plans
            store.cypher(query, {"u": base + (i * 104729) % ops})
        t0 = time.perf_counter()
        for i in range(reps):
            store.cypher(query, {"u": base + (i * 7919) % ops})
        emit(
            f"{metric}_latency",
            (time.perf_counter() - t0) / reps * 1e3,
            "ms",
            ops,
            backend=backend,
            budget=budget,
        )


def measure(store: EmbeddedStore, trace: Trace, url: str, reps: int, *, embedded_queries: bool) -> None:
    """Ingest ``trace``, publish it, time queries on both sides, remove it again."""
    name = f"bench_{trace.num_ops}"
    t0 = time.perf_counter()
    report = store.ingest(trace, name=name)
    seconds = time.perf_counter() - t0
    emit(
        "store_ingest_rate",
        trace.num_ops / seconds,
        "ops/s",
        trace.num_ops,
        backend="embedded",
        seconds=round(seconds, 2),
        deps=trace.num_deps,
        messages=report.trace.messages,
    )
    if embedded_queries:
        store.index()  # the graph index built before the queries are timed, as a query would
        queries("embedded", store, name, trace.num_ops, reps)
    t0 = time.perf_counter()
    sent = publish(store, url, names=[name])
    seconds = time.perf_counter() - t0
    emit(
        "publish_rate",
        trace.num_ops / seconds,
        "ops/s",
        trace.num_ops,
        backend="neo4j",
        seconds=round(seconds, 2),
        contents_sent=sent.contents_sent,
    )
    with open_store(url) as server:
        t0 = time.perf_counter()
        server.sql("SELECT count(*) FROM ops")  # a reader's first SQL fills its copy from the payload
        emit("reader_copy_fill", time.perf_counter() - t0, "s", trace.num_ops, backend="neo4j")
        queries("neo4j", server, name, trace.num_ops, reps)
    store.remove(name)
    t0 = time.perf_counter()
    publish(store, url, names=[], prune=True)
    emit("publish_removal", time.perf_counter() - t0, "s", trace.num_ops, backend="neo4j")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--url", default=os.environ.get("ETSTORE_TEST_NEO4J"))
    ap.add_argument("--skip-embedded", action="store_true", help="do not time queries on the embedded store")
    args = ap.parse_args()
    if not args.url:
        print("bench_neo4j: no server; pass --url or export ETSTORE_TEST_NEO4J=$(scripts/neo4j.sh start)")
        return 0
    src = OUT / f"ingest_{args.ops}_{args.ranks}"
    if not (src / "bench.0.et").exists():
        write_et(synthetic(args.ops, args.ranks), src / "bench")
    trace = read_et(src)
    tmp = Path(tempfile.mkdtemp(prefix="etstore-bench-"))
    os.environ.setdefault("ETSTORE_WAREHOUSE", str(tmp / "warehouse"))  # the reader's SQL copy
    try:
        with EmbeddedStore(tmp / "store") as store:
            measure(store, trace, args.url, args.reps, embedded_queries=not args.skip_embedded)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
