"""Built-in collective algorithms, produced in the same representation as MSCCL-IR input.

Each generator writes MSCCL-IR steps (threadblocks, channels, cross-threadblock
dependencies) through a small builder and expands them with the same code the XML
reader uses, so a generated algorithm exports to XML a runtime accepts and to
per-rank ``.et`` files without special cases.

All generators take ``ranks`` (N) and ``chunks`` (k, chunks per rank); the
collective's buffer then has ``nchunksperloop = N·k`` chunks. Layouts: all-reduce,
reduce-scatter in place in the input buffer ``i``; all-gather in place in the output
buffer ``o`` (rank r's input is ``o[r·k : (r+1)·k]``); all-to-all from ``i`` to ``o``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from etstore.algorithms._builder import Ref, _Builder
from etstore.algorithms.nccl import generate_nccl
from etstore.errors import OptionError, UnsatisfiableError
from etstore.ir import build_trace
from etstore.model import Trace
from etstore.units import budget_exceeded

__all__ = ["GENERATORS", "GeneratorInfo", "generate"]

log = logging.getLogger(__name__)

_PEERS_PER_CHANNEL = 32  # MSCCL: at most 32 sending (receiving) threadblocks per channel


# ---------------------------------------------------------------- algorithms


def _ring(b: _Builder, N: int, k: int, coll: str) -> None:
    """k rings (one per channel); lane j moves chunks q·k+j; rank r sends chunk r first."""
    if coll == "broadcast":
        _ring_broadcast(b, N, k)
        return
    for j in range(k):

        def c(x: int, j: int = j) -> int:
            return (x % N) * k + j

        for r in range(N):
            tb = b.tb(r, send=(r + 1) % N, recv=(r - 1) % N, chan=j)
            if coll == "allreduce":
                b.step(r, tb, "s", ("i", c(r)), ("i", c(r)))
                for t in range(1, N - 1):
                    b.step(r, tb, "rrs", ("i", c(r - t)), ("i", c(r - t)))
                b.step(r, tb, "rrcs", ("i", c(r + 1)), ("i", c(r + 1)))
                for t in range(N - 2):
                    b.step(r, tb, "rcs", ("i", c(r - t)), ("i", c(r - t)))
                b.step(r, tb, "r", ("i", c(r + 2)), ("i", c(r + 2)))
            elif coll == "allgather":
                b.step(r, tb, "s", ("o", c(r)), ("o", c(r)))
                for t in range(1, N - 1):
                    b.step(r, tb, "rcs", ("o", c(r - t)), ("o", c(r - t)))
                b.step(r, tb, "r", ("o", c(r + 1)), ("o", c(r + 1)))
            else:  # reducescatter
                b.step(r, tb, "s", ("i", c(r - 1)), ("i", c(r - 1)))
                for t in range(1, N - 1):
                    b.step(r, tb, "rrs", ("i", c(r - 1 - t)), ("i", c(r - 1 - t)))
                b.step(r, tb, "rrc", ("i", c(r)), ("i", c(r)))


def _ring_broadcast(b: _Builder, N: int, k: int) -> None:
    """Broadcast from rank 0 down a chain 0 → 1 → … → N-1 (NCCL's ring broadcast), each of the
    k channels pipelining its chunks q·k+j: a rank forwards a chunk as soon as it has it."""
    for j in range(k):
        for r in range(N):
            tb = b.tb(r, send=r + 1 if r < N - 1 else -1, recv=r - 1 if r else -1, chan=j)
            for q in range(N):
                c = ("i", q * k + j)
                b.step(r, tb, "s" if r == 0 else "rcs" if r < N - 1 else "r", c, c)


def _pair_channel(r: int, q: int, N: int) -> int:
    """Channel of the connection between r and q: symmetric, at most 32 peers per channel."""
    nchan = -(-N // _PEERS_PER_CHANNEL)
    return (r + q) % nchan


def _direct(b: _Builder, N: int, k: int, coll: str) -> None:
    """All pairs: every rank exchanges its peers' blocks directly, one threadblock per peer."""
    if coll == "alltoall":
        _alltoall_direct(b, N, k, coll)
        return
    if coll == "broadcast":  # the root sends the whole buffer to every peer (gloo's one-to-all)
        for q in range(1, N):
            chan = _pair_channel(0, q, N)
            b.step(0, b.tb(0, send=q, chan=chan), "s", ("i", 0), ("i", 0), N * k)
            b.step(q, b.tb(q, recv=0, chan=chan), "r", ("i", 0), ("i", 0), N * k)
        return
    for r in range(N):
        peers = [q for q in range(N) if q != r]
        slot = {q: m for m, q in enumerate(peers)}
        tbs = {q: b.tb(r, send=q, recv=q, chan=_pair_channel(r, q, N)) for q in peers}
        if coll == "allgather":
            for q in peers:
                b.step(r, tbs[q], "s", ("o", r * k), ("o", r * k), k)
                b.step(r, tbs[q], "r", ("o", q * k), ("o", q * k), k)
            continue
        recvd = {}
        for q in peers:  # reduce-scatter: send q its block, take my block from q into scratch
            b.step(r, tbs[q], "s", ("i", q * k), ("s", (r if r < q else r - 1) * k), k)
            recvd[q] = b.step(r, tbs[q], "r", ("i", r * k), ("s", slot[q] * k), k)
        red = b.tb(r)
        last = None
        for q in peers:
            last = b.step(r, red, "re", ("s", slot[q] * k), ("i", r * k), k, after=[recvd[q]])
        if coll == "allreduce":
            for q in peers:
                b.step(r, tbs[q], "s", ("i", r * k), ("i", r * k), k, after=[last])
                b.step(r, tbs[q], "r", ("i", q * k), ("i", q * k), k)


def _alltoall_direct(b: _Builder, N: int, k: int, coll: str) -> None:
    """Every rank sends block q of its input straight to rank q; its own block is copied."""
    for r in range(N):
        for q in range(N):
            if q == r:
                continue
            tb = b.tb(r, send=q, recv=q, chan=_pair_channel(r, q, N))
            b.step(r, tb, "s", ("i", q * k), ("o", r * k), k)
            b.step(r, tb, "r", ("i", r * k), ("o", q * k), k)
        b.step(r, b.tb(r), "cpy", ("i", r * k), ("o", r * k), k)


def _halving_doubling(b: _Builder, N: int, k: int, coll: str) -> None:
    """Recursive halving (reduce-scatter) and recursive doubling (all-gather), partner r XOR d."""
    if N & (N - 1):
        raise UnsatisfiableError(
            f"halving-doubling needs a power-of-two number of ranks, got {N} (use ring or direct)"
        )
    buf = "o" if coll == "allgather" else "i"
    for r in range(N):
        prev: Ref | None = None
        lo, size = 0, N  # blocks this rank is responsible for
        if coll in ("allreduce", "reducescatter"):
            d = N // 2
            while d >= 1:
                tb = b.tb(r, send=r ^ d, recv=r ^ d)
                half = size // 2
                keep, give = (lo + half, lo) if r & d else (lo, lo + half)
                b.step(r, tb, "s", (buf, give * k), (buf, give * k), half * k, after=[prev])
                prev = b.step(r, tb, "rrc", (buf, keep * k), (buf, keep * k), half * k)
                lo, size = keep, half
                d //= 2
        else:
            lo, size = r, 1
        if coll in ("allreduce", "allgather"):
            d = 1
            while d < N:
                tb = b.tb(r, send=r ^ d, recv=r ^ d)
                other = lo ^ d
                b.step(r, tb, "s", (buf, lo * k), (buf, lo * k), size * k, after=[prev])
                prev = b.step(r, tb, "r", (buf, other * k), (buf, other * k), size * k)
                lo, size = min(lo, other), size * 2
                d *= 2


def _bst(lo: int, hi: int, parent: int, par: list[int], kids: list[list[int]]) -> None:
    """In-order binary tree over lo..hi (mid-split), iteratively."""
    stack = [(lo, hi, parent)]
    while stack:
        a, z, p = stack.pop()
        if a > z:
            continue
        mid = (a + z) // 2
        par[mid] = p
        if p >= 0:
            kids[p].append(mid)
        stack.append((mid + 1, z, mid))
        stack.append((a, mid - 1, mid))


def _tree(b: _Builder, N: int, k: int, coll: str) -> None:
    """Double binary tree: two complementary trees (the second is the first shifted by one
    rank, as in NCCL) each reduce half of the chunks to their root and broadcast it back."""
    par_a = [-1] * N
    kids_a: list[list[int]] = [[] for _ in range(N)]
    _bst(0, N - 1, -1, par_a, kids_a)
    for kid in kids_a:
        kid.sort()
    par_b = [-1] * N
    kids_b: list[list[int]] = [[] for _ in range(N)]
    for x in range(N):
        y = (x + 1) % N
        par_b[y] = (par_a[x] + 1) % N if par_a[x] >= 0 else -1
        kids_b[y] = [(c + 1) % N for c in kids_a[x]]
    C = N * k
    halves = [list(range(C // 2)), list(range(C // 2, C))]
    for chan, (par, kids, chunks) in enumerate(((par_a, kids_a, halves[0]), (par_b, kids_b, halves[1]))):
        if not chunks:
            continue
        for r in range(N):
            up = b.tb(r, send=par[r], recv=par[r], chan=chan) if par[r] >= 0 else None
            down = {x: b.tb(r, send=x, recv=x, chan=chan) for x in kids[r]}
            reduced: dict[int, Ref | None] = {}
            for c in chunks:  # reduce towards the root, one chunk at a time
                last: Ref | None = None
                for x in kids[r]:
                    last = b.step(r, down[x], "rrc", ("i", c), ("i", c), after=[last])
                reduced[c] = last
                if up is not None:
                    b.step(r, up, "s", ("i", c), ("i", c), after=[last])
            for c in chunks:  # broadcast the result back down
                got = b.step(r, up, "r", ("i", c), ("i", c)) if up is not None else reduced[c]
                for x in kids[r]:
                    b.step(r, down[x], "s", ("i", c), ("i", c), after=[got])


@dataclass(frozen=True)
class GeneratorInfo:
    """A built-in algorithm: its name, the collectives it implements, a one-line description."""

    name: str
    collectives: tuple[str, ...]
    description: str
    needs_power_of_two: bool = False
    build: Callable[[_Builder, int, int, str], None] | None = field(default=None, repr=False, compare=False)


GENERATORS: Mapping[str, GeneratorInfo] = MappingProxyType(
    {
        "ring": GeneratorInfo(
            "ring",
            ("allreduce", "allgather", "reducescatter", "broadcast"),
            "k unidirectional rings, one per channel; 2N-1 fused steps per threadblock for all-reduce; "
            "broadcast pipelined down the chain from rank 0",
            build=_ring,
        ),
        "direct": GeneratorInfo(
            "direct",
            ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast"),
            "all pairs: one threadblock per peer, reductions serialised in a local threadblock; "
            "broadcast: rank 0 sends every peer the whole buffer",
            build=_direct,
        ),
        "halving-doubling": GeneratorInfo(
            "halving-doubling",
            ("allreduce", "allgather", "reducescatter"),
            "recursive halving reduce-scatter and recursive doubling all-gather (partners r XOR 2^i)",
            needs_power_of_two=True,
            build=_halving_doubling,
        ),
        "tree": GeneratorInfo(
            "tree",
            ("allreduce",),
            "double binary tree: two complementary trees each reduce and broadcast half the chunks",
            build=_tree,
        ),
        "alltoall-direct": GeneratorInfo(
            "alltoall-direct",
            ("alltoall",),
            "every rank sends each peer its block directly",
            build=_alltoall_direct,
        ),
    }
)

# Ops a generator makes for N ranks and k chunks per rank, a little above the counts measured for
# N = 8, 16 and k = 1, 2, 4 (every generator and collective), and the peak bytes per op while
# building (builder tuples, step table, trace columns; tracemalloc measured 260-700).
_OPS_ESTIMATE: Mapping[str, Callable[[int, int], float]] = MappingProxyType(
    {
        "ring": lambda n, k: 5.0 * n * n * k,
        "tree": lambda n, k: 5.0 * n * n * k,
        "direct": lambda n, k: 5.0 * n * n,
        "alltoall-direct": lambda n, k: 5.0 * n * n,
        "halving-doubling": lambda n, k: 5.0 * n * max(1.0, math.log2(n)),
    }
)
_BYTES_PER_OP = 700


def _require_budget(name: str, coll: str, ranks: int, chunks: int) -> None:
    """Refuse, before building, an algorithm whose ops would not fit the memory budget."""
    ops = _OPS_ESTIMATE[name](ranks, chunks)
    message = budget_exceeded(
        ops * _BYTES_PER_OP,
        f"the {name} {coll} over {ranks:,} ranks with {chunks:,} chunk(s) per rank (about {ops:,.0f} ops)",
    )
    if message is not None:
        raise OptionError(message)


_LAYOUT = {  # buffer sizes in chunks (beyond what the steps touch), in-place flags
    "allreduce": (lambda C: {"i": C}, True),
    "reducescatter": (lambda C: {"i": C}, True),
    "allgather": (lambda C: {"o": C}, True),
    "alltoall": (lambda C: {"i": C, "o": C}, False),
    "broadcast": (lambda C: {"i": C}, True),
}


def generate(name: str, *, coll: str, ranks: int, chunks: int = 1) -> Trace:
    """Build a built-in collective algorithm as an ``algorithm`` trace.

    Parameters
    ----------
    name
        One of :data:`GENERATORS`: ``ring``, ``direct``, ``halving-doubling``,
        ``tree`` (double binary tree), ``alltoall-direct``; or an NCCL generator spec,
        ``nccl-ring[:CHANNELS[:PROTO[:LOOPS]]]`` or ``nccl-tree[...]``
        (:func:`etstore.algorithms.nccl.generate_nccl`; ``chunks`` other than 1 is its
        loops per channel).
    coll
        ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall`` or ``broadcast``
        (from rank 0; see each generator's ``collectives``).
    ranks
        Number of ranks N (at least 2).
    chunks
        Chunks per rank k; the buffer has N·k chunks (``nchunksperloop``).

    Returns
    -------
    Trace
        Same representation as :func:`~etstore.formats.msccl_xml.read_msccl_xml`
        output (``params["producer"]`` is the generator name, ``params["generator"]``
        and ``params["chunks_per_rank"]`` record the inputs).

    Raises
    ------
    UnsatisfiableError
        Unknown generator, a collective it does not implement, fewer than two ranks,
        fewer than one chunk, or ``halving-doubling`` on a non-power-of-two.
    OptionError
        The ops for ``ranks`` and ``chunks`` would not fit the memory budget
        (:func:`etstore.units.memory_budget`; checked before anything is built).

    Notes
    -----
    Steps and nodes: ring O(N²·k); direct and alltoall-direct O(N²·k / k) = O(N²)
    steps moving k chunks each; halving-doubling O(N log N); tree O(N·k). Building
    is linear in the steps.

    Examples
    --------
    >>> t = generate("ring", coll="allreduce", ranks=4, chunks=2)
    >>> t.params["nchunksperloop"], t.num_ranks
    (8, 4)
    """
    head = name.split(":", 1)[0]
    if head in ("nccl-ring", "nccl-tree"):  # NCCL's structure: etstore.algorithms.nccl
        return generate_nccl(name, coll=coll, ranks=ranks, loops=None if chunks == 1 else chunks)
    if head == "nccl":
        raise UnsatisfiableError(
            f"{name!r} picks an NCCL algorithm per collective size (the simulator does that); "
            "to generate one, name it: nccl-ring[:CHANNELS[:PROTO[:LOOPS]]] or nccl-tree[...]"
        )
    info = GENERATORS.get(name)
    if info is None:
        raise UnsatisfiableError(
            f"unknown algorithm generator {name!r}; known: {', '.join(GENERATORS)}, nccl-ring, nccl-tree"
        )
    if coll not in info.collectives:
        raise UnsatisfiableError(
            f"generator {name!r} does not implement {coll!r}; it implements {', '.join(info.collectives)}"
        )
    if ranks < 2:
        raise UnsatisfiableError(f"a collective algorithm needs at least 2 ranks, got {ranks}")
    if chunks < 1:
        raise UnsatisfiableError(f"chunks per rank must be at least 1, got {chunks}")
    _require_budget(name, coll, ranks, chunks)
    C = ranks * chunks
    builder = _Builder(ranks, C)
    assert info.build is not None
    info.build(builder, ranks, chunks, coll)
    sizes_of, inplace = _LAYOUT[coll]
    st = builder.table(sizes_of(C))
    algo = f"{name}_{coll}_{ranks}r_{chunks}c"
    header = {
        "name": algo,
        "proto": "Simple",
        "nchannels": int(st.tb_chan.max()) + 1 if len(st.tb_chan) else 1,
        "nchunksperloop": C,
        "ngpus": ranks,
        "coll": coll,
        "inplace": int(inplace),
        "outofplace": int(not inplace),
        "minBytes": 0,
        "maxBytes": 0,
    }
    return build_trace(
        st,
        header,
        name=algo.replace("_", "-"),
        source=f"generate({name!r}, coll={coll!r}, ranks={ranks}, chunks={chunks})",
        producer=name,
        extra_params={"generator": name, "chunks_per_rank": chunks},
    )
