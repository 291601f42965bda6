"""NCCL's tuning model as a pure function: each (algorithm, protocol)'s predicted time, and the pick.

NCCL chooses an algorithm and protocol per call by a cost model: at communicator
setup ``ncclTopoTuneModel`` (``src/graph/tuning.cc``) fills, per collective, a latency
(base + hardware latency × steps) and a bandwidth (channels × per-channel bandwidth ×
the protocol's and the algorithm's factors) for every (algorithm, protocol); per call
``ncclTopoGetAlgoTime`` gives ``latency + bytes / bandwidth`` and ``topoGetAlgoInfo``
(``src/enqueue.cc``) takes the lowest, then trims the channels and threads for small
sizes. This module is that model, written from NVIDIA/nccl ``5067397c`` with the
constants of :mod:`etstore.algorithms._nccl_constants`, so a size's pick is NCCL's for the
same inputs. What NCCL measures on the machine at setup (the topology search's channels
and per-channel bandwidth, link types) are inputs here: :class:`NcclSystem`.

Not modelled: tuner plugins, ``NCCL_CTA_POLICY``, fp8 partitioning, aggregation of
several calls (``numPipeOps`` is 1), CollNet for all-gather and reduce-scatter (its
plugin capabilities), and the per-machine topology search itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from etstore.algorithms import _nccl_constants as K
from etstore.errors import OptionError

__all__ = [
    "PRESETS",
    "NcclChoice",
    "NcclCost",
    "NcclSystem",
    "choose",
    "cost_table",
    "nccl_channels",
    "system_for",
]

_TREE, _RING, _CNDIRECT, _CNCHAIN, _NVLS, _NVLSTREE, _PAT = range(7)
_LL, _LL128, _SIMPLE = range(3)
_NVLINK, _PCI, _NET = range(3)
_COLLS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
_PCI_BW = 12.0  # src/graph/topo.h: PCI Gen3 x16, GB/s
_MAX_CHANNELS = 64  # MAXCHANNELS
_MAX_DIRECT_ARITY = 7  # NCCL_MAX_DIRECT_ARITY
_MAX_NVLS_ARITY = 32  # NCCL_MAX_NVLS_ARITY
# maxThreads and threadThresholds per protocol (src/include/device.h, comm.h)
_MAX_THREADS = (512, 640, 512)  # LL, LL128, Simple (ring Simple: 256 on PCI-class bandwidth)
_THREAD_THRESHOLD = (8, 8, 64)
_MIN_TRAFFIC_PER_CHANNEL = 32 << 10  # scheduleCollTasksToPlan


class NcclSystem(NamedTuple):
    """What NCCL learns about the machine at setup, as the tuning model reads it.

    Bandwidths are per channel, GB/s with GB = 10^9 (NCCL's ``graph->bwIntra`` and
    ``bwInter``); ``channels`` is the topology search's channel count for ring and tree
    (``graph->nChannels``); the communicator runs twice as many (``comm->nChannels``,
    ``connect.cc`` duplicates them, at most 64).
    """

    generation: str = "ampere"
    """``volta``, ``ampere``, ``hopper`` or ``blackwell`` (the lowest GPU's)."""
    nodes: int = 1
    channels: int = 12
    bw_intra_gb_per_s: float = 20.0
    bw_inter_gb_per_s: float | None = None
    """None: the same as ``bw_intra_gb_per_s`` (one node)."""
    link: str = "nvlink"
    """The intra-node path of the ring and tree graphs: ``nvlink`` or ``pci``."""
    nvswitch: bool = True
    """NVSwitches present (CollNet Direct needs them)."""
    nvls_channels: int = 0
    """NVLS (NVLink SHARP) channels; 0: no NVLS (Hopper and later NVSwitch systems have it)."""
    collnet: bool = False
    """A CollNet (in-network reduction, e.g. SHARP) plugin is loaded and enabled."""
    cpu: str = "intel"
    """``intel``, ``amd``, ``arm`` or ``power``: the network overhead and multi-node LL cap."""
    tree_pattern: str = "balanced"
    """The tree graph's pattern: ``balanced``, ``split`` or ``tree`` (``tree`` costs 15% bandwidth)."""
    latency_inter_us: float = 0.0
    """The network's own latency (``graph->latencyInter``, from the net plugin)."""
    same_rings: bool = True
    """Every channel runs the same ring (``graph->sameChannels``; NVSwitch systems)."""
    ll128: bool | None = None
    """None: NCCL's default (on over NVLink); True/False: ``NCCL_PROTO`` said so."""


PRESETS: dict[str, NcclSystem] = {
    "a100": NcclSystem("ampere", channels=12, bw_intra_gb_per_s=20.0),
    "h100": NcclSystem("hopper", channels=16, bw_intra_gb_per_s=24.0, nvls_channels=16),
}
"""Assumed systems (etstore's, not NCCL's output): a DGX A100 (12 search channels of 20 GB/s:
12 NVLinks at NCCL's ``SM80_NVLINK_BW``), a DGX H100 (16 channels of 24 GB/s, about
18 NVLinks at ``SM90_NVLINK_BW`` = 20.6 GB/s, and 16 NVLS channels). Check a machine's own
with ``NCCL_DEBUG=INFO`` (``Pattern 4, crossNic 0, nChannels 12, bw 20.0/20.0``)."""


class NcclCost(NamedTuple):
    """One (algorithm, protocol) of the model for one call."""

    algorithm: str
    protocol: str
    bandwidth_gb_per_s: float
    """NCCL's ``comm->bandwidths`` (algorithm bandwidth; 0 when unavailable), GB = 10^9."""
    latency_us: float
    time_us: float | None
    """``latency + bytes / (1000 · bandwidth)`` with the size's corrections; None when unavailable."""
    why_not: str
    """Why it is unavailable ("" when it is available)."""


class NcclChoice(NamedTuple):
    """NCCL's pick for one call: the cheapest available (algorithm, protocol), its channels and threads."""

    algorithm: str
    protocol: str
    time_us: float
    channels: int
    """Channels the call runs on (``nMaxChannels`` after the small-size trim and the plan's cells)."""
    threads: int
    table: tuple[NcclCost, ...]


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else -1


def _generation(system: NcclSystem) -> int:
    try:
        return K.GENERATIONS.index(system.generation)
    except ValueError:
        raise OptionError(
            f"NCCL system: unknown GPU generation {system.generation!r}; expected one of "
            f"{', '.join(K.GENERATIONS)}"
        ) from None


def _nsteps(coll: str, n: int) -> int:
    return 2 * (n - 1) if coll == "allreduce" else n - 1 if coll in ("allgather", "reducescatter") else n


def _skipped(coll: str, a: int, p: int) -> str:
    """Why ``ncclTopoTuneModel`` never fills (a, p) for ``coll`` ("" when it does)."""
    if coll in ("broadcast", "reduce") and a != _RING:
        return f"NCCL runs {coll} with ring only"
    if coll in ("allgather", "reducescatter") and a not in (_PAT, _RING, _NVLS, _CNDIRECT):
        return f"NCCL has no {K.ALGORITHMS[a]} {coll}"
    if coll == "allreduce" and a == _PAT:
        return "PAT is for all-gather and reduce-scatter"
    if a in (_NVLS, _NVLSTREE, _CNDIRECT, _CNCHAIN) and p != _SIMPLE:
        return f"{K.ALGORITHMS[a]} runs Simple only"
    if a == _PAT and p != _SIMPLE:
        return "PAT runs Simple only"
    return ""


def _bandwidth(coll: str, a: int, p: int, n: int, system: NcclSystem, cc: int) -> tuple[float, str]:
    """NCCL's algorithm bandwidth of (a, p) for ``coll`` (``comm->bandwidths``), or 0 and why."""
    nodes = system.nodes
    i2 = min(nodes, 3) - 1
    ppn = n / nodes
    i1 = cc if nodes == 1 else (1 if system.cpu == "amd" else 0)
    ll_max = K.LL_MAX_BW[i1][i2]
    intra = system.bw_intra_gb_per_s
    inter = intra if system.bw_inter_gb_per_s is None else system.bw_inter_gb_per_s
    collnet = a in (_CNDIRECT, _CNCHAIN)
    nch = system.nvls_channels if a in (_NVLS, _NVLSTREE) else system.channels
    bw = intra if nodes <= 2 or collnet else inter
    if a in (_NVLS, _NVLSTREE):
        if nch < 2:
            return 0.0, "NVLS needs at least 2 NVLS channels (none on this system)"
        intra_bw = intra * K.NVLS_EFFICIENCY[cc] * (nch - 1) / nch
        intra_bw *= 2.0 if coll == "allreduce" else (ppn - 1) / ppn
        inter_bw = inter * (2 if nodes <= 2 and a == _NVLSTREE else 1)
        cap = K.PER_CH_MAX_NVLS_TREE_BW[cc][i2] if a == _NVLSTREE else math.inf
        bw = min(intra_bw, inter_bw, cap)
    bus = nch * bw
    if a == _RING and p == _LL:
        bus = min(ll_max, bus * 0.5)
    if a == _RING and p == _LL128:
        bus = min(bus * 0.92, nch * K.PER_CH_MAX_RING_LL128_BW[cc][i2])
    if a == _TREE and coll == "allreduce":
        bus = min(bus * 0.92, nch * K.PER_CH_MAX_TREE_BW[cc][i2])
    if a == _TREE and p == _LL:
        bus = min(bus / 3.8, ll_max)
    if a == _TREE and p == _LL128:
        bus = min(
            bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), nch * K.PER_CH_MAX_TREE_LL128_BW[cc][i2]
        )
    if a == _TREE and system.tree_pattern == "tree":
        bus *= 0.85
    if a == _PAT:
        bus *= 0.75
    if a == _CNDIRECT:
        if coll in ("allgather", "reducescatter"):
            bus = ppn * min(intra, inter * 0.9)
        else:
            factor = ppn / nch
            factor -= (factor - 1) / 2
            bus /= factor
            if cc >= 2:
                bus *= 0.85
    if a in (_NVLS, _CNDIRECT) and coll in ("allgather", "reducescatter") and nodes > 1:
        return (
            0.0,
            f"{K.ALGORITHMS[a]} {coll} across nodes needs CollNet gather/scatter support (not modelled)",
        )
    if not (a != _RING and coll in ("allgather", "reducescatter")):
        bus *= n / _nsteps(coll, n) if a in (_RING, _NVLS, _NVLSTREE) else 0.5
    return bus, ""


def _latency(coll: str, a: int, p: int, n: int, system: NcclSystem) -> float:
    """NCCL's latency of (a, p) for ``coll`` (``comm->latencies``), µs."""
    nodes = system.nodes
    ppn = n / nodes
    intra_hw = _NVLINK if system.link == "nvlink" else _PCI
    hw = intra_hw if nodes == 1 else _NET
    lat = K.BASE_LATENCY_US[a][p]
    intra = K.HW_LATENCY_US[intra_hw][a][p]
    inter = K.HW_LATENCY_US[_NET][_TREE if ppn == 1 else a][p] + system.latency_inter_us
    if p == _SIMPLE:
        inter += system.latency_inter_us  # the flush
    local = n // nodes
    nsteps = _nsteps(coll, n)
    if a == _RING:
        step = K.HW_LATENCY_US[hw][a][p]
        if coll in ("reduce", "broadcast"):
            if system.same_rings:
                return lat + step
            if p == _SIMPLE:
                step = K.HW_LATENCY_US[hw][_TREE][p]
            return lat + nsteps * step
        overhead = 0.0
        if nodes > 1:
            overhead = 2.0 if system.cpu == "amd" else 1.0
            if p == _SIMPLE:
                overhead *= 3
        intra = max(intra, overhead)
        ninter = 0 if nodes == 1 else 2 * (nodes - 1) if coll == "allreduce" else nodes - 1
        return lat + (nsteps - ninter) * intra + ninter * inter
    if a == _TREE:
        return lat + (2 * ((local - 1) * intra + _log2i(nodes) * inter) if coll == "allreduce" else 0.0)
    if a == _CNDIRECT:
        return lat + 2 * (min(1, local - 1) * intra + (local - 1) * 0.4) + inter
    if a == _CNCHAIN:
        return lat + 2 * (local - 1) * intra + inter
    if a == _NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    if a == _NVLSTREE:
        return lat + intra + 2 * _log2i(nodes) * inter
    if coll in ("allgather", "reducescatter"):  # PAT
        return lat + _log2i(nodes) * (inter / 3.5) + n * 2.8
    return lat


def _disabled(coll: str, a: int, p: int, n: int, system: NcclSystem, cc: int) -> str:
    """Why NCCL turns (a, p) off on this system ("" when it does not)."""
    nodes = system.nodes
    local = n // nodes
    if a == _PAT and nodes != n:
        return "PAT needs one GPU per node"
    if a == _NVLSTREE and nodes == 1:
        return "NVLS tree is off on one node"
    if not system.collnet and (a in (_CNDIRECT, _CNCHAIN) or (a == _NVLS and nodes > 1)):
        return "needs CollNet (in-network reduction), which this system has not"
    if a == _CNDIRECT and not system.nvswitch:
        return "CollNet Direct needs NVSwitches"
    if a in (_CNDIRECT, _CNCHAIN) and local > _MAX_DIRECT_ARITY + 1:
        return f"CollNet runs at most {_MAX_DIRECT_ARITY + 1} GPUs per node"
    if a in (_NVLS, _NVLSTREE) and coll != "allreduce" and local > _MAX_NVLS_ARITY:
        return f"NVLS {coll} runs at most {_MAX_NVLS_ARITY} GPUs per node"
    if p == _LL128:
        on = system.ll128
        if on is None:
            on = system.link == "nvlink" and cc >= 0
        if not on:
            return "LL128 is off (NCCL enables it over NVLink paths only)"
    return ""


def cost_table(coll: str, nbytes: int, ranks: int, system: NcclSystem) -> tuple[NcclCost, ...]:
    """Every (algorithm, protocol) NCCL weighs for one call, with its bandwidth, latency and time.

    Parameters
    ----------
    coll
        ``allreduce``, ``allgather``, ``reducescatter``, ``broadcast`` or ``reduce``.
    nbytes
        NCCL's ``nBytes``: the size nccl-tests prints (all-gather and reduce-scatter: the
        whole buffer, every rank's part).
    ranks
        Ranks of the communicator (a multiple of ``system.nodes``).
    system
        The machine, as NCCL's setup sees it.

    Returns
    -------
    tuple of NcclCost
        In NCCL's (algorithm, protocol) order, 7 × 3 rows; unavailable pairs have
        ``time_us`` None and say why.

    Raises
    ------
    OptionError
        An unknown collective or GPU generation, fewer than 2 ranks, or ranks that the
        nodes do not divide.

    Notes
    -----
    O(1): 21 evaluations of ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``'s formulas.

    Examples
    --------
    One node of 8 A100s, 1 MiB all-reduce: ring/LL128 is 14.0 + 14 · 1.9 µs of latency
    plus 1 MiB at min(12 · 20 · 0.92, 12 · 20) · 8/14 GB/s.

    >>> t = {(c.algorithm, c.protocol): c for c in cost_table("allreduce", 1 << 20, 8, PRESETS["a100"])}
    >>> round(t["ring", "LL128"].latency_us, 2), round(t["ring", "LL128"].bandwidth_gb_per_s, 2)
    (40.6, 126.17)
    >>> round(t["ring", "LL128"].time_us, 2)
    48.91
    """
    if coll not in _COLLS:
        raise OptionError(
            f"NCCL tuning model: unknown collective {coll!r}; expected one of {', '.join(_COLLS)}"
        )
    if ranks < 2 or system.nodes < 1 or ranks % system.nodes:
        raise OptionError(
            f"NCCL tuning model: {ranks} ranks on {system.nodes} nodes; need at least 2 ranks, "
            "the same number on every node"
        )
    cc = _generation(system)
    comm_channels = min(_MAX_CHANNELS, 2 * system.channels)
    out = []
    for a, algo in enumerate(K.ALGORITHMS):
        for p, proto in enumerate(K.PROTOCOLS):
            why = _skipped(coll, a, p) or _disabled(coll, a, p, ranks, system, cc)
            bw, lat = 0.0, 0.0
            if not why:
                bw, why = _bandwidth(coll, a, p, ranks, system, cc)
                lat = _latency(coll, a, p, ranks, system)
            time = None
            if not why and bw > 0:
                log_size = _log2i(nbytes >> 6)
                cbw = bw
                if a == _TREE and coll == "allreduce" and 0 <= log_size < 23:
                    cbw *= K.TREE_CORRECTION[p][log_size]
                if (
                    a == _NVLSTREE
                    and coll == "allreduce"
                    and 0 <= log_size < 24
                    and cc >= 3
                    and system.cpu in ("intel", "amd")
                ):
                    cbw *= K.TREE_CORRECTION[p][log_size]
                clat = lat
                if (
                    a == _RING
                    and p == _SIMPLE
                    and system.nodes > 1
                    and coll == "allreduce"
                    and nbytes // (comm_channels * ranks) >= 64
                ):
                    clat *= 1.4 if cc >= 1 else 1.9  # the ring's plateau
                time = clat + nbytes / (1000.0 * cbw)
            elif not why:
                why = "no bandwidth"
            out.append(NcclCost(algo, proto, bw, lat, time, why))
    return tuple(out)


def nccl_channels(
    algorithm: str, protocol: str, coll: str, nbytes: int, ranks: int, system: NcclSystem
) -> tuple[int, int]:
    """Channels and threads NCCL runs one call of (algorithm, protocol) on.

    ``topoGetAlgoInfo`` starts from the communicator's channels (twice the search's, at
    most 64; NVLS: its own) and drops one while ``nBytes < channels · threads ·
    threshold``, then halves the threads the same way; ``scheduleCollTasksToPlan`` then
    spreads the call's traffic over cells of at least 32 KiB of traffic (8 KiB of bytes
    for LL, whose traffic counts 4×), so a small call uses as many channels as it has
    cells. Returns (channels, threads).

    Examples
    --------
    >>> nccl_channels("ring", "Simple", "allreduce", 1 << 30, 8, PRESETS["a100"])
    (24, 544)
    >>> nccl_channels("ring", "LL", "allreduce", 65536, 8, PRESETS["a100"])
    (2, 512)
    """
    a, p = K.ALGORITHMS.index(algorithm), K.PROTOCOLS.index(protocol)
    if a in (_NVLS, _NVLSTREE):
        nc = system.nvls_channels
        if system.nodes > 1 and a == _NVLS:
            nc = min(nc, min(_MAX_CHANNELS, 2 * system.channels))
        return max(nc, 1), 640
    nc = min(_MAX_CHANNELS, 2 * system.channels)
    nt = _MAX_THREADS[p]
    if a in (_CNDIRECT, _CNCHAIN):
        nt = 640
    if a == _RING and p == _SIMPLE and system.bw_intra_gb_per_s * system.channels <= _PCI_BW:
        nt = 256
    threshold = _THREAD_THRESHOLD[p] * (ranks if a == _RING and p == _LL else 1)
    if a in (_CNDIRECT, _CNCHAIN) and p == _SIMPLE:
        threshold = 512
    if a != _CNDIRECT:
        while nbytes < nc * nt * threshold and nc >= 2:
            nc -= 1
        while nbytes < nc * nt * threshold and nt % 128 == 0:
            nt //= 2
    if p == _SIMPLE:
        nt += 32 if a == _RING else 128 if a == _TREE else 0
    nt = max(nt, 96)
    if a in (_TREE, _PAT):
        nt = 640
    return _plan_channels(coll, nbytes, ranks, nc, p), nt


def _plan_channels(coll: str, nbytes: int, ranks: int, nc: int, p: int) -> int:
    """Channels one call alone in a plan spreads over (``scheduleCollTasksToPlan``'s cells)."""
    if nc <= 1 or nbytes <= 0:
        return 1
    per_byte = 2 if coll == "allreduce" else ranks if coll in ("allgather", "reducescatter") else 1
    count_bytes = nbytes // ranks if coll in ("allgather", "reducescatter") else nbytes  # the task's count
    if p == _LL:
        per_byte *= 4
    traffic = max(_MIN_TRAFFIC_PER_CHANNEL, count_bytes * per_byte)
    per_channel = _up16(traffic // nc)
    cell = _up16(-(-_MIN_TRAFFIC_PER_CHANNEL // per_byte))
    cells = -(-count_bytes // cell)
    per_cell = cell * per_byte
    per_ch_cells = min(cells, -(-per_channel // per_cell))
    lo = min(cells, -(-per_channel // per_cell))
    mid = (cells - lo) // per_ch_cells
    hi = (cells - lo) % per_ch_cells
    used = (1 if lo else 0) + mid + (1 if hi else 0)
    return max(1, min(used, nc))


def _up16(x: int) -> int:
    return -(-x // 16) * 16


def choose(
    coll: str,
    nbytes: int,
    ranks: int,
    system: NcclSystem,
    *,
    algorithms: Iterable[str] | None = None,
    protocols: Iterable[str] | None = None,
) -> NcclChoice:
    """NCCL's pick for one call: the available (algorithm, protocol) of lowest predicted time.

    ``algorithms`` and ``protocols`` restrict the choice as ``NCCL_ALGO`` and
    ``NCCL_PROTO`` do (names in any case: ``ring``, ``Tree``, ``LL128``). Ties go to the
    first in NCCL's order (tree before ring; LL, LL128, Simple), as its strict ``<``
    does.

    Raises
    ------
    OptionError
        As :func:`cost_table`, an unknown name in ``algorithms``/``protocols``, or no
        (algorithm, protocol) left (NCCL: "No algorithm/protocol available").

    Examples
    --------
    >>> [choose("allreduce", s, 8, PRESETS["a100"])[:2] for s in (1024, 4 << 20, 1 << 30)]
    [('ring', 'LL'), ('ring', 'LL128'), ('ring', 'Simple')]
    """
    allowed_a = _names(algorithms, K.ALGORITHMS, "algorithm")
    allowed_p = _names(protocols, K.PROTOCOLS, "protocol")
    table = cost_table(coll, nbytes, ranks, system)
    best: NcclCost | None = None
    for c in table:
        if c.time_us is None or c.algorithm not in allowed_a or c.protocol not in allowed_p:
            continue
        if best is None or best.time_us is None or c.time_us < best.time_us:
            best = c
    if best is None or best.time_us is None:
        raise OptionError(
            f"NCCL tuning model: no algorithm/protocol available for {coll} on {ranks} ranks "
            f"(algorithms {sorted(allowed_a)}, protocols {sorted(allowed_p)})"
        )
    nc, nt = nccl_channels(best.algorithm, best.protocol, coll, nbytes, ranks, system)
    return NcclChoice(best.algorithm, best.protocol, best.time_us, nc, nt, table)


def _names(given: Iterable[str] | None, known: tuple[str, ...], what: str) -> set[str]:
    if given is None:
        return set(known)
    lookup = {k.lower().replace("_", ""): k for k in known}
    out = set()
    for g in given:
        key = g.strip().lower().replace("_", "")
        if key not in lookup:
            raise OptionError(f"NCCL tuning model: unknown {what} {g!r}; expected one of {', '.join(known)}")
        out.add(lookup[key])
    return out


def system_for(gpu: str = "a100", nodes: int = 1, channels: int | None = None) -> NcclSystem:
    """A preset of :data:`PRESETS` on ``nodes`` nodes, optionally with other search channels.

    Raises
    ------
    OptionError
        An unknown preset, fewer than 1 node or channel.

    Examples
    --------
    >>> system_for("a100", 2).nodes, system_for("h100").nvls_channels
    (2, 16)
    """
    key = gpu.strip().lower()
    if key not in PRESETS:
        raise OptionError(f"NCCL system {gpu!r}: unknown; presets: {', '.join(PRESETS)}")
    if nodes < 1 or (channels is not None and channels < 1):
        raise OptionError(f"NCCL system {gpu!r}: nodes and channels must be at least 1")
    base = PRESETS[key]
    return base._replace(nodes=nodes, channels=base.channels if channels is None else channels)
