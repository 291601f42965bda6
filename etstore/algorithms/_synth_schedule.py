"""The columnar :class:`Schedule` of a synthesized algorithm and how phases combine into it.

A phase is one engine run as arrays (:class:`Flow`); a reduction phase is the time
reversal of a flood (:func:`reverse`), on the reversed links when the topology is
symmetric; :func:`assemble` stacks phases, each shifted by its start time.

Memory: a schedule keeps 17 bytes per transfer (link, chunk, start, phase); the
sending and receiving NPU and, for copy phases, the end time are derived from the
link on access. Only reversed phases keep their end times (25 bytes per transfer),
so that times stay the exact float sums the engine used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from etstore.algorithms._synth_engine import Raw
from etstore.topology import Topology

__all__ = ["Flow", "Schedule", "assemble", "flow", "reverse", "reverse_links"]


@dataclass(frozen=True, eq=False)
class Schedule:
    """The timed transfers of a synthesized algorithm, one row per chunk per link (columnar).

    ``phase`` is 0 for a reduction phase (Reduce-Scatter, Reduce), 1 for a copy
    phase (All-Gather, Broadcast) and 2 for routed All-to-All traffic. Times in ns.
    ``src``, ``dst`` and (unless stored) ``end_ns`` are computed from the link on
    each access.
    """

    link: np.ndarray  # int32, link id in the topology
    chunk: np.ndarray  # int32 (int64 from 2^31 chunks on), chunk id (see SynthResult)
    start_ns: np.ndarray  # float64
    phase: np.ndarray  # int8
    link_src: np.ndarray  # per link of the topology: its sending NPU
    link_dst: np.ndarray  # per link: its receiving NPU
    link_ns: np.ndarray  # per link: its chunk time, ns
    stored_end_ns: np.ndarray | None = None  # float64 where phases were reversed

    def __len__(self) -> int:
        return len(self.link)

    @property
    def src(self) -> np.ndarray:
        """Sending NPU per transfer (int32)."""
        return self.link_src[self.link]

    @property
    def dst(self) -> np.ndarray:
        """Receiving NPU per transfer (int32)."""
        return self.link_dst[self.link]

    @property
    def end_ns(self) -> np.ndarray:
        """When each transfer ends (ns, float64)."""
        if self.stored_end_ns is not None:
            return self.stored_end_ns
        return self.start_ns + self.link_ns[self.link]

    @property
    def time_ns(self) -> float:
        """When the last transfer ends (0 if there is none)."""
        return float(self.end_ns.max()) if len(self.link) else 0.0

    @property
    def nbytes(self) -> int:
        """Bytes held by the per-transfer columns."""
        cols = (self.link, self.chunk, self.start_ns, self.phase, self.stored_end_ns)
        return sum(c.nbytes for c in cols if c is not None)


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
    chunk: np.ndarray  # int32 (int64 from 2^31 chunks on)
    start: np.ndarray  # float64
    end: np.ndarray | None  # float64, or None: start + the link's time
    makespan: float


def flow(raw: Raw) -> Flow:
    """The arrays of one engine run (the link and chunk columns are the engine's buffers, not copies)."""
    link = np.frombuffer(raw.link, dtype=np.int32) if len(raw.link) else np.zeros(0, np.int32)
    wide = np.int32 if raw.chunk.itemsize == 4 else np.int64
    chunk = np.frombuffer(raw.chunk, dtype=wide) if len(raw.chunk) else np.zeros(0, np.int32)
    event = np.frombuffer(raw.event, dtype=np.int32) if len(raw.event) else np.zeros(0, np.int32)
    start = np.asarray(raw.event_ns, dtype=np.float64)[event]
    return Flow(link, chunk, start, None, float(raw.makespan))


def _ends(f: Flow, times: np.ndarray) -> np.ndarray:
    # the same float sum the engine used, so a forward starts exactly when its input ended
    return f.end if f.end is not None else f.start + times[f.link]


def reverse(f: Flow, link_map: np.ndarray, times: np.ndarray) -> Flow:
    """Time reversal: a transfer on link l over [s, e] becomes one on ``link_map[l]`` over [T-e, T-s]."""
    end = _ends(f, times)
    return Flow(link_map[f.link], f.chunk, f.makespan - end, f.makespan - f.start, f.makespan)


def assemble(topo: Topology, times: np.ndarray, phases: Sequence[tuple[Flow, int, float]]) -> Schedule:
    """The columnar schedule of all phases; phases are (flow, phase code, time offset).

    A single copy phase at offset 0 keeps its arrays without copying them.
    """
    link_src = topo.src.astype(np.int32)
    link_dst = topo.dst.astype(np.int32)
    if len(phases) == 1 and phases[0][0].end is None and phases[0][2] == 0.0:
        f, code = phases[0][0], phases[0][1]
        return Schedule(
            f.link, f.chunk, f.start, np.full(len(f.link), code, np.int8), link_src, link_dst, times
        )
    stored_end = None
    if any(f.end is not None for f, _, _ in phases):
        stored_end = np.concatenate([_ends(f, times) + off for f, _, off in phases])
    return Schedule(
        np.concatenate([f.link for f, _, _ in phases]).astype(np.int32),
        np.concatenate([f.chunk for f, _, _ in phases]),
        np.concatenate([f.start + off for f, _, off in phases]),
        np.concatenate([np.full(len(f.link), code, dtype=np.int8) for f, code, _ in phases]),
        link_src,
        link_dst,
        times,
        stored_end,
    )
