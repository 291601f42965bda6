"""Network topology: NPUs and directed links with latency and bandwidth.

Shared by the synthesizer (``etstore.algorithms``) and the simulator
(``etstore.sim``). Links are columnar (numpy arrays), so a 1024-NPU 3D torus is a
handful of arrays, not thousands of objects.

:class:`Topology` is the public face: the link arrays and their checks
(:mod:`etstore.topology.links`), routes and distances (:mod:`etstore.topology.paths`),
the bisection (:mod:`etstore.topology.cuts`), and the constructors. A topology
comes from a short spec (:meth:`Topology.from_spec`, grammar in
:mod:`etstore.topology.spec` and ``docs/topology.md``), from a file
(:func:`~etstore.topology.read_topology`) or from explicit links
(:meth:`Topology.from_links`). Bandwidth is in GB/s with GB = 2^30 bytes
(ASTRA-sim's convention), latency in ns.

Examples
--------
>>> t = Topology.from_spec("mesh2d:4x4,bw=100")
>>> t.num_npus, t.num_links, t.diameter
(16, 48, 6)
>>> float(t.bisection_bandwidth())
400.0
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from etstore.errors import TopologyError
from etstore.topology import paths
from etstore.topology.axes import (
    DEFAULT_BANDWIDTH_GB_PER_S,
    DEFAULT_LATENCY_NS,
    Dim,
    Values,
    axes_of,
    check_axes,
    compose_links,
    dims_spec,
)
from etstore.topology.cuts import bisection
from etstore.topology.links import LinkArrays
from etstore.topology.spec import link_text, parse_spec

__all__ = ["Topology"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Topology(LinkArrays):
    """Directed links ``src[i] → dst[i]`` with ``latency_ns[i]`` and ``bandwidth_gb_per_s[i]``.

    Bandwidth is in GB/s with GB = 2^30 bytes (ASTRA-sim's convention), so a link
    moves ``bandwidth_gb_per_s * 2**30 / 1e9`` bytes per ns. ``name`` is the spec
    it was built from (``ring:8``, ``mesh2d:8x8``...). Built-in shapes keep their
    axes in ``dims``; ``labels`` maps each NPU to its id before failed NPUs were
    removed (``None``: the identity). Links may be asymmetric and heterogeneous;
    parallel links between one pair are allowed, self-loops are not.
    """

    # ------------------------------------------------------------------ copies
    def renamed(self, name: str) -> Topology:
        """The same links under another name."""
        return Topology(
            self.num_npus,
            self.src,
            self.dst,
            self.latency_ns,
            self.bandwidth_gb_per_s,
            name,
            self.dims,
            self.labels,
        )

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

    def without(
        self,
        *,
        npus: Iterable[int] = (),
        links: Iterable[tuple[int, int]] = (),
        directed_links: Iterable[tuple[int, int]] = (),
        keep_axes: bool = False,
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
        keep_axes
            Keep ``dims`` though links are gone (no NPU may be): the machine's axes still
            number its NPUs and shape its native collectives, while routes go around the gap
            (a what-if of a link failing under a running job). Closed forms no longer apply
            (:meth:`is_intact` is false).

        Raises
        ------
        TopologyError
            If an id is not an NPU, a pair has no link, every NPU would be removed, or
            ``keep_axes`` is asked with NPUs removed.
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
        keep_link = self._surviving_links(links, directed_links)
        alive = np.ones(n, dtype=bool)
        alive[dead] = False
        if not alive.any():
            raise TopologyError(f"topology {self.name}: every NPU failed")
        if keep_axes and dead:
            raise TopologyError(f"topology {self.name}: its axes cannot be kept without NPU {dead[0]}")
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
            self.dims if keep_axes or (not dead and keep_link.all()) else (),
            None if labels is None else np.asarray(labels, dtype=np.int64),
        )

    def _surviving_links(
        self, links: Iterable[tuple[int, int]], directed_links: Iterable[tuple[int, int]]
    ) -> np.ndarray:
        """Mask of the links not named by a failed pair; every pair must name a link."""
        keep_link = np.ones(self.num_links, dtype=bool)
        for pair in [(*p, True) for p in links] + [(*p, False) for p in directed_links]:
            keep_link &= ~self._pair_links(pair, "failed")
        return keep_link

    def _pair_links(self, pair: tuple[int, int, bool], what: str) -> np.ndarray:
        """Mask of the links ``a → b`` (and ``b → a`` where ``both``) of ``pair``; it must name one."""
        a, b, both = int(pair[0]), int(pair[1]), pair[2]
        hit = (self.src == a) & (self.dst == b)
        if both:
            hit |= (self.src == b) & (self.dst == a)
        if not hit.any():
            raise TopologyError(f"topology {self.name}: {what} link {link_text(a, b, both)} is not a link")
        return hit

    def degraded(self, factors: Mapping[tuple[int, int, bool], float]) -> Topology:
        """A copy whose links of each pair ``(a, b, both)`` carry their bandwidth × factor.

        The shape stays (routes, axes and hop counts are the intact ones'), only the values
        change, so a degraded link slows what crosses it and nothing else.

        Raises
        ------
        TopologyError
            A pair names no link, or a factor is not > 0.
        """
        bw = self.bandwidth_gb_per_s.copy()
        for pair, f in factors.items():
            if not f > 0:
                raise TopologyError(f"topology {self.name}: a link's bandwidth factor must be > 0, got {f}")
            bw[self._pair_links(pair, "degraded")] *= f
        return Topology(
            self.num_npus, self.src, self.dst, self.latency_ns, bw, self.name, self.dims, self.labels
        )

    def scaled(self, *, bandwidth: float = 1.0, latency: float = 1.0) -> Topology:
        """A copy with every link's bandwidth × ``bandwidth`` and latency × ``latency``, axes alike.

        An intact built-in shape is rebuilt from its scaled axes, so it stays one (closed forms,
        ASTRA-sim's timing rules); factors 1 return this topology itself.

        Raises
        ------
        TopologyError
            A factor is not > 0 (``latency`` may be 0).
        """
        if not (bandwidth > 0 and latency >= 0):
            raise TopologyError(f"topology {self.name}: bandwidth factor must be > 0 and latency factor >= 0")
        if bandwidth == 1 and latency == 1:
            return self
        dims = tuple(
            d._replace(bandwidth_gb_per_s=d.bandwidth_gb_per_s * bandwidth, latency_ns=d.latency_ns * latency)
            for d in self.dims
        )
        if self.is_regular():
            return Topology.compose(dims, name=self.name)
        return Topology(
            self.num_npus,
            self.src,
            self.dst,
            self.latency_ns * latency,
            self.bandwidth_gb_per_s * bandwidth,
            self.name,
            dims,
            self.labels,
        )

    # --------------------------------------------------------- routes, cuts
    def hop_distances(self) -> np.ndarray:
        """``h[s, d]`` = fewest links from ``s`` to ``d`` (int32, N × N; -1 if unreachable).

        Notes
        -----
        See :func:`etstore.topology.paths.hop_distances`: O(N² · axes) for built-in
        shapes, O(D · E · N / 8) otherwise. Cached.
        """
        return paths.hop_distances(self)

    def is_strongly_connected(self) -> bool:
        """Whether every NPU reaches every other over directed links.

        O(1) for intact built-in shapes (connected by construction), else O(D · E · N / 8).
        """
        return self.num_npus == 1 or self.is_intact() or bool((self.hop_distances() >= 0).all())

    def require_routes(self) -> None:
        """Raise :class:`TopologyError` upfront when routing a simulation over this topology (its
        N × N tables, :func:`etstore.topology.paths.require_routes`) would not fit the memory budget."""
        paths.require_routes(self)

    def require_connected(self) -> None:
        """Raise :class:`TopologyError` unless every NPU reaches every other.

        Raises
        ------
        TopologyError
            Naming one NPU pair with no directed path.
        """
        paths.require_connected(self)

    @property
    def diameter(self) -> int:
        """Largest hop count of a shortest path between two NPUs.

        Raises
        ------
        TopologyError
            If some NPU cannot reach another.
        """
        hops = paths.diameter_hops(self)
        if hops < 0:
            self.require_connected()  # names a pair with no path
        return hops

    def distances_ns(self, size_bytes: float = 0.0) -> np.ndarray:
        """``t[s, d]`` = least time to move ``size_bytes`` from ``s`` to ``d`` store-and-forward (ns).

        Each hop costs its link's ``latency + size / bandwidth``; ``inf`` if unreachable.

        Notes
        -----
        See :func:`etstore.topology.paths.distances_ns`: O(N² · axes) for built-in
        shapes, O(N²) on uniform links, O(D' · N · E) otherwise.
        """
        return paths.distances_ns(self, size_bytes)

    def next_link(self) -> np.ndarray:
        """``r[s, d]`` = id of the first link on a fewest-hops path ``s → d`` (int32, N × N).

        -1 on the diagonal and where ``d`` is unreachable.

        Among equally short paths the lowest link id wins; built-in shapes list each
        NPU's links axis 0 first, so routes are dimension-ordered (XY routing on a mesh).

        Notes
        -----
        See :func:`etstore.topology.paths.next_link`: O(N² · axes) in closed form for
        intact built-in shapes (a fully connected axis costs its N × N table, not N³),
        O(E · N) time and memory over the hop-distance matrix otherwise. Cached.
        """
        return paths.next_link(self)

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
        return paths.route(self, s, d)

    def bisection(self) -> tuple[float, bool]:
        """``(bandwidth_gb_per_s, exact)`` of the bisection; see :meth:`bisection_bandwidth`."""
        return self.memo("bisection", lambda: bisection(self))

    def bisection_bandwidth(self) -> float:
        """Least total bandwidth (GB/s) crossing a cut of the NPUs into two halves, in one direction.

        For a cut (A, B) with ``|A| = ⌊N/2⌋`` the crossing bandwidth is
        ``min(bw(A→B), bw(B→A))``; the bisection is its minimum over all cuts.

        Notes
        -----
        Closed form for built-in shapes without failures, exact enumeration up to
        16 NPUs (O(C(N, N/2) · E)), else the best spectral cut, an upper bound (O(N³));
        see :func:`etstore.topology.cuts.bisection`. :meth:`bisection` says which.
        """
        return self.bisection()[0]

    # ------------------------------------------------------------- summaries
    def describe(self) -> dict[str, Any]:
        """A JSON-able summary: name, npus, links, degrees, diameter, bisection, link ranges.

        This is what ``etstore topo show`` prints. Bandwidth in GB/s (GB = 2^30 B),
        latency in ns.

        Raises
        ------
        TopologyError
            A topology that is not an intact built-in shape and whose N × N distance
            table or bisection would not fit the memory budget.

        Notes
        -----
        O(E) for intact built-in shapes (closed forms); otherwise as :meth:`hop_distances`
        and :meth:`bisection`.
        """
        indeg = self.in_degree()
        bis, exact = self.bisection()
        connected = self.is_strongly_connected()
        has = self.num_links > 0
        return {
            "name": self.name,
            "npus": self.num_npus,
            "links": self.num_links,
            "min_in_degree": int(indeg.min()),
            "max_in_degree": int(indeg.max()),
            "diameter_hops": paths.diameter_hops(self) if connected else None,
            "connected": connected,
            "bisection_bandwidth_gb_per_s": float(bis),
            "bisection_exact": exact,
            "latency_ns_min": float(self.latency_ns.min()) if has else None,
            "latency_ns_max": float(self.latency_ns.max()) if has else None,
            "bandwidth_gb_per_s_min": float(self.bandwidth_gb_per_s.min()) if has else None,
            "bandwidth_gb_per_s_max": float(self.bandwidth_gb_per_s.max()) if has else None,
            "symmetric": self.is_symmetric(),
            "removed_npus": self.num_removed(),
        }

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
            import yaml  # optional and slow to import; only YAML output needs it

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
        latency_ns: Values = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A mesh (no wrap-around) with ``sizes[k]`` NPUs along axis k; per-axis values allowed."""
        return Topology.compose(axes_of("line", sizes, bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def torus(
        sizes: Sequence[int],
        *,
        latency_ns: Values = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A torus (a bidirectional ring along every axis); per-axis values allowed."""
        return Topology.compose(axes_of("ring", sizes, bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def hypercube(
        n: int,
        *,
        latency_ns: Values = DEFAULT_LATENCY_NS,
        bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
    ) -> Topology:
        """A binary hypercube of ``n`` NPUs (a power of two): NPUs differing in one bit are linked.

        Raises
        ------
        TopologyError
            If ``n`` is not a power of two ≥ 2.
        """
        if n < 2 or n & (n - 1):
            raise TopologyError(f"hypercube:{n}: the NPU count must be a power of two >= 2")
        return Topology.compose(axes_of("line", [2] * (n.bit_length() - 1), bandwidth_gb_per_s, latency_ns))

    @staticmethod
    def compose(dims: Sequence[Dim], *, name: str | None = None) -> Topology:
        """The product of axes: NPU ``u`` has coordinate ``(u // stride_k) % size_k`` on axis k.

        Links join NPUs that differ in one coordinate, as that axis's kind says:
        ``line`` (neighbours), ``ring`` (neighbours with wrap-around), ``uniring``
        (``+1`` only), ``fc`` (all pairs), ``switch`` (all pairs, unwound as in
        :meth:`switch`). Each NPU's links are listed axis 0 first, ``+`` before ``-``.
        An axis of 1 NPU adds no links but keeps its place, so axis indices match a
        description that lists it (ASTRA-sim network files may).

        Raises
        ------
        TopologyError
            If there is no axis, an axis has an unknown kind or no NPU, or a
            bandwidth is not positive.

        Notes
        -----
        O(E) numpy work, E = Σ_k N · (links per NPU on axis k); see
        :func:`etstore.topology.axes.compose_links`.
        """
        axes = check_axes(dims)
        n, src, dst, lat, bw = compose_links(axes)
        return Topology(n, src, dst, lat, bw, name or dims_spec(axes), tuple(axes))

    @staticmethod
    def from_spec(
        spec: str,
        *,
        bandwidth_gb_per_s: Values = DEFAULT_BANDWIDTH_GB_PER_S,
        latency_ns: Values = DEFAULT_LATENCY_NS,
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
        parsed = parse_spec(spec, bandwidth_gb_per_s, latency_ns)
        topo = Topology.compose(parsed.dims)
        if parsed.fail_npus or parsed.fail_links or parsed.fail_directed:
            topo = topo.without(
                npus=parsed.fail_npus, links=parsed.fail_links, directed_links=parsed.fail_directed
            )
        topo = topo.renamed(parsed.name)
        topo.require_connected()
        return topo
