"""Per-rank op templates that a ``COMM_COLL`` node expands into inside the simulator.

A :class:`Template` is the columnar, rank-relative form of a collective algorithm
for one collective size: for every algorithm rank, its sends, receives and local
delays (reductions, endpoint hops) and the dependencies among them. Three sources:

* :func:`native_template`: ASTRA-sim's native ring collectives (chunks, one ring
  phase per network dimension, endpoint delays, local-memory reduction cost);
  see ``docs/simulator.md`` for the derivation.
* :func:`trace_template`: any algorithm trace in etstore's representation
  (``docs/algorithms.md``), stored or generated.
* :func:`ring_algorithm`: a small ring generator used while
  ``etstore.collectives.generators`` is not available.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from etstore.errors import EtstoreError
from etstore.model import Trace, deps_table, ops_table

__all__ = ["K_DELAY", "K_RECV", "K_SEND", "Template", "native_template", "ring_algorithm", "trace_template"]

K_SEND, K_RECV, K_DELAY = 0, 1, 2


class TemplateError(EtstoreError):
    """An algorithm cannot be expanded for a collective (wrong rank count, no sizes)."""


@dataclass(frozen=True, eq=False)
class Template:
    """Ops of every algorithm rank, rank-major; edges are rank-local row offsets."""

    name: str
    n: int
    starts: np.ndarray  # (n + 1,) op rows of rank p: starts[p]:starts[p + 1]
    kind: np.ndarray  # int8: K_SEND, K_RECV, K_DELAY
    dur_ns: np.ndarray  # float64, K_DELAY only
    peer: np.ndarray  # int64 algorithm rank of the peer, -1 for delays
    tag: np.ndarray  # int64 >= 0, local to the algorithm
    size: np.ndarray  # int64 bytes
    edge_starts: np.ndarray  # (n + 1,) edges of rank p
    esrc: np.ndarray  # int64 rank-local row of the source
    edst: np.ndarray  # int64 rank-local row of the destination
    root: np.ndarray  # bool: no incoming edge (waits for the collective to start)
    sink: np.ndarray  # bool: no outgoing edge (the collective waits for it)

    @property
    def num_tags(self) -> int:
        return int(self.tag.max()) + 1 if len(self.tag) else 1


def _finish(
    name: str,
    n: int,
    rank: np.ndarray,
    kind: np.ndarray,
    dur: np.ndarray,
    peer: np.ndarray,
    tag: np.ndarray,
    size: np.ndarray,
    esrc: np.ndarray,
    edst: np.ndarray,
) -> Template:
    """Sort rows rank-major, make edges rank-local and find roots and sinks (global rows in)."""
    order = np.argsort(rank, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    rank, kind, dur, peer, tag, size = (
        rank[order],
        kind[order],
        dur[order],
        peer[order],
        tag[order],
        size[order],
    )
    esrc, edst = inv[esrc], inv[edst]
    counts = np.bincount(rank, minlength=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    if (rank[esrc] != rank[edst]).any():
        raise TemplateError(f"algorithm {name}: a dependency crosses ranks")
    eorder = np.lexsort((edst, esrc, rank[esrc])) if len(esrc) else np.zeros(0, dtype=np.int64)
    esrc, edst = esrc[eorder], edst[eorder]
    erank = rank[esrc]
    ecounts = np.bincount(erank, minlength=n)
    edge_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(ecounts, out=edge_starts[1:])
    root = np.ones(len(rank), dtype=bool)
    root[edst] = False
    sink = np.ones(len(rank), dtype=bool)
    sink[esrc] = False
    base = starts[erank]
    return Template(
        name,
        n,
        starts,
        kind.astype(np.int8),
        dur.astype(np.float64),
        peer.astype(np.int64),
        tag.astype(np.int64),
        size.astype(np.int64),
        edge_starts,
        esrc - base,
        edst - base,
        root,
        sink,
    )


def _floor(x: float, integer_ns: bool) -> float:
    return float(math.floor(x)) if integer_ns else float(x)


def mem_cost_ns(size_bytes: float, accesses: int, local_mem_bw_gb_per_s: float, integer_ns: bool) -> float:
    """``accesses`` passes over ``size_bytes`` of local memory (GB = 10^9), each truncated if asked."""
    one = size_bytes / local_mem_bw_gb_per_s  # GB/s with GB = 1e9 is bytes per ns
    return accesses * _floor(one, integer_ns)


# ---------------------------------------------------------------- native ring


def _phase_plan(coll: str, dims: Sequence[int], chunk: int) -> list[tuple[int, str, int]]:
    """(dimension, phase kind, bytes entering the phase) for one chunk, ASTRA-sim order."""
    active = [d for d, n in enumerate(dims) if n > 1]
    plan: list[tuple[int, str]] = []
    if coll == "ALL_REDUCE":
        if active:
            plan = [(d, "RS") for d in active[:-1]] + [(active[-1], "AR")]
            plan += [(d, "AG") for d in reversed(active[:-1])]
    elif coll in ("REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK"):
        plan = [(d, "RS") for d in active]
    elif coll == "ALL_GATHER":
        plan = [(d, "AG") for d in reversed(active)]
    elif coll == "ALL_TO_ALL":
        plan = [(d, "A2A") for d in active]
    else:
        raise TemplateError(f"ASTRA-sim's native ring has no {coll}; pass an algorithm for it")
    out = []
    c = chunk
    for d, kind in plan:
        n = dims[d]
        out.append((d, kind, c))
        if kind == "RS":
            c = c // n
        elif kind == "AG":
            c = c * n
    return out


def native_template(
    coll: str,
    size_bytes: int,
    dims: Sequence[int],
    *,
    splits: int,
    active_chunks: int,
    endpoint_delay_ns: float,
    local_mem_bw_gb_per_s: float,
    reduction_mem_accesses: int,
    integer_ns: bool,
) -> Template:
    """ASTRA-sim's native ring collective as a template over ``prod(dims)`` ranks.

    The collective of ``size_bytes`` is cut into ``ceil(S / (S // splits))`` chunks
    of ``S // splits`` bytes. Each chunk runs one ring phase per dimension (all-reduce:
    reduce-scatter up the dimensions, all-reduce on the last, all-gather back down;
    all-gather walks the dimensions in reverse). A phase of ``m`` steps on a ring of
    ``n``: an endpoint delay, then ``m`` times (send ``msg`` to the next NPU, receive
    ``msg`` from the previous one, endpoint delay, plus a reduction of
    ``reduction_mem_accesses × msg / local_mem_bw`` when the step reduces). Steps and
    message sizes: all-reduce ``2(n-1)`` of ``c/n`` reducing the first ``n-1``;
    reduce-scatter ``n-1`` of ``c/n`` all reducing; all-gather ``n-1`` of ``c``;
    all-to-all ``n(n-1)/2`` of ``c/n``. At most ``active_chunks`` chunks occupy a
    dimension at once, in chunk order, phase-major.

    Notes
    -----
    O(P · Σ_phases m) ops for P ranks; built with numpy per phase.
    """
    n_ranks = int(np.prod(dims))
    if size_bytes <= 0:
        raise TemplateError(f"collective of {size_bytes} bytes cannot be simulated")
    chunk = max(1, size_bytes // max(1, splits))
    nchunks = -(-size_bytes // chunk)
    plan = _phase_plan(coll, dims, chunk)
    if not plan:  # a single NPU: nothing moves
        z = np.zeros(0, dtype=np.int64)
        return _finish(f"native-{coll}", n_ranks, z, z, z.astype(float), z, z, z, z, z)
    coords = np.zeros((n_ranks, len(dims)), dtype=np.int64)
    stride = np.ones(len(dims), dtype=np.int64)
    ids = np.arange(n_ranks, dtype=np.int64)
    for d, n in enumerate(dims):
        stride[d] = int(np.prod(dims[:d])) if d else 1
        coords[:, d] = (ids // stride[d]) % n
    nxt = {d: ids + (((coords[:, d] + 1) % n) - coords[:, d]) * stride[d] for d, n in enumerate(dims)}
    prv = {d: ids + (((coords[:, d] - 1) % n) - coords[:, d]) * stride[d] for d, n in enumerate(dims)}
    ep = _floor(endpoint_delay_ns, integer_ns)

    # rank-0 structure of one phase, then broadcast to every rank
    seq_kind: list[np.ndarray] = []
    seq_dur: list[np.ndarray] = []
    seq_dir: list[np.ndarray] = []  # +1 send to next, -1 recv from previous, 0 delay
    seq_dim: list[np.ndarray] = []
    seq_tag: list[np.ndarray] = []
    seq_size: list[np.ndarray] = []
    e_src: list[np.ndarray] = []
    e_dst: list[np.ndarray] = []
    nphases = len(plan)
    entry = np.zeros((nchunks, nphases), dtype=np.int64)
    exit_ = np.zeros((nchunks, nphases), dtype=np.int64)
    row = 0
    for p, (d, kind, c) in enumerate(plan):
        n = dims[d]
        if kind == "AR":
            m, msg, red = 2 * (n - 1), c // n, n - 1
        elif kind == "RS":
            m, msg, red = n - 1, c // n, n - 1
        elif kind == "AG":
            m, msg, red = n - 1, c, 0
        else:
            m, msg, red = n * (n - 1) // 2, c // n, 0
        rcost = mem_cost_ns(msg, reduction_mem_accesses, local_mem_bw_gb_per_s, integer_ns)
        # ops of one phase: E0, then per step k: S_k, R_k, D_k  -> 1 + 3m rows
        k = np.arange(1, m + 1)
        kinds = np.empty(1 + 3 * m, dtype=np.int8)
        kinds[0] = K_DELAY
        kinds[1::3], kinds[2::3], kinds[3::3] = K_SEND, K_RECV, K_DELAY
        durs = np.zeros(1 + 3 * m)
        durs[0] = ep
        durs[3::3] = ep + np.where(k <= red, rcost, 0.0)
        dirs = np.zeros(1 + 3 * m, dtype=np.int64)
        dirs[1::3], dirs[2::3] = 1, -1
        sizes = np.zeros(1 + 3 * m, dtype=np.int64)
        sizes[1::3] = sizes[2::3] = msg
        # edges: E0 -> S1, R1 ; R_k -> D_k ; D_k -> S_{k+1}, R_{k+1}
        s_idx, r_idx, d_idx = 1 + 3 * (k - 1), 2 + 3 * (k - 1), 3 + 3 * (k - 1)
        prev = np.concatenate([[0], d_idx[:-1]])
        local_src = np.concatenate([prev, prev, r_idx])
        local_dst = np.concatenate([s_idx, r_idx, d_idx])
        for ch in range(nchunks):
            seq_kind.append(kinds)
            seq_dur.append(durs)
            seq_dir.append(dirs)
            seq_dim.append(np.full(len(kinds), d, dtype=np.int64))
            seq_tag.append(np.full(len(kinds), ch * nphases + p, dtype=np.int64))
            seq_size.append(sizes)
            e_src.append(local_src + row)
            e_dst.append(local_dst + row)
            entry[ch, p] = row
            exit_[ch, p] = row + 3 * m
            row += len(kinds)
    # chaining: a chunk's phases in order; per dimension, the window of active chunks
    for p in range(1, nphases):
        e_src.append(exit_[:, p - 1])
        e_dst.append(entry[:, p])
    order_per_dim: dict[int, list[tuple[int, int]]] = {}
    for p, (d, _, _) in enumerate(plan):
        for ch in range(nchunks):
            order_per_dim.setdefault(d, []).append((p, ch))
    for users in order_per_dim.values():
        users.sort()
        for i in range(active_chunks, len(users)):
            (pa_, ca), (pb, cb) = users[i - active_chunks], users[i]
            e_src.append(np.array([exit_[ca, pa_]]))
            e_dst.append(np.array([entry[cb, pb]]))
    kind1 = np.concatenate(seq_kind)
    dur1 = np.concatenate(seq_dur)
    dir1 = np.concatenate(seq_dir)
    dim1 = np.concatenate(seq_dim)
    tag1 = np.concatenate(seq_tag)
    size1 = np.concatenate(seq_size)
    es1 = np.concatenate(e_src).astype(np.int64)
    ed1 = np.concatenate(e_dst).astype(np.int64)
    # dedupe edges (window and chain may coincide)
    if len(es1):
        pairs = np.unique(np.stack([es1, ed1], axis=1), axis=0)
        es1, ed1 = pairs[:, 0], pairs[:, 1]
    m1 = len(kind1)
    rank = np.repeat(ids, m1)
    peer = np.full(n_ranks * m1, -1, dtype=np.int64)
    for d in range(len(dims)):
        for sign, table in ((1, nxt[d]), (-1, prv[d])):
            mask1 = (dim1 == d) & (dir1 == sign)
            if mask1.any():
                pos = np.flatnonzero(mask1)
                peer[(ids[:, None] * m1 + pos[None, :]).ravel()] = np.repeat(table, len(pos))
    offs = (ids * m1)[:, None]
    esrc = (offs + es1[None, :]).ravel()
    edst = (offs + ed1[None, :]).ravel()
    return _finish(
        f"native-{coll}",
        n_ranks,
        rank,
        np.tile(kind1, n_ranks),
        np.tile(dur1, n_ranks),
        peer,
        np.tile(tag1, n_ranks),
        np.tile(size1, n_ranks),
        esrc,
        edst,
    )


# ---------------------------------------------------------------- algorithm traces


def buffer_bytes(coll: str, comm_size: int, n: int) -> int:
    """Bytes of the buffer an algorithm's ``total_chunk_cnt`` divides, for a Chakra ``comm_size``.

    ``comm_size`` follows ASTRA-sim: the per-rank contribution for ``ALL_GATHER`` (the
    buffer is ``n`` times larger), the whole buffer for every other collective.
    """
    return comm_size * n if coll == "ALL_GATHER" else comm_size


def trace_template(
    trace: Trace,
    coll: str,
    size_bytes: int,
    *,
    duration_unit_ns: float,
    local_mem_bw_gb_per_s: float,
    reduction_mem_accesses: int,
    copy_mem_accesses: int,
    integer_ns: bool,
    label: str | None = None,
) -> Template:
    """An algorithm trace (``docs/algorithms.md``) as a template for a collective of ``size_bytes``.

    Message size is ``B / total_chunk_cnt · msg_chunk_cnt`` with ``B`` =
    :func:`buffer_bytes`, else the op's ``comm_size``. A ``COMP_NODE`` lasts
    ``duration_micros`` if set, else a local reduction (or copy, when its name starts
    with ``copy``) of its chunk bytes. Other node types take no time.

    Raises
    ------
    TemplateError
        A send or receive has neither chunk columns nor ``comm_size``, or a peer is
        not one of the algorithm's ranks.

    Notes
    -----
    O(V + E log E) over the algorithm trace, vectorised.
    """
    name = label or trace.name
    ops = trace.ops
    nops = ops.num_rows
    ranks_all = ops["rank"].to_numpy().astype(np.int64)
    uniq = np.unique(ranks_all)
    n = len(uniq)
    pos = np.searchsorted(uniq, ranks_all)
    B = buffer_bytes(coll, size_bytes, n)
    types = ops["type"].to_numpy(zero_copy_only=False)

    def col(name_: str, fill: int) -> tuple[np.ndarray, np.ndarray]:
        arr = ops[name_]
        valid = pc.is_valid(arr).to_numpy(zero_copy_only=False)
        vals = pc.fill_null(arr, fill).to_numpy(zero_copy_only=False).astype(np.int64)
        return vals, valid

    msg_cnt, has_msg = col("msg_chunk_cnt", 1)
    tot_cnt, has_tot = col("total_chunk_cnt", 1)
    csize, has_csize = col("comm_size", 0)
    tag, _ = col("comm_tag", 0)
    cdst, has_dst = col("comm_dst", -1)
    csrc, has_src = col("comm_src", -1)
    durm = ops["duration_micros"].to_numpy().astype(np.float64)
    chunked = has_tot & (tot_cnt > 0)
    size = np.where(
        chunked,
        (B * np.where(has_msg, msg_cnt, 1)) // np.where(chunked, tot_cnt, 1),
        np.where(has_csize, csize, 0),
    )
    is_send = types == "COMM_SEND_NODE"
    is_recv = types == "COMM_RECV_NODE"
    is_comp = types == "COMP_NODE"
    comm = is_send | is_recv
    bad = comm & ~chunked & ~has_csize
    if bad.any():
        i = int(np.argmax(bad))
        raise TemplateError(
            f"algorithm {name}: rank {int(ranks_all[i])} node {ops['id'][i].as_py()} has neither "
            "chunk columns (total_chunk_cnt) nor comm_size, so its message size is unknown"
        )
    peer_rank = np.where(is_send, cdst, np.where(is_recv, csrc, -1))
    bad = comm & ((is_send & ~has_dst) | (is_recv & ~has_src) | ~np.isin(peer_rank, uniq))
    if bad.any():
        i = int(np.argmax(bad))
        raise TemplateError(
            f"algorithm {name}: rank {int(ranks_all[i])} node {ops['id'][i].as_py()} names peer "
            f"{int(peer_rank[i])}, not one of its {n} ranks"
        )
    peer = np.where(comm, np.searchsorted(uniq, np.where(comm, peer_rank, uniq[0])), -1)
    kind = np.where(is_send, K_SEND, np.where(is_recv, K_RECV, K_DELAY)).astype(np.int8)
    names = ops["name"].to_numpy(zero_copy_only=False)
    is_copy = np.fromiter((str(x or "").startswith("copy") for x in names), dtype=bool, count=nops)
    one_pass = size.astype(np.float64) / local_mem_bw_gb_per_s
    if integer_ns:
        one_pass = np.floor(one_pass)
    mem = one_pass * np.where(is_copy, copy_mem_accesses, reduction_mem_accesses)
    dur = np.where(is_comp, np.where(durm > 0, durm * duration_unit_ns, mem), 0.0)
    if integer_ns:
        dur = np.floor(dur)
    # dependencies -> global rows
    ids = ops["id"].to_numpy().astype(np.uint64)
    key = (ranks_all.astype(np.uint64) << np.uint64(40)) | ids
    korder = np.argsort(key, kind="stable")
    deps = trace.deps
    if deps.num_rows:
        dkey_src = (deps["rank"].to_numpy().astype(np.uint64) << np.uint64(40)) | deps["src"].to_numpy()
        dkey_dst = (deps["rank"].to_numpy().astype(np.uint64) << np.uint64(40)) | deps["dst"].to_numpy()
        sk = key[korder]
        es = korder[np.clip(np.searchsorted(sk, dkey_src), 0, nops - 1)]
        ed = korder[np.clip(np.searchsorted(sk, dkey_dst), 0, nops - 1)]
        ok = (key[es] == dkey_src) & (key[ed] == dkey_dst)
        es, ed = es[ok], ed[ok]
    else:
        es = ed = np.zeros(0, dtype=np.int64)
    return _finish(
        name,
        n,
        pos.astype(np.int64),
        kind,
        dur,
        peer,
        np.where(comm, tag, 0),
        size,
        es.astype(np.int64),
        ed.astype(np.int64),
    )


def ring_algorithm(coll: str, n: int, chunks: int = 1) -> Trace:
    """A unidirectional ring algorithm in etstore's representation (private fallback).

    ``coll`` is ``allreduce``, ``allgather`` or ``reducescatter``. Rank ``r`` sends to
    ``r + 1`` and receives from ``r - 1``; ``chunks`` independent rings (tags
    ``0..chunks-1``) each move ``1 / (n · chunks)`` of the buffer per message.

    Raises
    ------
    TemplateError
        Another collective, or fewer than 2 ranks.
    """
    if coll not in ("allreduce", "allgather", "reducescatter"):
        raise TemplateError(f"the built-in ring generator has no {coll}")
    if n < 2:
        raise TemplateError("a ring needs at least 2 ranks")
    cols: dict[str, list] = {
        k: []
        for k in (
            "rank",
            "id",
            "name",
            "type",
            "comm_src",
            "comm_dst",
            "comm_tag",
            "msg_chunk_cnt",
            "msg_chunk_idx",
            "total_chunk_cnt",
            "chunk_offset",
            "tb_id",
            "local_time_step",
        )
    }
    drank: list[int] = []
    dsrc: list[int] = []
    ddst: list[int] = []
    total = n * chunks
    for r in range(n):
        nid = 0
        for ch in range(chunks):
            steps: list[tuple[str, int]] = [("send", r)]
            if coll in ("allreduce", "reducescatter"):
                for k in range(1, n):
                    c = (r - k) % n
                    steps += [("recv", c), ("reduce", c)]
                    if k < n - 1 or coll == "allreduce":
                        steps.append(("send", c))
                if coll == "allreduce":
                    for k in range(1, n):
                        c = (r + 1 - k) % n
                        steps.append(("recv", c))
                        if k < n - 1:
                            steps.append(("send", c))
            else:
                for k in range(1, n):
                    c = (r - k) % n
                    steps.append(("recv", c))
                    if k < n - 1:
                        steps.append(("send", c))
            first = nid
            for step, (what, c) in enumerate(steps):
                cols["rank"].append(r)
                cols["id"].append(nid)
                cols["name"].append(f"{what}_ch{ch}_c{c}")
                cols["type"].append(
                    {"send": "COMM_SEND_NODE", "recv": "COMM_RECV_NODE"}.get(what, "COMP_NODE")
                )
                cols["comm_src"].append((r - 1) % n if what == "recv" else None)
                cols["comm_dst"].append((r + 1) % n if what == "send" else None)
                cols["comm_tag"].append(ch if what != "reduce" else None)
                cols["msg_chunk_cnt"].append(1)
                cols["msg_chunk_idx"].append(c * chunks + ch)
                cols["total_chunk_cnt"].append(total)
                cols["chunk_offset"].append(c * chunks + ch)
                cols["tb_id"].append(ch)
                cols["local_time_step"].append(step)
                if nid > first:
                    drank.append(r)
                    dsrc.append(nid - 1)
                    ddst.append(nid)
                nid += 1
    ops = ops_table(cols)
    return Trace(
        ops=ops,
        deps=deps_table(drank, dsrc, ddst),
        name=f"ring-{coll}-{n}",
        kind="algorithm",
        params={
            "collective": coll,
            "ngpus": n,
            "nchunksperloop": total,
            "inplace": True,
            "producer": "etstore.sim",
        },
    )
