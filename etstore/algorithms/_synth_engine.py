"""The greedy event engine of synthesis: link–chunk matching over link finish events.

:class:`Engine` holds one topology's links with fixed per-chunk times and runs the
two schedulers of :mod:`etstore.algorithms.synth`: :meth:`Engine.flood` (every NPU
must end with every chunk: All-Gather, Broadcast, and in reverse the reductions)
and :meth:`Engine.alltoall` (shortest-path routing). Each returns the raw transfer
columns (:class:`Raw`: compact ``array.array`` buffers, no object per transfer);
:meth:`Engine.best_of` keeps the fastest of several seeded trials.
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from etstore.errors import UnsatisfiableError
from etstore.topology import Topology

__all__ = ["EPS", "Engine", "Raw"]

EPS = 1e-6  # ns: events closer than this are simultaneous
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
        """Every event within ``EPS`` of the earliest one, earliest first (empty when none is left)."""
        got: list[tuple[float, int, int]] = []
        if self.use_heap:
            heap = self.heap
            if heap:
                limit = heap[0][0] + EPS
                while heap and heap[0][0] <= limit:
                    got.append(heapq.heappop(heap))
            return got
        fifos = [q for q in self.fifos if q]
        if not fifos:
            return got
        limit = min(q[0][0] for q in fifos) + EPS
        for q in fifos:
            while q and q[0][0] <= limit:
                got.append(q.popleft())
        if len(fifos) > 1:
            got.sort()
        return got


class Raw(NamedTuple):
    """One trial's transfers as compact columns: 12 bytes per transfer."""

    link: array[int]  # int32, link id
    chunk: array[int]  # int32 chunk id (int64 from 2^31 chunks on)
    event: array[int]  # int32, index into ``event_ns`` of the transfer's start
    event_ns: list[float]  # the distinct event times, ascending
    makespan: float  # ns


def _chunk_buffer(num_chunks: int) -> array[int]:
    """A buffer for chunk ids: 4 bytes each, 8 when ids reach 2^31."""
    return array("i" if num_chunks < 2**31 else "q")


class Engine:
    """Greedy schedulers over one topology with fixed per-link chunk times."""

    def __init__(self, topo: Topology, times: np.ndarray, dist: np.ndarray | None = None) -> None:
        self.topo = topo
        self.dist = dist  # every pair's distance in ns: only All-to-All routing needs it
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

    def best_of(
        self, trials: int, seed: int, bound: float, run: Callable[[random.Random, str], Raw]
    ) -> tuple[Raw, int, int]:
        """Run up to ``trials`` seeded trials alternating the two chunk policies; keep the fastest."""
        # oldest-first is the faster and, on uniform links, the better policy; random spreads
        # distinct chunks over parallel paths, which heterogeneous links need
        policies = ("random", "oldest") if self.any_hetero else ("oldest", "random")
        best: Raw | None = None
        best_trial = 0
        used = 0
        for trial in range(trials):
            rng = random.Random(seed * 1_000_003 + trial)
            raw = run(rng, policies[trial % 2])
            used += 1
            if best is None or raw.makespan < best.makespan - EPS:
                best, best_trial = raw, trial
            if best.makespan <= bound * (1 + 1e-9) + EPS:
                break
        assert best is not None
        return best, used, best_trial

    def flood(self, holders: list[list[int]], rng: random.Random, policy: str) -> Raw:
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
        rec_link: array[int] = array("i")
        rec_chunk = _chunk_buffer(num_chunks)
        rec_event: array[int] = array("i")
        event_ns = [0.0]
        ev = 0
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
                        rec_event.append(ev)
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
            event_ns.append(t)
            ev += 1
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
        return Raw(rec_link, rec_chunk, rec_event, event_ns, t)

    def alltoall(self, k: int, rng: random.Random, policy: str) -> Raw:
        """Chunk ``(r·N + d)·k + j`` goes from NPU r to NPU d over shortest paths, farthest first.

        O(T log T) for T hop transfers, plus O(E · N) for the admissible-link table.
        """
        n, src, dst, times = self.n, self.src, self.dst, self.times
        num_links = len(src)
        dist = self.dist
        assert dist is not None, "alltoall needs the distance table"
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
        rec_link: array[int] = array("i")
        rec_chunk = _chunk_buffer(n * n * k)
        rec_event: array[int] = array("i")
        event_ns = [0.0]
        ev = 0
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
                        rec_event.append(ev)
                        busy[link] = 1
                        heapq.heappush(heap, (t + times[link], link, ch))
                        break
            ready = []
            if not heap:
                break
            t = heap[0][0]
            limit = t + EPS
            ev += 1
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
            event_ns.append(t)
            for x, ch in arrived:
                offer(x, ch, dest_of[ch])
        if todo:
            raise UnsatisfiableError(f"synth: {todo} all-to-all chunks cannot be routed on {self.topo.name}")
        return Raw(rec_link, rec_chunk, rec_event, event_ns, t)
