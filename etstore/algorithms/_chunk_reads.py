"""A recording's consumers of an expanded collective wait for the chunks they read, not all of it.

``expand`` gives a consumer of an expanded node an edge from every exit op of the node's
part: it waits for the whole collective. A recording knows more: each op's tensor
arguments name the bytes it reads (storage, offset, size), and the collective's the bytes it
fills. A consumer that reads part of the result (DDP copying one parameter's gradient out
of its bucket, a layer reading one parameter of an FSDP all-gather) needs only the chunks
those bytes fall in, and on this rank only the op that wrote each chunk's final value.

The algorithm's buffer of ``B`` bytes is cut into ``total_chunk_cnt`` chunks as
:func:`~etstore.algorithms._parts.chunk_bytes` cuts it (``B // C`` each, the last one
taking the rest); an op of the part writes chunks ``chunk_offset .. + msg_chunk_cnt`` when
it is a receive or a reduction or copy (a send only reads). A consumer's data edges from
the part are replaced by edges from the writers of the chunks it reads. Where that cannot
be said exactly, the edges stay as they were (waiting for everything is never wrong): the
consumer's bytes are not inside the filled tensor, the tensor is not the algorithm's whole
buffer (a reduce-scatter's own shard), a chunk it reads is written by no op of the part
(the rank's own all-gather chunk), or it reads a reduce-scatter's chunk outside the rank's own
share (a partial sum on this rank, passed on: not a result here).

What each consumer reads is kept in ``params["chunk_reads"]`` (:data:`READS_COLUMNS`, one row
per chunk it reads and final writer of it, byte range relative to the filled buffer), for the
consumers whose chunks are known exactly, those that read every chunk included: the chunk
finder of a recording splits a consumer by them (:mod:`etstore.analysis.lane_split`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.formats._torch_flow import node_ranges
from etstore.model import Trace, decode_attrs, deps_table, op_row_map

__all__ = ["NODE_ATTR", "READS_COLUMNS", "narrow_consumers"]

NODE_ATTR = "pytorch_et_node"
"""The attribute holding a recorded op's ET node (``etstore.formats.pytorch_et``)."""

_WRITERS = ("COMM_RECV_NODE", "COMP_NODE")

READS_COLUMNS = ("rank", "op", "block", "slot", "writer", "storage", "lo", "hi", "writes")
"""``params["chunk_reads"]``: the consumer's rank and id, the index of the collective's entry in
``collective_blocks``, the chunk slot, the id of an op that wrote its final value, the bytes
``[lo, hi)`` of ``storage`` the consumer reads in it (as the recording numbers storages and
offsets), and 1 when the consumer also writes into the collective's buffer (in place: it must
not run before the algorithm's sends of a chunk)."""


def _node(blob: bytes | None) -> str | None:
    value = decode_attrs(blob).get(NODE_ATTR)
    return value if isinstance(value, str) else None


def narrow_consumers(workload: Trace, expanded: Trace) -> tuple[Trace, int]:
    """``expanded`` with each recorded consumer's data edges from an expanded collective
    narrowed to the writers of the chunks it reads, and how many consumers were narrowed.

    ``workload`` is the trace that was expanded (its collective nodes carry their tensors).
    A trace without recorded tensors comes back unchanged.
    """
    blocks: Mapping[str, Any] = expanded.params.get("collective_blocks") or {}
    if not blocks.get("rank") or NODE_ATTR not in _attr_names(workload):
        return expanded, 0
    ops = expanded.ops
    ids = ops["id"].to_numpy().astype(np.int64)
    row_of = op_row_map(ops)
    w_row = op_row_map(workload.ops)
    block_of: dict[tuple[int, int], int] = {}  # (rank, id) of each op in a block -> the block
    for b, (r, first, count) in enumerate(
        zip(blocks["rank"], blocks["first_id"], blocks["ops"], strict=True)
    ):
        for i in range(int(first), int(first) + int(count)):
            block_of[(int(r), i)] = b
    deps = expanded.deps
    d_rank, d_src, d_dst = (deps[c].to_numpy().astype(np.int64) for c in ("rank", "src", "dst"))
    d_kind = deps["kind"].to_pylist()
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)  # (block, consumer id) -> edges
    for e in range(deps.num_rows):
        src_block = block_of.get((int(d_rank[e]), int(d_src[e])))
        if src_block is not None and d_kind[e] == "data" and (int(d_rank[e]), int(d_dst[e])) not in block_of:
            groups[(src_block, int(d_dst[e]))].append(e)
    if not groups:
        return expanded, 0
    inner: dict[int, list[int]] = defaultdict(list)  # a block's own edges, by op row
    for e in range(deps.num_rows):
        key_s, key_d = (int(d_rank[e]), int(d_src[e])), (int(d_rank[e]), int(d_dst[e]))
        if key_s in block_of and block_of.get(key_d) == block_of[key_s]:
            inner[row_of[key_s]].append(row_of[key_d])
    chunk = {c: ops[c].to_numpy(zero_copy_only=False) for c in ("chunk_offset", "msg_chunk_cnt")}
    total = pc.fill_null(ops["total_chunk_cnt"], 0).to_numpy().astype(np.int64)
    types = ops["type"].to_numpy(zero_copy_only=False)
    attrs = expanded.ops["attrs"]
    fills: dict[int, list[tuple[int, int, int]]] = {}
    reads: dict[str, list[int]] = {c: [] for c in READS_COLUMNS}
    drop: list[int] = []
    add_rank: list[int] = []
    add_src: list[int] = []
    add_dst: list[int] = []
    for (b, consumer), edges in groups.items():
        r = int(blocks["rank"][b])
        if b not in fills:
            parent = w_row.get((r, int(blocks["parent_id"][b])))
            filled = node_ranges(_node(workload.ops["attrs"][parent].as_py())) if parent is not None else []
            buffer = _buffer(blocks, b)
            fills[b] = [f for f in filled if f[2] - f[1] == buffer]  # the tensor the chunks cut
        crow = row_of.get((r, consumer))
        if crow is None:
            continue
        first, count = int(blocks["first_id"][b]), int(blocks["ops"][b])
        members = [row_of[(r, i)] for i in range(first, first + count) if (r, i) in row_of]
        node = _node(attrs[crow].as_py())
        found = _writers_of(
            node_ranges(node),
            fills[b],
            members,
            types,
            chunk,
            total,
            inner,
            _share(blocks, b),
        )
        if found is None:
            continue
        writes = int(_overlaps(node_ranges(node, "outputs"), fills[b]))
        for slot, w, storage, lo, hi in found:
            row = (r, consumer, b, slot, int(ids[w]), storage, lo, hi, writes)
            for col, v in zip(READS_COLUMNS, row, strict=True):
                reads[col].append(v)
        writers = sorted({w for _, w, _, _, _ in found})
        if {int(ids[w]) for w in writers} >= {int(d_src[e]) for e in edges}:
            continue  # it reads every chunk the exits write: it waits for all of them anyway
        drop += edges
        add_rank += [r] * len(writers)
        add_src += [int(ids[w]) for w in writers]
        add_dst += [consumer] * len(writers)
    if reads["op"]:
        expanded = expanded.replace(params={**expanded.params, "chunk_reads": reads})
    if not drop:
        return expanded, 0
    keep = np.ones(deps.num_rows, dtype=bool)
    keep[drop] = False
    kept = deps.filter(pa.array(keep))
    new = deps_table(add_rank, add_src, add_dst, "data")
    both = pa.concat_tables([kept.drop_columns(["pos"]), new.drop_columns(["pos"])])
    rebuilt = deps_table(both["rank"], both["src"], both["dst"], both["kind"].to_pylist())
    order = np.argsort(rebuilt["rank"].to_numpy(), kind="stable")
    count_narrowed = len({(r, d) for r, d in zip(add_rank, add_dst, strict=True)})
    return expanded.replace(deps=rebuilt.take(pa.array(order))), count_narrowed


def _buffer(blocks: Mapping[str, Any], b: int) -> int:
    """Bytes of block ``b``'s algorithm buffer: ``comm_size``, times the group for an all-gather."""
    size = int(blocks["comm_size"][b] or 0)
    return size * int(blocks["group_size"][b]) if blocks["comm_type"][b] == "ALL_GATHER" else size


def _share(blocks: Mapping[str, Any], b: int) -> tuple[int, int] | None:
    """(the rank's position, the group's size) for a reduce-scatter, whose other chunks on the
    rank are partial sums passed on; None for collectives whose every chunk is a result."""
    if blocks["comm_type"][b] != "REDUCE_SCATTER":
        return None
    return int(blocks["group_pos"][b]), int(blocks["group_size"][b])


def _overlaps(a: list[tuple[int, int, int]], b: list[tuple[int, int, int]]) -> bool:
    """Whether two lists of ``(storage, lo, hi)`` byte ranges share a byte."""
    return any(s1 == s2 and lo1 < hi2 and lo2 < hi1 for s1, lo1, hi1 in a for s2, lo2, hi2 in b)


def _attr_names(trace: Trace) -> set[str]:
    """Attribute names of the trace's first op that has any (recordings carry them on every op)."""
    for blob in trace.ops["attrs"].slice(0, 64).to_pylist():  # not the whole column
        if blob:
            return set(decode_attrs(blob))
    return set()


def _writers_of(
    reads: list[tuple[int, int, int]],
    fills: list[tuple[int, int, int]],
    members: list[int],
    types: np.ndarray,
    chunk: Mapping[str, np.ndarray],
    total: np.ndarray,
    inner: Mapping[int, list[int]],
    share: tuple[int, int] | None,
) -> list[tuple[int, int, int, int, int]] | None:
    """Per chunk slot ``reads`` covers and op of the part that last wrote it (of a chunk's
    writers, those no other writer of it follows in the part): ``(slot, row, storage, lo,
    hi)``, the bytes read in it; None when that cannot be said exactly (see the module's
    note)."""
    writes = [m for m in members if types[m] in _WRITERS and chunk["chunk_offset"][m] is not None]
    if not writes:
        return None
    c = int(total[writes[0]])
    if c <= 0 or any(int(total[m]) != c for m in writes):
        return None
    slots: dict[int, tuple[int, int, int]] = {}
    for storage, lo, hi in reads:
        for f_storage, f_lo, f_hi in fills:
            if storage != f_storage or hi <= f_lo or lo >= f_hi:
                continue
            if lo < f_lo or hi > f_hi:
                return None  # reads past the tensor the collective filled
            size = f_hi - f_lo
            q = size // c
            if q <= 0:
                return None
            first = min((lo - f_lo) // q, c - 1)
            last = min((hi - 1 - f_lo) // q, c - 1)
            for s in range(first, last + 1):  # the slot's bytes (the last takes the rest) it reads
                s_lo = f_lo + max(lo - f_lo, s * q)
                s_hi = f_lo + min(hi - f_lo, size if s == c - 1 else (s + 1) * q)
                was = slots.get(s)
                slots[s] = (
                    (storage, s_lo, s_hi) if was is None else (storage, min(was[1], s_lo), max(was[2], s_hi))
                )
    if not slots:
        return None
    if share is not None:  # a reduce-scatter: only the rank's own share is a result on it
        pos, n = share
        if min(slots) < pos * c // n or max(slots) >= (pos + 1) * c // n:
            return None
    out: list[tuple[int, int, int, int, int]] = []
    for s in sorted(slots):
        found = [
            m
            for m in writes
            if int(chunk["chunk_offset"][m])
            <= s
            < int(chunk["chunk_offset"][m]) + int(chunk["msg_chunk_cnt"][m] or 1)
        ]
        if not found:
            return None
        storage, lo, hi = slots[s]
        out += [(s, m, storage, lo, hi) for m in found if not _follows(m, set(found) - {m}, inner)]
    return out


def _follows(op: int, others: set[int], inner: Mapping[int, list[int]]) -> bool:
    """Whether one of ``others`` comes after ``op`` in its part (a path of the part's edges)."""
    seen, todo = {op}, [op]
    while todo:
        for nxt in inner.get(todo.pop(), ()):
            if nxt in others:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False
