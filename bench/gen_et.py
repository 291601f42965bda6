"""Write a large seeded multi-rank Chakra trace, one ``<prefix>.<rank>.et`` file per rank.

Why: ingest at scale (16,384 ranks x 6,100 ops = 100M ops) needs an input far larger
than memory holds as one trace, so the generator never holds more than one rank. Every
rank runs the same training step (SPMD), so the columns every rank shares are built once
(:func:`template`) and each rank only gets its own durations (seeded per rank, ±10 %),
start times, pipeline peers and process-group names before it is encoded with etstore's
own encoder and written.

One rank's step: a pipeline send to rank ``r + tp`` and receive from ``r - tp``, then
layers of a tensor-parallel all-gather, layer norms, matmuls, attention and GELU
(``COMP_NODE``), a tensor-parallel reduce-scatter, backward matmuls and a data-parallel
all-reduce of the layer's gradients. Collectives name their group in ``pg_name``
(ASTRA-sim's group numbers: tensor-parallel groups ``1..ranks/tp``, then the
data-parallel ones) and ``<prefix>.comm_groups.json`` lists the groups. Dependencies:
each op on the one before it (data), every other compute op also on the op three back
(data or ctrl), each all-reduce on its layer's last backward matmul; the first op of a
rank has a ctrl dependency on node 0, which no rank holds (a dangling dependency, as
truncated captures have).

Usage::

    python bench/gen_et.py OUTDIR --ranks 16384 --ops-per-rank 6100 [--jobs N] [--gzip]

Prints one JSON line (ops, deps, ranks, bytes, seconds). Tests import
:func:`generate` for small sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa

from etstore.formats.et import encode_rank
from etstore.formats.files import comm_groups_path
from etstore.model import DEPS_SCHEMA, OPS_SCHEMA, deps_table, encode_attrs, ops_table
from etstore.proto import GlobalMetadata

# one layer of a rank's step: (name, type, comm_type, pg: "tp" | "dp" | None, base µs or bytes)
_LAYER = (
    ("nccl:all_gather", "COMM_COLL_NODE", "ALL_GATHER", "tp", 8 << 20),
    ("aten::layer_norm", "COMP_NODE", None, None, 35),
    ("aten::mm", "COMP_NODE", None, None, 410),
    ("aten::_flash_attention_forward", "COMP_NODE", None, None, 520),
    ("aten::mm", "COMP_NODE", None, None, 140),
    ("nccl:reduce_scatter", "COMM_COLL_NODE", "REDUCE_SCATTER", "tp", 8 << 20),
    ("aten::layer_norm", "COMP_NODE", None, None, 35),
    ("aten::addmm", "COMP_NODE", None, None, 560),
    ("aten::gelu", "COMP_NODE", None, None, 60),
    ("aten::addmm", "COMP_NODE", None, None, 560),
    ("aten::mm", "COMP_NODE", None, None, 1100),
    ("aten::_flash_attention_backward", "COMP_NODE", None, None, 1300),
    ("aten::mm", "COMP_NODE", None, None, 1050),
    ("nccl:all_reduce", "COMM_COLL_NODE", "ALL_REDUCE", "dp", 96 << 20),
)
_P2P_BYTES = 4 << 20


@dataclass(frozen=True)
class Template:
    """The columns every rank shares, and where the per-rank ones go."""

    ops: dict[str, pa.Array]
    deps: pa.Table  # rank column 0
    base_us: np.ndarray  # per op, 0 for communication
    send: int  # row of the send, the receive follows it
    tp_rows: np.ndarray
    dp_rows: np.ndarray


@lru_cache(maxsize=4)
def template(ops_per_rank: int) -> Template:
    """The shared columns of a rank of ``ops_per_rank`` ops (at least 3)."""
    n = ops_per_rank
    body = [_LAYER[i % len(_LAYER)] for i in range(n - 2)]
    specs = [
        ("nccl:send", "COMM_SEND_NODE", None, None, _P2P_BYTES),
        ("nccl:recv", "COMM_RECV_NODE", None, None, _P2P_BYTES),
        *body,
    ]
    names = [s[0] for s in specs]
    types = np.array([s[1] for s in specs])
    comp = types == "COMP_NODE"
    coll = types == "COMM_COLL_NODE"
    comm = ~comp
    amount = np.array([s[4] for s in specs], dtype=np.int64)
    pg = np.array([s[3] or "" for s in specs])
    rng = np.random.default_rng(12345)
    variants = [
        encode_attrs([("num_ops", "int64_val", int(v)), ("tensor_size", "uint64_val", int(v) * 2)])
        for v in rng.integers(1 << 20, 1 << 34, size=64)
    ]
    comm_attrs = encode_attrs([("comm_priority", "int32_val", 0), ("involved_dim", "bool_list", [True])])
    attrs = [variants[i % 64] if c else comm_attrs for i, c in enumerate(comp)]
    ids = np.arange(1, n + 1, dtype=np.uint64)
    ops = {
        "id": pa.array(ids),
        "name": pa.array(names, pa.string()),
        "type": pa.array(types, pa.string()),
        "is_cpu_op": pa.array(np.zeros(n, dtype=bool), mask=comm),
        "comm_type": pa.array([s[2] for s in specs], pa.string()),
        "comm_size": pa.array(amount, mask=comp),
        "comm_tag": pa.array(np.where(comm, 7, 0).astype(np.int32), mask=~np.isin(np.arange(n), [0, 1])),
        "attrs": pa.array(attrs, pa.binary()),
    }
    local = np.arange(n)
    chain_dst = ids[1:]
    chain_src = ids[:-1]
    back = comp & (local >= 3) & (local % 2 == 0)
    extra_dst, extra_src = ids[back], ids[local[back] - 3]
    extra_kind = np.where(local[back] % 4 == 0, "data", "ctrl")
    ar = np.flatnonzero(np.array([s[2] == "ALL_REDUCE" for s in specs]))
    ar = ar[ar >= 2]
    dst = np.concatenate([[ids[0]], chain_dst, extra_dst, ids[ar]])
    src = np.concatenate([[0], chain_src, extra_src, ids[ar - 2]])
    kind = np.concatenate([["ctrl"], np.full(n - 1, "data"), extra_kind, np.full(len(ar), "data")])
    order = np.argsort(dst, kind="stable")
    deps = deps_table(0, src[order], dst[order], kind[order])
    return Template(
        ops=ops,
        deps=deps,
        base_us=np.where(comp, amount, 0).astype(np.float64),
        send=0,
        tp_rows=np.flatnonzero((pg == "tp") & coll),
        dp_rows=np.flatnonzero((pg == "dp") & coll),
    )


def rank_bytes(rank: int, ranks: int, ops_per_rank: int, tp: int, seed: int) -> bytes:
    """One rank's ``.et`` bytes (uncompressed)."""
    t = template(ops_per_rank)
    n = ops_per_rank
    rng = np.random.default_rng([seed, rank])
    dur = np.rint(t.base_us * rng.uniform(0.9, 1.1, size=n) * (1 + 0.05 * (rank % 7) / 7)).astype(np.uint64)
    start = np.concatenate([[0], np.cumsum(dur)[:-1]]).astype(np.uint64)
    peer_to, peer_from = (rank + tp) % ranks, (rank - tp) % ranks
    src = np.full(n, -1, dtype=np.int64)
    dst = np.full(n, -1, dtype=np.int64)
    src[t.send], dst[t.send] = rank, peer_to
    src[t.send + 1], dst[t.send + 1] = peer_from, rank
    p2p = src >= 0
    pg = np.full(n, None, dtype=object)
    pg[t.tp_rows] = str(1 + rank // tp)
    pg[t.dp_rows] = str(1 + ranks // tp + rank % tp)
    cols = {
        **t.ops,
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "duration_micros": pa.array(dur),
        "start_time_micros": pa.array(start),
        "comm_src": pa.array(src.astype(np.int32), mask=~p2p),
        "comm_dst": pa.array(dst.astype(np.int32), mask=~p2p),
        "pg_name": pa.array(pg, pa.string()),
    }
    ops = ops_table(cols, num_rows=n)
    deps = t.deps.set_column(0, "rank", pa.array(np.full(t.deps.num_rows, rank, dtype=np.int32)))
    assert ops.schema == OPS_SCHEMA and deps.schema == DEPS_SCHEMA
    return encode_rank(ops, deps, GlobalMetadata(version="0.0.4").SerializeToString())


def _write_ranks(
    out: str, prefix: str, lo: int, hi: int, ranks: int, ops_per_rank: int, tp: int, seed: int, gz: bool
) -> int:
    """Write ranks ``lo..hi-1``; returns the bytes written."""
    total = 0
    for rank in range(lo, hi):
        blob = rank_bytes(rank, ranks, ops_per_rank, tp, seed)
        if gz:
            blob = gzip.compress(blob, compresslevel=1, mtime=0)
        path = Path(out) / f"{prefix}.{rank}.et{'.gz' if gz else ''}"
        path.write_bytes(blob)
        total += len(blob)
    return total


def comm_groups(ranks: int, tp: int) -> dict[str, list[int]]:
    """ASTRA-sim's communicator groups: tensor-parallel ``1..ranks/tp``, then data-parallel."""
    groups = {str(1 + k): list(range(k * tp, (k + 1) * tp)) for k in range(ranks // tp)}
    groups |= {str(1 + ranks // tp + j): list(range(j, ranks, tp)) for j in range(tp)}
    return groups


def default_tp(ranks: int) -> int:
    """8, or the largest power of two below it that divides ``ranks``."""
    tp = 8
    while ranks % tp:
        tp //= 2
    return tp


def generate(
    out: str | Path,
    *,
    ranks: int,
    ops_per_rank: int,
    prefix: str = "scale",
    tp: int | None = None,
    seed: int = 0,
    jobs: int = 1,
    gzip_output: bool = False,
) -> dict[str, int]:
    """Write the trace into ``out``; returns ``{"ops", "deps", "ranks", "bytes"}``.

    ``jobs`` processes write contiguous rank ranges side by side (each holds one rank at a time).
    """
    if ops_per_rank < 3 or ranks < 1:
        raise SystemExit("gen_et: need at least 1 rank and 3 ops per rank")
    tp = tp or default_tp(ranks)
    if ranks % tp:
        raise SystemExit(f"gen_et: ranks ({ranks}) must be a multiple of tp ({tp})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    step = max(1, min(512, -(-ranks // max(1, jobs * 4))))
    ranges = [(lo, min(ranks, lo + step)) for lo in range(0, ranks, step)]
    args = (ranks, ops_per_rank, tp, seed, gzip_output)
    if jobs <= 1:
        written = sum(_write_ranks(str(out), prefix, lo, hi, *args) for lo, hi in ranges)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_write_ranks, str(out), prefix, lo, hi, *args) for lo, hi in ranges]
            written = sum(f.result() for f in futures)
    comm_groups_path(out / prefix).write_text(json.dumps(comm_groups(ranks, tp)))
    return {
        "ops": ranks * ops_per_rank,
        "deps": ranks * template(ops_per_rank).deps.num_rows,
        "ranks": ranks,
        "bytes": written,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops-per-rank", type=int, default=6100)
    ap.add_argument("--tp", type=int, default=None, help="tensor-parallel group size (default 8 or less)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default="scale")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gzip", action="store_true")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    got = generate(
        args.out,
        ranks=args.ranks,
        ops_per_rank=args.ops_per_rank,
        prefix=args.prefix,
        tp=args.tp,
        seed=args.seed,
        jobs=args.jobs,
        gzip_output=args.gzip,
    )
    seconds = time.perf_counter() - started
    print(json.dumps({"metric": "gen_et", **got, "seconds": round(seconds, 2), "dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
