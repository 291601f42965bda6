"""Write a seeded synthetic multi-rank Chakra trace (``<out>/<prefix>.<rank>.et``) for benchmarks.

Why synthetic: the real fixtures are small (the largest has 3,664 nodes); decode speed
needs a million-node input whose shape resembles training traces. Every rank gets a
chain of compute and communication nodes: ~60 % COMP, ~20 % COMM_COLL, ~10 % each
COMM_SEND / COMM_RECV, ~1.5 dependencies per node (mostly data, some ctrl), the comm
attributes ASTRA-sim reads, and a few extra attributes (``num_ops``, ``tensor_size``,
``comm_priority``, ``involved_dim``) kept as raw bytes. Written with etstore's own writer.

Usage: python bench/data/gen_trace.py OUT_DIR [--ops 1000000] [--ranks 64] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from etstore.formats.et import write_et
from etstore.model import META_SCHEMA, Trace, deps_table, encode_attrs, ops_table
from etstore.proto import COLLECTIVE_COMM_TYPES, GlobalMetadata

COMP_NAMES = ["aten::mm", "aten::addmm", "aten::bmm", "aten::layer_norm", "aten::gelu",
              "aten::softmax", "aten::add_", "aten::copy_", "aten::_flash_attention_forward"]
COLL_NAMES = ["nccl:all_reduce", "nccl:all_gather", "nccl:reduce_scatter", "nccl:all_to_all"]
COLL_TYPES = ["ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"]


def _variants(rng: np.random.Generator, kind: str, count: int) -> list[bytes]:
    """Pre-encoded extra-attribute cells, so a million rows need no per-row protobuf work."""
    out = []
    for _ in range(count):
        if kind == "comp":
            attrs = [("num_ops", "int64_val", int(rng.integers(1, 1 << 30))),
                     ("tensor_size", "uint64_val", int(rng.integers(1, 1 << 34)))]
        elif kind == "coll":
            attrs = [("comm_priority", "int32_val", 0),
                     ("involved_dim", "bool_list", [True, bool(rng.integers(2)), False])]
        else:
            attrs = [("comm_priority", "int32_val", int(rng.integers(0, 4)))]
        out.append(encode_attrs(attrs))
    return out


def make_trace(num_ops: int, num_ranks: int, seed: int) -> Trace:
    """The synthetic trace, built column-wise (no Python object per node)."""
    rng = np.random.default_rng(seed)
    per = np.full(num_ranks, num_ops // num_ranks)
    per[: num_ops % num_ranks] += 1
    rank = np.repeat(np.arange(num_ranks, dtype=np.int32), per)
    n = len(rank)
    starts = np.concatenate([[0], np.cumsum(per)[:-1]])
    local = np.arange(n) - np.repeat(starts, per)
    # ids grow with gaps, like PyTorch-derived traces; not 0-based
    gaps = rng.integers(1, 4, size=n).astype(np.uint64)
    ids = np.empty(n, dtype=np.uint64)
    for r, (s, c) in enumerate(zip(starts, per, strict=True)):
        ids[s : s + c] = 1000 + np.cumsum(gaps[s : s + c]) + r
    kind = rng.choice(4, size=n, p=[0.6, 0.2, 0.1, 0.1])  # comp, coll, send, recv
    type_names = np.array(["COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"])
    comp_name = np.array(COMP_NAMES)[rng.integers(len(COMP_NAMES), size=n)]
    coll_pick = rng.integers(len(COLL_NAMES), size=n)
    names = np.where(kind == 0, comp_name, np.array(COLL_NAMES)[coll_pick])
    names = np.where(kind == 2, "nccl:send", np.where(kind == 3, "nccl:recv", names))
    is_comm = kind > 0
    is_p2p = kind >= 2
    peer = (rank + np.where(kind == 2, 1, -1)) % num_ranks
    size = (1 << rng.integers(10, 28, size=n)).astype(np.int64)

    comm_type = np.array(COLL_TYPES)[coll_pick]
    assert set(COLL_TYPES) <= set(COLLECTIVE_COMM_TYPES)
    cols = {
        "rank": rank,
        "id": ids,
        "name": names,
        "type": type_names[kind],
        "duration_micros": np.where(kind == 0, rng.integers(1, 5000, size=n), 0).astype(np.uint64),
        "is_cpu_op": pa.array(np.zeros(n, dtype=bool), mask=is_comm),
        "comm_type": pa.array(comm_type, mask=kind != 1),
        "comm_size": pa.array(size, mask=~is_comm),
        "comm_src": pa.array(np.where(kind == 2, rank, peer).astype(np.int32), mask=~is_p2p),
        "comm_dst": pa.array(np.where(kind == 2, peer, rank).astype(np.int32), mask=~is_p2p),
        "comm_tag": pa.array((local % 1024).astype(np.int32), mask=~is_p2p),
        "pg_name": pa.array(np.full(n, "0"), mask=kind != 1),
    }
    variants = {k: pa.array(_variants(rng, k, 256), pa.binary()) for k in ("comp", "coll", "p2p")}
    pick = rng.integers(256, size=n)
    attrs = [None] * 3
    for i, k in enumerate(("comp", "coll", "p2p")):
        attrs[i] = variants[k].take(pa.array(pick)).to_numpy(zero_copy_only=False)
    cols["attrs"] = pa.array(np.where(kind == 0, attrs[0], np.where(kind == 1, attrs[1], attrs[2])),
                             pa.binary())
    ops = ops_table(cols, num_rows=n)

    # deps: a data edge to the previous node of the rank (the stream order) for ~90 %,
    # plus a random earlier node within 64 for ~60 % (data or ctrl)
    first = local == 0
    chain = ~first & (rng.random(n) < 0.9)
    back = np.minimum(rng.integers(2, 64, size=n), local)
    extra = (back >= 2) & (rng.random(n) < 0.6)
    idx = np.arange(n)
    src = np.concatenate([ids[idx[chain] - 1], ids[idx[extra] - back[extra]]])
    dst = np.concatenate([ids[chain], ids[extra]])
    drank = np.concatenate([rank[chain], rank[extra]])
    kinds = np.concatenate([np.full(chain.sum(), "data"),
                            np.where(rng.random(extra.sum()) < 0.7, "data", "ctrl")])
    order = np.lexsort((dst, drank))
    deps = deps_table(drank[order], src[order], dst[order], kinds[order])

    meta_blob = GlobalMetadata(version="0.0.4").SerializeToString()
    meta = pa.Table.from_pydict({"rank": list(range(num_ranks)), "metadata": [meta_blob] * num_ranks},
                                schema=META_SCHEMA)
    return Trace(ops=ops, deps=deps, meta=meta, name="synthetic")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default="synthetic")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    trace = make_trace(args.ops, args.ranks, args.seed)
    t1 = time.perf_counter()
    paths = write_et(trace, args.out / args.prefix)
    t2 = time.perf_counter()
    total = sum(p.stat().st_size for p in paths)
    print(json.dumps({"metric": "gen_trace", "ops": trace.num_ops, "deps": trace.num_deps,
                      "ranks": len(paths), "bytes": total, "build_s": round(t1 - t0, 3),
                      "write_s": round(t2 - t1, 3), "dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
