"""Lower bounds on a collective's time under the link model (ns): no schedule can beat them.

Every bound counts link finish times. A link ``l`` carries one chunk at a time, each
taking ``t_l`` ns, so from a moment ``r`` on it completes at most ``⌊(τ - r) / t_l⌋``
chunks by ``τ``; a set of links that must carry ``m`` chunks therefore needs the
least ``τ`` with ``Σ_l ⌊(τ - r_l) / t_l⌋ ≥ m`` (:func:`capacity_bound`). The sets:

- *ingress / egress*: the links into (out of) one NPU, ``m`` = the chunks it must
  receive (send) — injection and ejection bandwidth;
- *cuts*: the links from side A to side B of a cut of the NPUs, ``m`` = the chunks
  that must cross (All-to-All: ``|A|·|B|·k`` each way; All-Gather: ``|A|·k`` from A to
  B) — bisection bandwidth when the cut halves the NPUs. Any cut gives a valid bound;
  the ones tried are the prefixes of the NPUs ordered along each axis of a built-in
  shape and by distance from two far-apart NPUs (:func:`cut_bound`);
- *distance*: a chunk cannot arrive before the shortest store-and-forward path.

Broadcast adds release times (a link out of NPU ``y`` carries nothing before the
first chunk can reach ``y``) and the root's injection followed by the distance the
last chunk to leave the root still has to cover. Reductions are the time reversal
of those floods on the transposed topology, so their bounds are the flood bounds
there, over links slowed by the reduction that follows each arrival
(:func:`effective_times`). All-Reduce's phases may overlap chunk by chunk
(:func:`allreduce_bound`). The link times are the simulator's message times, so the
bounds hold for what ``etstore sim`` reports of the stored algorithm. Source: TACOS
(Won et al., MICRO 2024) for the All-Gather ingress bound.
"""

from __future__ import annotations

import numpy as np

from etstore.topology import Topology
from etstore.topology.axes import coordinates

__all__ = [
    "allreduce_bound",
    "alltoall_bound",
    "capacity_bound",
    "cut_bound",
    "distance_rows",
    "effective_times",
    "flood_bound",
    "flood_holders",
    "ingress_bound",
]

_MAX_CLASSES = 16  # distinct link times solved exactly per cut; more use the fluid relaxation
_ITERATIONS = 80  # bisection steps of τ: 2^-80 of the range, far below a link time


def capacity_bound(
    group: np.ndarray,
    times: np.ndarray,
    need: np.ndarray,
    release: np.ndarray | None = None,
) -> np.ndarray:
    """Per group g: least τ with Σ_{l in g} ⌊(τ - release_l) / t_l⌋⁺ ≥ need[g] (0 where need is 0).

    Parameters
    ----------
    group
        Group id of each link (int, ``0 ≤ group < len(need)``).
    times
        Per-link chunk time in ns (``> 0``).
    need
        Chunks each group's links must carry.
    release
        Per-link time in ns before which the link can carry nothing (default 0).

    Returns
    -------
    numpy.ndarray
        float64 per group, ns: a link finish time ``release_l + j·t_l``; ``inf`` where
        a group with need has no links.

    Notes
    -----
    Bisection on τ for all groups at once, then snapped down to a finish time;
    O(E · 80).
    """
    need = np.asarray(need, dtype=np.float64)
    groups = len(need)
    rel = np.zeros(len(group)) if release is None else np.asarray(release, dtype=np.float64)
    active = need > 0
    deg = np.bincount(group, minlength=groups)
    if np.any(active & (deg == 0)):
        return np.where(active & (deg == 0), np.inf, 0.0)
    if not len(group):
        return np.zeros(groups)
    # one link alone carries need chunks by release + need · t: an upper end for the search
    hi = np.zeros(groups)
    np.maximum.at(hi, group, rel + need[group] * times)
    lo = np.zeros(groups)
    for _ in range(_ITERATIONS):
        mid = (lo + hi) / 2
        slots = np.maximum(np.floor((mid[group] - rel) / times + 1e-12), 0.0)
        enough = np.bincount(group, weights=slots, minlength=groups) >= need
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    # the bound is a finish time release_l + j·t_l; the smallest one >= hi - tolerance
    snapped = np.full(groups, np.inf)
    cand = rel + np.maximum(np.ceil((hi[group] - rel) / times - 1e-9), 0.0) * times
    np.minimum.at(snapped, group, cand)
    return np.where(active, np.minimum(snapped, hi), 0.0)


def ingress_bound(num_npus: int, dst: np.ndarray, times: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per NPU d: least τ with Σ_{links l into d} ⌊τ / t_l⌋ ≥ need[d] (ns); O(E · 80)."""
    return capacity_bound(np.asarray(dst), times, np.resize(np.asarray(need, np.float64), num_npus))


def distance_rows(
    num_npus: int, src: np.ndarray, dst: np.ndarray, times: np.ndarray, sources: list[int]
) -> np.ndarray:
    """Least store-and-forward times (ns) from each NPU in ``sources`` to every NPU over ``src → dst``.

    Bellman–Ford from the given sources at once, O(D · E · len(sources)) for a
    shortest-path hop count D: a few rows without the N × N table.
    """
    rows = np.full((len(sources), num_npus), np.inf)
    rows[np.arange(len(sources)), sources] = 0.0
    while True:
        reach = rows[:, src] + times
        new = rows.copy()
        for i in range(len(sources)):
            np.minimum.at(new[i], dst, reach[i])
        if np.array_equal(new, rows):
            return rows
        rows = new


def _cut_orders(topo: Topology, rows: np.ndarray) -> list[np.ndarray]:
    """Orders of the NPUs whose prefixes are the cuts tried: along each axis, and by distance rows."""
    n = topo.num_npus
    orders: list[np.ndarray] = []
    if topo.dims:
        sizes = [d.size for d in topo.dims]
        ids = np.arange(n) if topo.labels is None else np.asarray(topo.labels, dtype=np.int64)
        coords = coordinates(int(np.prod(sizes)), sizes)[ids]
        for axis, size in enumerate(sizes):
            if size > 1:
                orders.append(np.argsort(coords[:, axis], kind="stable"))
    orders.extend(np.argsort(row, kind="stable") for row in rows)
    return orders


def _prefix_bounds(
    src: np.ndarray,
    dst: np.ndarray,
    times: np.ndarray,
    order: np.ndarray,
    need: np.ndarray,
    step: float = 0.0,
) -> float:
    """Largest capacity bound over the prefix cuts A = order[:j] (links A → B, ``need[j]`` chunks).

    Crossing links per prefix come from a difference array over positions, per
    distinct link time; O(E + N · classes · 80). ``step``: see :func:`effective_times`.
    """
    n = len(order)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    ps, pd = pos[src], pos[dst]
    fwd = ps < pd  # link crosses A → B for every prefix length j in (ps, pd]
    classes, cls = np.unique(times, return_inverse=True)
    sizes = need[1:n]
    if n < 2:
        return 0.0
    every, rel, _ = effective_times(classes, step)
    if len(classes) > _MAX_CLASSES:
        return _fluid_prefix_bound(n, ps[fwd], pd[fwd], np.maximum(times[fwd], step), sizes)
    diff = np.zeros((n + 1, len(classes)))
    np.add.at(diff, (ps[fwd] + 1, cls[fwd]), 1.0)
    np.add.at(diff, (pd[fwd] + 1, cls[fwd]), -1.0)
    count = np.cumsum(diff, axis=0)[1:n]  # row j-1: links crossing, per class, for prefix length j
    return _classed_prefix_bound(count, every, sizes, np.zeros(len(classes)) if rel is None else rel)


def _classed_prefix_bound(
    count: np.ndarray, classes: np.ndarray, sizes: np.ndarray, rel: np.ndarray
) -> float:
    """Max over cuts of the least τ with Σ_c count[cut, c] · ⌊(τ - rel_c) / t_c⌋⁺ ≥ sizes[cut];
    O(cuts · classes)."""
    if np.any((count.sum(axis=1) == 0) & (sizes > 0)):
        return float("inf")  # chunks that must cross a cut no link crosses
    lo = np.zeros(len(sizes))
    hi = sizes * classes.max() + rel.max()  # one link of any class carries them all by then
    for _ in range(_ITERATIONS):
        mid = (lo + hi) / 2
        slots = np.maximum(np.floor((mid[:, None] - rel[None, :]) / classes[None, :] + 1e-12), 0.0)
        enough = (count * slots).sum(axis=1) >= sizes
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    finish = (
        rel[None, :]
        + np.maximum(np.ceil((hi[:, None] - rel[None, :]) / classes[None, :] - 1e-9), 0.0)
        * (classes[None, :])
    )
    snapped = np.min(np.where(count > 0, finish, np.inf), axis=1)
    return float(np.max(np.minimum(snapped, hi)))


def _fluid_prefix_bound(
    n: int, ps: np.ndarray, pd: np.ndarray, times: np.ndarray, sizes: np.ndarray
) -> float:
    """With many distinct link times: ⌊τ / t⌋ ≤ τ / t, so τ ≥ need / Σ 1/t_l over the crossing links."""
    rate_diff = np.zeros(n + 1)
    np.add.at(rate_diff, ps + 1, 1.0 / times)
    np.add.at(rate_diff, pd + 1, -1.0 / times)
    rate = np.cumsum(rate_diff)[1:n]
    with np.errstate(divide="ignore"):
        got = np.where(sizes > 0, sizes / rate, 0.0)
    return float(got.max()) * (1 - 1e-12)  # the summed rates round; never claim more than holds


def cut_bound(
    topo: Topology,
    src: np.ndarray,
    dst: np.ndarray,
    times: np.ndarray,
    rows: np.ndarray,
    coll: str,
    k: int,
    step: float = 0.0,
) -> float:
    """The best cut bound (ns) of ``coll`` over the cuts of :func:`_cut_orders`.

    ``coll`` is ``allgather`` (``|A|·k`` chunks from A to B) or ``alltoall``
    (``|A|·|B|·k`` each way); both directions of each cut are tried. Links are
    ``src → dst`` (pass them swapped for the transposed topology); ``rows`` are
    distance rows whose orders give further cuts; ``step``: see :func:`effective_times`.
    """
    n = topo.num_npus
    a = np.arange(n + 1, dtype=np.float64)
    best = 0.0
    for order in _cut_orders(topo, rows):
        if coll == "alltoall":
            need_ab = need_ba = a * (n - a) * k
        else:
            need_ab, need_ba = a * k, (n - a) * k
        best = max(best, _prefix_bounds(src, dst, times, order, need_ab, step))
        best = max(best, _prefix_bounds(dst, src, times, order, need_ba, step))
    return best


def flood_holders(n: int, coll: str, k: int, root: int) -> list[list[int]]:
    """The chunks each NPU starts with: its own k (All-Gather) or the root's k (Broadcast)."""
    if coll == "allgather":
        return [list(range(u * k, (u + 1) * k)) for u in range(n)]
    holders: list[list[int]] = [[] for _ in range(n)]
    holders[root] = list(range(k))
    return holders


def _far_sources(num_npus: int, src: np.ndarray, dst: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Distance rows from NPU 0, the NPU farthest from it and the one farthest from that (a double sweep)."""
    first = distance_rows(num_npus, src, dst, times, [0])
    far = int(np.argmax(first[0]))
    second = distance_rows(num_npus, src, dst, times, [far])
    farther = int(np.argmax(second[0]))
    return np.vstack([first, second, distance_rows(num_npus, src, dst, times, [farther])])


def effective_times(times: np.ndarray, step: float) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(capacity time, release, hop time) per link when every arrival is followed by ``step`` ns of work
    on the receiving end of the same link before it takes the next (a reduction in the
    receive's threadblock, as synthesized traces run them).

    The sender's chain spaces a link's arrivals ``t`` apart and the receiver's its
    reductions ``step`` apart, so the m-th reduction ends no sooner than
    ``t + step + (m-1) · max(t, step)``: a link of time ``max(t, step)`` released at
    ``min(t, step)``; a chunk's hop takes ``t + step`` (it leaves once reduced). With no
    step: the link model itself (release None).
    """
    if step <= 0:
        return times, None, times
    return np.maximum(times, step), np.minimum(times, step), times + step


def flood_bound(
    topo: Topology, times: np.ndarray, coll: str, k: int, root: int, *, transpose: bool, step: float = 0.0
) -> float:
    """Lower bound (ns) of a flood: All-Gather or Broadcast, or on the transpose their reductions.

    All-Gather: every NPU's ingress of ``(N-1)·k`` chunks, the cuts, and the
    farthest pair found by a double sweep (any pair's distance is a bound).
    Broadcast: every other NPU's ingress of ``k`` chunks with each in-link released
    when a chunk can first reach its source, the root's egress of ``k`` chunks plus
    the farthest any NPU lies from the root's nearest out-neighbour, and the
    farthest NPU. ``step`` (reductions only): the work after each arrival
    (:func:`effective_times`); the reversal of a reduction is then a flood over links of
    those times, so the same bounds hold over them. O(E · 80 + D · E) per bound; no N × N
    table.
    """
    n = topo.num_npus
    src, dst = (topo.dst, topo.src) if transpose else (topo.src, topo.dst)
    every, rel, hop = effective_times(times, step)
    rel0 = np.zeros(len(times)) if rel is None else rel
    if coll == "allgather":
        rows = _far_sources(n, src, dst, hop)
        ingress = float(capacity_bound(dst, every, np.full(n, (n - 1) * k), release=rel).max())
        cuts = cut_bound(topo, src, dst, times, rows, "allgather", k, step)
        return max(ingress, cuts, float(rows.max()))
    need = np.full(n, k)
    need[root] = 0
    out = np.flatnonzero(src == root)
    rows = distance_rows(n, src, dst, hop, [root, *dst[out].tolist()])
    from_root, from_next = rows[0], rows[1:]
    ingress = float(capacity_bound(dst, every, need, release=from_root[src] + rel0).max())
    egress = float(
        capacity_bound(np.zeros(len(out), dtype=np.int64), every[out], np.array([k]), release=rel0[out])[0]
    )
    # the last chunk to leave the root does so at >= egress, from one of its out-neighbours
    tail = from_next.min(axis=0)
    tail[root] = 0.0
    return max(ingress, egress + float(tail.max()), float(from_root.max()))


def allreduce_bound(
    topo: Topology, times: np.ndarray, k: int, step: float, lb_rs: float, lb_ag: float
) -> float:
    """All-Reduce lower bound (ns) for Reduce-Scatter then All-Gather where a chunk's All-Gather starts
    as soon as its own reduction is complete (as synthesized traces run it), from the phases' bounds.

    ``lb_rs + lb_ag`` (TACOS's) bounds only a schedule whose All-Gather waits for the whole
    Reduce-Scatter; chunk by chunk the phases may overlap (an NPU can take in gathered chunks
    while it still sends partial sums), so the bound is the largest of: the Reduce-Scatter's
    bound plus one hop (the chunk reduced last must still leave its owner); one reduced hop
    plus the All-Gather's bound (no chunk is complete before); the link work (every link
    carries its reductions at ``max(t, step)`` each and every transfer at ``t`` each,
    ``N·(N-1)·k`` of each phase at least); and a chunk's round trip: every contribution
    reaches its owner (``t + step`` a hop), then the sum reaches every NPU, for the owners
    of a double sweep's far NPUs. O(E · 80 + D · E).
    """
    n = topo.num_npus
    t_min = float(times.min())
    every, _, hop = effective_times(times, step)
    per_phase = float(n * (n - 1) * k)
    work = max(2 * per_phase / float(np.sum(1.0 / times)), per_phase / float(np.sum(1.0 / every)))
    owners = [int(row.argmax()) for row in _far_sources(n, topo.src, topo.dst, times)]
    gathered = distance_rows(n, topo.src, topo.dst, times, owners).max(axis=1)
    reduced = distance_rows(n, topo.dst, topo.src, hop, owners).max(axis=1)
    trip = float((gathered + reduced).max())
    return max(lb_rs + t_min, t_min + step + lb_ag, work * (1 - 1e-12), trip)


def alltoall_bound(
    topo: Topology, times: np.ndarray, dist: np.ndarray, k: int, copies_ns: float = 0.0
) -> float:
    """All-to-All lower bound (ns): injection, ejection, cuts (bisection), farthest pair, total link work,
    and ``copies_ns``, the longest an NPU's chained local copies of its own blocks take."""
    n = topo.num_npus
    need = np.full(n, (n - 1) * k)
    ingress = float(capacity_bound(topo.dst, times, need).max())
    egress = float(capacity_bound(topo.src, times, need).max())
    far = int(np.argmax(dist[0]))
    cuts = cut_bound(topo, topo.src, topo.dst, times, dist[[0, far]], "alltoall", k)
    work = k * float(dist.sum()) / max(1, topo.num_links)
    return max(ingress, egress, cuts, float(dist.max()), work, copies_ns)
