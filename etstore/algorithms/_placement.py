"""Placement of an expansion's new ops: each expanded collective node's block takes its place.

Every expanded node (an *X row*) is replaced, on its rank and at its row, by the
ops of its algorithm part: ids after the rank's largest workload id, peers mapped
from algorithm ranks to the group's global ranks, message sizes scaled to the
collective's bytes, tags offset per instance. Columns are built with numpy
scatters (fixed width) and run copies (strings), never per op in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etstore.algorithms._columns import gather_bytes, numeric, ragged
from etstore.algorithms._instances import Collectives
from etstore.algorithms._parts import Parts, part_bytes, wire_bytes
from etstore.model import OPS_SCHEMA, Trace

__all__ = ["Placed", "place_ops"]


@dataclass(frozen=True, eq=False)
class Placed:
    """The expanded trace's ops and, per X row and per new op, what the later phases need."""

    ops: pa.Table  # OPS_SCHEMA: kept workload rows and new ops, in output order
    xrows: np.ndarray  # workload row of each expanded node, ascending
    xinst: np.ndarray  # its instance
    xrank: np.ndarray  # its rank
    xpart: np.ndarray  # its algorithm part (index into parts)
    xpos: np.ndarray  # its rank's position in its group
    xgroup: np.ndarray  # its group's size
    xbase: np.ndarray  # uint64: id of its block's first op
    xm: np.ndarray  # ops in its block
    owner: np.ndarray  # per new op: its X row (index into xrows)
    new_rank: np.ndarray
    new_id: np.ndarray  # uint64
    is_send: np.ndarray
    size: np.ndarray  # comm_size in bytes (fixed size for unchunked messages)


def place_ops(
    workload: Trace,
    colls: Collectives,
    chosen: np.ndarray,
    parts: Parts,
    inst_alg: np.ndarray,
    inst_buf: np.ndarray,
    inst_tag0: np.ndarray,
    reduce_duration_micros: int | None,
) -> Placed:
    """Stamp each chosen instance's parts into the workload (see the module docstring).

    ``inst_alg``, ``inst_buf`` (bytes) and ``inst_tag0`` are per instance: the
    prepared algorithm, the buffer size and the first tag.

    Notes
    -----
    O(V + V') for V workload ops and V' new ops.
    """
    ops = workload.ops
    n0 = ops.num_rows
    xj = np.flatnonzero(chosen[colls.inst])  # index into colls.rows
    xrows = colls.rows[xj]
    xinst = colls.inst[xj]
    xrank = colls.rank[xj]
    xpart = parts.part_base[inst_alg[xinst]] + colls.apos[xj]
    xm = parts.op_start[xpart + 1] - parts.op_start[xpart]
    xbase = _block_ids(ops, xrank, xm)

    owner, q = ragged(parts.op_start[xpart], xm)
    nnew = len(q)
    new_rank = xrank[owner]
    new_id = xbase[owner] + parts.local[q].astype(np.uint64)
    gpeer = _global_peers(colls, xinst[owner], parts.peer[q])
    is_send, is_recv = parts.is_send[q], parts.is_recv[q]
    comm = is_send | is_recv
    size = part_bytes(parts, inst_buf[xinst][owner], q)
    size = wire_bytes(parts, size, q, inst_alg[xinst][owner])  # bytes on the wire (NCCL's LL: 2x)
    # a reduction or copy carries the bytes it processes, so the simulator charges it as
    # it charges the same step inside a collective node (docs/simulator.md, "Cost model")
    sized = comm | (parts.is_comp[q] & (parts.chunked[q] | (parts.fixed_size[q] > 0)))
    tag = inst_tag0[xinst][owner] + parts.tag[q]
    dur = parts.duration[q]
    if reduce_duration_micros is not None:
        dur = np.where(parts.is_comp[q], np.uint64(reduce_duration_micros), dur)

    # output order: each expanded node's block takes the node's place on its rank
    out_len = np.ones(n0, dtype=np.int64)
    out_len[xrows] = xm
    out_start = np.cumsum(out_len) - out_len
    keep = np.ones(n0, dtype=bool)
    keep[xrows] = False
    kept_rows = np.flatnonzero(keep)
    offs = np.cumsum(xm) - xm
    place = _Placer(
        int(out_len.sum()),
        out_start[kept_rows],
        kept_rows,
        out_start[xrows][owner] + (np.arange(nnew) - offs[owner]),
    )
    ones = np.ones(nnew, dtype=bool)
    new_cols: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "rank": (new_rank, ones),
        "id": (new_id, ones),
        "duration_micros": (dur, ones),
        "comm_size": (size, sized),
        "comm_src": (gpeer, is_recv),
        "comm_dst": (gpeer, is_send),
        "comm_tag": (tag, comm),
    }
    arrays = []
    for f in OPS_SCHEMA:
        old = ops[f.name]
        if f.name in new_cols:
            values, valid = new_cols[f.name]
            arrays.append(place.numeric(old, values, valid, f.type))
        elif f.name == "pg_name":  # the collective's group
            arrays.append(place.take(old, None, xrows[owner]))
        elif f.name == "comm_type":
            arrays.append(place.take(old, pa.nulls(1, f.type), np.zeros(nnew, dtype=np.int64)))
        elif pa.types.is_string(f.type) or pa.types.is_binary(f.type):
            arrays.append(place.take(old, parts.columns[f.name], q))
        else:
            vals, valid = numeric(parts.columns[f.name])
            arrays.append(place.numeric(old, vals[q], valid[q], f.type))
    out_ops = pa.Table.from_arrays(arrays, schema=OPS_SCHEMA)
    xpos, xgroup = colls.apos[xj], colls.gsize[colls.inst_pg[xinst]]
    return Placed(
        out_ops, xrows, xinst, xrank, xpart, xpos, xgroup, xbase, xm, owner, new_rank, new_id, is_send, size
    )


def _block_ids(ops: pa.Table, xrank: np.ndarray, xm: np.ndarray) -> np.ndarray:
    """First id of each X row's block: after its rank's largest id, one block per node in row order."""
    rank_all = ops["rank"].to_numpy().astype(np.int64)
    rank_max = np.zeros(int(rank_all.max()) + 1, dtype=np.uint64)
    np.maximum.at(rank_max, rank_all, ops["id"].to_numpy().astype(np.uint64))
    rorder = np.argsort(xrank, kind="stable")
    rs = xrank[rorder]
    csum = np.cumsum(xm[rorder]) - xm[rorder]
    gstart = np.maximum.accumulate(np.where(np.r_[True, rs[1:] != rs[:-1]], np.arange(len(rs)), 0))
    within = np.empty(len(xrank), dtype=np.int64)
    within[rorder] = csum - csum[gstart]
    return rank_max[xrank] + np.uint64(1) + within.astype(np.uint64)


def _global_peers(colls: Collectives, inst_of_op: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """Global rank of each new op's peer: algorithm rank ``p`` is the group's p-th member."""
    member = np.full((len(colls.members), max(int(colls.gsize.max()), 1)), -1, dtype=np.int64)
    for g, m in enumerate(colls.members):
        member[g, : len(m)] = m
    return member[colls.inst_pg[inst_of_op], np.clip(peer, 0, None)]


class _Placer:
    """Builds output columns from kept workload rows and new ops, each at its output position."""

    def __init__(self, n: int, kpos: np.ndarray, kept: np.ndarray, npos: np.ndarray) -> None:
        self.n, self.kpos, self.kept, self.npos = n, kpos, kept, npos

    def numeric(
        self, old: pa.ChunkedArray, values: np.ndarray, valid: np.ndarray, typ: pa.DataType
    ) -> pa.Array:
        """Fixed-width column: numpy scatter of old and new values and validity (O(n))."""
        ov, ok = numeric(old)
        dtype = np.bool_ if pa.types.is_boolean(typ) else typ.to_pandas_dtype()
        out = np.empty(self.n, dtype=dtype)
        out[self.kpos] = ov[self.kept]
        out[self.npos] = values
        mask = np.empty(self.n, dtype=bool)
        mask[self.kpos] = ok[self.kept]
        mask[self.npos] = valid
        return pa.array(out, type=typ, mask=None if mask.all() else ~mask)

    def take(self, old: pa.ChunkedArray, pool: pa.Array | None, src: np.ndarray) -> pa.Array:
        """Variable-width column: one take from the small source ``old ++ pool`` (``src`` indexes
        ``pool``, or ``old`` when ``pool`` is None)."""
        base = old.combine_chunks()
        n_old = len(base)
        idx = np.empty(self.n, dtype=np.int64)
        idx[self.kpos] = self.kept
        idx[self.npos] = src if pool is None else n_old + src
        source = base if pool is None else pa.concat_arrays([base, pool.cast(base.type)])
        return gather_bytes(source, idx)
