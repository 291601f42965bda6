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

import heapq
import logging
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.collective import short_name
from etstore.errors import UnsatisfiableError
from etstore.model import Trace, deps_table, encode_attrs, ops_table
from etstore.topology import Topology, parse_topology

__all__ = ["COLLECTIVES", "Schedule", "SynthResult", "synthesize"]

log = logging.getLogger(__name__)

COLLECTIVES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall")
_EPS = 1e-6  # ns: events closer than this are simultaneous


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


# ====================================================================== API
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
    import time

    began = time.perf_counter()
    coll_name = short_name(coll) or coll.lower()
    if coll_name not in COLLECTIVES:
        names = ", ".join(COLLECTIVES)
        raise UnsatisfiableError(f"synth: unknown collective {coll!r}; expected one of {names}")
    if isinstance(topo, str):
        topo = parse_topology(topo)
    n = topo.num_npus
    k = int(chunks_per_npu)
    if k < 1:
        raise UnsatisfiableError(f"synth: chunks_per_npu must be >= 1, got {chunks_per_npu}")
    if trials < 1:
        raise UnsatisfiableError(f"synth: trials must be >= 1, got {trials}")
    if n < 2:
        raise UnsatisfiableError(f"synth: {coll_name} on {topo.name} needs at least 2 NPUs")
    if coll_name in ("broadcast", "reduce") and not 0 <= root < n:
        raise UnsatisfiableError(f"synth: root {root} is not an NPU of {topo.name} (0..{n - 1})")
    topo.require_connected()
    total_chunks = k if coll_name in ("broadcast", "reduce") else n * k
    if buffer_bytes < total_chunks:
        raise UnsatisfiableError(
            f"synth: buffer_bytes={buffer_bytes} is smaller than one byte per chunk ({total_chunks} chunks)"
        )
    chunk_bytes = buffer_bytes / total_chunks
    times = topo.link_time_ns(chunk_bytes)
    dist = topo.distances_ns(chunk_bytes)
    engine = _Engine(topo, times, dist)
    phases: list[tuple[_Flow, int, float]]

    def gather(rng: random.Random, policy: str) -> _Raw:
        return engine.flood(holders, rng, policy)

    if coll_name == "alltoall":
        lb = _alltoall_bound(topo, times, dist, k)
        raw, used, best = engine.best_of(trials, seed, lb, lambda rng, pol: engine.alltoall(k, rng, pol))
        phases = [(_flow(raw, times), 2, 0.0)]
    elif coll_name in ("allgather", "broadcast"):
        holders, lb = _flood_setup(topo, times, dist, coll_name, k, root, transpose=False)
        raw, used, best = engine.best_of(trials, seed, lb, gather)
        phases = [(_flow(raw, times), 1, 0.0)]
    else:  # reducescatter, reduce, allreduce: reverse a flood on the transposed topology
        base = "allgather" if coll_name in ("reducescatter", "allreduce") else "broadcast"
        holders, lb_ag = _flood_setup(topo, times, dist, base, k, root, transpose=False)
        _, lb_rs = _flood_setup(topo, times, dist, base, k, root, transpose=True)
        rev = _reverse_links(topo)
        ag: _Flow | None = None
        if rev is not None:  # symmetric: a flood on the transpose is this flood on reversed links
            raw, used, best = engine.best_of(trials, seed, lb_ag, gather)
            ag = _flow(raw, times)
            rs = _reverse(ag, rev)
        else:
            tengine = _Engine(topo.transpose(), times, dist.T)
            raw, used, best = tengine.best_of(
                trials, seed, lb_rs, lambda rng, pol: tengine.flood(holders, rng, pol)
            )
            rs = _reverse(_flow(raw, times), np.arange(topo.num_links, dtype=np.int32))
            if coll_name == "allreduce":
                raw, used2, _ = engine.best_of(trials, seed, lb_ag, gather)
                ag = _flow(raw, times)
                used += used2
        if coll_name == "allreduce":
            assert ag is not None
            phases = [(rs, 0, 0.0), (ag, 1, rs.makespan)]
            lb = lb_rs + lb_ag
        else:
            phases = [(rs, 0, 0.0)]
            lb = lb_rs
    schedule = _assemble(topo, phases)
    trace = _build_trace(topo, schedule, coll_name, n, k, total_chunks)
    elapsed = time.perf_counter() - began
    params = {
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


# ============================================================ greedy engine
_MAX_CLASSES = 16


class _EventQueue:
    """Link finish events ``(time, link, chunk)``; :meth:`pop_next` returns all events at the next time.

    Links with equal transfer times finish in the order they start, so with few
    distinct link times one FIFO per time class replaces a heap (O(1) per event);
    otherwise a binary heap (O(log T)).
    """

    def __init__(self, time_class: list[int], num_classes: int) -> None:
        self.cls = time_class
        self.fifos: list[deque[tuple[float, int, int]]] = [deque() for _ in range(num_classes)]
        self.heap: list[tuple[float, int, int]] = []
        self.use_heap = num_classes == 0

    def push(self, time: float, link: int, chunk: int) -> None:
        if self.use_heap:
            heapq.heappush(self.heap, (time, link, chunk))
        else:
            self.fifos[self.cls[link]].append((time, link, chunk))

    def pop_next(self) -> list[tuple[float, int, int]]:
        """Every event within ``_EPS`` of the earliest one, earliest first (empty when none is left)."""
        got: list[tuple[float, int, int]] = []
        if self.use_heap:
            heap = self.heap
            if heap:
                limit = heap[0][0] + _EPS
                while heap and heap[0][0] <= limit:
                    got.append(heapq.heappop(heap))
            return got
        fifos = [q for q in self.fifos if q]
        if not fifos:
            return got
        limit = min(q[0][0] for q in fifos) + _EPS
        for q in fifos:
            while q and q[0][0] <= limit:
                got.append(q.popleft())
        if len(fifos) > 1:
            got.sort()
        return got


_Raw = tuple[list[int], list[int], list[float], float]  # links, chunks, starts, makespan


class _Engine:
    """Greedy schedulers over one topology with fixed per-link chunk times."""

    def __init__(self, topo: Topology, times: np.ndarray, dist: np.ndarray) -> None:
        self.topo = topo
        self.dist = dist
        self.n = topo.num_npus
        self.src: list[int] = topo.src.tolist()
        self.dst: list[int] = topo.dst.tolist()
        self.times: list[float] = times.tolist()
        self.out: list[list[int]] = [[] for _ in range(self.n)]
        self.inl: list[list[int]] = [[] for _ in range(self.n)]
        for link, (s, d) in enumerate(zip(self.src, self.dst, strict=True)):
            self.out[s].append(link)
            self.inl[d].append(link)
        self.hetero_in = [len({self.times[x] for x in links}) > 1 for links in self.inl]
        self.any_hetero = len(set(self.times)) > 1
        distinct = sorted(set(self.times))
        self.num_classes = len(distinct) if len(distinct) <= _MAX_CLASSES else 0
        cls = {v: i for i, v in enumerate(distinct)}
        self.time_class = [cls[x] for x in self.times] if self.num_classes else []

    def best_of(self, trials: int, seed: int, bound: float, run: Any) -> tuple[_Raw, int, int]:
        """Run up to ``trials`` seeded trials alternating the two chunk policies; keep the fastest."""
        # oldest-first is the faster and, on uniform links, the better policy; random spreads
        # distinct chunks over parallel paths, which heterogeneous links need
        policies = ("random", "oldest") if self.any_hetero else ("oldest", "random")
        best: _Raw | None = None
        best_trial = 0
        used = 0
        for trial in range(trials):
            rng = random.Random(seed * 1_000_003 + trial)
            raw = run(rng, policies[trial % 2])
            used += 1
            if best is None or raw[3] < best[3] - _EPS:
                best, best_trial = raw, trial
            if best[3] <= bound * (1 + 1e-9) + _EPS:
                break
        assert best is not None
        return best, used, best_trial

    def flood(self, holders: list[list[int]], rng: random.Random, policy: str) -> _Raw:
        """Every NPU must end with every chunk; ``holders[u]`` are the chunks NPU u starts with.

        O(N · C · deg + T log E); see the module docstring.
        """
        n, src, dst, times = self.n, self.src, self.dst, self.times
        out, inl, hetero_in = self.out, self.inl, self.hetero_in
        num_links = len(src)
        num_chunks = 1 + max((c for h in holders for c in h), default=0)
        need = bytearray(b"\x01") * (n * num_chunks)
        remaining = [num_chunks] * n
        for u, chunks in enumerate(holders):
            for c in chunks:
                if need[u * num_chunks + c]:
                    need[u * num_chunks + c] = 0
                    remaining[u] -= 1
        todo = sum(remaining)
        cand = [list(holders[src[link]]) for link in range(num_links)]
        head = [0] * num_links
        busy = bytearray(num_links)
        until = [0.0] * num_links
        in_ready = bytearray(num_links)
        ready = [link for link in range(num_links) if cand[link]]
        for link in ready:
            in_ready[link] = 1
        out_base = [[(x, dst[x] * num_chunks) for x in links] for links in out]
        deferred: list[list[int]] = [[] for _ in range(n)]
        rec_link: list[int] = []
        rec_chunk: list[int] = []
        rec_start: list[float] = []
        # free links are served in a per-trial random order, fastest links first
        noise = [rng.random() for _ in range(num_links)]
        by_speed = sorted(range(num_links), key=lambda x: (times[x], noise[x]))
        prio = [0] * num_links
        for rank, link in enumerate(by_speed):
            prio[link] = rank
        key = prio.__getitem__
        events = _EventQueue(self.time_class, self.num_classes)
        rand = rng.random
        oldest = policy == "oldest"
        t = 0.0
        while True:
            ready.sort(key=key)
            for link in ready:
                in_ready[link] = 0
                d = dst[link]
                if hetero_in[d] and remaining[d]:
                    # would busy faster links into d deliver everything d still lacks first?
                    finish = t + times[link]
                    slots = 0
                    for other in inl[d]:
                        if busy[other] and other != link:
                            f = until[other]
                            tl = times[other]
                            if f + tl <= finish:
                                slots += int((finish - f) / tl)
                    if slots >= remaining[d]:
                        deferred[d].append(link)
                        continue
                lst = cand[link]
                h = head[link]
                size = len(lst)
                base = d * num_chunks
                while h < size:
                    if oldest:
                        c = lst[h]
                    else:
                        i = h + int(rand() * (size - h))
                        c = lst[i]
                        lst[i] = lst[h]
                    h += 1
                    if need[base + c]:
                        need[base + c] = 0
                        remaining[d] -= 1
                        rec_link.append(link)
                        rec_chunk.append(c)
                        rec_start.append(t)
                        f = t + times[link]
                        until[link] = f
                        busy[link] = 1
                        events.push(f, link, c)
                        break
                if h > 32 and 2 * h > size:
                    del lst[:h]
                    h = 0
                head[link] = h
            ready = []
            arrivals = events.pop_next()
            if not arrivals:
                break
            t = arrivals[-1][0]
            todo -= len(arrivals)
            for _, link, c in arrivals:
                busy[link] = 0
                if not in_ready[link]:
                    in_ready[link] = 1
                    ready.append(link)
                d = dst[link]
                if deferred[d]:
                    for other in deferred[d]:
                        if not in_ready[other] and not busy[other]:
                            in_ready[other] = 1
                            ready.append(other)
                    deferred[d] = []
                for nxt, nbase in out_base[d]:
                    if need[nbase + c]:
                        cand[nxt].append(c)
                        if not busy[nxt] and not in_ready[nxt]:
                            in_ready[nxt] = 1
                            ready.append(nxt)
        if todo:
            raise UnsatisfiableError(f"synth: {todo} chunk deliveries are impossible on {self.topo.name}")
        return rec_link, rec_chunk, rec_start, t

    def alltoall(self, k: int, rng: random.Random, policy: str) -> _Raw:
        """Chunk ``(r·N + d)·k + j`` goes from NPU r to NPU d over shortest paths, farthest first.

        O(T log T) for T hop transfers, plus O(E · N) for the admissible-link table.
        """
        n, src, dst, times = self.n, self.src, self.dst, self.times
        num_links = len(src)
        dist = self.dist
        # link s→x may carry a chunk bound for d iff it starts a shortest path to d
        tol = 1e-9 * max(1.0, float(np.max(dist)))
        sl, dl = self.topo.src, self.topo.dst
        t_arr = np.asarray(times)
        adm = [
            bytes(row)
            for row in (np.abs(dist[dl] + t_arr[:, None] - dist[sl]) <= tol).astype(np.uint8) * (dist[sl] > 0)
        ]
        far = dist.tolist()
        out = self.out
        queues: list[list[tuple[float, float, int]]] = [[] for _ in range(num_links)]
        where = []  # current NPU of each chunk
        rand = rng.random
        oldest = policy == "oldest"
        seq = 0.0
        ready_set = bytearray(num_links)
        ready: list[int] = []

        def offer(u: int, ch: int, d: int) -> None:
            nonlocal seq
            pri = -far[u][d]
            seq += 1.0
            tie = seq if oldest else rand()
            for link in out[u]:
                if adm[link][d]:
                    heapq.heappush(queues[link], (pri, tie, ch))
                    if not busy[link] and not ready_set[link]:
                        ready_set[link] = 1
                        ready.append(link)

        busy = bytearray(num_links)
        dest_of: list[int] = []
        for r in range(n):
            for d in range(n):
                for _ in range(k):
                    where.append(r)
                    dest_of.append(d)
        for r in range(n):
            for d in range(n):
                if d != r:
                    for j in range(k):
                        offer(r, (r * n + d) * k + j, d)
        rec_link: list[int] = []
        rec_chunk: list[int] = []
        rec_start: list[float] = []
        heap: list[tuple[float, int, int]] = []
        moving = bytearray(n * n * k)
        todo = n * (n - 1) * k
        t = 0.0
        while True:
            rng.shuffle(ready)
            if self.any_hetero:
                ready.sort(key=times.__getitem__)
            for link in ready:
                ready_set[link] = 0
                q = queues[link]
                u = src[link]
                while q:
                    _, _, ch = heapq.heappop(q)
                    if where[ch] == u and not moving[ch]:
                        moving[ch] = 1
                        rec_link.append(link)
                        rec_chunk.append(ch)
                        rec_start.append(t)
                        busy[link] = 1
                        heapq.heappush(heap, (t + times[link], link, ch))
                        break
            ready = []
            if not heap:
                break
            t = heap[0][0]
            limit = t + _EPS
            arrived: list[tuple[int, int]] = []
            while heap and heap[0][0] <= limit:
                t, link, ch = heapq.heappop(heap)
                busy[link] = 0
                x = dst[link]
                where[ch] = x
                moving[ch] = 0
                if queues[link] and not ready_set[link]:
                    ready_set[link] = 1
                    ready.append(link)
                if x == dest_of[ch]:
                    todo -= 1
                else:
                    arrived.append((x, ch))
            for x, ch in arrived:
                offer(x, ch, dest_of[ch])
        if todo:
            raise UnsatisfiableError(f"synth: {todo} all-to-all chunks cannot be routed on {self.topo.name}")
        return rec_link, rec_chunk, rec_start, t


# ============================================================ lower bounds
def _ingress_bound(num_npus: int, dst: np.ndarray, times: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per NPU d: least τ with Σ_{links l into d} ⌊τ / t_l⌋ ≥ need[d] (0 where need is 0).

    Binary search on τ for all NPUs at once, then snapped to the next link finish.
    O(E · 64).
    """
    need = np.asarray(need, dtype=np.float64)
    out = np.zeros(num_npus)
    if not len(dst):
        return np.where(need > 0, np.inf, 0.0)
    tmin = np.full(num_npus, np.inf)
    np.minimum.at(tmin, dst, times)
    deg = np.bincount(dst, minlength=num_npus)
    active = need > 0
    if np.any(active & (deg == 0)):
        return np.where(active & (deg == 0), np.inf, 0.0)
    lo = np.zeros(num_npus)
    hi = np.where(active, need * np.where(np.isfinite(tmin), tmin, 0.0), 0.0)  # one fastest link suffices
    for _ in range(80):
        mid = (lo + hi) / 2
        got = np.bincount(dst, weights=np.floor(mid[dst] / times + 1e-12), minlength=num_npus)
        enough = got >= need
        hi = np.where(enough, mid, hi)
        lo = np.where(enough, lo, mid)
    # the bound is a link finish time j·t_l; take the smallest one >= hi - tolerance
    snapped = np.full(num_npus, np.inf)
    cand = np.ceil(hi[dst] / times - 1e-9) * times
    np.minimum.at(snapped, dst, cand)
    out = np.where(active, np.minimum(snapped, hi), 0.0)
    return out


def _flood_setup(
    topo: Topology, times: np.ndarray, dist: np.ndarray, coll: str, k: int, root: int, *, transpose: bool
) -> tuple[list[list[int]], float]:
    """Initial holders of a flood (All-Gather or Broadcast) and its lower bound (ns)."""
    n = topo.num_npus
    if transpose:
        dist = dist.T
    ends = (topo.src, topo.dst) if transpose else (topo.dst, topo.src)
    if coll == "allgather":
        holders = [list(range(u * k, (u + 1) * k)) for u in range(n)]
        need = np.full(n, (n - 1) * k)
        lb = max(float(_ingress_bound(n, ends[0], times, need).max()), float(dist.max()))
    else:  # broadcast
        holders = [[] for _ in range(n)]
        holders[root] = list(range(k))
        need = np.full(n, k)
        need[root] = 0
        ingress = float(_ingress_bound(n, ends[0], times, need).max())
        root_need = np.zeros(n)
        root_need[root] = k
        egress = float(_ingress_bound(n, ends[1], times, root_need).max())
        lb = max(ingress, egress, float(dist[root].max()))
    return holders, lb


def _alltoall_bound(topo: Topology, times: np.ndarray, dist: np.ndarray, k: int) -> float:
    """Max of the ingress, egress, farthest-pair and total-link-time bounds of All-to-All (ns)."""
    n = topo.num_npus
    need = np.full(n, (n - 1) * k)
    ingress = float(_ingress_bound(n, topo.dst, times, need).max())
    egress = float(_ingress_bound(n, topo.src, times, need).max())
    work = k * float(dist.sum()) / max(1, topo.num_links)
    return max(ingress, egress, float(dist.max()), work)


# ======================================================= schedule assembly
def _reverse_links(topo: Topology) -> np.ndarray | None:
    """``rev[l]`` = a link ``dst[l] → src[l]`` with equal latency and bandwidth (one-to-one), or None."""
    if not topo.is_symmetric():
        return None
    a = np.lexsort((topo.bandwidth_gb_per_s, topo.latency_ns, topo.dst, topo.src))
    b = np.lexsort((topo.bandwidth_gb_per_s, topo.latency_ns, topo.src, topo.dst))
    rev = np.empty(topo.num_links, dtype=np.int32)
    rev[a] = b
    return rev


class _Flow(NamedTuple):
    """One phase's transfers as arrays (times relative to the phase start)."""

    link: np.ndarray  # int32
    chunk: np.ndarray  # int64
    start: np.ndarray  # float64
    end: np.ndarray  # float64
    makespan: float


def _flow(raw: _Raw, times: np.ndarray) -> _Flow:
    links, chunks, starts, makespan = raw
    link = np.asarray(links, dtype=np.int32)
    start = np.asarray(starts, dtype=np.float64)
    # the same float sum the engine used, so a forward starts exactly when its input ended
    return _Flow(link, np.asarray(chunks, dtype=np.int64), start, start + times[link], float(makespan))


def _reverse(flow: _Flow, link_map: np.ndarray) -> _Flow:
    """Time reversal: a transfer on link l over [s, e] becomes one on ``link_map[l]`` over [T-e, T-s]."""
    return _Flow(
        link_map[flow.link], flow.chunk, flow.makespan - flow.end, flow.makespan - flow.start, flow.makespan
    )


def _assemble(topo: Topology, phases: Sequence[tuple[_Flow, int, float]]) -> Schedule:
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


# ============================================================ trace building
_SEND, _RECV, _REDUCE, _COPY = 0, 1, 2, 3
_TYPE_NAMES = ["COMM_SEND_NODE", "COMM_RECV_NODE", "COMP_NODE", "COMP_NODE"]
_OP_NAMES = ["send", "recv", "reduce", "copy"]
_ORDER = np.array([3, 0, 1, 2], dtype=np.int8)  # at equal times: recv, reduce, copy, send
_BUFS = ("i", "o", "s")
_I, _O, _S = 0, 1, 2


def _join(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (i, j) with ``a[i] == b[j]`` (many-to-many). O((|a| + |b|) log |b| + pairs)."""
    order = np.argsort(b, kind="stable")
    sb = b[order]
    lo = np.searchsorted(sb, a, side="left")
    hi = np.searchsorted(sb, a, side="right")
    counts = hi - lo
    total = int(counts.sum())
    ia = np.repeat(np.arange(len(a)), counts)
    first = np.cumsum(counts) - counts
    ib = order[np.arange(total) - np.repeat(first, counts) + np.repeat(lo, counts)]
    return ia, ib


def _group_rank(keys_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted keys: (is-first-of-group mask, index within the group)."""
    m = len(keys_sorted)
    new = np.ones(m, dtype=bool)
    new[1:] = keys_sorted[1:] != keys_sorted[:-1]
    start = np.maximum.accumulate(np.where(new, np.arange(m), 0))
    return new, np.arange(m) - start


def _build_trace(topo: Topology, sched: Schedule, coll: str, n: int, k: int, total_chunks: int) -> Trace:
    """The algorithm trace of a schedule (docs/algorithms.md). O(T log T) for T transfers.

    Per transfer: a send at the source and a recv at the destination, plus a
    ``reduce`` COMP in the recv's step for reduction phases (an MSCCL ``rrc``).
    Threadblocks: one per (NPU, link, direction), steps in schedule order, each
    chained to the previous one; All-to-All adds one ``copy`` per own chunk.
    """
    t = len(sched)
    sb, so, db, do = _buffers(sched, coll, n, k)
    r_idx = np.flatnonzero(sched.phase == 0)
    parts_transfer = [np.arange(t), np.arange(t), r_idx]
    parts_kind = [np.full(t, _SEND), np.full(t, _RECV), np.full(len(r_idx), _REDUCE)]
    parts_rank = [sched.src, sched.dst, sched.dst[r_idx]]
    parts_time = [sched.start_ns, sched.end_ns, sched.end_ns[r_idx]]
    parts_link = [sched.link, sched.link, sched.link[r_idx]]
    parts_side = [np.zeros(t), np.ones(t), np.ones(len(r_idx))]
    extra_attr: list[np.ndarray] = []
    if coll == "alltoall":  # an NPU's block for itself is a local copy i[r·k + j] → o[r·k + j]
        rr = np.repeat(np.arange(n), k)
        jj = np.tile(np.arange(k), n)
        parts_transfer.append(np.full(n * k, -1))
        parts_kind.append(np.full(n * k, _COPY))
        parts_rank.append(rr)
        parts_time.append(np.zeros(n * k))
        parts_link.append(np.full(n * k, topo.num_links))
        parts_side.append(np.full(n * k, 2))
        extra_attr = [rr * n * k + rr * k + jj, rr * k + jj]
    op_transfer = np.concatenate(parts_transfer).astype(np.int64)
    op_kind = np.concatenate(parts_kind).astype(np.int8)
    op_rank = np.concatenate(parts_rank).astype(np.int32)
    op_time = np.concatenate(parts_time)
    op_link = np.concatenate(parts_link).astype(np.int64)
    op_side = np.concatenate(parts_side).astype(np.int64)
    minor = (_ORDER[op_kind].astype(np.int64) << 40) | (op_side << 36) | op_link
    order = np.lexsort((minor, op_time, op_rank))
    op_transfer, op_kind, op_rank, op_time, op_link, op_side = (
        x[order] for x in (op_transfer, op_kind, op_rank, op_time, op_link, op_side)
    )
    m = len(order)
    rank_start = np.searchsorted(op_rank, np.arange(n + 1))
    op_id = np.arange(m, dtype=np.int64) - rank_start[op_rank]
    tr = np.maximum(op_transfer, 0)
    is_copy = op_kind == _COPY
    # ---- per-op chunk, buffers and offsets
    chunk = sched.chunk[tr] if t else np.zeros(m, dtype=np.int64)
    own_sb, own_so, own_db, own_do = sb[tr], so[tr], db[tr], do[tr]
    if is_copy.any():
        c_src = np.flatnonzero(is_copy)
        copy_rank = op_rank[c_src].astype(np.int64)
        pos = np.searchsorted(np.flatnonzero(is_copy), c_src)  # copies keep (rank, j) order
        chunk = chunk.copy()
        chunk[c_src] = extra_attr[0][pos]
        own_sb, own_so, own_db, own_do = (x.copy() for x in (own_sb, own_so, own_db, own_do))
        own_sb[c_src], own_db[c_src] = _I, _O
        own_so[c_src] = own_do[c_src] = extra_attr[1][pos]
        del copy_rank
    local_offset = np.where(op_kind == _SEND, own_so, own_do)
    # ---- threadblocks: one per (rank, link side); steps in time order, recv + reduce share a step
    tb_key = (op_rank.astype(np.int64) * 3 + op_side) * (topo.num_links + 1) + op_link
    tb_order = np.argsort(tb_key, kind="stable")
    new_tb, _ = _group_rank(tb_key[tb_order])
    tb_global = np.cumsum(new_tb) - 1
    rank_of_tb = op_rank[tb_order][new_tb]
    tb_local = tb_global - np.searchsorted(rank_of_tb, np.arange(n + 1))[op_rank[tb_order]]
    opens = (op_kind[tb_order] != _REDUCE).astype(np.int64)
    csum = np.cumsum(opens)
    tb_base = np.maximum.accumulate(np.where(new_tb, csum - opens, 0))
    tb_id = np.empty(m, dtype=np.int64)
    step = np.empty(m, dtype=np.int64)
    tb_id[tb_order] = tb_local
    step[tb_order] = csum - tb_base - 1
    chain_src = tb_order[:-1][~new_tb[1:]]
    chain_dst = tb_order[1:][~new_tb[1:]]
    # ---- data dependencies (all on one rank)
    phase = np.where(is_copy, 3, sched.phase[tr] if t else 0).astype(np.int64)
    big = np.int64(int(chunk.max()) + 1 if m else 1)
    key = (op_rank.astype(np.int64) * 4 + phase) * big + chunk
    sends = np.flatnonzero(op_kind == _SEND)
    recvs = np.flatnonzero(op_kind == _RECV)
    reduces = np.flatnonzero(op_kind == _REDUCE)
    dep_src = [chain_src]
    dep_dst = [chain_dst]
    fwd = sends[phase[sends] != 0]
    recv_fwd = recvs[phase[recvs] != 0]
    ia, ib = _join(key[fwd], key[recv_fwd])  # a forwarded chunk waits for its arrival
    dep_src.append(recv_fwd[ib])
    dep_dst.append(fwd[ia])
    red_sends = sends[phase[sends] == 0]
    ja, jb = _join(key[red_sends], key[reduces])  # a partial sum leaves once all its inputs are in
    dep_src.append(reduces[jb])
    dep_dst.append(red_sends[ja])
    if coll == "allreduce":  # the owner broadcasts a chunk once its reduction is complete
        has_recv = np.zeros(len(fwd), dtype=bool)
        has_recv[ia] = True
        first = fwd[~has_recv]
        ka, kb = _join(op_rank[first].astype(np.int64) * 4 * big + chunk[first], key[reduces])
        dep_src.append(reduces[kb])
        dep_dst.append(first[ka])
    d_src = np.concatenate(dep_src)
    d_dst = np.concatenate(dep_dst)
    by_dst = np.argsort(d_dst, kind="stable")
    pos = np.empty(len(d_dst), dtype=np.int64)
    pos[by_dst] = _group_rank(d_dst[by_dst])[1] if len(d_dst) else pos
    deps = deps_table(op_rank[d_dst], op_id[d_src].astype(np.uint64), op_id[d_dst].astype(np.uint64), pos=pos)
    # ---- columns
    attrs = _attr_column(own_sb, own_so, own_db, own_do)
    peer = np.zeros(m, np.int32)
    if t:
        peer = np.where(op_kind == _SEND, sched.dst[tr], sched.src[tr]).astype(np.int32)
    tags = np.append(_link_tags(topo), 0)[np.minimum(op_link, topo.num_links)]
    kind32 = pa.array(op_kind.astype(np.int32))
    is_comm = (op_kind == _SEND) | (op_kind == _RECV)
    ops = ops_table(
        {
            "rank": op_rank,
            "id": op_id.astype(np.uint64),
            "name": pc.take(pa.array(_OP_NAMES), kind32),
            "type": pc.take(pa.array(_TYPE_NAMES), kind32),
            "comm_src": pa.array(peer, mask=op_kind != _RECV),
            "comm_dst": pa.array(peer, mask=op_kind != _SEND),
            "comm_tag": pa.array(tags.astype(np.int32), mask=~is_comm),
            "msg_chunk_cnt": np.ones(m, dtype=np.int64),
            "msg_chunk_idx": chunk,
            "chunk_offset": local_offset,
            "total_chunk_cnt": np.full(m, total_chunks, dtype=np.int64),
            "tb_id": tb_id,
            "local_time_step": step,
            "attrs": attrs,
        },
        num_rows=m,
    )
    shape = topo.name.split(",")[0]
    return Trace(ops, deps, name=f"synth-{coll}-{shape}-k{k}", kind="algorithm", source="synth")


def _attr_column(sb: np.ndarray, so: np.ndarray, db: np.ndarray, do: np.ndarray) -> pa.Array:
    """``attrs`` with srcbuf/srcoff/dstbuf/dstoff per op, one encoded blob per distinct value."""
    key = (sb.astype(np.int64) << 60) | (db.astype(np.int64) << 58) | (so.astype(np.int64) << 29) | do
    uniq, inverse = np.unique(key, return_inverse=True)
    blobs = [
        encode_attrs(
            [
                ("srcbuf", "string_val", _BUFS[(u >> 60) & 3]),
                ("srcoff", "int64_val", (u >> 29) & 0x1FFFFFFF),
                ("dstbuf", "string_val", _BUFS[(u >> 58) & 3]),
                ("dstoff", "int64_val", u & 0x1FFFFFFF),
            ]
        )
        for u in uniq.tolist()
    ]
    return pc.take(pa.array(blobs, pa.binary()), pa.array(inverse.reshape(-1).astype(np.int32)))


def _link_tags(topo: Topology) -> np.ndarray:
    """``comm_tag`` per link: its index among parallel links of the same (src, dst), usually 0."""
    key = topo.src.astype(np.int64) * topo.num_npus + topo.dst
    order = np.argsort(key, kind="stable")
    tags = np.empty(topo.num_links, dtype=np.int64)
    if topo.num_links:
        tags[order] = _group_rank(key[order])[1]
    return tags


_Arrays4 = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _buffers(sched: Schedule, coll: str, n: int, k: int) -> _Arrays4:
    """Per transfer: (sender buffer, sender offset, receiver buffer, receiver offset), offsets in chunks.

    All-Gather works in place in ``o``; the reductions, All-Reduce and Broadcast in
    ``i``; All-to-All reads ``i[d·k + j]`` at the origin, writes ``o[r·k + j]`` at the
    destination and parks chunks in ``s`` slots (one per chunk per NPU) on the way.
    """
    t = len(sched)
    c = sched.chunk
    if coll != "alltoall":
        buf = np.full(t, _O if coll == "allgather" else _I, dtype=np.int64)
        return buf, c, buf, c
    r = c // (n * k)
    d = (c // k) % n
    j = c % k
    from_origin = sched.src == r
    to_final = sched.dst == d
    # scratch slot at the NPU where a hop lands short of its destination, numbered in arrival order
    inter = np.flatnonzero(~to_final)
    slot_key = sched.dst[inter].astype(np.int64) * (n * n * k) + c[inter]
    o = np.lexsort((sched.end_ns[inter], sched.dst[inter]))
    slot = np.empty(len(inter), dtype=np.int64)
    slot[o] = _group_rank(sched.dst[inter][o])[1] if len(inter) else slot
    lookup = np.argsort(slot_key)
    send_slot = np.zeros(t, dtype=np.int64)
    fwd = np.flatnonzero(~from_origin)
    if len(fwd):
        want = sched.src[fwd].astype(np.int64) * (n * n * k) + c[fwd]
        send_slot[fwd] = slot[lookup[np.searchsorted(slot_key[lookup], want)]]
    recv_slot = np.zeros(t, dtype=np.int64)
    recv_slot[inter] = slot
    sbuf = np.where(from_origin, _I, _S)
    soff = np.where(from_origin, d * k + j, send_slot)
    dbuf = np.where(to_final, _O, _S)
    doff = np.where(to_final, r * k + j, recv_slot)
    return sbuf, soff, dbuf, doff
