"""Next links of an intact built-in topology, computed from coordinates instead of an N × N table.

The simulator's routes are the topology's own (:meth:`~etstore.topology.Topology.next_link`):
on an intact built-in shape a route leaves along the lowest axis on which source and
destination differ, by a link found from the two coordinates alone. The topology writes
that rule out as an N × N int32 table, 1 GiB for 16,384 NPUs, although a replay asks for
the routes of a few NPU pairs only (congestion-unaware times are closed forms; the link
tables walk the pairs that exchanged messages). :class:`ClosedRoutes` applies the same
rule to the pairs asked for, with O(N · axes) memory, so a ring of 16,384 NPUs needs no
table at all (:class:`~etstore.sim.network.Network` builds one only for what the rule
does not cover: other topologies, explicit dimensions, the congestion-aware graph).
"""

from __future__ import annotations

import numpy as np

from etstore.topology import Topology

# The topology's own layout of links and tie-break between equally short ways (``+`` before
# ``-`` on a ring, the direct link on an all-pairs axis): taken as is, so both give the same
# link for every pair.
from etstore.topology.axes import Dim, coordinates
from etstore.topology.paths import axis_first_links, axis_step

__all__ = ["ClosedRoutes"]


def _neighbours(d: Dim, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(NPU position, target coordinate) of one target per link the rule can take on axis ``d``."""
    n = len(c)
    pos = np.arange(n, dtype=np.int64)
    if d.kind in ("fc", "switch"):
        t = np.arange(d.size, dtype=np.int64)
        u, tt = np.repeat(pos, d.size), np.tile(t, n)
        keep = tt != c[u]
        return u[keep], tt[keep]
    if d.kind == "line":
        up, down = c < d.size - 1, c > 0
        return np.concatenate([pos[up], pos[down]]), np.concatenate([c[up] + 1, c[down] - 1])
    ahead = (c + 1) % d.size
    if d.kind == "uniring" or d.size == 2:
        return pos, ahead
    return np.concatenate([pos, pos]), np.concatenate([ahead, (c - 1) % d.size])


class ClosedRoutes:
    """The first link from NPU ``cur`` towards NPU ``dst``, for arrays of pairs, by the topology's rule.

    Only for an intact built-in shape whose links are laid out as its axes make them
    (:meth:`of` checks every link the rule can name, O(E) once); then every answer equals
    the topology's ``next_link()[cur, dst]``.
    """

    def __init__(self, dims: tuple[Dim, ...], strides: list[int], first: list[np.ndarray]) -> None:
        self.dims = dims
        self.strides = strides
        self.first = first  # per axis: the id of each NPU's first link on it

    @classmethod
    def of(cls, topo: Topology) -> ClosedRoutes | None:
        """The rule for ``topo``, or None where it is not a built-in shape laid out as its axes say.

        Notes
        -----
        O(E + N · axes) time, O(N · axes) memory.
        """
        if not (topo.is_intact() and topo.num_links) or topo.num_links >= 1 << 31:
            return None
        dims = tuple(topo.dims)
        sizes = [int(d.size) for d in dims]
        strides = [int(x) for x in np.cumprod([1, *sizes[:-1]])]
        grid = coordinates(topo.num_npus, sizes)
        first = axis_first_links(topo, grid)
        if first is None:
            return None
        coords = [grid[:, k] for k in range(len(dims))]
        src = np.asarray(topo.src, dtype=np.int64)
        dst = np.asarray(topo.dst, dtype=np.int64)
        for k, d in enumerate(dims):  # every link the rule names starts at its NPU and leads where it says
            if d.size < 2:
                continue
            u, t = _neighbours(d, coords[k])
            col, to = axis_step(d, coords[k][u], t)
            link = first[k][u] + np.asarray(col, dtype=np.int64)
            nxt = u + (np.asarray(to, dtype=np.int64) - coords[k][u]) * strides[k]
            if (link >= topo.num_links).any() or (src[link] != u).any() or (dst[link] != nxt).any():
                return None
        return cls(dims, strides, first)

    def next_links(self, cur: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Link ids of the first hop of each pair (-1 where ``cur == dst``).

        Notes
        -----
        O(P · axes) numpy work for P pairs.
        """
        cur = np.asarray(cur, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        out = np.full(len(cur), -1, dtype=np.int64)
        open_ = cur != dst
        for k, d in enumerate(self.dims):
            if d.size < 2 or not open_.any():
                continue
            a = (cur // self.strides[k]) % d.size
            b = (dst // self.strides[k]) % d.size
            here = np.flatnonzero(open_ & (a != b))
            if len(here):
                col, _ = axis_step(d, a[here], b[here])
                out[here] = self.first[k][cur[here]] + np.asarray(col, dtype=np.int64)
                open_[here] = False
        return out
