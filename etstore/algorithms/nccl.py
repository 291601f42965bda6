"""NCCL's ring and double binary tree as algorithm generators, with NCCL's structure.

``nccl-ring`` and ``nccl-tree`` write MSCCL-IR steps through the generators' builder
(:mod:`etstore.algorithms._builder`), so ``check`` proves them, ``sim`` runs them and
``expand`` stamps them like any algorithm; what they add is NCCL's shape (NVIDIA/nccl
``5067397c``, ``src/device/all_reduce.h``, ``src/graph/trees.cc``, ``connect.cc``,
``src/enqueue.cc``):

* **channels.** The buffer is cut into one contiguous part per channel; every channel
  runs its own ring (or tree) on its own threadblocks, at the same time.
* **loops and chunks.** A channel's part is processed in loops; a ring loop moves one
  chunk per rank through ``2(N-1)`` steps (all-reduce: reduce-scatter then all-gather,
  ``runRing``'s ``directSend``, ``directRecvReduceDirectSend`` ..., ``directRecv``), a
  tree loop one chunk up and down. The chunk is the protocol's: a step of its
  connection buffer (``buffSize / NCCL_STEPS``), times 4 steps for ring Simple, halved
  for LL (its lines carry half data), 15/16 of it for LL128; see :func:`chunk_bytes`.
  etstore's chunks are equal, so the loops are too (NCCL's last loop is the short one).
* **protocol on the wire.** LL sends 16-byte lines of two 4-byte data words, each
  beside a 4-byte flag: 2 bytes on the wire per payload byte; LL128 128-byte lines of which
  120 carry data (16/15); Simple none. The trace carries the ratio in
  ``params["wire_bytes_ratio"]``, and the simulator and ``expand`` size every message
  by it (:func:`~etstore.algorithms._parts.wire_bytes`).
* **the tree.** Within a node a chain; across nodes NCCL's double binary tree
  (``ncclGetDtree``: a binary tree over nodes and its mirror, or its shift by one for
  an odd count); the first half of the channels runs tree 0, the second tree 1; reduce
  up and broadcast down run on separate threadblocks at the same time, as NCCL's split
  tree kernel (``runTreeSplit``) does.

Not modelled: NCCL's slices within a chunk and its 8-step flow control (sends never
block here, as in ASTRA-sim), the ring order per channel (every channel's ring is rank
order, as on NVSwitch systems), and the per-step synchronisation latency of each
protocol (it is the network's link latency here; ``calibrate`` fits it per algorithm
and protocol, docs/measured.md).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from etstore.algorithms import _nccl_constants as K
from etstore.algorithms import nccl_tuning as T
from etstore.algorithms._builder import _Builder
from etstore.errors import OptionError, UnsatisfiableError
from etstore.ir import build_trace
from etstore.model import Trace
from etstore.units import budget_exceeded

__all__ = [
    "MAX_LOOPS",
    "NCCL_GENERATORS",
    "NcclSpec",
    "cached_nccl",
    "check_nccl_spec",
    "chunk_bytes",
    "generate_nccl",
    "is_nccl_spec",
    "loops_for",
    "parse_nccl",
    "parse_pick",
    "resolve_nccl",
    "tree_links",
    "wire_ratio",
]

NCCL_GENERATORS: dict[str, tuple[str, ...]] = {
    "nccl-ring": ("allreduce", "allgather", "reducescatter", "broadcast"),
    "nccl-tree": ("allreduce",),
}
"""The NCCL generators and the collectives each implements."""
NCCL_PICK_COLLECTIVES: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "broadcast")
"""What ``nccl`` (NCCL's tuning model choosing per size) covers."""
MAX_LOOPS = 64
"""Loops per channel at most: a larger call gets larger chunks than NCCL's (fewer steps)."""
_PROTO_KEYS = {p.lower(): p for p in K.PROTOCOLS}
_WIRE = {"LL": (2, 1), "LL128": (16, 15), "Simple": (1, 1)}


class NcclSpec(NamedTuple):
    """A concrete NCCL generator: ``nccl-ring[:CHANNELS[:PROTO[:LOOPS]]]`` or
    ``nccl-tree[:CHANNELS[:PROTO[:NODES[:LOOPS]]]]``; ``loops`` None: from the size."""

    algorithm: str  # "ring" | "tree"
    channels: int = 2
    protocol: str = "Simple"
    nodes: int = 1
    loops: int | None = None

    def text(self, *, loops: bool = True) -> str:
        """The spec written back (``nccl-ring:24:LL128:3``)."""
        parts = [f"nccl-{self.algorithm}", str(self.channels), self.protocol]
        if self.algorithm == "tree":
            parts.append(str(self.nodes))
        if loops and self.loops is not None:
            parts.append(str(self.loops))
        return ":".join(parts)


def is_nccl_spec(spec: object) -> bool:
    """Whether ``spec`` names an NCCL algorithm: ``nccl[:...]``, ``nccl-ring[:...]``, ``nccl-tree[:...]``."""
    if not isinstance(spec, str):
        return False
    head = spec.split(":", 1)[0]
    return head == "nccl" or head in NCCL_GENERATORS


def _positive(text: str, what: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise OptionError(f"algorithm {spec!r}: {what} must be a positive integer, got {text!r}")
    return int(text)


def parse_nccl(spec: str) -> NcclSpec:
    """Read ``nccl-ring[:CHANNELS[:PROTO[:LOOPS]]]`` or ``nccl-tree[:CHANNELS[:PROTO[:NODES[:LOOPS]]]]``.

    PROTO is ``ll``, ``ll128`` or ``simple`` in any case; defaults: 2 channels (a
    communicator's least), Simple, 1 node, loops from the size (simulator) or 1.

    Raises
    ------
    OptionError
        Not an NCCL generator, too many fields, or a field out of range.

    Examples
    --------
    >>> parse_nccl("nccl-ring:24:ll128")
    NcclSpec(algorithm='ring', channels=24, protocol='LL128', nodes=1, loops=None)
    >>> parse_nccl("nccl-tree:4:LL:2:3").text()
    'nccl-tree:4:LL:2:3'
    """
    head, *fields = spec.split(":")
    if head not in NCCL_GENERATORS:
        raise OptionError(f"algorithm {spec!r}: not an NCCL generator ({', '.join(NCCL_GENERATORS)})")
    algo = head.removeprefix("nccl-")
    names = ["channels", "protocol", *(["nodes"] if algo == "tree" else []), "loops"]
    if len(fields) > len(names):
        raise OptionError(f"algorithm {spec!r}: expected {head}[:{']['.join(n.upper() for n in names)}]")
    values: dict[str, object] = {}
    for name, text in zip(names, fields, strict=False):
        if name == "protocol":
            proto = _PROTO_KEYS.get(text.lower())
            if proto is None:
                raise OptionError(f"algorithm {spec!r}: protocol {text!r} is not one of ll, ll128, simple")
            values[name] = proto
        else:
            values[name] = _positive(text, name, spec)
    return NcclSpec(algo, **values)  # type: ignore[arg-type]


def wire_ratio(protocol: str) -> tuple[int, int]:
    """Bytes on the wire per payload byte, as (numerator, denominator).

    LL: a 16-byte line carries two 4-byte data words, each beside a 4-byte flag
    (``union ncclLLFifoLine``); LL128: a 128-byte line carries 120 bytes of data and
    one 8-byte flag word (``NCCL_LL128_DATAELEMS`` of ``NCCL_LL128_LINEELEMS``); Simple
    sends data alone.

    >>> wire_ratio("LL"), wire_ratio("LL128"), wire_ratio("Simple")
    ((2, 1), (16, 15), (1, 1))
    """
    return _WIRE[protocol]


def chunk_bytes(
    algorithm: str, protocol: str, coll: str, *, channel_bytes: int = 0, nodes: int = 1, ppn: int = 1
) -> int:
    """Payload bytes of one NCCL chunk (``calcCollChunking``).

    A step is ``buffSize / NCCL_STEPS`` of the protocol's connection buffer (LL
    65,536 B, LL128 614,400 B, Simple 524,288 B); ring Simple takes 4 steps per chunk
    (``*_CHUNKSTEPS``; broadcast 1), the others 1; LL carries half of it as data, LL128
    15/16. Tree LL128 halves its chunk while a channel has few of them
    (``nstepsLL128 = 1 + log2(nodes) + 0.1·ppn``). Rounded down to the protocol's grain.

    >>> [chunk_bytes("ring", p, "allreduce") for p in ("LL", "LL128", "Simple")]
    [32768, 576000, 2097152]
    """
    p = K.PROTOCOLS.index(protocol)
    step = K.BUFFER_BYTES[p] // 8
    steps = 4 if protocol == "Simple" and algorithm == "ring" and coll != "broadcast" else 1
    chunk = step * steps
    if protocol == "LL":
        chunk //= 2
    elif protocol == "LL128":
        chunk = chunk // 16 * 15
    if algorithm == "tree" and protocol == "LL128" and channel_bytes > 0:
        nsteps = 1 + (nodes.bit_length() - 1) + 0.1 * ppn
        while channel_bytes // chunk < nsteps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while channel_bytes // chunk < nsteps * 16 / ppn and chunk > 32768:
            chunk //= 2
    grain = {"LL": 16, "LL128": 1920, "Simple": 512}[protocol]
    return max(grain, chunk // grain * grain)


def loops_for(spec: NcclSpec, coll: str, buffer_bytes: int, ranks: int) -> int:
    """Loops per channel NCCL needs for a ``buffer_bytes`` call (at most :data:`MAX_LOOPS`).

    A ring loop moves one chunk per rank and channel (broadcast: one chunk), a tree loop
    one chunk per channel: ``ceil(bytes / (channels · ranks · chunk))``.

    >>> loops_for(parse_nccl("nccl-ring:24:simple"), "allreduce", 1 << 30, 8)
    3
    """
    per_channel = -(-buffer_bytes // spec.channels)
    chunk = chunk_bytes(
        spec.algorithm,
        spec.protocol,
        coll,
        channel_bytes=per_channel,
        nodes=spec.nodes,
        ppn=ranks // spec.nodes,
    )
    per_loop = chunk * (ranks if spec.algorithm == "ring" and coll != "broadcast" else 1)
    return max(1, min(MAX_LOOPS, -(-per_channel // per_loop)))


# ---------------------------------------------------------------- schedules


def _ring(b: _Builder, N: int, ch: int, L: int, coll: str) -> None:
    """One ring per channel, rank order; every loop of a channel on its threadblock, in order."""
    k = ch * L
    for j in range(ch):
        for r in range(N):
            if coll == "broadcast":  # from rank 0 down the chain, a chunk per loop (runRing of broadcast.h)
                tb = b.tb(r, send=r + 1 if r < N - 1 else -1, recv=r - 1 if r else -1, chan=j)
                for lp in range(L):
                    c = ("i", j * L + lp)
                    b.step(r, tb, "s" if r == 0 else "rcs" if r < N - 1 else "r", c, c)
                continue
            tb = b.tb(r, send=(r + 1) % N, recv=(r - 1) % N, chan=j)
            for lp in range(L):
                if coll == "allreduce":  # channel-major, as NCCL cuts the buffer

                    def at(q: int, lp: int = lp, j: int = j) -> tuple[str, int]:
                        return ("i", (j * L + lp) * N + q % N)

                    b.step(r, tb, "s", at(r - 1), at(r - 1))
                    for t in range(2, N):
                        b.step(r, tb, "rrs", at(r - t), at(r - t))
                    b.step(r, tb, "rrcs", at(r), at(r))
                    for t in range(1, N - 1):
                        b.step(r, tb, "rcs", at(r - t), at(r - t))
                    b.step(r, tb, "r", at(r + 1), at(r + 1))
                    continue
                buf = "o" if coll == "allgather" else "i"

                def blk(q: int, lp: int = lp, j: int = j, buf: str = buf) -> tuple[str, int]:
                    return (buf, (q % N) * k + j * L + lp)  # rank-major: each rank's block is its own

                if coll == "allgather":
                    b.step(r, tb, "s", blk(r), blk(r))
                    for t in range(1, N - 1):
                        b.step(r, tb, "rcs", blk(r - t), blk(r - t))
                    b.step(r, tb, "r", blk(r + 1), blk(r + 1))
                else:  # reducescatter
                    b.step(r, tb, "s", blk(r - 1), blk(r - 1))
                    for t in range(2, N):
                        b.step(r, tb, "rrs", blk(r - t), blk(r - t))
                    b.step(r, tb, "rrc", blk(r), blk(r))


def _btree(n: int, rank: int) -> tuple[int, int, int, int]:
    """NCCL's ``ncclGetBtree``: (up, down0, down1, child type) of ``rank`` over ``n`` (-1: none)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if n > 1 else -1), 0
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    d0 = -1 if low == 0 else rank - low
    d1 = -1 if low == 0 else rank + low
    while d1 >= n:
        d1 = -1 if low == 0 else rank + low
        low >>= 1
    return up, d0, d1, 0 if rank < up else 1


def _dtree(n: int, rank: int, tree: int) -> tuple[int, int, int, int]:
    """``ncclGetDtree``: tree 0 is the btree, tree 1 its mirror (even n) or shift by one (odd n)."""
    if tree == 0:
        return _btree(n, rank)
    if n % 2:
        u, d0, d1, ct = _btree(n, (rank - 1 + n) % n)
        u, d0, d1 = (-1 if x == -1 else (x + 1) % n for x in (u, d0, d1))
        return u, d0, d1, ct
    u, d0, d1, ct = _btree(n, n - 1 - rank)
    u, d0, d1 = (-1 if x == -1 else n - 1 - x for x in (u, d0, d1))
    return u, d0, d1, ct


def tree_links(ranks: int, nodes: int, tree: int) -> tuple[list[int], list[list[int]]]:
    """Parent and children of every rank in NCCL's tree ``tree`` (0 or 1) over ``nodes`` nodes.

    Each node's ranks form a chain (``treeIntra``: rank i's parent is i-1); its first
    rank takes the node's parent in the double binary tree over nodes, its second rank
    (the first with one GPU per node) the first child node's head, its first rank the
    second child node's head (``connectTrees``, balanced pattern).

    >>> tree_links(4, 1, 0)
    ([-1, 0, 1, 2], [[1], [2], [3], []])
    >>> tree_links(4, 4, 1)[0]
    [1, 3, 1, -1]
    """
    ppn = ranks // nodes
    parent = [-1] * ranks
    kids: list[list[int]] = [[] for _ in range(ranks)]
    for node in range(nodes):
        base = node * ppn
        for i in range(1, ppn):
            parent[base + i] = base + i - 1
            kids[base + i - 1].append(base + i)
    child0, child1 = min(1, ppn - 1), 0  # treeIntra indices of the ranks taking child nodes 0 and 1
    for node in range(nodes):
        up, d0, d1, ctype = _dtree(nodes, node, tree)
        head = node * ppn
        if up >= 0:
            parent[head] = up * ppn + (child0 if ctype == 0 else child1)
        for d, idx in ((d0, child0), (d1, child1)):
            if d >= 0:
                kids[node * ppn + idx].append(d * ppn)
    return parent, kids


def _tree(b: _Builder, N: int, ch: int, L: int, nodes: int) -> None:
    """Per channel a tree; chunks reduce up and come back down on separate threadblocks."""
    half = -(-ch // 2)
    links = [tree_links(N, nodes, t) for t in (0, 1)]
    for j in range(ch):
        parent, kids = links[0 if j < half else 1]
        for r in range(N):
            p = parent[r]
            rk = {x: b.tb(r, recv=x, chan=j) for x in kids[r]}
            sd = {x: b.tb(r, send=x, chan=j) for x in kids[r]}
            su = b.tb(r, send=p, chan=j) if p >= 0 else -1
            rd = b.tb(r, recv=p, chan=j) if p >= 0 else -1
            for lp in range(L):
                c = ("i", j * L + lp)
                last = None
                for x in kids[r]:  # reduce up: each child's partial into mine, in turn
                    last = b.step(r, rk[x], "rrc", c, c, after=[last])
                if p >= 0:
                    b.step(r, su, "s", c, c, after=[last])
                got = b.step(r, rd, "r", c, c) if p >= 0 else last
                for x in kids[r]:  # broadcast down
                    b.step(r, sd[x], "s", c, c, after=[got])


def generate_nccl(spec: str | NcclSpec, *, coll: str, ranks: int, loops: int | None = None) -> Trace:
    """Build NCCL's ring or tree for ``coll`` on ``ranks`` ranks as an ``algorithm`` trace.

    Parameters
    ----------
    spec
        ``nccl-ring[:CHANNELS[:PROTO[:LOOPS]]]`` or ``nccl-tree[:CHANNELS[:PROTO[:NODES[:LOOPS]]]]``
        (:func:`parse_nccl`), or a parsed one.
    coll
        ``allreduce``, ``allgather``, ``reducescatter`` or ``broadcast`` (ring; from rank 0),
        ``allreduce`` (tree).
    ranks
        N, at least 2; the tree's nodes must divide it.
    loops
        Loops per channel; None: the spec's, else 1.

    Returns
    -------
    Trace
        ``nchunksperloop`` = N · channels · loops (ring), channels · loops (tree, broadcast);
        ``params["nccl"]`` holds algorithm, protocol, channels, nodes, loops;
        ``params["wire_bytes_ratio"]`` the protocol's bytes on the wire per payload byte;
        the MSCCL-IR header's ``proto`` is the protocol.

    Raises
    ------
    UnsatisfiableError
        A collective the algorithm does not implement, fewer than 2 ranks, nodes that do
        not divide the ranks.
    OptionError
        A bad spec, or ops beyond the memory budget (checked before building).

    Notes
    -----
    Steps: ring O(channels · loops · N²) (each rank 2N-1 per loop), tree
    O(channels · loops · N); building is linear in them.

    Examples
    --------
    >>> t = generate_nccl("nccl-ring:2:ll", coll="allreduce", ranks=4, loops=3)
    >>> t.params["nchunksperloop"], t.params["wire_bytes_ratio"], t.params["nccl"]["loops"]
    (24, [2, 1], 3)
    """
    s = parse_nccl(spec) if isinstance(spec, str) else spec
    name = f"nccl-{s.algorithm}"
    if coll not in NCCL_GENERATORS[name]:
        known = ", ".join(NCCL_GENERATORS[name])
        raise UnsatisfiableError(f"generator {name!r} does not implement {coll!r}; it implements {known}")
    if ranks < 2:
        raise UnsatisfiableError(f"a collective algorithm needs at least 2 ranks, got {ranks}")
    if s.algorithm == "tree" and ranks % s.nodes:
        raise UnsatisfiableError(f"{name}: {ranks} ranks cannot spread evenly over {s.nodes} nodes")
    L = loops if loops is not None else s.loops or 1
    if L < 1:
        raise UnsatisfiableError(f"loops per channel must be at least 1, got {L}")
    per_rank = s.channels * L
    C = per_rank * (ranks if s.algorithm == "ring" and coll != "broadcast" else 1)
    ops = (5.0 * ranks * ranks if s.algorithm == "ring" else 12.0 * ranks) * per_rank
    refused = budget_exceeded(
        ops * 700, f"the {s.text(loops=False)} {coll} over {ranks:,} ranks, {L} loop(s)"
    )
    if refused is not None:
        raise OptionError(refused)
    b = _Builder(ranks, C)
    if s.algorithm == "ring":
        _ring(b, ranks, s.channels, L, coll)
    else:
        _tree(b, ranks, s.channels, L, s.nodes)
    buf = "o" if coll == "allgather" else "i"
    st = b.table({buf: C})
    label = f"{s.text(loops=False)}:{L}"
    header = {
        "name": label.replace(":", "_"),
        "proto": s.protocol,
        "nchannels": s.channels,
        "nchunksperloop": C,
        "ngpus": ranks,
        "coll": coll,
        "inplace": 1,
        "outofplace": 0,
        "minBytes": 0,
        "maxBytes": 0,
    }
    meta = {
        "algorithm": s.algorithm,
        "protocol": s.protocol,
        "channels": s.channels,
        "nodes": s.nodes,
        "loops": L,
    }
    return build_trace(
        st,
        header,
        name=f"{label.replace(':', '-')}-{coll}-{ranks}r",
        source=f"generate_nccl({label!r}, coll={coll!r}, ranks={ranks})",
        producer=name,
        extra_params={
            "generator": name,
            "chunks_per_rank": L,
            "nccl": meta,
            "wire_bytes_ratio": list(wire_ratio(s.protocol)),
        },
    )


def parse_pick(spec: str) -> tuple[str, T.NcclSystem]:
    """Read ``nccl[:GPU[:NODES[:CHANNELS]]]``: the preset's name and the system it stands for.

    Raises
    ------
    OptionError
        Not ``nccl...``, too many fields, an unknown preset, a count below 1.

    >>> parse_pick("nccl:a100:2")[1].nodes
    2
    """
    head, _, rest = spec.partition(":")
    fields = rest.split(":") if rest else []
    if head != "nccl" or len(fields) > 3:
        raise OptionError(f"algorithm {spec!r}: expected nccl[:GPU[:NODES[:CHANNELS]]]")
    gpu = fields[0].lower() if fields and fields[0] else "a100"
    nodes = _positive(fields[1], "nodes", spec) if len(fields) > 1 else 1
    channels = _positive(fields[2], "channels", spec) if len(fields) > 2 else None
    return gpu, T.system_for(gpu, nodes, channels)


def check_nccl_spec(spec: str) -> None:
    """Raise :class:`OptionError` unless ``spec`` is a well-formed NCCL spec of either kind."""
    if spec.split(":", 1)[0] == "nccl":
        parse_pick(spec)
    else:
        parse_nccl(spec)


@functools.lru_cache(maxsize=16)
def cached_nccl(spec: str, coll: str, ranks: int) -> Trace:
    """:func:`generate_nccl` of a spec with its loops, kept for the next caller (traces are not
    changed by their users): a calibration simulates one algorithm for many parameters."""
    return generate_nccl(spec, coll=coll, ranks=ranks)


def resolve_nccl(spec: str, coll: str, buffer_bytes: int, ranks: int) -> tuple[NcclSpec, str]:
    """The concrete generator an NCCL spec runs for one call, and how results name it.

    ``nccl[:GPU[:NODES[:CHANNELS]]]`` asks NCCL's tuning model
    (:func:`~etstore.algorithms.nccl_tuning.choose` on
    :func:`~etstore.algorithms.nccl_tuning.system_for`; default ``a100``, 1 node, the
    preset's channels) for the (algorithm, protocol) and channels of this size, among
    what etstore builds (ring, tree); when NCCL itself would pick another (NVLS, PAT,
    CollNet), the label says so. ``nccl-ring``/``nccl-tree`` specs without loops get
    :func:`loops_for` this size.

    Parameters
    ----------
    coll
        The short collective name (``allreduce`` ...).
    buffer_bytes
        NCCL's ``nBytes`` (all-gather: every rank's part).

    Raises
    ------
    OptionError
        A bad spec, an unknown preset, or a collective ``nccl`` does not cover.

    Examples
    --------
    >>> s, label = resolve_nccl("nccl", "allreduce", 1 << 30, 8)
    >>> s.text(), label
    ('nccl-ring:24:Simple:3', 'nccl:a100 ring/Simple/24ch')
    """
    if spec.split(":", 1)[0] != "nccl":
        s = parse_nccl(spec)
        if s.loops is None:
            s = s._replace(loops=loops_for(s, coll, buffer_bytes, ranks))
        return s, s.text(loops=False)
    gpu, system = parse_pick(spec)
    nodes = system.nodes
    if coll not in NCCL_PICK_COLLECTIVES:
        raise OptionError(f"algorithm {spec!r}: NCCL's model here covers {', '.join(NCCL_PICK_COLLECTIVES)}")
    if ranks % nodes:
        raise OptionError(f"algorithm {spec!r}: {ranks} ranks cannot spread evenly over {nodes} nodes")
    built = ("ring", "tree") if coll == "allreduce" else ("ring",)
    pick = T.choose(coll, buffer_bytes, ranks, system, algorithms=built)
    free = T.choose(coll, buffer_bytes, ranks, system)
    s = NcclSpec(pick.algorithm, pick.channels, pick.protocol, nodes)
    s = s._replace(loops=loops_for(s, coll, buffer_bytes, ranks))
    label = f"nccl:{gpu}{f'x{nodes}' if nodes > 1 else ''} {pick.algorithm}/{pick.protocol}/{pick.channels}ch"
    if (free.algorithm, free.protocol) != (pick.algorithm, pick.protocol):
        label += f" (NCCL: {free.algorithm}/{free.protocol}, not built)"
    return s, label
