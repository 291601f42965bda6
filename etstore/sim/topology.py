"""Network topology: NPUs and directed links with latency and bandwidth.

Shared by the synthesizer (``etstore.collectives``) and the simulator
(``etstore.sim``). Links are columnar (numpy arrays), so a 1024-NPU 3D torus is a
handful of arrays, not thousands of objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from etstore.errors import TopologyError

__all__ = ["GIB", "Topology"]

GIB = float(1 << 30)  # ASTRA-sim's "GB" in GB/s is 2^30 bytes


@dataclass(frozen=True, eq=False)
class Topology:
    """Directed links ``src[i] → dst[i]`` with ``latency_ns[i]`` and ``bandwidth_gb_per_s[i]``.

    Bandwidth is in GB/s with GB = 2^30 bytes (ASTRA-sim's convention), so a link
    moves ``bandwidth_gb_per_s * 2**30 / 1e9`` bytes per ns. ``name`` is the spec
    it was built from (``ring:8``, ``mesh2d:8x8``...).
    """

    num_npus: int
    src: np.ndarray  # int32, link sources
    dst: np.ndarray  # int32, link destinations
    latency_ns: np.ndarray  # float64
    bandwidth_gb_per_s: np.ndarray  # float64
    name: str = "custom"

    def __post_init__(self) -> None:
        n = len(self.src)
        if not (len(self.dst) == len(self.latency_ns) == len(self.bandwidth_gb_per_s) == n):
            raise TopologyError(f"topology {self.name}: link arrays differ in length")
        if self.num_npus <= 0:
            raise TopologyError(f"topology {self.name}: needs at least one NPU")
        if n and (self.src.min() < 0 or self.dst.min() < 0 or max(self.src.max(), self.dst.max()) >= self.num_npus):
            raise TopologyError(f"topology {self.name}: a link names an NPU outside 0..{self.num_npus - 1}")
        if n and (np.any(self.bandwidth_gb_per_s <= 0) or np.any(self.latency_ns < 0)):
            raise TopologyError(f"topology {self.name}: links need bandwidth > 0 and latency >= 0")

    @property
    def num_links(self) -> int:
        return len(self.src)

    def link_time_ns(self, size_bytes: float) -> np.ndarray:
        """Per-link time to move ``size_bytes``: latency + size / bandwidth (ns)."""
        return self.latency_ns + size_bytes / (self.bandwidth_gb_per_s * GIB / 1e9)

    @staticmethod
    def from_links(
        num_npus: int,
        links: list[tuple[int, int]],
        *,
        latency_ns: float = 500.0,
        bandwidth_gb_per_s: float = 50.0,
        name: str = "custom",
    ) -> Topology:
        """A topology from ``(src, dst)`` pairs with uniform latency and bandwidth."""
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
    def ring(n: int, *, latency_ns: float = 500.0, bandwidth_gb_per_s: float = 50.0) -> Topology:
        """Bidirectional ring of ``n`` NPUs."""
        if n < 2:
            raise TopologyError(f"ring:{n}: a ring needs at least 2 NPUs")
        links = [(i, (i + 1) % n) for i in range(n)] + [((i + 1) % n, i) for i in range(n)]
        if n == 2:
            links = [(0, 1), (1, 0)]
        return Topology.from_links(
            n, links, latency_ns=latency_ns, bandwidth_gb_per_s=bandwidth_gb_per_s, name=f"ring:{n}"
        )
