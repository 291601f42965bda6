"""The simulator's price of a synthesized algorithm, so that ``synth`` and ``sim`` give one answer.

``etstore synth`` reports the time ``etstore sim`` gives the stored algorithm: one collective
of ``buffer_bytes`` (nccl-tests' S, as ``sweep`` runs it) on the same topology under the same
simulator settings (:class:`SimSettings`: a :class:`~etstore.sim.config.SimConfig` is one).
It does so without simulating, from the schedule and the simulator's cost rules for the
steps a synthesized algorithm is made of:

- a message of ``b`` bytes over link ``l`` costs ``⌊latency_l + b / bandwidth_l⌋`` ns plus
  ``message_overhead_ns`` (``sim``'s congestion-unaware model, ASTRA-sim's analytical one:
  a synthesized transfer is one hop between neighbours, so its route is its link, and
  ASTRA-sim's first-differing-axis rule charges that axis' values, which are the link's);
  a switch's pair moves at the port's full bandwidth (``sim`` gives the unwound pairwise
  link its port back, :class:`etstore.sim.network.Network`); ``b`` is what
  :func:`~etstore.algorithms._parts.chunk_bytes`, the function the simulator sizes
  algorithm messages with, gives the chunk (the last chunk also carries the remainder);
- a reduction or an All-to-All copy of ``b`` bytes costs ``passes · ⌊b / local_mem_bw⌋``,
  at least ``min_comp_ns`` (``reduction_mem_accesses`` / ``copy_mem_accesses``:
  :func:`etstore.sim._templates.step_cost_ns`);
- the order is the stored trace's dependencies (:mod:`etstore.algorithms._synth_trace`): the
  sends of one link, and its receives with their reductions, each wait for the one before
  (one threadblock per link end); a send waits for its chunk's arrival, a partial sum for
  every reduction of it at its NPU, an All-Reduce owner's first send for its reduction; the
  steps take no NPU slot, and a send completes when its message arrives.

Every op then starts when its last dependency ends, which is what the simulator's loop does
for a collective's steps, so the makespan here is ``sim``'s to the ns. The rules are stated
here because the simulator sits above the algorithms (docs/architecture.md);
``tests/algorithms/test_synth_cost.py`` holds them to the simulator's, time for time.
Congestion-aware, the same holds wherever each link carries its own transfers one at a
time; through a switch (its ports shared, a message two hops) or over parallel links
messages queue, which the schedule alone does not say: :attr:`Prices.exact` is False and
the time is the congestion-unaware one (``etstore synth`` then simulates the algorithm).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from etstore.algorithms._parts import buffer_bytes as algorithm_buffer_bytes
from etstore.algorithms._synth_schedule import Schedule
from etstore.collective import chakra_name
from etstore.topology import GIB, Dim, Topology, dims_of, link_dimensions

__all__ = ["Prices", "Settings", "SimSettings", "copies_ns", "evaluate", "prices", "transfer_distances"]

_MIN_PLAN_NS = 1e-3
"""Least planning time of a link: a message the simulator times at 0 ns (no latency, under
1 ns of bytes) still orders its schedule."""


class SimSettings(Protocol):
    """The simulator settings a synthesized algorithm's time depends on (a ``SimConfig`` has them)."""

    @property
    def congestion(self) -> str: ...
    @property
    def reduction_mem_accesses(self) -> int: ...
    @property
    def copy_mem_accesses(self) -> int: ...
    @property
    def local_mem_bw_gb_per_s(self) -> float: ...
    @property
    def min_comp_ns(self) -> float: ...
    @property
    def integer_ns(self) -> bool: ...
    @property
    def message_overhead_ns(self) -> float: ...


@dataclass(frozen=True)
class Settings:
    """:class:`SimSettings` with the simulator's defaults (``SimConfig()``'s; a test holds them equal).

    ``local_mem_bw_gb_per_s`` is GB/s with GB = 10^9, as ASTRA-sim reads ``local-mem-bw``.
    """

    congestion: str = "unaware"
    reduction_mem_accesses: int = 3
    copy_mem_accesses: int = 2
    local_mem_bw_gb_per_s: float = 50.0
    min_comp_ns: float = 1.0
    integer_ns: bool = True
    message_overhead_ns: float = 0.0

    @staticmethod
    def of(config: SimSettings | None) -> Settings:
        """The settings of ``config`` (None: the defaults)."""
        if config is None:
            return Settings()
        return Settings(
            config.congestion,
            int(config.reduction_mem_accesses),
            int(config.copy_mem_accesses),
            float(config.local_mem_bw_gb_per_s),
            float(config.min_comp_ns),
            bool(config.integer_ns),
            float(config.message_overhead_ns),
        )


@dataclass(frozen=True, eq=False)
class Prices:
    """What the simulator charges the steps of one synthesized collective (ns).

    ``link_ns`` prices a message of an ordinary chunk (``B // C`` bytes) on each link,
    ``last_link_ns`` one of chunk ids ``≥ C - 1``, which also carry ``B % C`` (the rule of
    :func:`~etstore.algorithms._parts.chunk_bytes`); ``reduce_ns`` / ``copy_ns`` price a
    reduction / copy of those two sizes. ``exact``: whether :func:`evaluate` is the
    simulator's time under ``settings`` (False: congestion-aware where messages queue; the
    time is then the congestion-unaware one, what the queues add left out).
    """

    link_ns: np.ndarray
    last_link_ns: np.ndarray
    reduce_ns: tuple[float, float]
    copy_ns: tuple[float, float]
    total_chunks: int
    buffer_bytes: int
    settings: Settings
    exact: bool

    @property
    def plan_ns(self) -> np.ndarray:
        """Per-link chunk time the search plans with and the bounds count: an ordinary chunk's message."""
        out: np.ndarray = np.maximum(self.link_ns, _MIN_PLAN_NS)
        return out

    @property
    def step_ns(self) -> float:
        """The least a reduction costs (an ordinary chunk's): what the reduction bounds add per arrival."""
        return float(min(self.reduce_ns))


def prices(topo: Topology, coll: str, k: int, size_bytes: int, settings: Settings) -> Prices:
    """The simulator's prices for ``coll`` of ``size_bytes`` (nccl-tests' S) with ``k`` chunks per NPU.

    The buffer the chunks divide is the one the simulator gives the algorithm for a
    ``COMM_COLL_NODE`` of that size: S, and for All-Gather ``(S // N) · N`` (its node
    carries the per-rank share, as ASTRA-sim reads ``comm_size``). O(E).
    """
    n = topo.num_npus
    total = k if coll in ("broadcast", "reduce") else n * k
    chakra = chakra_name(coll) or coll
    comm_size = size_bytes // n if chakra == "ALL_GATHER" else size_bytes
    buf = int(algorithm_buffer_bytes(chakra, comm_size, n))
    base = buf // total
    sizes = (float(base), float(base + buf % total))
    latency, bytes_per_ns = _hop_values(topo)
    message = [latency + b / bytes_per_ns for b in sizes]
    one_pass = [b / settings.local_mem_bw_gb_per_s for b in sizes]
    if settings.integer_ns:  # ASTRA-sim's clock: each delay and each memory pass in whole ns
        message = [np.floor(m) for m in message]
        one_pass = [float(np.floor(x)) for x in one_pass]
    reduce_ns = [max(x * settings.reduction_mem_accesses, settings.min_comp_ns) for x in one_pass]
    copy_ns = [max(x * settings.copy_mem_accesses, settings.min_comp_ns) for x in one_pass]
    if settings.integer_ns:  # and the step's duration once more
        reduce_ns = [float(np.floor(x)) for x in reduce_ns]
        copy_ns = [float(np.floor(x)) for x in copy_ns]
    return Prices(
        message[0] + settings.message_overhead_ns,
        message[1] + settings.message_overhead_ns,
        (reduce_ns[0], reduce_ns[1]),
        (copy_ns[0], copy_ns[1]),
        total,
        buf,
        settings,
        _exact(topo, settings.congestion),
    )


_ASTRA_AXIS_KINDS = ("ring", "fc", "switch")
"""Axis kinds ASTRA-sim's analytical network has (``etstore.sim.network.ASTRA_AXIS_KINDS``)."""


def _axes(topo: Topology) -> tuple[Dim, ...]:
    """The axes the simulator's network keeps: an intact built-in shape's (else its links are all)."""
    if not topo.dims or not topo.is_intact() or dims_of(topo) != tuple(int(d.size) for d in topo.dims):
        return ()
    return tuple(topo.dims)


def _switch_axes(topo: Topology) -> np.ndarray:
    """Per link: the size of the simulator's switch axis it belongs to, else 0 (a switch of a
    topology with failures is its pairwise links, as they are)."""
    out = np.zeros(topo.num_links, dtype=np.int64)
    axes = _axes(topo)
    if not any(d.kind == "switch" for d in axes):
        return out
    label = link_dimensions(topo, dims_of(topo))
    for axis, d in enumerate(axes):
        if d.kind == "switch":
            out[label == axis] = int(d.size)
    return out


def _hop_values(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Per link, the latency (ns) and bandwidth (bytes/ns) the congestion-unaware model charges a
    message between its two ends, computed as :class:`etstore.sim.network.Network` does.

    A switch's pair is given its port's bandwidth back; on an intact shape of ASTRA-sim's
    axis kinds whose links keep their axis' values, a message is charged its axis' values
    (``h`` hops of latency: 1 to a ring or fully connected neighbour, 2 through a switch).
    """
    latency = np.asarray(topo.latency_ns, dtype=np.float64).copy()
    bytes_per_ns = np.asarray(topo.bandwidth_gb_per_s, dtype=np.float64) * GIB / 1e9
    size = _switch_axes(topo)
    wide = size > 2
    bytes_per_ns[wide] *= size[wide] - 1
    axes = _axes(topo)
    if axes and all(d.kind in _ASTRA_AXIS_KINDS for d in axes if d.size > 1) and topo.is_regular():
        label = link_dimensions(topo, dims_of(topo))
        for axis, d in enumerate(axes):
            on = label == axis
            latency[on] = (2 if d.kind == "switch" else 1) * float(d.latency_ns)
            bytes_per_ns[on] = float(d.bandwidth_gb_per_s) * GIB / 1e9
    return latency, bytes_per_ns


def _exact(topo: Topology, congestion: str) -> bool:
    """Whether every link's message time is the simulator's under ``congestion``: a pair's route is
    its one link (or links of equal values, unaware); congestion-aware also no switch (a message
    crosses two ports) and no parallel links (their messages queue on one route)."""
    pairs = np.asarray(topo.src, np.int64) * topo.num_npus + np.asarray(topo.dst, np.int64)
    parallel = len(np.unique(pairs)) < len(pairs)
    if congestion == "aware":
        return not parallel and not _switch_axes(topo).any()
    if not parallel:
        return True
    values = np.unique(np.stack([pairs, topo.latency_ns, topo.bandwidth_gb_per_s]), axis=1)
    return len(np.unique(values[0])) == values.shape[1]


def transfer_distances(topo: Topology, times: np.ndarray) -> np.ndarray:
    """``d[s, t]``: least sum of ``times`` over a path ``s → t`` (every pair; All-to-All's routing)."""
    if topo.num_links and np.all(times == times[0]):
        hops = topo.hop_distances()
        out = hops.astype(np.float64) * float(times[0])
        out[hops < 0] = np.inf
        return out
    weighted = Topology(
        topo.num_npus,
        topo.src,
        topo.dst,
        np.asarray(times, dtype=np.float64),
        np.ones(topo.num_links),  # no bytes: each link costs its time
        topo.name,
    )
    return weighted.distances_ns(0.0)


def evaluate(s: Schedule, p: Prices, coll: str, n: int, k: int) -> float:
    """The simulator's time (ns) of the schedule's algorithm trace: every op starts when its last
    dependency ends, priced by ``p``.

    Per transfer: its send starts when the previous send on its link has arrived and its
    chunk is there to send — arrived at the sender (a copy or routed phase; an All-Reduce
    owner's own chunk: every reduction of it there has ended) or, a partial sum, every
    reduction of it at the sender has ended; it arrives a message time later; its receive
    ends when it has arrived and the previous receive (with its reduction) on the link has
    ended; its reduction lasts the step's price. The collective ends with its last op
    (All-to-All: or its NPUs' local copies).

    Notes
    -----
    The trace's dependencies all point from a transfer that ends in the plan to one that
    starts no earlier, so transfers are taken in windows of plan start times narrower than
    the shortest link time: no dependency inside a window, and no two transfers of one
    link. Each window is priced at once, keeping per link its last arrival and receive,
    and per (NPU, chunk) when the chunk arrived or was reduced there (per chunk for
    All-to-All, which moves each chunk along one path). O(T) numpy work for T transfers in
    O(W) calls for W windows (about the makespan over the fastest link's time); memory
    O(N · C + E) beyond the schedule (16 bytes per (NPU, chunk) of a flood).
    """
    t = len(s)
    copies = copies_ns(p, coll, n, k)
    if t == 0:
        return copies
    span = p.total_chunks
    present = set(np.unique(s.phase).tolist())
    link_arrive = np.zeros(len(s.link_ns))  # per link: its last message's arrival
    link_done = np.zeros(len(s.link_ns))  # per link: its receiving end's last op (receive or reduction)
    have = np.zeros(n * span) if 1 in present else None  # per (NPU, chunk): its copy arrived
    reduced = np.zeros(n * span) if 0 in present else None  # per (NPU, chunk): its last reduction ended
    got = np.zeros(n * span, dtype=bool) if coll == "allreduce" else None  # received in the All-Gather
    moved = np.zeros(int(s.chunk.max()) + 1) if 2 in present else None  # per chunk: its last hop arrived
    last_chunk = span - 1
    end = 0.0
    for sel in _windows(s.start_ns, float(s.link_ns.min())):
        link = s.link[sel]
        chunk = s.chunk[sel].astype(np.int64)
        phase = s.phase[sel]
        at_src = s.link_src[link] * np.int64(span) + chunk
        at_dst = s.link_dst[link] * np.int64(span) + chunk
        go = link_arrive[link]
        if have is not None:
            m = phase == 1
            ready = have[at_src[m]]
            if got is not None and reduced is not None:  # an owner's chunk is ready once reduced
                ready = np.where(got[at_src[m]], ready, reduced[at_src[m]])
            go[m] = np.maximum(go[m], ready)
        if reduced is not None:
            m = phase == 0
            go[m] = np.maximum(go[m], reduced[at_src[m]])
        if moved is not None:
            m = phase == 2
            go[m] = np.maximum(go[m], moved[chunk[m]])
        last = chunk >= last_chunk
        a = go + np.where(last, p.last_link_ns[link], p.link_ns[link])
        d = np.maximum(a, link_done[link])
        if reduced is not None:
            m = phase == 0
            d[m] += np.where(last[m], p.reduce_ns[1], p.reduce_ns[0])
            np.maximum.at(reduced, at_dst[m], d[m])
        if have is not None:
            m = phase == 1
            have[at_dst[m]] = d[m]
            if got is not None:
                got[at_dst[m]] = True
        if moved is not None:
            m = phase == 2
            moved[chunk[m]] = d[m]
        link_arrive[link] = a
        link_done[link] = d
        end = max(end, float(d.max()))
    return max(end, copies)


def _windows(start: np.ndarray, min_ns: float) -> Iterator[slice | np.ndarray]:
    """Transfers in plan-start order (slices where the schedule is in that order already), cut into
    windows narrower than the shortest link time."""
    t = len(start)
    ordered = bool(np.all(start[1:] >= start[:-1]))
    order = None if ordered else np.argsort(start, kind="stable")
    ss = start if order is None else start[order]
    width = min_ns * (1 - 1e-9)
    count = int((ss[-1] - ss[0]) // width) + 1
    if count <= 4 * t + 1024:
        cuts = np.searchsorted(ss, ss[0] + width * np.arange(1, count + 1), side="left")
    else:  # link times far below the plan's span: one window per plan start time
        cuts = np.flatnonzero(ss[1:] > ss[:-1]) + 1
    bounds = np.unique(np.concatenate([[0], cuts, [t]])).tolist()
    for a, b in itertools.pairwise(bounds):
        yield slice(a, b) if order is None else order[a:b]


def copies_ns(p: Prices, coll: str, n: int, k: int) -> float:
    """All-to-All's local copies: k per NPU, chained, each its chunk's copy cost; the longest NPU's sum."""
    if coll != "alltoall":
        return 0.0
    rank = np.repeat(np.arange(n, dtype=np.int64), k)
    ids = rank * n * k + rank * k + np.tile(np.arange(k, dtype=np.int64), n)
    cost = np.where(ids >= p.total_chunks - 1, p.copy_ns[1], p.copy_ns[0])
    return float(np.bincount(rank, weights=cost, minlength=n).max())
