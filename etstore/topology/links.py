"""The columnar data of a topology: directed links as numpy arrays, checked once.

:class:`LinkArrays` holds the arrays and answers questions that need no search
(degrees, adjacency in CSR form, symmetry). :class:`~etstore.topology.Topology`
adds routes, cuts and constructors on top; the route and cut modules work on
:class:`LinkArrays`, so they need not know the class that builds topologies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from etstore.errors import TopologyError
from etstore.topology.axes import GIB, Dim, compose_links, composed_links

__all__ = ["LinkArrays"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(frozen=True, eq=False)
class LinkArrays:
    """The data of a :class:`~etstore.topology.Topology` and its checks: directed links
    ``src[i] → dst[i]`` with ``latency_ns[i]`` and ``bandwidth_gb_per_s[i]`` (fields and
    units as the Topology documents them).

    Raises
    ------
    TopologyError
        If the arrays differ in length, there is no NPU, a link names an NPU out of
        range or loops to its own source, or a bandwidth is not > 0 or a latency
        not ≥ 0 (both finite).
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
        if not n:
            return
        if min(self.src.min(), self.dst.min()) < 0 or max(self.src.max(), self.dst.max()) >= self.num_npus:
            raise TopologyError(f"topology {self.name}: a link names an NPU outside 0..{self.num_npus - 1}")
        if not (np.all(self.bandwidth_gb_per_s > 0) and np.all(self.latency_ns >= 0)):
            raise TopologyError(f"topology {self.name}: links need bandwidth > 0 and latency >= 0")
        if not (np.all(np.isfinite(self.bandwidth_gb_per_s)) and np.all(np.isfinite(self.latency_ns))):
            raise TopologyError(f"topology {self.name}: link bandwidth and latency must be finite")
        if np.any(self.src == self.dst):
            i = int(np.flatnonzero(self.src == self.dst)[0])
            raise TopologyError(f"topology {self.name}: link {i} loops from NPU {self.src[i]} to itself")

    def memo(self, key: str, compute: Callable[[], _T]) -> _T:
        """``compute()`` once per topology, kept under ``key`` (topologies are immutable)."""
        if key not in self._cache:
            self._cache[key] = compute()
        value: _T = self._cache[key]
        return value

    @property
    def num_links(self) -> int:
        """Number of directed links."""
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

    def num_removed(self) -> int:
        """How many NPUs were removed as failed (0 if none)."""
        if self.labels is None:
            return 0
        return int(self.labels.max()) + 1 - self.num_npus if self.num_npus else 0

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

    def is_intact(self) -> bool:
        """Whether every link of its ``dims`` is there, whatever its latency and bandwidth.

        Closed forms of hop counts and routes hold then; a degraded link keeps them, a failed one not.
        """
        return (
            bool(self.dims)
            and self.labels is None
            and self.num_links == self.memo("composed_links", lambda: composed_links(self.dims))
        )

    def is_regular(self) -> bool:
        """Whether this is an intact built-in shape (links exactly as its ``dims`` make them, values too).

        Closed forms for distances and cuts hold only then. O(E) once, then cached.
        """
        return self.is_intact() and self.memo("axis_values", self._has_axis_values)

    def _has_axis_values(self) -> bool:
        """Whether each link has the latency and bandwidth its axis gives it (none degraded or scaled)."""
        _, _, _, lat, bw = compose_links(self.dims)
        return bool(np.array_equal(lat, self.latency_ns) and np.array_equal(bw, self.bandwidth_gb_per_s))
