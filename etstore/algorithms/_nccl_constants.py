"""NCCL's tuning constants, as numbers (NVIDIA/nccl ``5067397c``, ``src/graph/tuning.cc`` and headers).

Indices follow NCCL: algorithms Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree,
PAT (``NCCL_ALGO_*`` 0..6); protocols LL, LL128, Simple (``NCCL_PROTO_*`` 0..2); hardware
NVLink, PCI, network (``NCCL_HW_*``); GPU generations Volta, Ampere, Hopper, Blackwell
(``compCapIndex``); node-count index ``min(nNodes, 3) - 1``. Latencies are µs, bandwidths
GB/s with GB = 10^9 (NCCL divides bytes by ``1000 · bw`` to get µs).
"""

from __future__ import annotations

__all__ = [
    "ALGORITHMS",
    "BASE_LATENCY_US",
    "BUFFER_BYTES",
    "GENERATIONS",
    "HW_LATENCY_US",
    "LL_MAX_BW",
    "NVLS_EFFICIENCY",
    "PER_CH_MAX_NVLS_TREE_BW",
    "PER_CH_MAX_RING_LL128_BW",
    "PER_CH_MAX_TREE_BW",
    "PER_CH_MAX_TREE_LL128_BW",
    "PROTOCOLS",
    "TREE_CORRECTION",
]

ALGORITHMS: tuple[str, ...] = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
"""NCCL's algorithm names in ``NCCL_ALGO_*`` order (``nccl_tuner.h``), as its tuner plugin spells them."""
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
"""NCCL's protocol names in ``NCCL_PROTO_*`` order."""
GENERATIONS: tuple[str, ...] = ("volta", "ampere", "hopper", "blackwell")
"""``compCapIndex``: sm70+, sm80+, sm90+, sm100+."""

# baseLatencies[algorithm][protocol]
BASE_LATENCY_US: tuple[tuple[float, float, float], ...] = (
    (6.8, 14.0, 8.4),  # tree
    (6.6, 14.0, 8.4),  # ring
    (0.0, 0.0, 0.0),  # collnet direct
    (0.0, 0.0, 0.0),  # collnet chain
    (0.0, 0.0, 0.0),  # nvls
    (0.0, 0.0, 0.0),  # nvls tree
    (8.0, 8.0, 8.0),  # pat
)

# hwLatencies[hw][algorithm][protocol]; hw: 0 NVLink, 1 PCI, 2 network
HW_LATENCY_US: tuple[tuple[tuple[float, float, float], ...], ...] = (
    (  # NVLink
        (0.6, 1.25, 4.0),
        (0.6, 1.9, 3.4),
        (0.0, 0.0, 3.7),
        (0.0, 0.0, 2.8),
        (0.0, 0.0, 25.0),
        (0.0, 0.0, 25.0),
        (0.0, 0.0, 4.0),
    ),
    (  # PCI
        (1.0, 1.9, 4.0),
        (1.0, 2.5, 5.7),
        (0.0, 0.0, 3.7),
        (0.0, 0.0, 2.8),
        (0.0, 0.0, 0.0),
        (0.0, 0.0, 0.0),
        (0.0, 0.0, 4.0),
    ),
    (  # network
        (5.0, 8.5, 14.0),
        (2.7, 4.0, 14.0),
        (0.0, 0.0, 31.0),
        (0.0, 0.0, 30.0),
        (0.0, 0.0, 18.0),
        (0.0, 0.0, 20.9),
        (0.0, 0.0, 14.0),
    ),
)

# llMaxBws[index1][index2]: index1 the GPU generation on one node, else 0 (Intel) / 1 (AMD) CPUs
LL_MAX_BW: tuple[tuple[float, float, float], ...] = (
    (39.0, 39.0, 20.4),
    (87.7, 22.5, 19.0),
    (141.0, 45.0, 35.0),
    (2 * 141.0, 2 * 45.0, 2 * 35.0),
)
# per-channel caps [generation][node-count index]
PER_CH_MAX_RING_LL128_BW: tuple[tuple[float, float, float], ...] = (
    (20.0, 20.0, 20.0),
    (20.0, 20.0, 20.0),
    (36.7, 36.7, 36.7),
    (40.0, 40.0, 40.0),
)
PER_CH_MAX_TREE_LL128_BW: tuple[tuple[float, float, float], ...] = (
    (20.0, 20.0, 20.0),
    (20.0, 20.0, 20.0),
    (36.7, 36.7, 29.0),
    (55.6, 31.67, 20.0),
)
PER_CH_MAX_TREE_BW: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (38.7, 41.4, 36.0),
    (70.0, 42.8, 24.0),
)
PER_CH_MAX_NVLS_TREE_BW: tuple[tuple[float, float, float], ...] = (
    (26.5, 18.5, 10.0),
    (24.0, 23.6, 17.8),
    (0.0, 57.7, 45.5),
    (0.0, 96.0, 80.0),
)
NVLS_EFFICIENCY: tuple[float, ...] = (0.0, 0.0, 0.85, 0.74)

# treeCorrectionFactor[protocol][log2(bytes >> 6)], sizes 64 B .. 256 MiB
TREE_CORRECTION: tuple[tuple[float, ...], ...] = (
    (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
        1.0,
    ),
    (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
)

# Connection buffers per protocol (src/init.cc): LL 8 lines/thread x 512 threads x 8 steps x 16 B,
# LL128 120 elems/thread x 640 threads x 8 steps x 8 B, Simple 4 MiB; NCCL_STEPS = 8 steps each.
BUFFER_BYTES: tuple[int, int, int] = (8 * 512 * 8 * 16, 120 * 640 * 8 * 8, 1 << 22)
