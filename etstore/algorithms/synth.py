"""Topology-aware collective synthesis (TACOS-style greedy link–chunk matching).

:func:`synthesize` turns a :class:`~etstore.topology.Topology` and a collective
into an algorithm :class:`~etstore.model.Trace` in the representation of
``docs/algorithms.md`` (COMM_SEND / COMM_RECV / ``reduce`` COMP nodes with chunk
columns), plus its time and a lower bound.

The time is what ``etstore sim`` gives the stored algorithm: one collective of
``buffer_bytes`` on the same topology under the same simulator settings (a
:class:`~etstore.sim.config.SimConfig`; default: its defaults), equal to the ns
(:mod:`etstore.algorithms._synth_cost` prices the schedule by the simulator's rules:
message times, reductions at ``reduction_mem_accesses`` memory passes, the trace's
dependencies). The search plans in TACOS's link model (FORMATS.md §4) over those
message times: a link carries one chunk at a time, each taking the simulator's time
for it; an NPU forwards a chunk once it has fully arrived (store-and-forward).

How the greedy works, and why it is fast
----------------------------------------
Every (chunk, NPU) pair is delivered exactly once. Each link keeps a candidate
list: when a chunk arrives at NPU ``s`` it is appended to the lists of ``s``'s
outgoing links whose far end still needs it. Events are link finish times in a
heap; at an event the arrivals are applied first, then every free link with
candidates takes one (lazily skipping chunks its far end got meanwhile), so no
event rescans all links or all unsatisfied pairs. Total work is
O(N · C · deg + T log E) for N NPUs, C chunks, out-degree deg and T transfers —
quadratic in N for All-Gather (the output itself has N · (N-1) · k transfers),
where C++ TACOS rescans every link and every unsatisfied pair per event.

Choices that keep schedule quality at TACOS's level or better: free links are
served fastest first (TACOS's "earliest-finishing link"); a link into an NPU with
links of different speeds waits rather than start a transfer that faster busy
links would finish sooner; trials alternate between random chunk choice (spreads
distinct chunks over parallel paths) and oldest-first (no chunk starves), and
stop as soon as one meets the lower bound.

Reduce-Scatter is the time reversal of an All-Gather on the transposed topology
(receives become reductions), All-Reduce is Reduce-Scatter then All-Gather, Reduce
is a reversed Broadcast; All-to-All (not in TACOS) routes every chunk over
shortest paths, longest remaining distance first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from etstore.algorithms._synth_budget import require_parts_budget, require_synthesis_budget
from etstore.algorithms._synth_cost import Prices, Settings, SimSettings, evaluate, prices
from etstore.algorithms._synth_phases import Plan, plans
from etstore.algorithms._synth_schedule import Schedule, assemble
from etstore.algorithms._synth_trace import build_parts, build_trace, op_count
from etstore.collective import ALGORITHM_COLLECTIVES, short_name
from etstore.errors import UnsatisfiableError
from etstore.model import Trace
from etstore.progress import ProgressFn
from etstore.topology import Topology, parse_topology

__all__ = ["COLLECTIVES", "Schedule", "SynthResult", "synthesize"]

log = logging.getLogger(__name__)


COLLECTIVES = ALGORITHM_COLLECTIVES  # synthesis covers every collective an algorithm can implement


@dataclass(frozen=True, eq=False)
class SynthResult:
    """A synthesized algorithm and how good it is.

    ``time_ns`` is the time ``etstore sim`` gives the stored algorithm (one collective of
    ``buffer_bytes`` on ``network`` under ``config``), to the ns — unless ``time_exact`` is
    False: congestion-aware through a switch or over parallel links, where messages queue,
    it is the congestion-unaware time, the queueing left out (``etstore synth`` simulates
    ``trace`` for it). ``lower_bound_ns`` is a bound no schedule can beat under the same
    rules (see :func:`synthesize`), ``ratio`` their quotient (1.0 = provably optimal).
    ``schedule`` is the algorithm as compact columns (times of the search's plan; the
    simulator may start steps earlier); ``trace``, the algorithm trace, is built from it
    on first access (two or three nodes per transfer, so about 200 bytes per transfer
    against the schedule's 17).
    """

    network: Topology
    schedule: Schedule
    collective: str
    topology: str
    num_npus: int
    chunks_per_npu: int
    buffer_bytes: int
    chunk_bytes: float
    time_ns: float
    lower_bound_ns: float
    seed: int
    trials: int
    best_trial: int
    synthesis_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    config: Settings = field(default_factory=Settings)
    time_exact: bool = True

    @cached_property
    def trace(self) -> Trace:
        """The algorithm trace (kind ``algorithm``), built on first access; O(T log T) for T transfers."""
        coll, n, k = self.collective, self.num_npus, self.chunks_per_npu
        require_parts_budget(self._ops_per_rank(), len(self.schedule), self.num_ops)
        trace = build_trace(self.network, self.schedule, coll, n, k, self._total_chunks)
        return trace.replace(params=self._params())

    def trace_parts(self, max_ops: int = 1 << 21) -> Iterator[Trace]:
        """:attr:`trace` as consecutive rank ranges, built one at a time (nothing is cached).

        Each part is a :class:`~etstore.model.Trace` with the name, kind, source and
        params of :attr:`trace`, holding whole ranks ``[a, b)`` (ascending, disjoint,
        covering every rank): at most ``max_ops`` ops unless one rank alone has more.
        Its ops are :attr:`trace`'s rows of those ranks in their order (ids per rank as
        there); its deps are :attr:`trace`'s deps of those ranks in their order, so the
        parts end to end are :attr:`trace`. Memory is one part's (up to ~800 bytes per op
        at its peak) plus 8 bytes per transfer of index; stream these into a store
        instead of building :attr:`trace` whole.

        Raises
        ------
        OptionError
            If ``max_ops`` < 1.
        UnsatisfiableError
            The largest part would not fit the memory budget (checked before any is built).
        """
        coll, n, k = self.collective, self.num_npus, self.chunks_per_npu
        if max_ops >= 1:
            require_parts_budget(self._ops_per_rank(), len(self.schedule), max_ops)
        parts = build_parts(self.network, self.schedule, coll, n, k, self._total_chunks, max_ops=max_ops)
        params = self._params()
        # map, not a generator expression: that would hold the previous part while building the next
        return map(lambda part: part.replace(params=params), parts)

    def _ops_per_rank(self) -> np.ndarray:
        """Each rank's ops in :attr:`trace` (as :attr:`num_ops` counts them), from the schedule."""
        s, n = self.schedule, self.num_npus
        dst = s.dst
        per = np.bincount(s.src, minlength=n) + np.bincount(dst, minlength=n)
        per += np.bincount(dst[s.phase == 0], minlength=n)
        if self.collective == "alltoall":
            per += self.chunks_per_npu
        return per

    @property
    def _total_chunks(self) -> int:
        k = self.chunks_per_npu
        return k if self.collective in ("broadcast", "reduce") else self.num_npus * k

    def _params(self) -> dict[str, Any]:
        """The trace's params (what :attr:`trace` and every part of :meth:`trace_parts` carry)."""
        coll = self.collective
        params: dict[str, Any] = {
            "collective": coll,
            "ngpus": self.num_npus,
            "nchunksperloop": self._total_chunks,
            "inplace": coll != "alltoall",
            "producer": "synth",
            "topology": self.topology,
            "seed": self.seed,
            "chunks_per_npu": self.chunks_per_npu,
            "trials": self.trials,
            "buffer_bytes": self.buffer_bytes,
            "time_ns": self.time_ns,
            "lower_bound_ns": self.lower_bound_ns,
            **self.timed_by,
            **self.extra,
        }
        if self.network.labels is not None:
            params["npu_labels"] = [int(x) for x in self.network.labels]
        return params

    @property
    def num_ops(self) -> int:
        """Ops of :attr:`trace`, counted from the schedule without building it: a send and a
        receive per transfer, a reduction per transfer of a reduction phase, and All-to-All's
        one local copy per own chunk."""
        return op_count(self.schedule, self.collective, self.num_npus, self.chunks_per_npu)

    @property
    def timed_by(self) -> dict[str, Any]:
        """The simulator settings ``time_ns`` holds for: network model, reduction and copy passes,
        local memory bandwidth (GB/s, GB = 10^9); the same options to ``etstore sim`` give it."""
        cfg = self.config
        return {
            "congestion": cfg.congestion,
            "reduction_mem_accesses": cfg.reduction_mem_accesses,
            "copy_mem_accesses": cfg.copy_mem_accesses,
            "local_mem_bw_gb_per_s": cfg.local_mem_bw_gb_per_s,
            "time_exact": self.time_exact,
        }

    @property
    def ratio(self) -> float:
        """``time_ns / lower_bound_ns`` (1.0 when both are 0)."""
        return self.time_ns / self.lower_bound_ns if self.lower_bound_ns > 0 else 1.0

    def to_dict(self, *, deps: bool = True) -> dict[str, Any]:
        """A JSON-able summary (what ``etstore synth --format json`` prints); times in ns.

        ``deps=False`` leaves out the dependency count, the one figure that needs the
        trace built (≈ 200 bytes per transfer; ``etstore synth --no-store`` never builds it).
        """
        doc: dict[str, Any] = {
            "collective": self.collective,
            "topology": self.topology,
            "npus": self.num_npus,
            "chunks_per_npu": self.chunks_per_npu,
            "buffer_bytes": self.buffer_bytes,
            "chunk_bytes": self.chunk_bytes,
            "transfers": len(self.schedule),
            "ops": self.num_ops,
            "deps": self.trace.num_deps if deps else None,
            "time_ns": self.time_ns,
            "lower_bound_ns": self.lower_bound_ns,
            "ratio": self.ratio,
            **self.timed_by,
            "seed": self.seed,
            "trials": self.trials,
            "best_trial": self.best_trial,
            "synthesis_s": self.synthesis_s,
            **self.extra,
        }
        if not deps:
            del doc["deps"]
        return doc


def synthesize(
    topo: Topology | str,
    *,
    coll: str,
    chunks_per_npu: int = 1,
    trials: int = 8,
    seed: int = 0,
    buffer_bytes: int = 1 << 30,
    root: int = 0,
    config: SimSettings | None = None,
    progress: ProgressFn | None = None,
) -> SynthResult:
    """Synthesize a collective algorithm for a topology (TACOS-style greedy, extended).

    Parameters
    ----------
    topo
        The topology, or a spec / file name for :func:`~etstore.topology.parse_topology`.
    coll
        ``allgather``, ``reducescatter``, ``allreduce``, ``broadcast``, ``reduce`` or
        ``alltoall`` (``ag``, ``rs``, ``ar``, ``bcast``, ``a2a`` also accepted).
    chunks_per_npu
        k: chunks each NPU contributes. The buffer of ``buffer_bytes`` is cut into
        ``N·k`` chunks for allgather, reducescatter, allreduce and alltoall (for
        alltoall the buffer is each NPU's, k chunks per destination) and into ``k``
        chunks for broadcast and reduce.
    trials
        Greedy runs with different seeded randomness; the fastest is kept. Runs stop
        early once one meets the lower bound.
    seed
        Base seed; the same seed gives the same algorithm.
    buffer_bytes
        The collective size S in bytes (All-Gather: the whole gathered buffer).
    root
        Root NPU of broadcast and reduce.
    config
        The simulator settings the time is for: a :class:`~etstore.sim.config.SimConfig`
        (or anything with its ``congestion``, ``reduction_mem_accesses``,
        ``copy_mem_accesses``, ``local_mem_bw_gb_per_s``, ``min_comp_ns``, ``integer_ns``
        and ``message_overhead_ns``); default ``etstore sim``'s defaults. ``time_ns`` is
        what :func:`etstore.sim.simulate` gives the stored algorithm run as one collective
        of ``buffer_bytes`` (``sweep``'s workload) on ``topo`` under it (see
        ``SynthResult.time_exact``). Its message times and reduction and copy costs are
        also what the search plans with and the bounds count.
    progress
        Called as ``progress(phase, done, total)``: ``trials`` (greedy runs done of
        ``trials``; a second ``trials`` pass for an All-Reduce on a directed topology,
        and one for a reduction planned at its reductions' pace on links of unequal
        times; the count jumps to the total when a run meets the bound), then
        ``schedule`` (0 then 1 of 1). The trace is built later, on first access to
        ``result.trace``.

    Returns
    -------
    SynthResult
        ``trace`` (kind ``algorithm``; params ``collective``, ``ngpus``,
        ``nchunksperloop``, ``inplace``, ``producer="synth"``, ``topology``, ``seed``,
        ``time_ns`` and the settings it holds for, ...), ``schedule``, ``time_ns``,
        ``lower_bound_ns`` and ``ratio``; for All-Reduce ``extra["phases_bound_ns"]``.

    Raises
    ------
    UnsatisfiableError
        For an unknown collective, ``chunks_per_npu`` or ``trials`` < 1, a root that
        is not an NPU, a buffer smaller than one byte per chunk, fewer than 2 NPUs, or
        a schedule whose transfers would not fit the memory budget (estimated from the
        request before anything runs; ``etstore.algorithms._synth_budget``).
    TopologyError
        If the topology is disconnected or the spec cannot be read.

    Notes
    -----
    Time O(trials · (N · C · deg + T log E)) with C chunks, out-degree deg, T transfers
    and E links, plus O(T log T) to time the schedule by the simulator's rules; memory
    17 bytes per transfer for the schedule (25 for reductions) plus N · C bytes of
    delivery flags. The trace is built on first access to ``result.trace``,
    O(T log T). The lower bounds (``_synth_bounds``, all counting link finish times
    over the simulator's message times t): All-Gather the largest of every NPU's
    ingress of (N-1)·k chunks (TACOS's ⌈(N-1)k / indeg⌉ · t when links are equal), the
    cuts (|A|·k chunks from side A to side B) and the farthest pair; Reduce-Scatter the
    same on the transposed topology (egress), each link's reductions paced at
    max(t, r) for a reduction of r ns and each hop t + r; All-Reduce the largest of
    Reduce-Scatter's plus a hop, a reduced hop plus All-Gather's, the link work and a
    chunk's round trip (the sum of the two, TACOS's, holds only if the All-Gather
    waited for the whole Reduce-Scatter: ``phases_bound_ns``); Broadcast the root's
    injection of k chunks plus the distance the last one still has to go, every other
    NPU's ingress with in-links released when a chunk can first reach them, and the
    farthest NPU; Reduce the same on the transpose, paced as Reduce-Scatter;
    All-to-All injection, ejection, the cuts (|A|·|B|·k chunks each way: the
    bisection), the farthest pair, the total link work and an NPU's local copies.
    Source: W. Won et al., "TACOS: Topology-Aware Collective Algorithm Synthesizer
    for Distributed Machine Learning", MICRO 2024; FORMATS.md §4.

    Examples
    --------
    >>> r = synthesize("ring:4", coll="allgather", buffer_bytes=4 << 20)
    >>> r.ratio
    1.0
    >>> r.trace.params["producer"], r.trace.num_ranks
    ('synth', 4)
    """
    began = time.perf_counter()
    coll_name = short_name(coll) or coll.lower()
    if coll_name not in COLLECTIVES:
        names = ", ".join(COLLECTIVES)
        raise UnsatisfiableError(f"synth: unknown collective {coll!r}; expected one of {names}")
    if isinstance(topo, str):
        topo = parse_topology(topo)
    k = int(chunks_per_npu)
    _check_request(topo, coll_name, k, trials, root)
    n = topo.num_npus
    topo.require_connected()
    require_synthesis_budget(topo, coll_name, k)
    total_chunks = k if coll_name in ("broadcast", "reduce") else n * k
    if buffer_bytes < total_chunks:
        raise UnsatisfiableError(
            f"synth: buffer_bytes={buffer_bytes} is smaller than one byte per chunk ({total_chunks} chunks)"
        )
    chunk_bytes = buffer_bytes / total_chunks
    cfg = Settings.of(config)
    cost = prices(topo, coll_name, k, int(buffer_bytes), cfg)
    candidates, bounds, used, best = plans(topo, coll_name, k, root, cost, trials, seed, progress)
    lb = bounds.lower
    if progress is not None:
        progress("schedule", 0, 1)
    schedule, time_ns = _fastest(topo, candidates, cost, coll_name, k)
    del candidates
    if progress is not None:
        progress("schedule", 1, 1)
    elapsed = time.perf_counter() - began
    log.debug("synth %s on %s: %.1f ns (bound %.1f) in %.3f s", coll_name, topo.name, time_ns, lb, elapsed)
    extra: dict[str, Any] = {"root": root} if coll_name in ("broadcast", "reduce") else {}
    if bounds.phases is not None:
        extra["phases_bound_ns"] = bounds.phases
    return SynthResult(
        topo,
        schedule,
        coll_name,
        topo.name,
        n,
        k,
        int(buffer_bytes),
        chunk_bytes,
        time_ns,
        lb,
        seed,
        used,
        best,
        elapsed,
        extra,
        cfg,
        cost.exact,
    )


def _check_request(topo: Topology, coll: str, k: int, trials: int, root: int) -> None:
    """Raise :class:`UnsatisfiableError` for parameters out of range for this topology."""
    n = topo.num_npus
    if k < 1:
        raise UnsatisfiableError(f"synth: chunks_per_npu must be >= 1, got {k}")
    if trials < 1:
        raise UnsatisfiableError(f"synth: trials must be >= 1, got {trials}")
    if n < 2:
        raise UnsatisfiableError(f"synth: {coll} on {topo.name} needs at least 2 NPUs")
    if coll in ("broadcast", "reduce") and not 0 <= root < n:
        raise UnsatisfiableError(f"synth: root {root} is not an NPU of {topo.name} (0..{n - 1})")


def _fastest(
    topo: Topology, candidates: list[Plan], cost: Prices, coll: str, k: int
) -> tuple[Schedule, float]:
    """The candidate plan the simulator's rules time fastest (the first on a tie), as a schedule,
    and that time (ns; :func:`~etstore.algorithms._synth_cost.evaluate`)."""
    n = topo.num_npus
    best: tuple[Schedule, float] | None = None
    while candidates:
        schedule = assemble(topo, cost.plan_ns, candidates.pop(0))
        time_ns = evaluate(schedule, cost, coll, n, k)
        if best is None or time_ns < best[1]:
            best = (schedule, time_ns)
    assert best is not None  # plans() returns at least one candidate
    return best
