"""Lower bounds on a collective's time under the link model (ns): no schedule can beat them.

Ingress (an NPU cannot receive faster than its in-links deliver), egress (the
same for sending), and the longest shortest path; All-to-All adds the total link
time over all links. Source: TACOS (Won et al., MICRO 2024) for All-Gather.
"""

from __future__ import annotations

import numpy as np

from etstore.topology import Topology

__all__ = ["alltoall_bound", "flood_setup", "ingress_bound"]


def ingress_bound(num_npus: int, dst: np.ndarray, times: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per NPU d: least τ with Σ_{links l into d} ⌊τ / t_l⌋ ≥ need[d] (0 where need is 0).

    Binary search on τ for all NPUs at once, then snapped to the next link finish.
    O(E · 64).
    """
    need = np.asarray(need, dtype=np.float64)
    out = np.zeros(num_npus)
    if not len(dst):
        return np.where(need > 0, np.inf, 0.0)
    tmin = np.full(num_npus, np.inf)
    np.minimum.at(tmin, dst, times)
    deg = np.bincount(dst, minlength=num_npus)
    active = need > 0
    if np.any(active & (deg == 0)):
        return np.where(active & (deg == 0), np.inf, 0.0)
    lo = np.zeros(num_npus)
    hi = np.where(active, need * np.where(np.isfinite(tmin), tmin, 0.0), 0.0)  # one fastest link suffices
    for _ in range(80):
        mid = (lo + hi) / 2
        got = np.bincount(dst, weights=np.floor(mid[dst] / times + 1e-12), minlength=num_npus)
        enough = got >= need
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    # the bound is a link finish time j·t_l; take the smallest one >= hi - tolerance
    snapped = np.full(num_npus, np.inf)
    cand = np.ceil(hi[dst] / times - 1e-9) * times
    np.minimum.at(snapped, dst, cand)
    out = np.where(active, np.minimum(snapped, hi), 0.0)
    return out


def flood_setup(
    topo: Topology, times: np.ndarray, dist: np.ndarray, coll: str, k: int, root: int, *, transpose: bool
) -> tuple[list[list[int]], float]:
    """Initial holders of a flood (All-Gather or Broadcast) and its lower bound (ns)."""
    n = topo.num_npus
    if transpose:
        dist = dist.T
    ends = (topo.src, topo.dst) if transpose else (topo.dst, topo.src)
    if coll == "allgather":
        holders = [list(range(u * k, (u + 1) * k)) for u in range(n)]
        need = np.full(n, (n - 1) * k)
        lb = max(float(ingress_bound(n, ends[0], times, need).max()), float(dist.max()))
    else:  # broadcast
        holders = [[] for _ in range(n)]
        holders[root] = list(range(k))
        need = np.full(n, k)
        need[root] = 0
        ingress = float(ingress_bound(n, ends[0], times, need).max())
        root_need = np.zeros(n)
        root_need[root] = k
        egress = float(ingress_bound(n, ends[1], times, root_need).max())
        lb = max(ingress, egress, float(dist[root].max()))
    return holders, lb


def alltoall_bound(topo: Topology, times: np.ndarray, dist: np.ndarray, k: int) -> float:
    """Max of the ingress, egress, farthest-pair and total-link-time bounds of All-to-All (ns)."""
    n = topo.num_npus
    need = np.full(n, (n - 1) * k)
    ingress = float(ingress_bound(n, topo.dst, times, need).max())
    egress = float(ingress_bound(n, topo.src, times, need).max())
    work = k * float(dist.sum()) / max(1, topo.num_links)
    return max(ingress, egress, float(dist.max()), work)
