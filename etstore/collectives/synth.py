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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from etstore.collective import ALGORITHM_COLLECTIVES, short_name
from etstore.collectives._synth_bounds import alltoall_bound, flood_setup
from etstore.collectives._synth_engine import Engine, Raw
from etstore.collectives._synth_schedule import Flow, Schedule, assemble, flow, reverse, reverse_links
from etstore.collectives._synth_trace import build_trace
from etstore.errors import UnsatisfiableError
from etstore.model import Trace
from etstore.topology import Topology, parse_topology

__all__ = ["COLLECTIVES", "Schedule", "SynthResult", "synthesize"]

log = logging.getLogger(__name__)

COLLECTIVES = ALGORITHM_COLLECTIVES  # synthesis covers every collective an algorithm can implement


@dataclass(frozen=True)
class SynthResult:
    """A synthesized algorithm and how good it is.

    ``time_ns`` is the schedule's collective time under the link model,
    ``lower_bound_ns`` a bound no schedule can beat (see :func:`synthesize`),
    ``ratio`` their quotient (1.0 = provably optimal under the model).
    """

    trace: Trace
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

    @property
    def ratio(self) -> float:
        """``time_ns / lower_bound_ns`` (1.0 when both are 0)."""
        return self.time_ns / self.lower_bound_ns if self.lower_bound_ns > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (what ``etstore synth --format json`` prints); times in ns."""
        return {
            "collective": self.collective,
            "topology": self.topology,
            "npus": self.num_npus,
            "chunks_per_npu": self.chunks_per_npu,
            "buffer_bytes": self.buffer_bytes,
            "chunk_bytes": self.chunk_bytes,
            "transfers": len(self.schedule),
            "ops": self.trace.num_ops,
            "deps": self.trace.num_deps,
            "time_ns": self.time_ns,
            "lower_bound_ns": self.lower_bound_ns,
            "ratio": self.ratio,
            "seed": self.seed,
            "trials": self.trials,
            "best_trial": self.best_trial,
            "synthesis_s": self.synthesis_s,
            **self.extra,
        }


def synthesize(
    topo: Topology | str,
    *,
    coll: str,
    chunks_per_npu: int = 1,
    trials: int = 8,
    seed: int = 0,
    buffer_bytes: int = 1 << 30,
    root: int = 0,
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
        is not an NPU, a buffer smaller than one byte per chunk, or fewer than 2 NPUs.
    TopologyError
        If the topology is disconnected or the spec cannot be read.

    Notes
    -----
    Time O(trials · (N · C · deg + T log E)) with C chunks, out-degree deg, T transfers
    and E links, plus O(T log T) to build the trace. The lower bounds: for
    All-Gather the larger of the ingress bound (NPU d needs (N-1)·k chunks; its
    in-links deliver at most ⌊τ / t_l⌋ each by time τ; TACOS's ⌈(N-1)k / indeg⌉ · t
    when links are equal) and the longest shortest path; Reduce-Scatter the same on
    the transposed topology (egress); All-Reduce their sum (the bound of the
    RS + AG decomposition, as TACOS); Broadcast/Reduce the root's egress/ingress,
    every other NPU's ingress/egress for k chunks and the farthest NPU;
    All-to-All adds the total link time needed (k · Σ shortest paths / links).
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
    total_chunks = k if coll_name in ("broadcast", "reduce") else n * k
    if buffer_bytes < total_chunks:
        raise UnsatisfiableError(
            f"synth: buffer_bytes={buffer_bytes} is smaller than one byte per chunk ({total_chunks} chunks)"
        )
    chunk_bytes = buffer_bytes / total_chunks
    phases, lb, used, best = _run_phases(topo, coll_name, k, root, chunk_bytes, trials, seed)
    schedule = assemble(topo, phases)
    trace = build_trace(topo, schedule, coll_name, n, k, total_chunks)
    elapsed = time.perf_counter() - began
    params: dict[str, Any] = {
        "collective": coll_name,
        "ngpus": n,
        "nchunksperloop": total_chunks,
        "inplace": coll_name != "alltoall",
        "producer": "synth",
        "topology": topo.name,
        "seed": seed,
        "chunks_per_npu": k,
        "trials": used,
        "buffer_bytes": int(buffer_bytes),
        "time_ns": schedule.time_ns,
        "lower_bound_ns": lb,
    }
    if coll_name in ("broadcast", "reduce"):
        params["root"] = root
    if topo.labels is not None:
        params["npu_labels"] = [int(x) for x in topo.labels]
    trace = trace.replace(params=params)
    log.debug(
        "synth %s on %s: %.1f ns (bound %.1f) in %.3f s", coll_name, topo.name, schedule.time_ns, lb, elapsed
    )
    extra = {"root": root} if coll_name in ("broadcast", "reduce") else {}
    return SynthResult(
        trace,
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


def _run_phases(
    topo: Topology, coll: str, k: int, root: int, chunk_bytes: float, trials: int, seed: int
) -> tuple[list[tuple[Flow, int, float]], float, int, int]:
    """Run the engine for each phase of ``coll``: (phases, lower bound in ns, trials run, best trial).

    A phase is ``(flow, phase code, start offset in ns)``; reductions are floods on
    the transposed topology played backwards, All-Reduce is Reduce-Scatter then
    All-Gather.
    """
    times = topo.link_time_ns(chunk_bytes)
    dist = topo.distances_ns(chunk_bytes)
    engine = Engine(topo, times, dist)
    if coll == "alltoall":
        lb = alltoall_bound(topo, times, dist, k)
        raw, used, best = engine.best_of(trials, seed, lb, lambda rng, pol: engine.alltoall(k, rng, pol))
        return [(flow(raw, times), 2, 0.0)], lb, used, best
    base = "allgather" if coll in ("allgather", "reducescatter", "allreduce") else "broadcast"
    holders, lb_ag = flood_setup(topo, times, dist, base, k, root, transpose=False)

    def gather(rng: random.Random, policy: str) -> Raw:
        return engine.flood(holders, rng, policy)

    if coll in ("allgather", "broadcast"):
        raw, used, best = engine.best_of(trials, seed, lb_ag, gather)
        return [(flow(raw, times), 1, 0.0)], lb_ag, used, best
    # reducescatter, reduce, allreduce: reverse a flood on the transposed topology
    _, lb_rs = flood_setup(topo, times, dist, base, k, root, transpose=True)
    rev = reverse_links(topo)
    ag: Flow | None = None
    if rev is not None:  # symmetric: a flood on the transpose is this flood on reversed links
        raw, used, best = engine.best_of(trials, seed, lb_ag, gather)
        ag = flow(raw, times)
        rs = reverse(ag, rev)
    else:
        tengine = Engine(topo.transpose(), times, dist.T)
        raw, used, best = tengine.best_of(
            trials, seed, lb_rs, lambda rng, pol: tengine.flood(holders, rng, pol)
        )
        rs = reverse(flow(raw, times), np.arange(topo.num_links, dtype=np.int32))
        if coll == "allreduce":
            raw, used2, _ = engine.best_of(trials, seed, lb_ag, gather)
            ag = flow(raw, times)
            used += used2
    if coll == "allreduce":
        assert ag is not None  # both branches above build the All-Gather for allreduce
        return [(rs, 0, 0.0), (ag, 1, rs.makespan)], lb_rs + lb_ag, used, best
    return [(rs, 0, 0.0)], lb_rs, used, best
