"""A recording's consumers of an expanded all-reduce wait for the chunks they read.

DDP copies each parameter's gradient out of its bucket; with the bucket's all-reduce expanded
into a ring, a copy of bytes in chunk ``j`` needs only the ops that wrote chunk ``j`` on its
rank, checked here against the byte ranges of the recording itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from etstore.algorithms._chunk_reads import NODE_ATTR, narrow_consumers
from etstore.algorithms.expand import expand
from etstore.formats._torch_flow import node_ranges
from etstore.formats.pytorch_et import read_pytorch_et
from etstore.model import decode_attrs
from etstore.sim.replay import replay

DATA = Path(__file__).parent.parent / "data"


def test_a_copy_out_of_a_bucket_waits_for_the_writers_of_its_chunks_only() -> None:
    w = read_pytorch_et(DATA / "torch_ddp_buckets_2r")
    y = expand(w, "ring:2").trace  # expand narrows a recording's consumers
    assert narrow_consumers(w, y)[1] == 0  # and once is enough
    ops = y.ops
    key = {
        (r, i): k for k, (r, i) in enumerate(zip(ops["rank"].to_pylist(), ops["id"].to_pylist(), strict=True))
    }
    w_key = {
        (r, i): k
        for k, (r, i) in enumerate(zip(w.ops["rank"].to_pylist(), w.ops["id"].to_pylist(), strict=True))
    }
    blocks = y.params["collective_blocks"]
    block_of = {
        (r, i): b
        for b, (r, f, n) in enumerate(zip(blocks["rank"], blocks["first_id"], blocks["ops"], strict=True))
        for i in range(f, f + n)
    }

    # a block's exits: its ops no other op of the block follows
    d = y.deps.filter(np.asarray(y.deps["kind"].to_pylist()) == "data")
    after = set(zip(*(d[k].to_pylist() for k in ("rank", "src", "dst")), strict=True))
    d_all = y.deps
    has_succ = {
        (r, s)
        for r, s, t in zip(*(d_all[k].to_pylist() for k in ("rank", "src", "dst")), strict=True)
        if (r, s) in block_of and block_of.get((r, t)) == block_of[(r, s)]
    }
    exits = {
        b: {i for (r, i), bb in block_of.items() if bb == b and (r, i) not in has_succ}
        for b in range(len(blocks["rank"]))
    }
    preds: dict[tuple[int, int], set[int]] = {}
    for r, s, c in after:
        if (r, s) in block_of and (r, c) not in block_of:
            preds.setdefault((r, c), set()).add(s)
    narrowed_to = {k for k, p in preds.items() if not exits[block_of[(k[0], next(iter(p)))]] <= p}
    assert narrowed_to  # some copies wait for less than the whole all-reduce
    checked = partial = 0
    for r, s, c in sorted(after):
        b = block_of.get((r, s))
        if b is None or (r, c) not in narrowed_to:
            continue
        # the consumer's bytes inside the bucket the all-reduce filled, in the recording
        parent = w.ops["attrs"][w_key[(r, blocks["parent_id"][b])]].as_py()
        (bucket,) = [
            f for f in node_ranges(decode_attrs(parent)[NODE_ATTR]) if f[2] - f[1] == blocks["comm_size"][b]
        ]
        reads = node_ranges(decode_attrs(ops["attrs"][key[(r, c)]].as_py())[NODE_ATTR])
        lo, hi = next((a - bucket[1], z - bucket[1]) for st, a, z in reads if st == bucket[0])
        row = key[(r, s)]
        total = ops["total_chunk_cnt"][row].as_py()
        q = blocks["comm_size"][b] // total
        first, cnt = ops["chunk_offset"][row].as_py(), ops["msg_chunk_cnt"][row].as_py()
        # the writer's chunks overlap the consumer's bytes
        assert ops["type"][row].as_py() in ("COMM_RECV_NODE", "COMP_NODE")
        end = min((first + cnt) * q, blocks["comm_size"][b])
        assert (first * q < hi and lo < end) or first + cnt == total
        checked += 1
        partial += int(hi - lo < blocks["comm_size"][b])
    assert checked and partial  # copies of one parameter read part of their bucket
    # still a replayable recording: the narrowed edges close no cycle
    assert replay(y).steps.num_rows == replay(w).steps.num_rows


def test_a_trace_without_recorded_tensors_is_left_as_it_is() -> None:
    from etstore.sim.sweep import collective_workload

    w = collective_workload("ALL_REDUCE", 4, 1 << 20)
    x = expand(w, "ring").trace
    y, narrowed = narrow_consumers(w, x)
    assert narrowed == 0 and y is x


def test_fsdp_gradient_division_waits_for_its_own_reduced_shard_only() -> None:
    """FSDP2 on gloo reduce-scatters gradients (an all-reduce of the whole buffer, recognised as
    a reduce-scatter) and divides the rank's own shard: the division waits for the reduction
    that finished that shard on the rank, and for no other chunk."""
    w = read_pytorch_et(DATA / "torch_fsdp2_2r")
    y = expand(w, "ring").trace
    ops = y.ops
    names, types, ids, ranks = (ops[c].to_pylist() for c in ("name", "type", "id", "rank"))
    key = {(r, i): k for k, (r, i) in enumerate(zip(ranks, ids, strict=True))}
    blocks = y.params["collective_blocks"]
    block_of = {
        (r, i): b
        for b, (r, f, n) in enumerate(zip(blocks["rank"], blocks["first_id"], blocks["ops"], strict=True))
        for i in range(f, f + n)
    }
    d = y.deps
    seen = 0
    for r, s, c, k in zip(*(d[x].to_pylist() for x in ("rank", "src", "dst", "kind")), strict=True):
        if k != "data" or (r, s) not in block_of or names[key[(r, c)]] != "aten::div_":
            continue
        b = block_of[(r, s)]
        assert blocks["comm_type"][b] == "REDUCE_SCATTER"  # gloo's all-reduce, recognised
        row = key[(r, s)]
        assert types[row] == "COMP_NODE"  # the rank's last reduction of its shard, not a receive
        # the rank's own share: its position's slots of the buffer
        total = ops["total_chunk_cnt"][row].as_py()
        own = range(r * total // 2, (r + 1) * total // 2)
        assert ops["chunk_offset"][row].as_py() in own
        seen += 1
    assert seen >= 4  # two divisions (weight, bias shards) per reduce-scatter on each rank
