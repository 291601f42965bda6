"""Routes and distances over a topology: hop counts, transfer times, next-link tables.

Everything here works on the link arrays of a
:class:`~etstore.topology.links.LinkArrays` and is vectorised: breadth-first search
from every NPU at once on bitsets, min-plus relaxation for weighted distances, and
closed forms (sums of per-axis distances) for intact built-in shapes. Tables are
cached on the topology, which is immutable.

Routes take the fewest hops; among equally short ones the lowest link id wins.
Built-in shapes list each NPU's links axis 0 first, so their routes are
dimension-ordered (XY routing on a mesh). :func:`dims_of` and
:func:`link_dimensions` give the axes and each link's axis for simulators that
route by dimension themselves.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np

from etstore.errors import TopologyError
from etstore.topology.axes import GIB, Dim, coordinates, link_values, require_budget
from etstore.topology.links import LinkArrays

__all__ = [
    "axis_first_links",
    "axis_step",
    "diameter_hops",
    "dims_of",
    "distances_ns",
    "hop_distances",
    "link_dimensions",
    "next_link",
    "product_distances",
    "require_connected",
    "require_routes",
    "route",
]

log = logging.getLogger(__name__)

_SIZES_RE = re.compile(r":(\d+(?:x\d+)*)$")


# --------------------------------------------------------------- distances
def _require_table(t: LinkArrays, bytes_per_pair: float, what: str) -> None:
    """Refuse an N × N ``what`` table of ``bytes_per_pair`` (peak, temporaries included) over budget."""
    n = t.num_npus
    require_budget(float(n) * n * bytes_per_pair, f"topology {t.name}: the {n:,} x {n:,} {what} table")


ROUTE_BYTES_PER_PAIR = 12
"""Bytes per NPU pair of routing a simulation over a topology: the simulator's int32 next-hop
table, the topology's own next-link table it starts from, and that table's transposed copy."""


def require_routes(t: LinkArrays) -> None:
    """Refuse, before any table is allocated, a topology whose routes would not fit the memory budget.

    Why: a simulation routes through an N × N table (:data:`ROUTE_BYTES_PER_PAIR`); a spec of a
    few characters (``hypercube:65536``) asks for 48 GiB of it. ``describe()`` and the closed
    forms need none of it, so building a topology does not check this; what routes over it does.

    Raises
    ------
    TopologyError
        The tables exceed :func:`etstore.units.memory_budget`, in one line naming the topology,
        the estimate and how to raise the budget.
    """
    _require_table(t, ROUTE_BYTES_PER_PAIR, "routing")


def diameter_hops(t: LinkArrays) -> int:
    """Largest fewest-links distance between two NPUs (-1 if some NPU cannot reach another).

    Notes
    -----
    Intact built-in shapes add up the per-axis diameters, O(axes), so even a
    1,048,576-NPU ring needs no N × N table; other topologies take the maximum of
    :func:`hop_distances`.
    """
    if t.is_intact():
        per_axis = {"line": lambda s: s - 1, "ring": lambda s: s // 2, "uniring": lambda s: s - 1}
        return sum(per_axis.get(d.kind, lambda s: 1)(d.size) for d in t.dims if d.size > 1)
    hops = hop_distances(t)
    return -1 if (hops < 0).any() else int(hops.max())


def hop_distances(t: LinkArrays) -> np.ndarray:
    """``h[s, d]`` = fewest links from ``s`` to ``d`` (int32, N × N; -1 if unreachable).

    Notes
    -----
    Built-in shapes add up per-axis distances, O(N² · axes). Other topologies run
    a breadth-first search from every NPU at once on bitsets: each round ORs the
    reach sets of the in-neighbours, O(D · E · N / 8) byte operations for hop
    diameter D. Cached.
    """
    return t.memo("hops", lambda: _hop_distances(t))


def _hop_distances(t: LinkArrays) -> np.ndarray:
    """Uncached :func:`hop_distances`."""
    n = t.num_npus
    if t.is_intact():
        _require_table(t, 28, "hop-distance")  # float64 sum and its gather temporaries, int32 result
        return product_distances(t, [1.0] * len(t.dims)).astype(np.int32)
    _require_table(t, 4 + 3 * 0.125 + 0.125 * t.num_links / max(n, 1), "hop-distance")
    hops = np.full((n, n), -1, dtype=np.int32)
    np.fill_diagonal(hops, 0)
    if not t.num_links:
        return hops
    order = np.argsort(t.dst, kind="stable")
    s_sorted, d_sorted = t.src[order], t.dst[order]
    starts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
    targets = d_sorted[starts]
    reach = np.packbits(np.eye(n, dtype=bool), axis=1)  # reach[v] = sources that reached v
    h = 0
    while True:
        h += 1
        incoming = np.bitwise_or.reduceat(reach[s_sorted], starts, axis=0)
        new = reach.copy()
        new[targets] |= incoming
        fresh = new & ~reach
        if not fresh.any():
            break
        rows = np.flatnonzero(fresh.any(axis=1))
        bits = np.unpackbits(fresh[rows], axis=1, count=n).astype(bool)
        v_idx, s_idx = np.nonzero(bits)
        hops[s_idx, rows[v_idx]] = h
        reach = new
    return hops


def require_connected(t: LinkArrays) -> None:
    """Raise :class:`TopologyError` unless every NPU reaches every other.

    Raises
    ------
    TopologyError
        Naming one NPU pair with no directed path (by the NPUs' original ids).

    Notes
    -----
    O(1) for intact built-in shapes; otherwise O(D · E · N / 8) through :func:`hop_distances`.
    """
    if t.is_intact():  # an intact built-in shape is connected by construction
        return
    bad = np.argwhere(hop_distances(t) < 0)
    if len(bad):
        s, d = (t.label(int(x)) for x in bad[0])
        raise TopologyError(f"topology {t.name} is disconnected: no path from NPU {s} to NPU {d}")


def distances_ns(t: LinkArrays, size_bytes: float = 0.0) -> np.ndarray:
    """``d[s, d]`` = least time to move ``size_bytes`` from ``s`` to ``d`` store-and-forward (ns).

    Each hop costs its link's ``latency + size / bandwidth``; ``inf`` if unreachable.

    Notes
    -----
    Built-in shapes add up per-axis distances, O(N² · axes); when all links take
    the same time it is ``hops × t``, O(N²); otherwise Bellman–Ford from every
    source at once (min-plus relaxation over the links), O(D' · N · E) with D' the
    hop count of the slowest shortest path.
    """
    if t.is_regular():
        per_axis = []
        for d in t.dims:
            bw, lat = link_values(d)  # a switch hop at the fair share its unwound links carry
            per_axis.append(lat + size_bytes / (bw * GIB / 1e9))
        return product_distances(t, per_axis)
    w = t.link_time_ns(size_bytes)
    hops = hop_distances(t)
    if t.num_links == 0 or np.all(w == w[0]):
        out = hops.astype(np.float64) * (w[0] if t.num_links else 0.0)
        out[hops < 0] = np.inf
        return out
    return _relaxed_distances(t, w)


def _relaxed_distances(t: LinkArrays, w: np.ndarray) -> np.ndarray:
    """All-pairs least sums of link weights ``w`` by min-plus relaxation (Bellman–Ford)."""
    n = t.num_npus
    _require_table(t, 24 + 16 * t.num_links / max(n, 1), "distance")
    order = np.argsort(t.dst, kind="stable")
    s_sorted, d_sorted, w_sorted = t.src[order], t.dst[order], w[order]
    starts = np.flatnonzero(np.r_[True, d_sorted[1:] != d_sorted[:-1]])
    targets = d_sorted[starts]
    dist = np.full((n, n), np.inf)
    np.fill_diagonal(dist, 0.0)
    for _ in range(n):
        cand = np.minimum.reduceat(dist[:, s_sorted] + w_sorted, starts, axis=1)
        new = dist.copy()
        new[:, targets] = np.minimum(dist[:, targets], cand)
        if np.array_equal(new, dist):
            break
        dist = new
    return dist


def product_distances(t: LinkArrays, step: Sequence[float]) -> np.ndarray:
    """Σ over the axes of ``t.dims`` of the per-axis distance, a hop on axis k costing ``step[k]``.

    Notes
    -----
    O(N² · axes); valid only for intact built-in shapes (:meth:`LinkArrays.is_intact`), and for
    times only where every link has its axis's values (:meth:`LinkArrays.is_regular`).
    """
    n = t.num_npus
    _require_table(t, 24, "distance")  # the float64 sum, one gathered axis and its product
    out = np.zeros((n, n))
    u = np.arange(n)
    stride = 1
    for d, cost in zip(t.dims, step, strict=True):
        coord = (u // stride) % d.size
        i = np.arange(d.size)
        diff = (i[None, :] - i[:, None]) % d.size  # steps forward from i to j
        if d.kind == "line":
            axis = np.abs(i[None, :] - i[:, None]).astype(float)
        elif d.kind == "ring":
            axis = np.minimum(diff, d.size - diff).astype(float)
        elif d.kind == "uniring":
            axis = diff.astype(float)
        else:  # fc, switch: one hop
            axis = (diff > 0).astype(float)
        out += axis[coord[:, None], coord[None, :]] * cost
        stride *= d.size
    return out


# ----------------------------------------------------------------- routing
def next_link(t: LinkArrays) -> np.ndarray:
    """``r[s, d]`` = id of the first link on a fewest-hops path ``s → d`` (int32, N × N).

    -1 on the diagonal and where ``d`` is unreachable. Among equally short paths the
    lowest link id wins.

    Notes
    -----
    Intact built-in shapes: a closed form, O(N² · axes) time and the N × N table (the
    route leaves along the lowest axis where source and destination differ). Other
    topologies: O(E · N) time and memory over the hop-distance matrix. Cached.
    """
    return t.memo("next_link", lambda: _next_link(t))


def _next_link(t: LinkArrays) -> np.ndarray:
    """Uncached :func:`next_link`."""
    if t.is_intact() and t.num_links:
        table = _product_next_link(t)
        if table is not None:
            return table
    n = t.num_npus
    _require_table(t, 4 + 24 * t.num_links / max(n, 1), "next-link")  # int32 table, int64 scores per link
    hops = hop_distances(t)
    table = np.full((n, n), -1, dtype=np.int32)
    if t.num_links:
        offsets, order = t.out_links()
        big = np.int32(np.iinfo(np.int32).max)
        s_sorted = t.src[order]
        # a link s→x is on a shortest path to d iff hops[x, d] == hops[s, d] - 1
        ok = (hops[t.dst[order]] == hops[s_sorted] - 1) & (hops[s_sorted] > 0)
        score = np.where(ok, order[:, None], big)
        has = np.flatnonzero(np.diff(offsets) > 0)
        best = np.minimum.reduceat(score, offsets[has], axis=0)
        best[best == big] = -1
        table[has] = best
    return table


_ROW_BLOCK_BYTES = 32 << 20  # temporaries of the closed-form next-link table, at most, per block of rows


def axis_step(d: Dim, c: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From coordinate ``c`` towards ``t != c`` on axis ``d`` (broadcast int32 arrays): the index of
    the link taken among the NPU's links on this axis, and the coordinate it leads to.

    The lowest link id among those on a shortest path: ``+`` before ``-`` on a ring whose
    two ways are equally short, the link towards ``t`` on a line, the direct link (links
    to the other coordinates in ascending order) on an all-pairs axis.
    """
    size = d.size
    if d.kind in ("fc", "switch"):
        return t - (t > c), np.broadcast_to(t, np.broadcast_shapes(c.shape, t.shape))
    if d.kind == "line":
        up = t > c
        return np.where(up, 0, c < size - 1), np.where(up, c + 1, c - 1)
    ahead = (c + 1) % size
    if d.kind == "uniring" or size == 2:
        return np.zeros(np.broadcast_shapes(c.shape, t.shape), dtype=np.int32), np.broadcast_to(
            ahead, np.broadcast_shapes(c.shape, t.shape)
        )
    forward = (t - c) % size
    plus = 2 * forward <= size  # the forward way is no longer than the backward one
    return np.where(plus, 0, 1), np.where(plus, ahead, (c - 1) % size)


def axis_first_links(t: LinkArrays, coords: np.ndarray) -> list[np.ndarray] | None:
    """Per axis, the id of each NPU's first link on it, as :func:`~etstore.topology.axes.compose_links`
    lays out the links of an intact built-in shape (``coords``: N × axes, as
    :func:`~etstore.topology.axes.coordinates` gives them); None when the link count says the
    links are laid out otherwise. The shared base of the closed-form routes: the table
    (:func:`next_link`) and the simulator's per-pair rule (:mod:`etstore.sim._routes`).

    Notes
    -----
    O(N · axes).
    """
    n = t.num_npus
    counts = []  # links of each NPU on each axis (a mesh line's ends have one link fewer)
    for k, d in enumerate(t.dims):
        c = np.asarray(coords[:, k], dtype=np.int64)
        if d.size < 2:
            counts.append(np.zeros(n, dtype=np.int64))
        elif d.kind == "line":
            counts.append((c < d.size - 1).astype(np.int64) + (c > 0))
        elif d.kind in ("fc", "switch"):
            counts.append(np.full(n, d.size - 1, dtype=np.int64))
        else:
            counts.append(np.full(n, 1 if d.kind == "uniring" or d.size == 2 else 2, dtype=np.int64))
    per_npu = np.sum(counts, axis=0) if counts else np.zeros(n, dtype=np.int64)
    if int(per_npu.sum()) != t.num_links or t.num_links >= 1 << 31:  # link ids are int32
        return None
    first = []
    acc = np.concatenate([[0], np.cumsum(per_npu)[:-1]]).astype(np.int64)
    for cnt in counts:
        first.append(acc.copy())
        acc += cnt
    return first


def _product_next_link(t: LinkArrays) -> np.ndarray | None:
    """:func:`next_link` of an intact built-in shape in closed form, or None when its links are not in
    the order :func:`~etstore.topology.axes.compose_links` writes them.

    The route moves along the lowest axis on which source and destination differ, and
    the link is found from the coordinates alone: O(N² · axes) time, the N × N int32
    table plus :data:`_ROW_BLOCK_BYTES` of temporaries (no per-link work, so a fully
    connected axis of N NPUs costs N², not N³). Every link the table names is checked
    to start at its source and lead to the NPU the route moves to; a topology whose
    arrays disagree (:meth:`~etstore.topology.Topology.transpose` keeps the axes) gets
    None and the search over links.
    """
    n = t.num_npus
    _require_table(t, 4, "next-link")
    sizes = [int(d.size) for d in t.dims]
    coords = coordinates(n, sizes).astype(np.int32)
    strides = [int(x) for x in np.cumprod([1, *sizes[:-1]])]
    first = axis_first_links(t, coords)
    if first is None:
        return None
    axis_first = [a.astype(np.int32) for a in first]  # the table's temporaries stay int32
    table = np.full((n, n), -1, dtype=np.int32)
    rows = max(1, _ROW_BLOCK_BYTES // (24 * n))  # the next NPU, a gathered column, masks, the check
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        here = np.arange(lo, hi, dtype=np.int32)[:, None]
        block = table[lo:hi]
        nxt = np.empty((hi - lo, n), dtype=np.int32)
        for k, d in enumerate(t.dims):
            if d.size < 2:
                continue
            cs, cd = coords[lo:hi, k, None], coords[None, :, k]
            take = cs != cd
            take &= block < 0
            col, to = axis_step(d, cs, cd)
            np.copyto(block, axis_first[k][lo:hi, None] + col, where=take, casting="unsafe")
            np.copyto(nxt, here + (to - cs) * strides[k], where=take, casting="unsafe")
        np.copyto(nxt, here, where=block < 0)  # the diagonal: compared with itself below
        safe = np.maximum(block, 0)
        if not (
            (int(block.max()) < t.num_links)
            and bool(((t.src[safe] == here) | (block < 0)).all())
            and bool((np.where(block < 0, here, t.dst[safe]) == nxt).all())
        ):
            return None
    return table


def route(t: LinkArrays, s: int, d: int) -> list[int]:
    """Link ids of the :func:`next_link` route from NPU ``s`` to NPU ``d`` (empty if ``s == d``).

    Raises
    ------
    TopologyError
        If ``d`` is unreachable from ``s`` or either is not an NPU.

    Notes
    -----
    O(route length) after the cached :func:`next_link` table.
    """
    n = t.num_npus
    if not (0 <= s < n and 0 <= d < n):
        raise TopologyError(f"topology {t.name}: route {s} → {d} names an NPU outside 0..{n - 1}")
    nl = next_link(t)
    path: list[int] = []
    u = s
    while u != d:
        link = int(nl[u, d])
        if link < 0:
            raise TopologyError(f"topology {t.name}: no path from NPU {s} to NPU {d}")
        path.append(link)
        u = int(t.dst[link])
    return path


# -------------------------------------------------------------- dimensions
def dims_of(t: LinkArrays) -> tuple[int, ...]:
    """NPUs per dimension: the sizes of ``t.dims``, else parsed from ``t.name``.

    ``mesh2d:8x8`` → ``(8, 8)``, ``ring:8`` → ``(8,)``; a name without sizes, or
    sizes whose product is not ``num_npus``, gives ``(num_npus,)``.
    """
    if t.dims:
        sizes = tuple(int(d.size) for d in t.dims)
        if int(np.prod(sizes)) == t.num_npus:
            return sizes
    m = _SIZES_RE.search(t.name or "")
    if m:
        parsed = tuple(int(x) for x in m.group(1).split("x"))
        if int(np.prod(parsed)) == t.num_npus:
            return parsed
    return (t.num_npus,)


def link_dimensions(t: LinkArrays, dims: Sequence[int] | None = None) -> np.ndarray:
    """Per link, the one dimension whose coordinate it changes (``len(dims)`` if several or none).

    ``dims`` defaults to :func:`dims_of`; NPU ids are read as coordinates with
    dimension 0 fastest. O(E · len(dims)).
    """
    sizes = tuple(dims) if dims is not None else dims_of(t)
    if len(sizes) == 1 or t.num_links == 0:
        return np.zeros(t.num_links, dtype=np.int64)
    c = coordinates(t.num_npus, sizes)
    diff = c[t.src] != c[t.dst]
    one = diff.sum(axis=1) == 1
    return np.where(one, np.argmax(diff, axis=1), len(sizes)).astype(np.int64)
