"""Ingest throughput, the first Cypher query after it, ``ls`` and query latency on a >= 1M-op
synthetic multi-rank trace.

Prints one JSON line per measurement. The anchor is the decode-only loop of Chakra's
reference Python reader (varint length, parse one Node into a reused message, keep
nothing) over the same files, measured in the same run: ``store_ingest_rate`` (the
store's part), ``ingest_end_to_end_rate`` (read + store in one process) and
``cli_ingest_rate`` (``etstore ingest`` as a user runs it, interpreter start included, with
the child's CPU seconds) print their ratio to it (``ratio_vs_anchor``); ``cli_phases_s``
splits what that command does into its steps (imports, opening a new store, reading,
storing, closing), each timed in a fresh process. ``first_cypher_s`` is the first Cypher
query after the ingest, which builds the graph index from the warehouse;
``graph_engine_floor_rate`` is what Ladybug alone needs to bulk-load the bare graph of the
same size (key-only nodes, property-less edges, one checkpoint), the bound on that build.
The floor and the ingest run ``--repeat`` times, alternating, and the medians are reported;
``cpu_seconds`` (every thread of the process) drifts less than wall time when other
processes share the machine.

    python bench/bench_ingest.py [--ops 1000000] [--ranks 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from etstore.formats import read_et, write_et
from etstore.formats._frames import varint
from etstore.model import Trace, deps_table, ops_table
from etstore.proto import GlobalMetadata, Node
from etstore.store import EmbeddedStore

OUT = Path(__file__).resolve().parent / "out"


def emit(metric: str, value: float, unit: str, n: int, **extra: object) -> None:
    row = {
        "metric": metric,
        "value": round(value, 4),
        "unit": unit,
        "n": n,
        "machine": platform.machine(),
        **extra,
    }
    print(json.dumps(row), flush=True)


def synthetic(ops: int, ranks: int, seed: int = 7) -> Trace:
    """Per rank: a chain of compute/comm ops plus one extra data dep every other op (~1.5 deps/op)."""
    rng = np.random.default_rng(seed)
    per = ops // ranks
    rank = np.repeat(np.arange(ranks, dtype=np.int32), per)
    ids = np.tile(np.arange(per, dtype=np.uint64), ranks)
    kind = rng.choice(4, size=len(ids), p=[0.7, 0.1, 0.1, 0.1])
    types = np.array(["COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE"])[kind]
    peer_dst = np.where(kind == 1, (rank + 1) % ranks, -1)
    peer_src = np.where(kind == 2, (rank - 1) % ranks, -1)
    o = ops_table(
        {
            "rank": rank,
            "id": ids,
            "name": np.array(["gemm", "send", "recv", "allreduce"])[kind].astype(object),
            "type": types.astype(object),
            "duration_micros": np.where(kind == 0, rng.integers(1, 500, len(ids)), 0).astype(np.uint64),
            "is_cpu_op": kind == 0,
            "comm_type": np.where(kind == 3, "ALL_REDUCE", None),
            "comm_size": np.where(kind > 0, 1 << 20, None),
            "comm_dst": np.where(peer_dst >= 0, peer_dst, None),
            "comm_src": np.where(peer_src >= 0, peer_src, None),
            "comm_tag": np.where(kind == 1, 0, np.where(kind == 2, 0, None)),
        }
    )
    chain = ids[1:] if per > 1 else ids[:0]
    mask = np.tile(np.arange(per) > 0, ranks)
    d_rank = rank[mask]
    d_dst = ids[mask]
    d_src = d_dst - 1
    extra = mask & (ids >= 8) & (np.arange(len(ids)) % 2 == 0)
    e_src = ids[extra] - rng.integers(2, 8, int(extra.sum())).astype(np.uint64)
    deps = deps_table(
        np.concatenate([d_rank, rank[extra]]),
        np.concatenate([d_src, e_src]),
        np.concatenate([d_dst, ids[extra]]),
    )
    del chain
    return Trace(ops=o, deps=deps, name="bench")


def reference_decode(files: list[Path]) -> int:
    """Chakra's reference reader loop: decode every node into one reused message."""
    node = Node()
    meta = GlobalMetadata()
    count = 0
    for path in files:
        data = path.read_bytes()
        n, pos = varint(data, 0, path)
        meta.ParseFromString(data[pos : pos + n])
        pos += n
        while pos < len(data):
            n, pos = varint(data, pos, path)
            node.ParseFromString(data[pos : pos + n])
            pos += n
            count += 1
    return count


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread (user + system), in seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def graph_floor(num_ops: int, num_deps: int, directory: Path) -> tuple[float, float]:
    """Wall and CPU seconds Ladybug alone takes to bulk-load the bare graph: nodes with only
    their key, edges with no property, one checkpoint. No store can load the graph faster
    than this, so it bounds any end-to-end rate that includes the graph engine."""
    import ladybug

    base = 1 << 40
    uid = np.arange(base, base + num_ops, dtype=np.int64)
    rng = np.random.default_rng(0)
    src = np.sort(rng.integers(base, base + num_ops - 1, num_deps))
    nodes = pa.table({"uid": uid})  # noqa: F841 - read by COPY
    edges = pa.table({"from": src, "to": src + 1})  # noqa: F841 - read by COPY
    directory.mkdir(parents=True, exist_ok=True)
    db = ladybug.Database(str(directory / "floor"), auto_checkpoint=False)
    con = ladybug.Connection(db)
    con.execute("CREATE NODE TABLE Op(uid INT64, PRIMARY KEY(uid))")
    con.execute("CREATE REL TABLE DEP(FROM Op TO Op)")
    t0, c0 = time.perf_counter(), cpu_seconds()
    con.execute("COPY Op FROM nodes")
    con.execute("COPY DEP FROM edges")
    con.execute("CHECKPOINT")
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    con.close()
    db.close()
    return seconds, cpu


def ingest_once(trace: Trace, directory: Path, *, queries: bool) -> tuple[float, float, float]:
    """Wall and CPU seconds ``EmbeddedStore.ingest`` takes for ``trace`` into a fresh store, and
    the wall seconds of the first Cypher query after it (which builds the graph index); with
    ``queries``, also time a point lookup and a 5-hop walk on the result."""
    with EmbeddedStore(directory) as store:
        t0, c0 = time.perf_counter(), cpu_seconds()
        store.ingest(trace)
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        t1 = time.perf_counter()
        store.cypher("MATCH (o:Op) RETURN count(o)")
        first = time.perf_counter() - t1
        if queries:
            query_latency(store, trace.num_ops)
    return seconds, cpu, first


def cli_seconds(*args: str) -> tuple[float, float]:
    """Wall seconds of one ``etstore`` command, interpreter start included, and its CPU seconds
    (user + system of the child, ``os.wait4``): the steadier figure on a shared machine."""
    etstore = Path(sys.executable).parent / "etstore"
    cmd = [str(etstore)] if etstore.exists() else [sys.executable, "-m", "etstore.cli"]
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: nothing to drain while waiting
        t0 = time.perf_counter()
        child = subprocess.Popen([*cmd, *args], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            raise SystemExit(f"etstore {' '.join(args)} failed: {err.read().decode()[-2000:]}")
    return seconds, usage.ru_utime + usage.ru_stime


# What ``etstore ingest FILES`` does, step by step, in a fresh interpreter as the command runs
# it: where the command's time beyond the store's ingest goes (start-up, the store's creation,
# reading, storing, closing). Each step's wall and CPU seconds (every thread) as JSON.
_PHASES = """
import json, resource, sys, time
def now():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime
marks = [("start", now())]
from etstore.cli import ingest as _cli  # the command's imports
from etstore.formats import read_trace
from etstore.store import open_store
marks.append(("imports", now()))
store = open_store(sys.argv[1], write=True, purpose="ingest")
marks.append(("open", now()))
trace = read_trace(sys.argv[2])
marks.append(("read", now()))
store.ingest(trace)
marks.append(("store", now()))
store.close()
marks.append(("close", now()))
steps = zip(marks, marks[1:])
print(json.dumps({b: [round(y[0] - x[0], 3), round(y[1] - x[1], 3)] for (_, x), (b, y) in steps}))
"""


def cli_phases(store: Path, src: Path) -> dict[str, list[float]]:
    """``{step: [wall s, CPU s]}`` of :data:`_PHASES` in a child process (a fresh store)."""
    out = subprocess.run(
        [sys.executable, "-c", _PHASES, str(store), str(src)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.splitlines()[-1])


def query_latency(store: EmbeddedStore, num_ops: int) -> None:
    """Emit the mean latency of a uid point lookup and a 5-hop dependency walk (200 each)."""
    base = int(store.sql("SELECT min(uid) FROM ops").scalar())
    q_point = "MATCH (o:Op {uid: $u}) RETURN o.name, o.duration_micros"
    q_walk = "MATCH (o:Op {uid: $u})-[:DEP*5..5]->(x:Op) RETURN count(x)"
    for metric, q, budget in (("point_lookup", q_point, "< 1 ms"), ("walk_5_hops", q_walk, "< 5 ms")):
        store.cypher(q, {"u": base + num_ops // 2})
        reps = 200
        t0 = time.perf_counter()
        for i in range(reps):
            store.cypher(q, {"u": base + (i * 7919) % num_ops})
        emit(f"{metric}_latency", (time.perf_counter() - t0) / reps * 1e3, "ms", num_ops, budget=budget)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the floor and the ingest (medians)")
    args = ap.parse_args()
    src = OUT / f"ingest_{args.ops}_{args.ranks}"
    if not (src / "bench.0.et").exists():
        t0 = time.perf_counter()
        write_et(synthetic(args.ops, args.ranks), src / "bench")
        emit("write_et", time.perf_counter() - t0, "s", args.ops)
    files = sorted(src.glob("bench.*.et"))

    t0 = time.perf_counter()
    n = reference_decode(files)
    ref = n / (time.perf_counter() - t0)
    emit("reference_decode_rate", ref, "ops/s", n)

    t0 = time.perf_counter()
    trace = read_et(src)
    t_read = time.perf_counter() - t0
    emit(
        "read_et_rate",
        trace.num_ops / t_read,
        "ops/s",
        trace.num_ops,
        ratio_vs_anchor=round(trace.num_ops / t_read / ref, 3),
    )

    # The floor and the ingest alternate, so a machine whose speed drifts slows both alike;
    # each figure is the median of its runs, the ratios are of the medians.
    floors: list[tuple[float, float]] = []
    ingests: list[tuple[float, float, float]] = []
    clis: list[tuple[float, float]] = []
    lss: list[float] = []
    phases: list[dict[str, list[float]]] = []
    tmp = Path(tempfile.mkdtemp(prefix="etstore-bench-"))
    try:
        for i in range(args.repeat):
            floors.append(graph_floor(trace.num_ops, trace.num_deps, tmp / f"floor{i}"))
            last = i == args.repeat - 1
            ingests.append(ingest_once(trace, tmp / f"store{i}", queries=last))
            clis.append(
                cli_seconds("--store", str(tmp / f"cli{i}"), "ingest", str(src / "bench"), "--format", "csv")
            )
            lss.extend(
                cli_seconds("--store", str(tmp / f"cli{i}"), "ls", "--format", "csv")[0] for _ in range(3)
            )
            phases.append(cli_phases(tmp / f"phases{i}", src / "bench"))
            for d in (f"floor{i}", f"cli{i}", f"phases{i}", *([] if last else [f"store{i}"])):
                shutil.rmtree(tmp / d, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    floor, t_store = (float(np.median([r[0] for r in runs])) for runs in (floors, ingests))
    floor_cpu, store_cpu = (float(np.median([r[1] for r in runs])) for runs in (floors, ingests))
    t_first = float(np.median([r[2] for r in ingests]))
    t_cli, t_ls = float(np.median([w for w, _ in clis])), float(np.median(lss))
    floor_rate = trace.num_ops / floor
    emit(
        "graph_engine_floor_rate",
        floor_rate,
        "ops/s",
        trace.num_ops,
        seconds=round(floor, 3),
        cpu_seconds=round(floor_cpu, 3),
        runs=[round(w, 3) for w, _ in floors],
        deps=trace.num_deps,
        ratio_vs_anchor=round(floor_rate / ref, 3),
        note="Ladybug alone: key-only nodes + property-less edges + checkpoint, median",
    )
    emit(
        "store_ingest_rate",
        trace.num_ops / t_store,
        "ops/s",
        trace.num_ops,
        seconds=round(t_store, 3),
        cpu_seconds=round(store_cpu, 3),
        runs=[round(r[0], 3) for r in ingests],
        deps=trace.num_deps,
        ratio_vs_anchor=round(trace.num_ops / t_store / ref, 3),
    )
    total = t_read + t_store
    emit(
        "ingest_end_to_end_rate",
        trace.num_ops / total,
        "ops/s",
        trace.num_ops,
        ratio_vs_anchor=round(trace.num_ops / total / ref, 3),
        budget=">= 1e6 ops/s and >= 1x anchor",
    )
    emit(
        "cli_ingest_rate",
        trace.num_ops / t_cli,
        "ops/s",
        trace.num_ops,
        seconds=round(t_cli, 3),
        cpu_seconds=round(float(np.median([c for _, c in clis])), 3),
        runs=[round(w, 3) for w, _ in clis],
        ratio_vs_anchor=round(trace.num_ops / t_cli / ref, 3),
        budget=">= 1e6 ops/s and >= 1x anchor",
        note="etstore ingest FILES, interpreter start and reading included",
    )
    steps = {k: [float(np.median([p[k][j] for p in phases])) for j in (0, 1)] for k in phases[0]}
    emit(
        "cli_phases_s",
        sum(w for w, _ in steps.values()),
        "s",
        trace.num_ops,
        steps={k: {"wall": round(w, 3), "cpu": round(c, 3)} for k, (w, c) in steps.items()},
        note="what etstore ingest does, step by step in a fresh process (medians): imports, "
        "open (a new store), read, store, close",
    )
    emit(
        "first_cypher_s",
        t_first,
        "s",
        trace.num_ops,
        runs=[round(r[2], 3) for r in ingests],
        graph_vs_floor=round(t_first / floor, 3),
        budget="<= 2.5 s",
        note="builds the graph index from the warehouse, then counts the ops",
    )
    emit("ls_s", t_ls, "s", trace.num_ops, runs=[round(w, 3) for w in lss], budget="<= 0.1 s")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    emit("peak_rss", rss_mb, "MiB", args.ops)


if __name__ == "__main__":
    sys.exit(main())
