"""An algorithm trace cut into per-rank parts, ready to be stamped into a workload.

:func:`prepare` turns an ``algorithm`` :class:`~etstore.model.Trace` into one flat
"pool" of ops, rank-major, with everything expansion needs as numpy arrays: each
op's local index on its rank, peer (algorithm rank), channel tag, chunk columns
for sizing, the in-rank edges as local indices, and the entry ops (no in-rank
predecessor) and exit ops (no in-rank successor) of every rank. Several prepared
algorithms are concatenated by :func:`concat` so one vectorised pass can expand
collectives that use different algorithms.

It is the one decomposition of an algorithm: ``expand`` stamps the parts into a
workload, and the simulator's :func:`~etstore.sim._templates.trace_template` lays
them out as a template; both size messages with :func:`part_bytes` (the rule of
:func:`chunk_bytes` over :func:`buffer_bytes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import ExpansionError
from etstore.model import CHUNK_COLUMNS, OPS_SCHEMA, Trace, op_rows

__all__ = ["Parts", "buffer_bytes", "chunk_bytes", "concat", "part_bytes", "prepare", "wire_bytes"]

# op columns copied verbatim from the algorithm into the expansion
COPIED = ("name", "type", "start_time_micros", "is_cpu_op", *CHUNK_COLUMNS, "attrs", "attr_order")
_ALLOWED_TYPES = frozenset(
    {"COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE"}
)


def _starts(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class Parts:
    """Prepared algorithm(s): a pool of ops (rank-major) and per-part slices into it.

    A *part* is one algorithm rank of one algorithm; ``part_base[a]`` is the first
    part of algorithm ``a``, so part ``part_base[a] + p`` is rank ``p`` of it.
    Pool arrays are aligned with ``columns`` rows; ``local`` is an op's index on
    its rank. Edges, entries and exits are pools of their own, sliced per part.
    """

    labels: list[str]
    ranks: np.ndarray  # (algorithms,) group size each algorithm serves
    part_base: np.ndarray  # (algorithms + 1,)
    op_start: np.ndarray  # (parts + 1,)
    local: np.ndarray
    peer: np.ndarray  # algorithm rank of the peer, -1 if none
    tag: np.ndarray  # channel tag, 0 for non-messages
    is_send: np.ndarray
    is_recv: np.ndarray
    is_comp: np.ndarray
    chunked: np.ndarray  # size from chunk columns
    cnt: np.ndarray
    total: np.ndarray
    first: np.ndarray
    fixed_size: np.ndarray  # comm_size of unchunked messages
    duration: np.ndarray  # uint64 µs
    max_chunks: np.ndarray  # (algorithms,) largest total_chunk_cnt of a message
    tag_span: int  # 1 + largest tag of any algorithm
    edge_start: np.ndarray  # (parts + 1,)
    esrc: np.ndarray  # local index
    edst: np.ndarray
    ekind: pa.Array  # string
    epos: np.ndarray
    entry_start: np.ndarray  # (parts + 1,)
    entry: np.ndarray  # local index
    exit_start: np.ndarray
    exit: np.ndarray
    columns: dict[str, pa.Array]  # COPIED columns of the pool
    wire: np.ndarray  # (algorithms, 2) bytes on the wire per payload byte (numerator, denominator)


def _int(ops: pa.Table, name: str, fill: int) -> tuple[np.ndarray, np.ndarray]:
    col = ops[name]
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    return pc.fill_null(col, fill).to_numpy(zero_copy_only=False).astype(np.int64), valid


def prepare(trace: Trace, label: str) -> Parts:
    """Cut one algorithm trace into parts (see :class:`Parts`).

    The algorithm's ranks are ``0 .. ngpus-1`` (``params["ngpus"]``, else one more
    than the largest rank); every rank must have ops, every peer must be one of
    them, and every message must be sizable (chunk columns or ``comm_size``).

    Raises
    ------
    ExpansionError
        The trace breaks one of the rules above, holds collective nodes, or has
        dependencies on absent nodes; the message names the rank and node.

    Notes
    -----
    O(V log V + E log V) over the algorithm (one lexsort, a binary search per edge).
    """
    ops = trace.ops
    nops = ops.num_rows
    where = f"algorithm {label!r}"
    if nops == 0:
        raise ExpansionError(f"{where} has no ops")
    rank = ops["rank"].to_numpy().astype(np.int64)
    n = int(trace.params.get("ngpus") or 0) or int(rank.max()) + 1
    if rank.min() < 0 or rank.max() >= n:
        raise ExpansionError(f"{where}: ranks {int(rank.min())}..{int(rank.max())} exceed its {n} gpus")
    order = np.argsort(rank, kind="stable")
    if (order != np.arange(nops)).any():
        ops = ops.take(pa.array(order))
        rank = rank[order]
    counts = np.bincount(rank, minlength=n)
    if (counts == 0).any():
        p = int(np.flatnonzero(counts == 0)[0])
        raise ExpansionError(
            f"{where} has no ops on rank {p} of {n}; every member of a group needs its part of the collective"
        )
    op_start = _starts(counts)
    local = np.arange(nops, dtype=np.int64) - op_start[rank]
    msg = _messages(ops, rank, n, where)
    if trace.num_missing:
        raise ExpansionError(f"{where} has {trace.num_missing} dependencies on absent nodes; fix it first")
    srow, drow, drank, ekind, epos = _rank_edges(trace.deps, ops)
    has_in = np.zeros(nops, dtype=bool)
    has_in[drow] = True
    has_out = np.zeros(nops, dtype=bool)
    has_out[srow] = True
    entry_rows = np.flatnonzero(~has_in)
    exit_rows = np.flatnonzero(~has_out)
    is_send, is_recv, total = msg.is_send, msg.is_recv, msg.total
    ms = np.where((is_send | is_recv) & msg.chunked, total, 0)
    tag = msg.tag
    return Parts(
        labels=[label],
        ranks=np.array([n], dtype=np.int64),
        part_base=np.array([0, n], dtype=np.int64),
        op_start=op_start,
        local=local,
        peer=msg.peer,
        tag=tag,
        is_send=is_send,
        is_recv=is_recv,
        is_comp=msg.is_comp,
        chunked=msg.chunked,
        cnt=msg.cnt,
        total=np.maximum(total, 1),
        first=msg.first,
        fixed_size=msg.fixed,
        duration=pc.fill_null(ops["duration_micros"], 0).to_numpy().astype(np.uint64),
        max_chunks=np.array([int(ms.max()) if len(ms) else 0], dtype=np.int64),
        tag_span=int(tag.max()) + 1 if len(tag) else 1,
        edge_start=_starts(np.bincount(drank, minlength=n)),
        esrc=local[srow],
        edst=local[drow],
        ekind=ekind,
        epos=epos,
        entry_start=_starts(np.bincount(rank[entry_rows], minlength=n)),
        entry=local[entry_rows],
        exit_start=_starts(np.bincount(rank[exit_rows], minlength=n)),
        exit=local[exit_rows],
        columns={c: ops[c].combine_chunks() for c in COPIED},
        wire=_wire_ratio(trace, where),
    )


def _wire_ratio(trace: Trace, where: str) -> np.ndarray:
    """``params["wire_bytes_ratio"]`` as a (1, 2) array; (1, 1) when absent (NCCL's LL: 2/1)."""
    ratio = (trace.params or {}).get("wire_bytes_ratio")
    if ratio is None:
        return np.ones((1, 2), dtype=np.int64)
    try:
        num, den = (int(x) for x in ratio)
    except (TypeError, ValueError):
        num = den = 0
    if num < 1 or den < 1:
        raise ExpansionError(f"{where}: params wire_bytes_ratio {ratio!r} is not two positive integers")
    return np.array([[num, den]], dtype=np.int64)


@overload
def buffer_bytes(coll: str, comm_size: int, n: int) -> int: ...


@overload
def buffer_bytes(coll: np.ndarray, comm_size: np.ndarray, n: np.ndarray) -> np.ndarray: ...


def buffer_bytes(
    coll: str | np.ndarray, comm_size: int | np.ndarray, n: int | np.ndarray
) -> int | np.ndarray:
    """Bytes of the buffer an algorithm's ``total_chunk_cnt`` divides, for a Chakra ``comm_size``
    (one collective, or one per element of arrays).

    ``comm_size`` follows ASTRA-sim: the per-rank contribution for ``ALL_GATHER`` (the
    buffer is ``n`` times larger), the whole buffer for every other collective.
    """
    if isinstance(coll, str):
        return int(comm_size) * int(n) if coll == "ALL_GATHER" else int(comm_size)
    out: np.ndarray = np.where(np.asarray(coll) == "ALL_GATHER", np.multiply(comm_size, n), comm_size)
    return out


def chunk_bytes(
    buffer: int | np.ndarray, cnt: np.ndarray, total: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """Bytes of ``cnt`` chunks from chunk ``first`` of a ``buffer`` cut into ``total`` chunks.

    ``buffer // total · cnt``, plus ``buffer % total`` when the chunks include the
    last one, so a buffer's chunks add up to it exactly: the rule of
    :func:`etstore.formats.message_sizes`.
    """
    total = np.maximum(np.asarray(total, dtype=np.int64), 1)
    cnt = np.asarray(cnt, dtype=np.int64)
    out: np.ndarray = (buffer // total) * cnt + np.where(
        (first + cnt >= total) & (cnt > 0), buffer % total, 0
    )
    return out


def part_bytes(parts: Parts, buffer: int | np.ndarray, q: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Bytes that pool ops ``q`` move (messages) or process (steps) for a ``buffer``-byte collective:
    :func:`chunk_bytes` of the op's chunk columns, else its own ``comm_size`` (0 when absent).

    ``buffer`` is one number, or one per op of ``q``.
    """
    out: np.ndarray = np.where(
        parts.chunked[q],
        chunk_bytes(buffer, parts.cnt[q], parts.total[q], parts.first[q]),
        parts.fixed_size[q],
    )
    return out


def wire_bytes(
    parts: Parts, size: np.ndarray, q: np.ndarray | slice = slice(None), alg: np.ndarray | int = 0
) -> np.ndarray:
    """Bytes on the wire of pool ops ``q`` moving ``size`` payload bytes: messages scaled up by their
    algorithm's ``wire`` ratio (rounded up), every other op's bytes as they are.

    An NCCL protocol sends more than its payload (LL: a flag beside every data word);
    the simulator and ``expand`` both size messages this way, so they agree.
    """
    num, den = parts.wire[alg, 0], parts.wire[alg, 1]
    msg = parts.is_send[q] | parts.is_recv[q]
    out: np.ndarray = np.where(msg, -(-np.asarray(size, dtype=np.int64) * num // den), size)
    return out


class _Messages(NamedTuple):
    """Per op of an algorithm: node kind, peer (algorithm rank), tag and the chunk columns for sizing."""

    is_send: np.ndarray
    is_recv: np.ndarray
    is_comp: np.ndarray
    peer: np.ndarray
    tag: np.ndarray
    cnt: np.ndarray
    total: np.ndarray
    first: np.ndarray
    fixed: np.ndarray
    chunked: np.ndarray


def _messages(ops: pa.Table, rank: np.ndarray, n: int, where: str) -> _Messages:
    """Node kinds, peers, tags and sizes of the ops; raises on a node an expansion cannot place."""
    # node types dictionary-encoded: a mask is an integer compare, not one per Python string
    enc = pc.dictionary_encode(pc.fill_null(ops["type"], "")).combine_chunks()
    names = [str(x) for x in enc.dictionary.to_pylist()]
    codes = enc.indices.to_numpy(zero_copy_only=False)

    def of(*wanted: str) -> np.ndarray:
        found: np.ndarray = np.array([x in wanted for x in names], dtype=bool)[codes]
        return found

    bad = ~of(*_ALLOWED_TYPES)
    if bad.any():
        i = int(np.argmax(bad))
        raise ExpansionError(
            f"{where}: rank {int(rank[i])} node {ops['id'][i].as_py()} is a {ops['type'][i].as_py()}; an "
            "algorithm expands into sends, receives and compute only"
        )
    is_send = of("COMM_SEND_NODE")
    is_recv = of("COMM_RECV_NODE")
    comm = is_send | is_recv
    dst, has_dst = _int(ops, "comm_dst", -1)
    src, has_src = _int(ops, "comm_src", -1)
    peer = np.where(is_send, dst, np.where(is_recv, src, -1))
    bad = comm & ((is_send & ~has_dst) | (is_recv & ~has_src) | (peer < 0) | (peer >= n) | (peer == rank))
    if bad.any():
        i = int(np.argmax(bad))
        raise ExpansionError(
            f"{where}: rank {int(rank[i])} node {ops['id'][i].as_py()} ({names[codes[i]]}) names peer "
            f"{int(peer[i])}, not another of its {n} ranks"
        )
    tag, _ = _int(ops, "comm_tag", 0)
    tag = np.where(comm, tag, 0)
    if (tag < 0).any():
        i = int(np.argmax(tag < 0))
        raise ExpansionError(
            f"{where}: rank {int(rank[i])} node {ops['id'][i].as_py()} has a negative comm_tag"
        )
    cnt, has_cnt = _int(ops, "msg_chunk_cnt", 1)
    total, has_total = _int(ops, "total_chunk_cnt", 1)
    first, _ = _int(ops, "msg_chunk_idx", 0)
    fixed, has_fixed = _int(ops, "comm_size", 0)
    chunked = has_total & (total > 0)
    bad = comm & ~chunked & ~has_fixed
    if bad.any():
        i = int(np.argmax(bad))
        raise ExpansionError(
            f"{where}: rank {int(rank[i])} node {ops['id'][i].as_py()} has neither chunk columns "
            "(total_chunk_cnt) nor comm_size, so its message size is unknown"
        )
    return _Messages(
        is_send,
        is_recv,
        of("COMP_NODE"),
        peer,
        tag,
        np.where(has_cnt, cnt, 1),
        total,
        first,
        fixed,
        chunked,
    )


def _rank_edges(
    deps: pa.Table, ops: pa.Table
) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array, np.ndarray]:
    """The algorithm's edges as op rows sorted by (rank, src, dst): (src, dst, rank, kind, pos)."""
    if not deps.num_rows:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, pa.array([], pa.string()), np.zeros(0, dtype=np.int32)
    drank = deps["rank"].to_numpy().astype(np.int64)
    srow = op_rows(ops, drank, deps["src"].to_numpy())
    drow = op_rows(ops, drank, deps["dst"].to_numpy())
    eorder = np.lexsort((drow, srow, drank))
    ekind = deps["kind"].take(pa.array(eorder)).combine_chunks()
    epos = deps["pos"].to_numpy().astype(np.int32)[eorder]
    return srow[eorder], drow[eorder], drank[eorder], ekind, epos


def _cat_starts(starts: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate ``(k+1,)`` offset arrays into one, shifting each by the previous total."""
    out = [np.zeros(1, dtype=np.int64)]
    base = 0
    for s in starts:
        out.append(s[1:] + base)
        base += int(s[-1])
    return np.concatenate(out)


def concat(parts: Sequence[Parts]) -> Parts:
    """One :class:`Parts` holding several prepared algorithms, in order (O(total size))."""
    if len(parts) == 1:
        return parts[0]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return Parts(
        labels=[label for p in parts for label in p.labels],
        ranks=cat("ranks"),
        part_base=_cat_starts([p.part_base for p in parts]),
        op_start=_cat_starts([p.op_start for p in parts]),
        local=cat("local"),
        peer=cat("peer"),
        tag=cat("tag"),
        is_send=cat("is_send"),
        is_recv=cat("is_recv"),
        is_comp=cat("is_comp"),
        chunked=cat("chunked"),
        cnt=cat("cnt"),
        total=cat("total"),
        first=cat("first"),
        fixed_size=cat("fixed_size"),
        duration=cat("duration"),
        max_chunks=cat("max_chunks"),
        tag_span=max(p.tag_span for p in parts),
        edge_start=_cat_starts([p.edge_start for p in parts]),
        esrc=cat("esrc"),
        edst=cat("edst"),
        ekind=pa.concat_arrays([p.ekind for p in parts]),
        epos=cat("epos"),
        entry_start=_cat_starts([p.entry_start for p in parts]),
        entry=cat("entry"),
        exit_start=_cat_starts([p.exit_start for p in parts]),
        exit=cat("exit"),
        columns={
            c: pa.concat_arrays([p.columns[c].cast(OPS_SCHEMA.field(c).type) for p in parts]) for c in COPIED
        },
        wire=np.concatenate([p.wire for p in parts]),
    )
