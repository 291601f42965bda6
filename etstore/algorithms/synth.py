"""Topology-aware collective synthesis (TACOS-style greedy link–chunk matching).

:func:`synthesize` turns a :class:`~etstore.topology.Topology` and a collective
into an algorithm :class:`~etstore.model.Trace` in the representation of
``docs/algorithms.md`` (COMM_SEND / COMM_RECV / ``reduce`` COMP nodes with chunk
columns), plus the schedule's time under the link model and a lower bound.

The link model is TACOS's (FORMATS.md §4): a link carries one chunk at a time and
takes ``latency + chunk_bytes / bandwidth`` per chunk; an NPU forwards a chunk
once it has fully arrived (store-and-forward).

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
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from etstore.algorithms._synth_bounds import alltoall_bound, flood_bound, flood_holders
from etstore.algorithms._synth_budget import require_parts_budget, require_synthesis_budget
from etstore.algorithms._synth_engine import Engine, Raw
from etstore.algorithms._synth_schedule import Flow, Schedule, assemble, flow, reverse, reverse_links
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

    ``time_ns`` is the schedule's collective time under the link model,
    ``lower_bound_ns`` a bound no schedule can beat (see :func:`synthesize`),
    ``ratio`` their quotient (1.0 = provably optimal under the model).
    ``schedule`` is the algorithm as compact columns; ``trace``, the algorithm
    trace, is built from it on first access (two or three nodes per transfer, so
    about 200 bytes per transfer against the schedule's 17).
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
    progress
        Called as ``progress(phase, done, total)``: ``trials`` (greedy runs done of
        ``trials``; a second ``trials`` pass for an All-Reduce on a directed topology;
        the count jumps to the total when a run meets the bound), then ``schedule``
        (0 then 1 of 1). The trace is built later, on first access to ``result.trace``.

    Returns
    -------
    SynthResult
        ``trace`` (kind ``algorithm``; params ``collective``, ``ngpus``,
        ``nchunksperloop``, ``inplace``, ``producer="synth"``, ``topology``, ``seed``,
        ...), ``schedule``, ``time_ns``, ``lower_bound_ns`` and ``ratio``.

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
    and E links; memory 17 bytes per transfer for the schedule (25 for reductions)
    plus N · C bytes of delivery flags. The trace is built on first access to
    ``result.trace``, O(T log T). The lower bounds (``_synth_bounds``, all counting
    link finish times): All-Gather the largest of every NPU's ingress of (N-1)·k chunks
    (TACOS's ⌈(N-1)k / indeg⌉ · t when links are equal), the cuts (|A|·k chunks from
    side A to side B) and the farthest pair; Reduce-Scatter the same on the transposed
    topology (egress); All-Reduce their sum (the bound of the RS + AG decomposition,
    as TACOS); Broadcast the root's injection of k chunks plus the distance the last
    one still has to go, every other NPU's ingress with in-links released when a chunk
    can first reach them, and the farthest NPU; Reduce the same on the transpose;
    All-to-All injection, ejection, the cuts (|A|·|B|·k chunks each way: the bisection),
    the farthest pair and the total link work.
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
    phases, lb, used, best = _run_phases(topo, coll_name, k, root, chunk_bytes, trials, seed, progress)
    if progress is not None:
        progress("schedule", 0, 1)
    schedule = assemble(topo, topo.link_time_ns(chunk_bytes), phases)
    del phases
    if progress is not None:
        progress("schedule", 1, 1)
    elapsed = time.perf_counter() - began
    log.debug(
        "synth %s on %s: %.1f ns (bound %.1f) in %.3f s", coll_name, topo.name, schedule.time_ns, lb, elapsed
    )
    extra = {"root": root} if coll_name in ("broadcast", "reduce") else {}
    return SynthResult(
        topo,
        schedule,
        coll_name,
        topo.name,
        n,
        k,
        int(buffer_bytes),
        chunk_bytes,
        schedule.time_ns,
        lb,
        seed,
        used,
        best,
        elapsed,
        extra,
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


def _counted(
    run: Callable[[random.Random, str], Raw], trials: int, progress: ProgressFn | None
) -> Callable[[random.Random, str], Raw]:
    """``run``, reporting ``("trials", done, trials)`` after each call (a trial is long enough
    for one callback each to cost nothing)."""
    if progress is None:
        return run
    progress("trials", 0, trials)
    done = [0]

    def counted(rng: random.Random, policy: str) -> Raw:
        raw = run(rng, policy)
        done[0] += 1
        progress("trials", done[0], trials)
        return raw

    return counted


def _trials_done(trials: int, progress: ProgressFn | None) -> None:
    """The trials' count at its total: a run that met the bound ended the search early."""
    if progress is not None:
        progress("trials", trials, trials)


def _run_phases(
    topo: Topology,
    coll: str,
    k: int,
    root: int,
    chunk_bytes: float,
    trials: int,
    seed: int,
    progress: ProgressFn | None = None,
) -> tuple[list[tuple[Flow, int, float]], float, int, int]:
    """Run the engine for each phase of ``coll``: (phases, lower bound in ns, trials run, best trial).

    A phase is ``(flow, phase code, start offset in ns)``; reductions are floods on
    the transposed topology played backwards, All-Reduce is Reduce-Scatter then
    All-Gather.
    """
    times = topo.link_time_ns(chunk_bytes)
    if coll == "alltoall":  # shortest-path routing needs every pair's distance
        dist = topo.distances_ns(chunk_bytes)
        engine = Engine(topo, times, dist)
        lb = alltoall_bound(topo, times, dist, k)
        a2a = _counted(lambda rng, pol: engine.alltoall(k, rng, pol), trials, progress)
        raw, used, best = engine.best_of(trials, seed, lb, a2a)
        _trials_done(trials, progress)
        return [(flow(raw), 2, 0.0)], lb, used, best
    base = "allgather" if coll in ("allgather", "reducescatter", "allreduce") else "broadcast"
    holders = flood_holders(topo.num_npus, base, k, root)
    engine = Engine(topo, times)
    lb_ag = flood_bound(topo, times, base, k, root, transpose=False)

    def gather(rng: random.Random, policy: str) -> Raw:
        return engine.flood(holders, rng, policy)

    if coll in ("allgather", "broadcast"):
        raw, used, best = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
        _trials_done(trials, progress)
        return [(flow(raw), 1, 0.0)], lb_ag, used, best
    # reducescatter, reduce, allreduce: reverse a flood on the transposed topology
    lb_rs = flood_bound(topo, times, base, k, root, transpose=True)
    rev = reverse_links(topo)
    ag: Flow | None = None
    if rev is not None:  # symmetric: a flood on the transpose is this flood on reversed links
        raw, used, best = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
        _trials_done(trials, progress)
        ag = flow(raw)
        rs = reverse(ag, rev, times)
    else:
        tengine = Engine(topo.transpose(), times)
        raw, used, best = tengine.best_of(
            trials, seed, lb_rs, _counted(lambda rng, pol: tengine.flood(holders, rng, pol), trials, progress)
        )
        _trials_done(trials, progress)
        rs = reverse(flow(raw), np.arange(topo.num_links, dtype=np.int32), times)
        if coll == "allreduce":
            raw, used2, _ = engine.best_of(trials, seed, lb_ag, _counted(gather, trials, progress))
            _trials_done(trials, progress)
            ag = flow(raw)
            used += used2
    if coll == "allreduce":
        assert ag is not None  # both branches above build the All-Gather for allreduce
        return [(rs, 0, 0.0), (ag, 1, rs.makespan)], lb_rs + lb_ag, used, best
    return [(rs, 0, 0.0)], lb_rs, used, best
