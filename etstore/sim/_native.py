"""ASTRA-sim's native collective implementations as simulator templates.

ASTRA-sim's system layer runs a collective as *chunks* (``preferred-dataset-splits``
streams), each a sequence of *phases*, one per network dimension; the system JSON
names the implementation of each dimension (``all-reduce-implementation:
["ring", "direct"]``). :func:`native_template` builds that, per rank, as a
:class:`~etstore.sim._templates.Template`:

* ``ring`` / ``oneRing``: a ring of the dimension's NPUs (``one*``: one ring over
  every NPU); all-reduce ``2(n-1)`` steps of ``c/n``, the first ``n-1`` reducing.
* ``direct`` / ``oneDirect``: every NPU sends to all ``n-1`` peers at once;
  all-reduce is a direct reduce-scatter of ``c/n`` to every peer, a reduction per
  received message, then a direct all-gather once every message has arrived, one
  message per ended reduction.
* ``halvingDoubling`` / ``oneHalvingDoubling``: ``log2 n`` exchanges with partner
  ``i XOR 2^k``: halving sizes ``c/2, c/4, ...`` (reduce-scatter), then doubling back
  (all-gather); ASTRA-sim charges each reduction at the size of the *next*
  message, so only ``log2 n - 1`` reductions are paid.
* ``doubleBinaryTree``: an all-reduce up and down one binary tree (in-order
  numbering, root at the highest index for even chunks, the lowest for odd ones):
  leaves send ``c`` to their parent, inner nodes reduce both children's ``c`` and
  forward it, the root reduces and sends back down; every node reduces what comes
  from its parent before passing it on.

Every message received costs one ``endpoint-delay`` (the NPU ↔ memory hop; 10 ns
fixed on a communicator group smaller than the system, ASTRA-sim's "local"
transmission), a phase starts with one, and a reduction costs
``reduction_mem_accesses`` passes at ``local-mem-bw`` (with ``model-shared-bus``, LogGP
transfers instead: :class:`~etstore.sim._phases.SharedBus`). The phases themselves are
built in :mod:`etstore.sim._phases`; this module chooses them per dimension and chains
them into chunks. docs/simulator.md derives each one from ASTRA-sim's source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from etstore.errors import ConfigError, TemplateError
from etstore.sim._phases import (
    Block,
    Hop,
    Program,
    Reduce,
    SharedBus,
    direct_phase,
    halving_doubling_phase,
    ring_phase,
    tree_phase,
)
from etstore.sim._templates import Template, Uniform, assemble, empty_template, mem_cost_ns, uniform

__all__ = [
    "IMPLEMENTATIONS",
    "native_template",
    "parse_implementation",
]

IMPLEMENTATIONS: tuple[str, ...] = (
    "ring",
    "oneRing",
    "direct",
    "oneDirect",
    "halvingDoubling",
    "oneHalvingDoubling",
    "doubleBinaryTree",
)
"""ASTRA-sim's native implementation names (``directN`` / ``oneDirectN`` carry a window)."""

_LOCAL_DELAY_NS = 10.0  # ASTRA-sim's "fast" NPU <-> memory hop of a communicator group's ring


def parse_implementation(name: str) -> tuple[str, int]:
    """``(base, window)`` of an ASTRA-sim implementation name; window -1 when none.

    Raises
    ------
    ConfigError
        Not one of :data:`IMPLEMENTATIONS` (``directN`` with a whole number N allowed).
    """
    for base in ("oneDirect", "direct"):
        if name.startswith(base) and name != base:
            rest = name[len(base) :]
            if rest.isdigit():
                return base, int(rest)
    if name in IMPLEMENTATIONS:
        return name, -1
    raise ConfigError(f"unknown collective implementation {name!r}; supported: {', '.join(IMPLEMENTATIONS)}")


@dataclass(frozen=True)
class _Dim:
    """One logical dimension: ``n`` NPUs ``stride`` apart, run with ``impl``."""

    n: int
    stride: int
    impl: str
    window: int


def _logical_dims(dims: Sequence[int], impls: Sequence[str], local: bool, coll: str) -> list[_Dim]:
    """ASTRA-sim's logical topology: one entry per listed implementation (GeneralComplexTopology)."""
    total = int(np.prod(dims)) if len(dims) else 1
    parsed = [parse_implementation(x) for x in impls] or [("ring", -1)] * len(dims)
    if local:
        # a communicator group smaller than the system: one ring of its members, and a
        # multi-dimensional list falls back to ring (CommunicatorGroup::get_collective_plan)
        base, window = parsed[0] if len(parsed) == 1 else ("ring", -1)
        if base == "doubleBinaryTree":
            raise ConfigError(
                f"{coll}: doubleBinaryTree on a communicator group smaller than the system is not "
                "supported (ASTRA-sim builds a ring for such a group); supported there: ring, direct, "
                "halvingDoubling"
            )
        return [_Dim(total, 1, base.removeprefix("one").lower() if base.startswith("one") else base, window)]
    if len(parsed) > len(dims):
        raise ConfigError(
            f"{coll}: {len(parsed)} implementations ({', '.join(impls)}) for a network of "
            f"{len(dims)} dimensions"
        )
    if parsed[-1][0] == "doubleBinaryTree" and len(parsed) < len(dims):
        # ASTRA-sim numbers the last listed dimension's tree as the network's last one
        raise ConfigError(
            f"{coll}: doubleBinaryTree as the last of {len(parsed)} implementations on a network of "
            f"{len(dims)} dimensions is not supported (ASTRA-sim builds its tree over the wrong NPUs); "
            "list an implementation for every dimension"
        )
    out: list[_Dim] = []
    stride = 1
    for d, (base, window) in enumerate(parsed):
        if base.startswith("one"):  # one ring over every NPU, and no further dimension
            out.append(_Dim(total, 1, base[3].lower() + base[4:], window))
            return out
        out.append(_Dim(int(dims[d]), stride, base, window))
        stride *= int(dims[d])
    return out


def _phase_plan(
    coll: str, ldims: Sequence[_Dim], chunk: int, optimization: str
) -> list[tuple[int, str, int]]:
    """(logical dimension, phase collective, bytes entering) for one chunk (Sys::generate_collective)."""
    order = list(range(len(ldims)))
    if coll == "ALL_GATHER":
        order.reverse()
    active = [d for d in order if ldims[d].n > 1]
    kind = {"ALL_REDUCE": "AR", "ALL_GATHER": "AG", "ALL_TO_ALL": "A2A"}.get(coll, "RS")
    if kind != "AR" or optimization == "baseline":
        steps = [(d, kind) for d in active]
    elif active:  # localBWAware: reduce-scatter up, all-reduce on the last, all-gather down
        steps = [(d, "RS") for d in active[:-1]] + [(active[-1], "AR")]
        steps += [(d, "AG") for d in reversed(active[:-1])]
    else:
        steps = []
    out = []
    c = chunk
    for d, k in steps:
        n = ldims[d].n
        out.append((d, k, c))
        if ldims[d].impl == "doubleBinaryTree":
            continue  # ASTRA-sim runs a whole-chunk all-reduce whatever the phase
        if k == "RS":
            c = c // n
        elif k == "AG":
            c = c * n
    return out


def _check(coll: str, dim: _Dim, kind: str) -> None:
    """Refuse what ASTRA-sim cannot run (it exits or crashes) in one line."""
    n, impl = dim.n, dim.impl
    power_of_two = n & (n - 1) == 0
    if impl == "halvingDoubling":
        if kind == "A2A":
            raise ConfigError(f"{coll}: halvingDoubling has no all-to-all; supported: ring, direct")
        if not power_of_two:
            raise ConfigError(f"{coll}: halvingDoubling needs a power-of-two dimension, not {n} NPUs")
    if impl == "doubleBinaryTree" and not power_of_two:
        raise ConfigError(f"{coll}: doubleBinaryTree needs a power-of-two dimension, not {n} NPUs")
    if impl == "direct" and 0 < dim.window < n - 1:
        raise ConfigError(
            f"{coll}: direct{dim.window} (a window of {dim.window} < {n - 1} peers) is not supported; "
            "use direct (every peer at once)"
        )


# ---------------------------------------------------------------- assembling the collective


@dataclass
class _Rows:
    """Global rows of the template being built (every rank's ops, in (phase, chunk) order)."""

    parts: dict[str, list[np.ndarray]]
    count: int = 0
    per_rank: list[np.ndarray] = field(default_factory=list)  # rows of each rank, per add()

    def add(self, counts: np.ndarray, **cols: np.ndarray) -> int:
        """Append rows laid out rank by rank, ``counts[r]`` of them for rank r; returns the first."""
        first = self.count
        for k, v in cols.items():
            self.parts.setdefault(k, []).append(v)
        self.count += len(cols["kind"])
        self.per_rank.append(counts)
        return first

    def rank_major(self) -> np.ndarray:
        """New position of every row when the rows are ordered by rank, then by when added
        (what :func:`assemble` sorts into; laid out directly, its sorts find sorted input)."""
        c = np.stack(self.per_rank)  # (adds, ranks)
        before = np.cumsum(c, axis=0) - c  # rows of the same rank in earlier adds
        total = c.sum(axis=0)
        start = np.cumsum(total) - total
        out = []
        for b in range(len(c)):
            n = int(c[b].sum())
            within = np.arange(n) - np.repeat(np.cumsum(c[b]) - c[b], c[b])
            out.append(np.repeat(start + before[b], c[b]) + within)
        return np.concatenate(out)


def _place(rows: _Rows, blk: Block, dim: _Dim, n_ranks: int, tag: int) -> tuple[np.ndarray, np.ndarray]:
    """Add a block for every rank (rank r runs the program of its index in ``dim``); returns the
    global rows of each rank's entry and exit op."""
    ranks = np.arange(n_ranks, dtype=np.int64)
    idx = (ranks // dim.stride) % dim.n
    base = ranks - idx * dim.stride  # the rank of index 0 in r's dimension
    counts = np.diff(blk.starts)[idx]
    offs = np.zeros(n_ranks, dtype=np.int64)
    np.cumsum(counts[:-1], out=offs[1:])
    row_rank = np.repeat(ranks, counts)
    src = blk.starts[idx][row_rank] + np.arange(int(counts.sum())) - offs[row_rank]
    bpeer = blk.peer[src]
    first = rows.add(
        counts,
        rank=row_rank,
        kind=blk.kind[src],
        dur=blk.dur[src],
        peer=np.where(bpeer >= 0, base[row_rank] + bpeer * dim.stride, -1),
        tag=np.full(len(src), tag, dtype=np.int64),
        size=blk.size[src],
    )
    start_g = first + offs - blk.starts[idx]  # global row of block row b on rank r: start_g[r] + b
    ecounts = np.diff(blk.edge_starts)[idx]
    eoffs = np.zeros(n_ranks, dtype=np.int64)
    np.cumsum(ecounts[:-1], out=eoffs[1:])
    erank = np.repeat(ranks, ecounts)
    esrc_b = blk.edge_starts[idx][erank] + np.arange(int(ecounts.sum())) - eoffs[erank]
    rows.parts.setdefault("esrc", []).append(start_g[erank] + blk.esrc[esrc_b])
    rows.parts.setdefault("edst", []).append(start_g[erank] + blk.edst[esrc_b])
    return start_g + blk.entry[idx], start_g + blk.exit[idx]


def _order_links(
    plan: Sequence[tuple[int, str, int]], nchunks: int, active_chunks: int
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((phase, chunk) that must end, (phase, chunk) that waits for it): a chunk's phases in
    order, and per dimension a window of ``active_chunks`` chunks in (phase, chunk) order."""
    out = [((p - 1, ch), (p, ch)) for p in range(1, len(plan)) for ch in range(nchunks)]
    users: dict[int, list[tuple[int, int]]] = {}
    for p, (d, _, _) in enumerate(plan):
        users.setdefault(d, []).extend((p, ch) for ch in range(nchunks))
    for seq in users.values():
        seq.sort()
        out += [(seq[i - active_chunks], seq[i]) for i in range(active_chunks, len(seq))]
    return out


def _uniform_template(
    name: str,
    placed: Sequence[tuple[int, int, Program]],
    plan: Sequence[tuple[int, str, int]],
    ldims: Sequence[_Dim],
    n_ranks: int,
    nchunks: int,
    active_chunks: int,
) -> Uniform:
    """Every rank runs the same ops (ring, direct, halving-doubling): one rank's program, its
    phases one after another, each row's peer a rule of its dimension."""
    sizes = [len(prog.kind) for _, _, prog in placed]
    offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    at = {(p, ch): i for i, (p, ch, _) in enumerate(placed)}
    es: list[np.ndarray] = []
    ed: list[np.ndarray] = []
    tags: list[np.ndarray] = []
    dn: list[np.ndarray] = []
    stride: list[np.ndarray] = []
    nphases = len(plan)
    for i, (p, ch, prog) in enumerate(placed):
        dim = ldims[plan[p][0]]
        es.append(offs[i] + prog.esrc)
        ed.append(offs[i] + prog.edst)
        tags.append(np.full(sizes[i], ch * nphases + p, dtype=np.int64))
        dn.append(np.full(sizes[i], dim.n, dtype=np.int64))
        stride.append(np.full(sizes[i], dim.stride, dtype=np.int64))
    for a, b in _order_links(plan, nchunks, active_chunks):
        es.append(np.array([offs[at[a]] + placed[at[a]][2].exit]))
        ed.append(np.array([offs[at[b]] + placed[at[b]][2].entry]))
    progs = [prog for _, _, prog in placed]
    return uniform(
        name,
        n_ranks,
        np.concatenate([x.kind for x in progs]),
        np.concatenate([x.dur for x in progs]),
        np.concatenate([x.size for x in progs]),
        np.concatenate(tags),
        np.concatenate([x.mode for x in progs]),
        np.concatenate([x.val for x in progs]),
        np.concatenate(dn),
        np.concatenate(stride),
        np.concatenate(es),
        np.concatenate(ed),
    )


def _block(
    coll: str, dim: _Dim, kind: str, c: int, hop: Hop, reduce: Reduce, local: bool, tree: int, bus: bool
) -> Block | Program:
    """The program of one phase on ``dim`` entered with ``c`` bytes."""
    _check(coll, dim, kind)
    if dim.impl == "direct" and bus:
        raise ConfigError(
            f"{coll}: direct with model-shared-bus is not supported (ASTRA-sim queues its {dim.n - 1} "
            "concurrent packets on the shared bus); supported with the shared bus: ring, halvingDoubling, "
            "doubleBinaryTree"
        )
    if dim.impl == "ring":
        return ring_phase(dim.n, kind, c, hop, reduce)
    if dim.impl == "direct":
        return direct_phase(dim.n, kind, c, hop, reduce, local)
    if dim.impl == "halvingDoubling":
        return halving_doubling_phase(dim.n, kind, c, hop, reduce)
    return tree_phase(dim.n, c, hop, reduce, root_max=tree % 2 == 0)


def native_template(
    coll: str,
    size_bytes: int,
    dims: Sequence[int],
    *,
    impls: Sequence[str] = (),
    local: bool = False,
    total_npus: int | None = None,
    splits: int,
    active_chunks: int,
    endpoint_delay_ns: float,
    local_mem_bw_gb_per_s: float,
    reduction_mem_accesses: int,
    integer_ns: bool,
    optimization: str = "localBWAware",
    shared_bus: SharedBus | None = None,
) -> Template | Uniform:
    """ASTRA-sim's native collective as a template over ``prod(dims)`` ranks.

    Parameters
    ----------
    coll
        Chakra collective name (``ALL_REDUCE``, ``ALL_GATHER``, ``REDUCE_SCATTER``, ``ALL_TO_ALL``).
    size_bytes
        The collective's size (bytes).
    dims
        NPUs per network dimension (``(n,)`` for a communicator group).
    impls
        ASTRA-sim implementation per dimension (:data:`IMPLEMENTATIONS`); empty: ring on
        every dimension. Dimensions past the list are not used, as in ASTRA-sim; a
        ``one*`` name is one ring over every NPU.
    local
        The ranks are a communicator group smaller than the system: one dimension, a list
        of several implementations falls back to ring, and the NPU ↔ memory hop is
        ASTRA-sim's fixed 10 ns instead of the endpoint delay.
    total_npus
        NPUs of the whole system (ASTRA-sim's minimum chunk); ``prod(dims)`` if None.
    splits, active_chunks
        ``preferred-dataset-splits``, ``active-chunks-per-dimension``.
    endpoint_delay_ns, local_mem_bw_gb_per_s, reduction_mem_accesses, integer_ns
        Endpoint delay (ns), local memory bandwidth (GB = 10^9) and passes of a reduction.
    optimization
        ``collective-optimization``: ``localBWAware`` (all-reduce = reduce-scatter up
        the dimensions, all-reduce on the last, all-gather down) or ``baseline``
        (an all-reduce phase of the whole chunk on every dimension).
    shared_bus
        ASTRA-sim's ``model-shared-bus: 1`` (:class:`SharedBus`): memory hops cost LogGP
        transfers instead of the endpoint delay; None: the endpoint delay.

    Returns
    -------
    Template or Uniform
        A :class:`~._templates.Uniform` (one rank's program, peers by rule: ``O(ranks)``
        rows for a ring) when every phase runs the same ops on every rank (ring, direct,
        halving-doubling), else every rank laid out (trees). ``ceil(S / c)`` chunks of
        ``c = S // splits`` bytes (``c`` at least ``total_npus`` except for all-gather),
        each one phase per used dimension;
        at most ``active_chunks`` chunks occupy a dimension at once, in chunk order.
        A rank's part ends with its last phase's last step: its own last sends are
        not waited for (ASTRA-sim sends without a completion callback).

    Raises
    ------
    ConfigError
        An implementation ASTRA-sim cannot run here (names it and what is supported).
    TemplateError
        ``size_bytes`` is not positive, or a collective ASTRA-sim has no native form of.

    Notes
    -----
    O(Σ_phases ops) of one rank for a uniform collective, O(P · Σ_phases ops) for P ranks
    otherwise, built with numpy per (phase, chunk).
    """
    n_ranks = int(np.prod(dims)) if len(dims) else 1
    if size_bytes <= 0:
        raise TemplateError(f"collective of {size_bytes} bytes cannot be simulated")
    if coll not in ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "ALL_TO_ALL"):
        raise TemplateError(f"ASTRA-sim's native collectives have no {coll}; pass an algorithm for it")
    if optimization not in ("localBWAware", "baseline"):
        raise ConfigError(f"collective-optimization {optimization!r}: expected localBWAware or baseline")
    size = size_bytes
    chunk = max(1, size // max(1, splits))
    total = n_ranks if total_npus is None else total_npus
    if coll != "ALL_GATHER" and total > chunk:  # Sys::determine_chunk_size's minimum
        chunk, size = total, max(1, splits) * total
    nchunks = -(-size // chunk)
    ldims = _logical_dims(dims, impls, local, coll)
    plan = _phase_plan(coll, ldims, chunk, optimization)
    if not plan:  # a single NPU: nothing moves
        return empty_template(f"native-{coll}", n_ranks)
    ep = _LOCAL_DELAY_NS if local else endpoint_delay_ns
    ep = float(math.floor(ep)) if integer_ns else float(ep)

    def hop(b: int, packet: str) -> float:
        # a group's ring uses the fast path, never the shared bus (MemBus::send_from_*)
        if shared_bus is None or local:
            return ep
        return shared_bus.hop(b, packet, integer_ns)

    def reduce(b: int) -> float:
        return mem_cost_ns(b, reduction_mem_accesses, local_mem_bw_gb_per_s, integer_ns)

    rows = _Rows({})
    nphases = len(plan)
    entry = np.zeros((nchunks, nphases, n_ranks), dtype=np.int64)
    exit_ = np.zeros((nchunks, nphases, n_ranks), dtype=np.int64)
    # doubleBinaryTree alternates its two trees each time a phase is generated on the
    # dimension, chunk by chunk (all phases of chunk 0, then of chunk 1, ...)
    uses = [sum(1 for d2, _, _ in plan[:p] if d2 == d) for p, (d, _, _) in enumerate(plan)]
    per_chunk = [sum(1 for d2, _, _ in plan if d2 == d) for d, _, _ in plan]
    cache: dict[tuple[int, int], Block | Program] = {}
    placed: list[tuple[int, int, Block | Program]] = []  # (phase, chunk, block), phase-major
    for p, (d, kind, c) in enumerate(plan):
        for ch in range(nchunks):
            tree = ch * per_chunk[p] + uses[p]
            key = (p, tree % 2 if ldims[d].impl == "doubleBinaryTree" else 0)
            if key not in cache:
                cache[key] = _block(
                    coll, ldims[d], kind, c, hop, reduce, local, tree, shared_bus is not None and not local
                )
            placed.append((p, ch, cache[key]))
    name = f"native-{coll}"
    programs = [(p, ch, blk) for p, ch, blk in placed if isinstance(blk, Program)]
    if len(programs) == len(placed):
        return _uniform_template(name, programs, plan, ldims, n_ranks, nchunks, active_chunks)
    laid: dict[int, Block] = {}  # a program mixed with trees, laid out for every index once
    for p, ch, blk in placed:
        if isinstance(blk, Program):
            blk = laid.setdefault(id(blk), blk.block())
        entry[ch, p], exit_[ch, p] = _place(rows, blk, ldims[plan[p][0]], n_ranks, ch * nphases + p)
    links = [
        (exit_[ca, pa_], entry[cb, pb]) for (pa_, ca), (pb, cb) in _order_links(plan, nchunks, active_chunks)
    ]
    if links:  # a window edge may repeat a chain edge: keep one
        pair = np.unique(
            np.concatenate([a for a, _ in links]) * rows.count + np.concatenate([b for _, b in links])
        )
        link_src, link_dst = pair // rows.count, pair % rows.count
    else:
        link_src = link_dst = np.zeros(0, dtype=np.int64)
    pos = rows.rank_major()
    es = pos[np.concatenate([*rows.parts["esrc"], link_src])]
    ed = pos[np.concatenate([*rows.parts["edst"], link_dst])]
    cols = {}
    for k, v in rows.parts.items():
        if k not in ("esrc", "edst"):
            col = np.concatenate(v)
            cols[k] = np.empty_like(col)
            cols[k][pos] = col
    return assemble(
        name,
        n_ranks,
        cols["rank"],
        cols["kind"],
        cols["dur"],
        cols["peer"],
        cols["tag"],
        cols["size"],
        es,
        ed,
        # ASTRA-sim sends without a completion callback: a rank leaves a native collective
        # after its last step, its own last messages may still be in flight
        await_sends=False,
    )
