"""Network topology: NPUs and directed links with latency and bandwidth.

Shared by the synthesizer (``etstore.collectives``) and the simulator
(``etstore.sim``). Links are columnar (numpy arrays), so a 1024-NPU 3D torus is a
handful of arrays, not thousands of objects.

A topology comes from a short spec (:func:`parse_topology`, grammar in
``docs/topology.md``), from a file (:func:`read_topology`: our YAML/JSON or
ASTRA-sim's analytical network YAML) or from explicit links
(:meth:`Topology.from_links`). Bandwidth is in GB/s with GB = 2^30 bytes
(ASTRA-sim's convention), latency in ns.

Examples
--------
>>> t = parse_topology("mesh2d:4x4,bw=100")
>>> t.num_npus, t.num_links, t.diameter
(16, 48, 6)
>>> float(t.bisection_bandwidth())
400.0
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from etstore.errors import TopologyError

__all__ = [
    "DEFAULT_BANDWIDTH_GB_PER_S",
    "DEFAULT_LATENCY_NS",
    "GIB",
    "Dim",
    "Topology",
    "parse_topology",
    "read_topology",
]

log = logging.getLogger(__name__)

GIB = float(1 << 30)  # ASTRA-sim's "GB" in GB/s is 2^30 bytes
DEFAULT_BANDWIDTH_GB_PER_S = 50.0
DEFAULT_LATENCY_NS = 500.0

# spec kind -> (canonical kind, number of sizes it takes; 0 = any)
_KINDS: dict[str, tuple[str, int]] = {
    "ring": ("ring", 1),
    "uniring": ("uniring", 1),
    "fc": ("fc", 1),
    "fullyconnected": ("fc", 1),
    "switch": ("switch", 1),
    "mesh": ("mesh", 0),
    "mesh1d": ("mesh", 1),
    "mesh2d": ("mesh", 2),
    "mesh3d": ("mesh", 3),
    "torus": ("torus", 0),
    "torus1d": ("torus", 1),
    "torus2d": ("torus", 2),
    "torus3d": ("torus", 3),
    "hypercube": ("hypercube", 1),
}
_ASTRA_KINDS = {"ring": "ring", "fullyconnected": "fc", "switch": "switch"}
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"


class Dim(NamedTuple):
    """One axis of a built-in topology (NPU ids vary fastest along axis 0)."""

    kind: str
    """``ring``, ``uniring``, ``line`` (a mesh axis), ``fc`` or ``switch``."""
    size: int
    """NPUs along this axis."""
    bandwidth_gb_per_s: float
    """Per-link bandwidth (GB/s, GB = 2^30 B); for a switch, per-NPU port bandwidth."""
    latency_ns: float
    """Per-link latency (ns); for a switch, per hop (a message takes two)."""


@dataclass(frozen=True, eq=False)
class Topology:
    """Directed links ``src[i] → dst[i]`` with ``latency_ns[i]`` and ``bandwidth_gb_per_s[i]``.

    Bandwidth is in GB/s with GB = 2^30 bytes (ASTRA-sim's convention), so a link
    moves ``bandwidth_gb_per_s * 2**30 / 1e9`` bytes per ns. ``name`` is the spec
    it was built from (``ring:8``, ``mesh2d:8x8``...). Built-in shapes keep their
    axes in ``dims``; ``labels`` maps each NPU to its id before failed NPUs were
    removed (``None``: the identity). Links may be asymmetric and heterogeneous;
    parallel links between one pair are allowed, self-loops are not.
    """

    num_npus: int
    src: np.ndarray  # int32, link sources
    dst: np.ndarray  # int32, link destinations
    latency_ns: np.ndarray  # float64
    bandwidth_gb_per_s: np.ndarray  # float64
    name: str = "custom"
    dims: tuple[Dim, ...] = ()
    labels: np.ndarray | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr, dtype in (
            ("src", np.int32),
            ("dst", np.int32),
            ("latency_ns", np.float64),
            ("bandwidth_gb_per_s", np.float64),
        ):
            object.__setattr__(self, attr, np.ascontiguousarray(getattr(self, attr), dtype=dtype))
        n = len(self.src)
        if not (len(self.dst) == len(self.latency_ns) == len(self.bandwidth_gb_per_s) == n):
            raise TopologyError(f"topology {self.name}: link arrays differ in length")
        if self.num_npus <= 0:
            raise TopologyError(f"topology {self.name}: needs at least one NPU")
        if n and (
            min(self.src.min(), self.dst.min()) < 0 or max(self.src.max(), self.dst.max()) >= self.num_npus
        ):
            raise TopologyError(f"topology {self.name}: a link names an NPU outside 0..{self.num_npus - 1}")
        if n and not (np.all(self.bandwidth_gb_per_s > 0) and np.all(self.latency_ns >= 0)):
            raise TopologyError(f"topology {self.name}: links need bandwidth > 0 and latency >= 0")
        if n and not (np.all(np.isfinite(self.bandwidth_gb_per_s)) and np.all(np.isfinite(self.latency_ns))):
            raise TopologyError(f"topology {self.name}: link bandwidth and latency must be finite")
        if n and np.any(self.src == self.dst):
            i = int(np.flatnonzero(self.src == self.dst)[0])
            raise TopologyError(f"topology {self.name}: link {i} loops from NPU {self.src[i]} to itself")

    # ------------------------------------------------------------------ basics
    @property
    def num_links(self) -> int:
        return len(self.src)

    def link_time_ns(self, size_bytes: float) -> np.ndarray:
        """Per-link time to move ``size_bytes``: latency + size / bandwidth (ns)."""
        return self.latency_ns + size_bytes / (self.bandwidth_gb_per_s * GIB / 1e9)

    def in_degree(self) -> np.ndarray:
        """Incoming links per NPU (int64, length ``num_npus``)."""
        return np.bincount(self.dst, minlength=self.num_npus)

    def out_degree(self) -> np.ndarray:
        """Outgoing links per NPU (int64, length ``num_npus``)."""
        return np.bincount(self.src, minlength=self.num_npus)

    def out_links(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of outgoing links: ``(offsets, links)``; NPU u's are ``links[offsets[u]:offsets[u+1]]``.

        Links of one NPU keep their order in the link arrays. O(E log E).
        """
        order = np.argsort(self.src, kind="stable").astype(np.int32)
        offsets = np.zeros(self.num_npus + 1, dtype=np.int64)
        np.cumsum(self.out_degree(), out=offsets[1:])
        return offsets, order

    def in_links(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of incoming links: ``(offsets, links)``, as :meth:`out_links`."""
        order = np.argsort(self.dst, kind="stable").astype(np.int32)
        offsets = np.zeros(self.num_npus + 1, dtype=np.int64)
        np.cumsum(self.in_degree(), out=offsets[1:])
        return offsets, order

    def link_matrix(self) -> np.ndarray:
        """``m[s, d]`` = id of the first link ``s → d`` or -1 (int32, N × N)."""
        m = np.full((self.num_npus, self.num_npus), -1, dtype=np.int32)
        ids = np.arange(self.num_links, dtype=np.int32)
        m[self.src[::-1], self.dst[::-1]] = ids[::-1]  # the first of parallel links wins
        return m

    def label(self, npu: int) -> int:
        """The id NPU ``npu`` had before failed NPUs were removed."""
        return int(npu if self.labels is None else self.labels[npu])

    def transpose(self) -> Topology:
        """The same links reversed (``d → s`` for every ``s → d``), as a new topology."""
        return Topology(
            self.num_npus,
            self.dst.copy(),
            self.src.copy(),
            self.latency_ns.copy(),
            self.bandwidth_gb_per_s.copy(),
            f"transpose({self.name})",
            self.dims,
            self.labels,
        )

    def is_symmetric(self) -> bool:
        """Whether every link ``s → d`` has a reverse ``d → s`` with equal latency and bandwidth."""
        a = np.lexsort((self.bandwidth_gb_per_s, self.latency_ns, self.dst, self.src))
        b = np.lexsort((self.bandwidth_gb_per_s, self.latency_ns, self.src, self.dst))
        return bool(
            np.array_equal(self.src[a], self.dst[b])
            and np.array_equal(self.dst[a], self.src[b])
            and np.array_equal(self.latency_ns[a], self.latency_ns[b])
            and np.array_equal(self.bandwidth_gb_per_s[a], self.bandwidth_gb_per_s[b])
        )

    # ------------------------------------------------------------- distances
    def hop_distances(self) -> np.ndarray:
        """``h[s, d]`` = fewest links from ``s`` to ``d`` (int32, N × N; -1 if unreachable).

        Notes
        -----
        Built-in shapes add up per-axis distances, O(N² · axes). Other topologies run
        a breadth-first search from every NPU at once on bitsets: each round ORs the
        reach sets of the in-neighbours, O(D · E · N / 8) byte operations for hop
        diameter D. Cached.
        """
        if "hops" in self._cache:
            return self._cache["hops"]
        n = self.num_npus
        if self._regular():
            hops = self._product_distances([1.0] * len(self.dims)).astype(np.int32)
            self._cache["hops"] = hops
            return hops
        hops = np.full((n, n), -1, dtype=np.int32)
        np.fill_diagonal(hops, 0)
        if self.num_links:
            order = np.argsort(self.dst, kind="stable")
            s_sorted, d_sorted = self.src[order], self.dst[order]
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
        self._cache["hops"] = hops
        return hops

    def is_strongly_connected(self) -> bool:
        """Whether every NPU reaches every other over directed links. O(D · E · N / 8)."""
        return self.num_npus == 1 or bool((self.hop_distances() >= 0).all())

    def require_connected(self) -> None:
        """Raise :class:`TopologyError` unless every NPU reaches every other.

        Raises
        ------
        TopologyError
            Naming one NPU pair with no directed path.
        """
        hops = self.hop_distances()
        bad = np.argwhere(hops < 0)
        if len(bad):
            s, d = (self.label(int(x)) for x in bad[0])
            raise TopologyError(f"topology {self.name} is disconnected: no path from NPU {s} to NPU {d}")

    @property
    def diameter(self) -> int:
        """Largest hop count of a shortest path between two NPUs.

        Raises
        ------
        TopologyError
            If some NPU cannot reach another.
        """
        self.require_connected()
        return int(self.hop_distances().max())

    def distances_ns(self, size_bytes: float = 0.0) -> np.ndarray:
        """``t[s, d]`` = least time to move ``size_bytes`` from ``s`` to ``d`` store-and-forward (ns).

        Each hop costs its link's ``latency + size / bandwidth``; ``inf`` if unreachable.

        Notes
        -----
        Built-in shapes add up per-axis distances, O(N² · axes); when all links take
        the same time it is ``hops × t``, O(N²); otherwise Bellman–Ford from every
        source at once (min-plus relaxation over the links), O(D' · N · E) with D' the
        hop count of the slowest shortest path.
        """
        w = self.link_time_ns(size_bytes)
        n = self.num_npus
        if self._regular():
            per_axis = []
            for d in self.dims:
                bw, lat = d.bandwidth_gb_per_s, d.latency_ns
                if d.kind == "switch":
                    bw, lat = bw / (d.size - 1), 2 * lat
                per_axis.append(lat + size_bytes / (bw * GIB / 1e9))
            return self._product_distances(per_axis)
        hops = self.hop_distances()
        if self.num_links == 0 or np.all(w == w[0]):
            out = hops.astype(np.float64) * (w[0] if self.num_links else 0.0)
            out[hops < 0] = np.inf
            return out
        order = np.argsort(self.dst, kind="stable")
        s_sorted, d_sorted, w_sorted = self.src[order], self.dst[order], w[order]
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

    def _regular(self) -> bool:
        """Whether this is an intact built-in shape (links exactly as :meth:`compose` made them)."""
        return (
            bool(self.dims)
            and self.labels is None
            and self.num_links == self._cache.setdefault("composed_links", _composed_links(self.dims))
        )

    def _product_distances(self, step: Sequence[float]) -> np.ndarray:
        """Σ over axes of the per-axis distance, each axis's hop costing ``step[k]``. O(N² · axes)."""
        n = self.num_npus
        out = np.zeros((n, n))
        u = np.arange(n)
        stride = 1
        for d, t in zip(self.dims, step, strict=True):
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
            out += axis[coord[:, None], coord[None, :]] * t
            stride *= d.size
        return out

    # --------------------------------------------------------------- routing
    def next_link(self) -> np.ndarray:
        """``r[s, d]`` = id of the first link on a fewest-hops path ``s → d`` (int32, N × N).

        -1 on the diagonal and where ``d`` is unreachable.

        Among equally short paths the lowest link id wins; built-in shapes list each
        NPU's links axis 0 first, so routes are dimension-ordered (XY routing on a mesh).

        Notes
        -----
        O(E · N) time and memory over the hop-distance matrix. Cached.
        """
        if "next_link" in self._cache:
            return self._cache["next_link"]
        n = self.num_npus
        hops = self.hop_distances()
        table = np.full((n, n), -1, dtype=np.int32)
        if self.num_links:
            offsets, order = self.out_links()
            big = np.int32(np.iinfo(np.int32).max)
            s_sorted = self.src[order]
            # a link s→x is on a shortest path to d iff hops[x, d] == hops[s, d] - 1
            ok = (hops[self.dst[order]] == hops[s_sorted] - 1) & (hops[s_sorted] > 0)
            score = np.where(ok, order[:, None], big)
            has = np.flatnonzero(np.diff(offsets) > 0)
            best = np.minimum.reduceat(score, offsets[has], axis=0)
            best[best == big] = -1
            table[has] = best
        self._cache["next_link"] = table
        return table

    def next_hop(self) -> np.ndarray:
        """``h[s, d]`` = the NPU after ``s`` on the route of :meth:`next_link` (-1 where none). O(N²)."""
        nl = self.next_link()
        return np.where(nl >= 0, self.dst[np.maximum(nl, 0)], -1).astype(np.int32)

    def route(self, s: int, d: int) -> list[int]:
        """Link ids of the :meth:`next_link` route from NPU ``s`` to NPU ``d`` (empty if ``s == d``).

        Raises
        ------
        TopologyError
            If ``d`` is unreachable from ``s`` or either is not an NPU.
        """
        n = self.num_npus
        if not (0 <= s < n and 0 <= d < n):
            raise TopologyError(f"topology {self.name}: route {s} → {d} names an NPU outside 0..{n - 1}")
        nl = self.next_link()
        path: list[int] = []
        u = s
        while u != d:
            link = int(nl[u, d])
            if link < 0:
                raise TopologyError(f"topology {self.name}: no path from NPU {s} to NPU {d}")
            path.append(link)
            u = int(self.dst[link])
        return path

    # ------------------------------------------------------------- bisection
    def bisection(self) -> tuple[float, bool]:
        """``(bandwidth_gb_per_s, exact)`` of the bisection; see :meth:`bisection_bandwidth`."""
        if "bisection" not in self._cache:
            self._cache["bisection"] = _bisection(self)
        return self._cache["bisection"]

    def bisection_bandwidth(self) -> float:
        """Least total bandwidth (GB/s) crossing a cut of the NPUs into two halves, in one direction.

        For a cut (A, B) with ``|A| = ⌊N/2⌋`` the crossing bandwidth is
        ``min(bw(A→B), bw(B→A))``; the bisection is its minimum over all cuts.

        Notes
        -----
        Built-in shapes without failures use the closed form: the cheapest cut across
        one axis, ``(N / n_k) × cut_k`` with ``cut_k`` = 1 link for a mesh axis, 2 for
        a ring, ``⌊n/2⌋⌈n/2⌉`` for fully connected and ``⌊n/2⌋`` ports for a switch
        (exact when that axis has an even size). Other topologies with N ≤ 16 are
        solved exactly by enumeration (O(C(N, N/2) · E)); larger ones get the best of
        spectral cuts (Fiedler vector mixed with the next eigenvector), an upper bound,
        O(N³). :meth:`bisection` says which.
        """
        return self.bisection()[0]

    # ------------------------------------------------------------- summaries
    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: name, npus, links, degrees, diameter, bisection, link ranges.

        This is what ``etstore topo show`` prints. Bandwidth in GB/s (GB = 2^30 B),
        latency in ns.
        """
        indeg = self.in_degree()
        bis, exact = self.bisection()
        connected = self.is_strongly_connected()
        return {
            "name": self.name,
            "npus": self.num_npus,
            "links": self.num_links,
            "min_in_degree": int(indeg.min()),
            "max_in_degree": int(indeg.max()),
            "diameter_hops": int(self.hop_distances().max()) if connected else None,
            "connected": connected,
            "bisection_bandwidth_gb_per_s": float(bis),
            "bisection_exact": exact,
            "latency_ns_min": float(self.latency_ns.min()) if self.num_links else None,
            "latency_ns_max": float(self.latency_ns.max()) if self.num_links else None,
            "bandwidth_gb_per_s_min": float(self.bandwidth_gb_per_s.min()) if self.num_links else None,
            "bandwidth_gb_per_s_max": float(self.bandwidth_gb_per_s.max()) if self.num_links else None,
            "symmetric": self.is_symmetric(),
            "removed_npus": self.num_removed(),
        }

    def num_removed(self) -> int:
        """How many NPUs were removed as failed (0 if none)."""
        if self.labels is None:
            return 0
        return int(self.labels.max()) + 1 - self.num_npus if self.num_npus else 0

    def to_dict(self) -> dict[str, Any]:
        """This topology in etstore's own file format (explicit directed links), JSON-able."""
        links = [
            {
                "src": int(s),
                "dst": int(d),
                "latency_ns": float(lat),
                "bandwidth_gb_per_s": float(bw),
                "bidirectional": False,
            }
            for s, d, lat, bw in zip(
                self.src, self.dst, self.latency_ns, self.bandwidth_gb_per_s, strict=True
            )
        ]
        return {"format": "etstore-topology/1", "name": self.name, "npus": self.num_npus, "links": links}

    def write(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON (``.json``) or YAML (anything else); returns the path."""
        path = Path(path)
        data = self.to_dict()
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(data, indent=1) + "\n")
        else:
            import yaml

            path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # ---------------------------------------------------------- constructors
    @staticmethod
    def from_links(
        num_npus: int,
        links: list[tuple[int, int]],
        *,
        latency_ns: float = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float = DEFAULT_BANDWIDTH_GB_PER_S,
        name: str = "custom",
    ) -> Topology:
        """A topology from directed ``(src, dst)`` pairs with uniform latency and bandwidth."""
        arr = np.asarray(links, dtype=np.int32).reshape(-1, 2)
        m = len(arr)
        return Topology(
            num_npus,
            arr[:, 0].copy(),
            arr[:, 1].copy(),
            np.full(m, float(latency_ns)),
            np.full(m, float(bandwidth_gb_per_s)),
            name,
        )

    @staticmethod
    def ring(
        n: int,
        *,
        latency_ns: float = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """Bidirectional ring of ``n`` NPUs (for ``n == 2``, one link each way)."""
        return Topology.compose([Dim("ring", n, bandwidth_gb_per_s, latency_ns)])

    @staticmethod
    def fully_connected(
        n: int,
        *,
        latency_ns: float = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A direct link between every ordered pair of ``n`` NPUs."""
        return Topology.compose([Dim("fc", n, bandwidth_gb_per_s, latency_ns)])

    @staticmethod
    def switch(
        n: int,
        *,
        latency_ns: float = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """``n`` NPUs on one switch, unwound to point-to-point links for synthesis.

        Every ordered pair gets a link of bandwidth ``bandwidth_gb_per_s / (n - 1)``
        (an NPU's port shared fairly by its peers) and latency ``2 × latency_ns``
        (NPU → switch → NPU, as ASTRA-sim counts a switch).
        """
        return Topology.compose([Dim("switch", n, bandwidth_gb_per_s, latency_ns)])

    @staticmethod
    def mesh(
        sizes: Sequence[int],
        *,
        latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A mesh (no wrap-around) with ``sizes[k]`` NPUs along axis k; per-axis values allowed."""
        return Topology.compose(_axes("line", sizes, bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def torus(
        sizes: Sequence[int],
        *,
        latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A torus (a bidirectional ring along every axis); per-axis values allowed."""
        return Topology.compose(_axes("ring", sizes, bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def hypercube(
        n: int,
        *,
        latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A binary hypercube of ``n`` NPUs (a power of two): NPUs differing in one bit are linked.

        Raises
        ------
        TopologyError
            If ``n`` is not a power of two ≥ 2.
        """
        if n < 2 or n & (n - 1):
            raise TopologyError(f"hypercube:{n}: the NPU count must be a power of two >= 2")
        return Topology.compose(_axes("line", [2] * (n.bit_length() - 1), bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def compose(dims: Sequence[Dim], *, name: str | None = None) -> Topology:
        """The product of axes: NPU ``u`` has coordinate ``(u // stride_k) % size_k`` on axis k.

        Links join NPUs that differ in one coordinate, as that axis's kind says:
        ``line`` (neighbours), ``ring`` (neighbours with wrap-around), ``uniring``
        (``+1`` only), ``fc`` (all pairs), ``switch`` (all pairs, unwound as in
        :meth:`switch`). Each NPU's links are listed axis 0 first, ``+`` before ``-``.

        Raises
        ------
        TopologyError
            If an axis has fewer than 2 NPUs or a non-positive bandwidth.

        Notes
        -----
        O(E) numpy work, E = Σ_k N · (links per NPU on axis k).
        """
        dims = [Dim(*d) for d in dims]
        if not dims:
            raise TopologyError("topology: needs at least one dimension")
        for d in dims:
            if d.kind not in ("ring", "uniring", "line", "fc", "switch"):
                raise TopologyError(f"topology: unknown axis kind {d.kind!r}")
            if d.size < 2:
                raise TopologyError(f"topology {_dim_spec(d)}: an axis needs at least 2 NPUs, got {d.size}")
            if not (d.bandwidth_gb_per_s > 0 and d.latency_ns >= 0):
                raise TopologyError(f"topology {_dim_spec(d)}: needs bandwidth > 0 and latency >= 0")
        n = math.prod(d.size for d in dims)
        if n > 1 << 20:
            raise TopologyError(f"topology: {n} NPUs is more than the supported 1048576")
        u = np.arange(n, dtype=np.int64)
        srcs, dsts, lats, bws, keys = [], [], [], [], []
        stride = 1
        for k, d in enumerate(dims):
            coord = (u // stride) % d.size
            base = u - coord * stride
            if d.kind in ("line", "ring", "uniring"):
                steps = [1] if d.kind == "uniring" or (d.kind == "ring" and d.size == 2) else [1, -1]
                for j, step in enumerate(steps):
                    other = coord + step
                    if d.kind == "line":
                        keep = (other >= 0) & (other < d.size)
                    else:
                        keep = np.ones(n, dtype=bool)
                        other = other % d.size
                    srcs.append(u[keep])
                    dsts.append(base[keep] + other[keep] * stride)
                    keys.append(np.full(int(keep.sum()), k * 2 * n + j, dtype=np.int64))
            else:  # fc, switch: every other coordinate on the axis, ascending
                others = np.arange(d.size)
                pair_u = np.repeat(u, d.size)
                pair_o = np.tile(others, n)
                keep = pair_o != np.repeat(coord, d.size)
                srcs.append(pair_u[keep])
                dsts.append(np.repeat(base, d.size)[keep] + pair_o[keep] * stride)
                keys.append(k * 2 * n + pair_o[keep])
            bw, lat = d.bandwidth_gb_per_s, d.latency_ns
            if d.kind == "switch":
                bw, lat = bw / (d.size - 1), 2 * lat
            while len(lats) < len(srcs):  # one (lat, bw) block per link block of this axis
                blk = len(srcs[len(lats)])
                lats.append(np.full(blk, float(lat)))
                bws.append(np.full(blk, float(bw)))
            stride *= d.size
        src = np.concatenate(srcs)
        dst = np.concatenate(dsts)
        key = np.concatenate(keys)
        order = np.lexsort((key, src))
        return Topology(
            n,
            src[order].astype(np.int32),
            dst[order].astype(np.int32),
            np.concatenate(lats)[order],
            np.concatenate(bws)[order],
            name or _dims_spec(dims),
            tuple(dims),
        )

    @staticmethod
    def from_spec(
        spec: str,
        *,
        bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
        latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
    ) -> Topology:
        """Build a topology from a short spec such as ``mesh2d:8x8`` or ``ring:4+switch:8,bw=50/400``.

        Parameters
        ----------
        spec
            ``shape[,option...]``: ``shape`` is ``kind:sizes`` joined by ``+`` (axis 0
            first); kinds ``ring``, ``uniring``, ``fc`` (``fullyconnected``), ``switch``,
            ``mesh``/``mesh2d``/``mesh3d``, ``torus``/``torus2d``/``torus3d``,
            ``hypercube``; sizes ``AxBxC``. Options: ``bw=`` GB/s and ``lat=`` ns, one
            value or one per axis separated by ``/``; ``fail=`` failed NPUs (``5``),
            links in both directions (``5-6``) or one (``5>6``), separated by ``/``.
        bandwidth_gb_per_s, latency_ns
            Defaults for axes the spec gives no ``bw=``/``lat=`` for (scalar or per axis).

        Returns
        -------
        Topology
            Named by the canonical spec; failed NPUs removed and the rest renumbered
            (``labels`` keeps their old ids).

        Raises
        ------
        TopologyError
            On a malformed spec, an unknown kind, a wrong number of sizes or values,
            a failure naming a missing NPU or link, or a result that is disconnected.

        Examples
        --------
        >>> Topology.from_spec("torus3d:4x4x4").num_links
        384
        >>> Topology.from_spec("mesh2d:2x2,fail=3").num_npus
        3

        Notes
        -----
        O(E) to build; the connectivity check is O(D · E · N / 8).
        """
        return _parse_spec(spec, bandwidth_gb_per_s, latency_ns)

    def without(
        self,
        *,
        npus: Iterable[int] = (),
        links: Iterable[tuple[int, int]] = (),
        directed_links: Iterable[tuple[int, int]] = (),
    ) -> Topology:
        """A copy with failed NPUs and links removed and the remaining NPUs renumbered.

        Parameters
        ----------
        npus
            NPU ids to remove with all their links.
        links
            ``(a, b)`` pairs whose links are removed in both directions.
        directed_links
            ``(a, b)`` pairs whose links ``a → b`` are removed.

        Raises
        ------
        TopologyError
            If an id is not an NPU, a pair has no link, or every NPU would be removed.
            (Connectivity is not checked here; see :meth:`require_connected`.)

        Notes
        -----
        O(E + N).
        """
        n = self.num_npus
        dead = sorted({int(x) for x in npus})
        for x in dead:
            if not 0 <= x < n:
                raise TopologyError(f"topology {self.name}: failed NPU {x} is not in 0..{n - 1}")
        keep_link = np.ones(self.num_links, dtype=bool)
        pairs = [(int(a), int(b), True) for a, b in links]
        pairs += [(int(a), int(b), False) for a, b in directed_links]
        for a, b, both in pairs:
            hit = (self.src == a) & (self.dst == b)
            if both:
                hit |= (self.src == b) & (self.dst == a)
            if not hit.any():
                sep = "-" if both else ">"
                raise TopologyError(f"topology {self.name}: failed link {a}{sep}{b} is not a link")
            keep_link &= ~hit
        alive = np.ones(n, dtype=bool)
        alive[dead] = False
        if not alive.any():
            raise TopologyError(f"topology {self.name}: every NPU failed")
        keep_link &= alive[self.src] & alive[self.dst]
        new_id = np.cumsum(alive) - 1
        old_labels = np.arange(n) if self.labels is None else self.labels
        labels = old_labels[alive] if dead or self.labels is not None else None
        return Topology(
            int(alive.sum()),
            new_id[self.src[keep_link]].astype(np.int32),
            new_id[self.dst[keep_link]].astype(np.int32),
            self.latency_ns[keep_link],
            self.bandwidth_gb_per_s[keep_link],
            self.name,
            self.dims if (not dead and keep_link.all()) else (),
            None if labels is None else np.asarray(labels, dtype=np.int64),
        )


# --------------------------------------------------------------------- specs
def _dim_spec(d: Dim) -> str:
    return f"{d.kind}:{d.size}"


def _fmt(x: float) -> str:
    return f"{x:g}"


def _dims_spec(dims: Sequence[Dim]) -> str:
    """Canonical spec of composed axes (mesh and torus axes written per axis)."""
    kind = {"line": "mesh", "ring": "ring", "uniring": "uniring", "fc": "fc", "switch": "switch"}
    shape = "+".join(f"{kind[d.kind]}:{d.size}" for d in dims)
    return f"{shape},{_values_spec(dims)}"


def _values_spec(dims: Sequence[Dim]) -> str:
    """``bw=...,lat=...`` with one value, or one per axis where they differ."""
    bws = [_fmt(d.bandwidth_gb_per_s) for d in dims]
    lats = [_fmt(d.latency_ns) for d in dims]
    bw = bws[0] if len(set(bws)) == 1 else "/".join(bws)
    lat = lats[0] if len(set(lats)) == 1 else "/".join(lats)
    return f"bw={bw},lat={lat}"


Values = float | Sequence[float]


def _axes(kind: str, sizes: Sequence[int], bw: Values, lat: Values) -> list[Dim]:
    sizes = list(sizes)
    bws = _per_axis(bw, len(sizes), "bw", "topology")
    lats = _per_axis(lat, len(sizes), "lat", "topology")
    return [Dim(kind, int(s), b, la) for s, b, la in zip(sizes, bws, lats, strict=True)]


def _per_axis(value: float | Sequence[float], axes: int, key: str, spec: str) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * axes
    vals = [float(v) for v in value]
    if len(vals) == 1:
        return vals * axes
    if len(vals) != axes:
        raise TopologyError(f"{spec}: {key} has {len(vals)} values but the topology has {axes} axes")
    return vals


def _parse_spec(spec: str, default_bw: Values, default_lat: Values) -> Topology:
    text = spec.strip().replace(" ", "")
    if not text:
        raise TopologyError("topology spec is empty; try e.g. mesh2d:8x8 or ring:16")
    shape, *options = text.split(",")
    groups: list[tuple[str, list[int]]] = []
    shape_parts: list[str] = []
    for part in shape.split("+"):
        m = re.fullmatch(r"([a-zA-Z0-9]+?):([0-9]+(?:x[0-9]+)*)", part)
        if not m:
            raise TopologyError(
                f"topology spec {spec!r}: cannot read {part!r}; expected kind:sizes like mesh2d:8x8"
            )
        raw_kind = m.group(1).lower()
        if raw_kind not in _KINDS:
            kinds = ", ".join(sorted(_KINDS))
            raise TopologyError(f"topology spec {spec!r}: unknown kind {m.group(1)!r}; expected {kinds}")
        kind, arity = _KINDS[raw_kind]
        sizes = [int(x) for x in m.group(2).split("x")]
        if arity and len(sizes) != arity:
            raise TopologyError(
                f"topology spec {spec!r}: {raw_kind} takes {arity} size(s), got {m.group(2)!r}"
            )
        if kind in ("ring", "uniring", "fc", "switch") and len(sizes) != 1:
            raise TopologyError(f"topology spec {spec!r}: {raw_kind} takes one size")
        groups.append((kind, sizes))
        shape_parts.append(f"{raw_kind}:{m.group(2)}")
    bw_opt: list[float] | None = None
    lat_opt: list[float] | None = None
    fail_npus: list[int] = []
    fail_links: list[tuple[int, int]] = []
    fail_directed: list[tuple[int, int]] = []
    seen: set[str] = set()
    for opt in options:
        key, eq, value = opt.partition("=")
        key = key.lower()
        if not eq or key not in ("bw", "lat", "fail"):
            raise TopologyError(
                f"topology spec {spec!r}: unknown option {opt!r}; expected bw=, lat= or fail="
            )
        if key in seen:
            raise TopologyError(f"topology spec {spec!r}: option {key}= given twice")
        seen.add(key)
        if key in ("bw", "lat"):
            if not re.fullmatch(rf"{_NUMBER}(?:/{_NUMBER})*", value):
                raise TopologyError(
                    f"topology spec {spec!r}: {key}={value!r} is not a number or numbers joined by /"
                )
            vals = [float(v) for v in value.split("/")]
            if key == "bw":
                bw_opt = vals
            else:
                lat_opt = vals
        else:
            for item in value.split("/"):
                if re.fullmatch(r"[0-9]+", item):
                    fail_npus.append(int(item))
                elif m := re.fullmatch(r"([0-9]+)-([0-9]+)", item):
                    fail_links.append((int(m.group(1)), int(m.group(2))))
                elif m := re.fullmatch(r"([0-9]+)>([0-9]+)", item):
                    fail_directed.append((int(m.group(1)), int(m.group(2))))
                else:
                    raise TopologyError(
                        f"topology spec {spec!r}: cannot read failure {item!r}; expected NPU, A-B or A>B"
                    )
    # expand groups into axes
    axes: list[tuple[str, int]] = []
    for kind, sizes in groups:
        if kind == "hypercube":
            n = sizes[0]
            if n < 2 or n & (n - 1):
                raise TopologyError(
                    f"topology spec {spec!r}: hypercube needs a power-of-two NPU count, got {n}"
                )
            axes += [("line", 2)] * (n.bit_length() - 1)
        elif kind == "mesh":
            axes += [("line", s) for s in sizes]
        elif kind == "torus":
            axes += [("ring", s) for s in sizes]
        else:
            axes.append((kind, sizes[0]))
    where = f"topology spec {spec!r}"
    bws = _per_axis(bw_opt if bw_opt is not None else default_bw, len(axes), "bw", where)
    lats = _per_axis(lat_opt if lat_opt is not None else default_lat, len(axes), "lat", where)
    dims = [Dim(k, s, b, la) for (k, s), b, la in zip(axes, bws, lats, strict=True)]
    try:
        topo = Topology.compose(dims)
    except TopologyError as exc:
        raise TopologyError(f"topology spec {spec!r}: {exc}") from exc
    name = f"{'+'.join(shape_parts)},{_values_spec(dims)}"
    if fail_npus or fail_links or fail_directed:
        items = [str(x) for x in fail_npus] + [f"{a}-{b}" for a, b in fail_links]
        items += [f"{a}>{b}" for a, b in fail_directed]
        name = f"{name},fail={'/'.join(items)}"
        topo = topo.without(npus=fail_npus, links=fail_links, directed_links=fail_directed)
    topo = _renamed(topo, name)
    topo.require_connected()
    return topo


def _renamed(topo: Topology, name: str) -> Topology:
    return Topology(
        topo.num_npus,
        topo.src,
        topo.dst,
        topo.latency_ns,
        topo.bandwidth_gb_per_s,
        name,
        topo.dims,
        topo.labels,
    )


def parse_topology(
    spec: str | Path,
    *,
    bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
) -> Topology:
    """A topology from a spec (see :meth:`Topology.from_spec`) or, if ``spec`` names a file, from that file.

    A string ending in ``.yml``, ``.yaml`` or ``.json``, or any existing path, is read
    with :func:`read_topology`; anything else is parsed as a spec.

    Raises
    ------
    TopologyError
        As :meth:`Topology.from_spec` or :func:`read_topology`.
    """
    text = str(spec)
    if isinstance(spec, Path) or text.lower().endswith((".yml", ".yaml", ".json")) or Path(text).is_file():
        return read_topology(text, bandwidth_gb_per_s=bandwidth_gb_per_s, latency_ns=latency_ns)
    return Topology.from_spec(text, bandwidth_gb_per_s=bandwidth_gb_per_s, latency_ns=latency_ns)


# --------------------------------------------------------------------- files
def read_topology(
    path: str | Path,
    *,
    bandwidth_gb_per_s: float | Sequence[float] = DEFAULT_BANDWIDTH_GB_PER_S,
    latency_ns: float | Sequence[float] = DEFAULT_LATENCY_NS,
) -> Topology:
    """Read a topology file: etstore's YAML/JSON or ASTRA-sim's analytical network YAML.

    ASTRA-sim files have ``topology: [Ring|FullyConnected|Switch, ...]`` with
    ``npus_count``, ``bandwidth`` (GB/s) and ``latency`` (ns) lists, one entry per
    dimension. etstore files have either ``spec:`` or ``npus:`` plus ``links:``
    (see ``docs/topology.md``), and optionally ``fail_npus`` / ``fail_links``.

    Raises
    ------
    TopologyError
        If the file is missing, not YAML/JSON, lacks a key, has a bad value (the
        message names the file and the key), or describes a disconnected topology.

    Notes
    -----
    O(E) after parsing.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read topology file ({exc.strerror})") from exc
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (ValueError, Exception) as exc:  # yaml.YAMLError has no common base with ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise TopologyError(f"{path}: not valid {kind}: {first}") from exc
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: expected a mapping at the top level")
    try:
        if "topology" in data and "npus_count" in data:
            topo = _from_astra(data, path)
        else:
            topo = _from_own(data, path, bandwidth_gb_per_s, latency_ns)
    except TopologyError as exc:
        msg = str(exc)
        raise TopologyError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from exc
    return topo


def _number_list(data: dict[str, Any], key: str, path: Path) -> list[float]:
    if key not in data:
        raise TopologyError(f"{path}: missing key {key!r}")
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise TopologyError(f"{path}: {key} must be a list of numbers, got {value!r}") from exc


def _from_astra(data: dict[str, Any], path: Path) -> Topology:
    kinds = data["topology"] if isinstance(data["topology"], list) else [data["topology"]]
    counts = _number_list(data, "npus_count", path)
    bws = _number_list(data, "bandwidth", path)
    lats = _number_list(data, "latency", path)
    if not (len(kinds) == len(counts) == len(bws) == len(lats)):
        raise TopologyError(
            f"{path}: topology, npus_count, bandwidth and latency must have one entry per dimension "
            f"(got {len(kinds)}, {len(counts)}, {len(bws)}, {len(lats)})"
        )
    dims = []
    for kind, count, bw, lat in zip(kinds, counts, bws, lats, strict=True):
        k = _ASTRA_KINDS.get(str(kind).lower())
        if k is None:
            raise TopologyError(f"{path}: unknown topology {kind!r}; expected Ring, FullyConnected or Switch")
        if count != int(count):
            raise TopologyError(f"{path}: npus_count {count!r} is not an integer")
        dims.append(Dim(k, int(count), bw, lat))
    topo = Topology.compose(dims)
    topo.require_connected()
    return topo


def _from_own(data: dict[str, Any], path: Path, default_bw: Any, default_lat: Any) -> Topology:
    known = {
        "format",
        "name",
        "spec",
        "npus",
        "links",
        "bandwidth_gb_per_s",
        "latency_ns",
        "bidirectional",
        "fail_npus",
        "fail_links",
    }
    extra = sorted(set(data) - known)
    if extra:
        raise TopologyError(
            f"{path}: unknown key {extra[0]!r}; expected spec or npus + links (see docs/topology.md)"
        )
    bw = data.get("bandwidth_gb_per_s", default_bw)
    lat = data.get("latency_ns", default_lat)
    if "spec" in data:
        if "links" in data or "npus" in data:
            raise TopologyError(f"{path}: give either spec or npus + links, not both")
        topo = Topology.from_spec(str(data["spec"]), bandwidth_gb_per_s=bw, latency_ns=lat)
    elif "npus" in data and "links" in data:
        topo = _explicit_links(data, path, bw, lat)
    else:
        raise TopologyError(f"{path}: expected spec, or npus and links")
    fail_npus = data.get("fail_npus") or []
    fail_links = data.get("fail_links") or []
    if fail_npus or fail_links:
        try:
            pairs = [(int(a), int(b)) for a, b in fail_links]
            topo = topo.without(npus=[int(x) for x in fail_npus], links=pairs)
        except (TypeError, ValueError) as exc:
            raise TopologyError(f"{path}: fail_npus must list NPU ids and fail_links [a, b] pairs") from exc
    if "name" in data:
        topo = _renamed(topo, str(data["name"]))
    elif "spec" not in data:
        topo = _renamed(topo, path.stem)
    topo.require_connected()
    return topo


def _explicit_links(data: dict[str, Any], path: Path, bw: Any, lat: Any) -> Topology:
    try:
        n = int(data["npus"])
        bw0, lat0 = float(bw), float(lat)
    except (TypeError, ValueError) as exc:
        raise TopologyError(
            f"{path}: npus must be an integer and bandwidth_gb_per_s/latency_ns numbers"
        ) from exc
    both_default = bool(data.get("bidirectional", True))
    links = data["links"]
    if not isinstance(links, list):
        raise TopologyError(f"{path}: links must be a list")
    src: list[int] = []
    dst: list[int] = []
    lats: list[float] = []
    bws: list[float] = []
    for i, item in enumerate(links):
        try:
            if isinstance(item, dict):
                unknown = set(item) - {"src", "dst", "bandwidth_gb_per_s", "latency_ns", "bidirectional"}
                if unknown:
                    raise TopologyError(f"{path}: link {i} has unknown key {sorted(unknown)[0]!r}")
                a, b = int(item["src"]), int(item["dst"])
                lb, ll = float(item.get("bandwidth_gb_per_s", bw0)), float(item.get("latency_ns", lat0))
                both = bool(item.get("bidirectional", both_default))
            elif isinstance(item, list) and len(item) == 2:
                a, b = int(item[0]), int(item[1])
                lb, ll, both = bw0, lat0, both_default
            else:
                raise TopologyError(f"{path}: link {i} must be [src, dst] or a mapping with src and dst")
        except (KeyError, TypeError, ValueError) as exc:
            raise TopologyError(
                f"{path}: link {i} ({item!r}) needs integer src/dst and numeric values"
            ) from exc
        for x, y in ((a, b), (b, a)) if both else ((a, b),):
            src.append(x)
            dst.append(y)
            lats.append(ll)
            bws.append(lb)
    try:
        return Topology(
            n,
            np.array(src, dtype=np.int64),
            np.array(dst, dtype=np.int64),
            np.array(lats),
            np.array(bws),
            str(data.get("name", path.stem)),
        )
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from exc


def _composed_links(dims: Sequence[Dim]) -> int:
    """How many links :meth:`Topology.compose` makes for these axes."""
    n = math.prod(d.size for d in dims)
    total = 0
    for d in dims:
        rest = n // d.size
        if d.kind == "line":
            total += 2 * (d.size - 1) * rest
        elif d.kind == "uniring" or (d.kind == "ring" and d.size == 2):
            total += d.size * rest
        elif d.kind == "ring":
            total += 2 * d.size * rest
        else:
            total += d.size * (d.size - 1) * rest
    return total


# ----------------------------------------------------------------- bisection
def _cut_1d(d: Dim) -> tuple[float, bool]:
    """Bandwidth across the best balanced cut of one axis, and whether the cut is balanced."""
    n = d.size
    if d.kind in ("line", "uniring"):
        links = 1.0
    elif d.kind == "ring":
        links = 2.0 if n > 2 else 1.0
    elif d.kind == "fc":
        links = float((n // 2) * (n - n // 2))
    else:  # switch: ports on the smaller side, at full port bandwidth
        return float(n // 2) * d.bandwidth_gb_per_s, n % 2 == 0
    return links * d.bandwidth_gb_per_s, n % 2 == 0


def _bisection(t: Topology) -> tuple[float, bool]:
    n = t.num_npus
    if n < 2:
        return 0.0, True
    if t.dims and t.labels is None:
        best, exact = math.inf, False
        for d in t.dims:
            cut, balanced = _cut_1d(d)
            value = cut * (n // d.size)
            if value < best or (value == best and balanced):
                best, exact = value, balanced
        # a balanced cut along one axis is optimal for the regular shapes we build
        return best, exact
    if n <= 16:
        return _bisection_exact(t), True
    return _bisection_spectral(t), False


def _cut_value(t: Topology, side: np.ndarray) -> np.ndarray:
    """min(bw(A→B), bw(B→A)) for each row of a boolean membership matrix (True = in A)."""
    a_src, a_dst = side[:, t.src], side[:, t.dst]
    fwd = (a_src & ~a_dst) @ t.bandwidth_gb_per_s
    back = (~a_src & a_dst) @ t.bandwidth_gb_per_s
    return np.minimum(fwd, back)


def _bisection_exact(t: Topology) -> float:
    n = t.num_npus
    sizes = {n // 2, n - n // 2}
    rows = []
    for size in sizes:
        for rest in combinations(range(1, n), size - 1):
            row = np.zeros(n, dtype=bool)
            row[0] = True
            row[list(rest)] = True
            rows.append(row)
    return float(_cut_value(t, np.array(rows)).min())


def _bisection_spectral(t: Topology) -> float:
    n = t.num_npus
    w = np.zeros((n, n))
    np.add.at(w, (t.src, t.dst), t.bandwidth_gb_per_s)
    w = w + w.T
    lap = np.diag(w.sum(axis=1)) - w
    _, vecs = np.linalg.eigh(lap)
    sides = []
    # the Fiedler vector, and mixes with the next one (they tie on symmetric shapes)
    angles = np.linspace(0, np.pi, 16, endpoint=False) if n > 2 else np.zeros(1)
    for angle in angles:
        v = np.cos(angle) * vecs[:, 1] + (np.sin(angle) * vecs[:, 2] if n > 2 else 0.0)
        order = np.argsort(v, kind="stable")
        for cut_at in {n // 2, n - n // 2}:
            side = np.zeros(n, dtype=bool)
            side[order[:cut_at]] = True
            sides.append(side)
    return float(_cut_value(t, np.array(sides)).min())
