"""The columnar :class:`Schedule` of a synthesized algorithm and how phases combine into it.

A phase is one engine run as arrays (:class:`Flow`); a reduction phase is the time
reversal of a flood (:func:`reverse`), on the reversed links when the topology is
symmetric; :func:`assemble` stacks phases, each shifted by its start time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from etstore.collectives._synth_engine import Raw
from etstore.topology import Topology

__all__ = ["Flow", "Schedule", "assemble", "flow", "reverse", "reverse_links"]


@dataclass(frozen=True)
class Schedule:
    """The timed transfers of a synthesized algorithm, one row per chunk per link (columnar).

    ``phase`` is 0 for a reduction phase (Reduce-Scatter, Reduce), 1 for a copy
    phase (All-Gather, Broadcast) and 2 for routed All-to-All traffic. Times in ns.
    """

    link: np.ndarray  # int32, link id in the topology
    src: np.ndarray  # int32, sending NPU
    dst: np.ndarray  # int32, receiving NPU
    chunk: np.ndarray  # int64, chunk id (see SynthResult)
    start_ns: np.ndarray  # float64
    end_ns: np.ndarray  # float64
    phase: np.ndarray  # int8

    def __len__(self) -> int:
        return len(self.link)

    @property
    def time_ns(self) -> float:
        """When the last transfer ends (0 if there is none)."""
        return float(self.end_ns.max()) if len(self.end_ns) else 0.0


def reverse_links(topo: Topology) -> np.ndarray | None:
    """``rev[l]`` = a link ``dst[l] → src[l]`` with equal latency and bandwidth (one-to-one), or None."""
    if not topo.is_symmetric():
        return None
    a = np.lexsort((topo.bandwidth_gb_per_s, topo.latency_ns, topo.dst, topo.src))
    b = np.lexsort((topo.bandwidth_gb_per_s, topo.latency_ns, topo.src, topo.dst))
    rev = np.empty(topo.num_links, dtype=np.int32)
    rev[a] = b
    return rev


class Flow(NamedTuple):
    """One phase's transfers as arrays (times relative to the phase start)."""

    link: np.ndarray  # int32
    chunk: np.ndarray  # int64
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    makespan: float


def flow(raw: Raw, times: np.ndarray) -> Flow:
    links, chunks, starts, makespan = raw
    link = np.asarray(links, dtype=np.int32)
    start = np.asarray(starts, dtype=np.float64)
    # the same float sum the engine used, so a forward starts exactly when its input ended
    return Flow(link, np.asarray(chunks, dtype=np.int64), start, start + times[link], float(makespan))


def reverse(flow: Flow, link_map: np.ndarray) -> Flow:
    """Time reversal: a transfer on link l over [s, e] becomes one on ``link_map[l]`` over [T-e, T-s]."""
    return Flow(
        link_map[flow.link], flow.chunk, flow.makespan - flow.end, flow.makespan - flow.start, flow.makespan
    )


def assemble(topo: Topology, phases: Sequence[tuple[Flow, int, float]]) -> Schedule:
    """The columnar schedule of all phases; phases are (flow, phase code, time offset)."""
    link = np.concatenate([f.link for f, _, _ in phases]).astype(np.int32)
    return Schedule(
        link,
        topo.src[link],
        topo.dst[link],
        np.concatenate([f.chunk for f, _, _ in phases]),
        np.concatenate([f.start + off for f, _, off in phases]),
        np.concatenate([f.end + off for f, _, off in phases]),
        np.concatenate([np.full(len(f.link), code, dtype=np.int8) for f, code, _ in phases]),
    )
