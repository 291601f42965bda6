"""The heaviest path of a trace too large to hold, computed batch of ranks by batch of ranks.

Why: the in-memory pass (:func:`etstore.analysis.critical_path`) holds the whole trace and
every edge at once (≈ 440 bytes per op with the trace). Here the ops are read in *units* of
whole ranks; dependencies never leave a rank, so only the messages between units link them.
A *group* of units is solved alone (:func:`~etstore.dag.generations`,
:func:`~etstore.dag.heaviest_paths`), each message from another group an input node whose
value is its send's finish once that send's group has placed it; a receive whose send is not
placed yet waits, with everything behind it, for a later sweep. That is Kahn's algorithm run
sweep by sweep, so the ops no sweep can place are exactly those on or behind a cycle, as in
the in-memory pass.

Each unit starts as a group of its own. Where messages keep going back to earlier groups
(collectives expanded into sends and receives between ranks of different units), the groups
still waiting after a sweep are merged, up to ``max_group_ops``, so that such a trace takes
a few sweeps, not one per hop; when many messages go back (:data:`_BACK_PER_UNIT` a unit),
units are grouped up to that size before the first sweep.

What stays across sweeps: the messages between units and their send's finish (≈ 40 bytes
each) and, for each unit done, its ops' predecessors (4 bytes an op, in a temporary file when
there are several units) and its ranks' own paths. The result is the in-memory pass's, op for
op: finishes are the same sums of the same floats, and each op's predecessor is the first
in-edge (its dependencies in table order, then its message) that attains the maximum.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import IO, NamedTuple

import numpy as np

from etstore.dag import break_cycles, generations, heaviest_paths
from etstore.errors import CycleError
from etstore.progress import ProgressFn

__all__ = ["BatchedPath", "PathBatch", "batched_heaviest_path"]

_BACK_PER_UNIT = 64
"""Messages to an earlier unit, per unit, past which units are grouped before the first sweep: a
pipeline's wrap (a few) is one more solve of the first unit; expanded collectives (thousands) go
back on every step."""


class PathBatch(NamedTuple):
    """One unit of whole ranks: rows ``lo .. lo + len(weight) - 1`` of the trace, as local rows."""

    weight: np.ndarray
    """Each op's duration (float64)."""
    dep_src: np.ndarray
    """Local row of each dependency's source (int64), the unit's dependencies in table order."""
    dep_dst: np.ndarray
    """Local row of each dependency's destination."""
    msg_send: np.ndarray
    """Local row of the send of each message with both ends in the unit, by ascending send."""
    msg_recv: np.ndarray
    """Local row of its receive."""
    ranks: np.ndarray
    """The unit's ranks, ascending."""
    rank_starts: np.ndarray
    """Local first row of each rank, then the unit's op count."""


class BatchedPath(NamedTuple):
    """What :func:`batched_heaviest_path` found."""

    length_micros: float
    rows: np.ndarray
    """Global rows of the heaviest path, first op first (int64)."""
    ranks: np.ndarray
    """Every rank, ascending (int32)."""
    rank_length_micros: np.ndarray
    """The heaviest path within each rank over its dependencies alone (float64)."""
    rank_ops: np.ndarray
    """Its ops (int64)."""
    dropped_edges: int
    sweeps: int
    """Sweeps over the groups."""
    solves: int
    """Group solves in all (each reads its units)."""
    largest_group_ops: int
    """Ops of the largest group solved at once."""


class _Links:
    """Each op's predecessor on its heaviest path (global row, -1 for none), written unit by unit:
    in memory for one unit, in a temporary file for several (4 bytes an op below 2^31 ops)."""

    def __init__(self, n: int, several: bool, spill_dir: str | None) -> None:
        self.dtype = np.int32 if n < np.iinfo(np.int32).max else np.int64
        self.n = n
        self.memory: np.ndarray | None = None if several else np.full(n, -1, dtype=self.dtype)
        self.file: IO[bytes] | None = None
        if several:
            self.file = tempfile.TemporaryFile(prefix="etstore-path-", dir=spill_dir)  # noqa: SIM115 (close())
            self.file.truncate(n * np.dtype(self.dtype).itemsize)

    def put(self, lo: int, pred: np.ndarray) -> None:
        """Predecessors of rows ``lo ..``."""
        block = pred.astype(self.dtype)
        if self.memory is not None:
            self.memory[lo : lo + len(block)] = block
            return
        assert self.file is not None
        self.file.seek(lo * block.itemsize)
        block.tofile(self.file)  # through the page cache: not this process's resident memory

    def chain(self, last: int) -> np.ndarray:
        """The rows of the chain of predecessors that ends at ``last``, first row first."""
        mapped = None
        if self.memory is not None:
            array = self.memory
        else:
            assert self.file is not None
            self.file.flush()
            mapped = array = np.memmap(self.file, dtype=self.dtype, mode="r", shape=(self.n,))
        links = array.data  # a memoryview: Python ints one at a time; of a file, the pages passed
        path = [last]
        while links[path[-1]] >= 0:
            path.append(links[path[-1]])
        links.release()
        del mapped
        return np.asarray(path[::-1], dtype=np.int64)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _Cross:
    """The messages between units: global rows, units, and what their sends finished at."""

    def __init__(self, starts: np.ndarray, send: np.ndarray, recv: np.ndarray) -> None:
        self.send = np.asarray(send, dtype=np.int64)
        self.recv = np.asarray(recv, dtype=np.int64)
        self.send_unit = np.searchsorted(starts, self.send, side="right") - 1
        self.recv_unit = np.searchsorted(starts, self.recv, side="right") - 1
        self.keep = np.ones(len(self.send), dtype=bool)
        self.value = np.zeros(len(self.send))
        self.final = np.zeros(len(self.send), dtype=bool)
        self.group = np.zeros(len(starts), dtype=np.int64)  # each unit's group

    def regroup(self, groups: list[list[int]]) -> None:
        for g, units in enumerate(groups):
            self.group[units] = g

    def into(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Kept messages into group ``g``: from another group, and from inside it (by ascending send)."""
        to_g = self.keep & (self.group[self.recv_unit] == g)
        inside = to_g & (self.group[self.send_unit] == g)
        return np.flatnonzero(to_g & ~inside), np.flatnonzero(inside)

    def out_of(self, g: int) -> np.ndarray:
        """Kept messages from group ``g`` to another group."""
        return np.flatnonzero(
            self.keep & (self.group[self.send_unit] == g) & (self.group[self.recv_unit] != g)
        )


class _Group(NamedTuple):
    """A group's units read and laid end to end: local rows, unit by unit."""

    units: list[int]
    data: list[PathBatch]
    offsets: np.ndarray  # local row of each unit's first op, then the group's op count
    weight: np.ndarray
    dep_src: np.ndarray
    dep_dst: np.ndarray


class _Solved(NamedTuple):
    """One solve of a group."""

    gen: np.ndarray
    finish: np.ndarray
    pred: np.ndarray
    incoming: np.ndarray  # the cross messages whose input nodes follow the ops
    placed: int


class _Sweeps:
    """Kahn's algorithm over the groups, one sweep at a time (see the module's note)."""

    def __init__(
        self,
        bounds: Sequence[tuple[int, int]],
        load: Callable[[int], PathBatch],
        cross: _Cross,
        max_group_ops: int,
        progress: ProgressFn | None,
    ) -> None:
        self.bounds, self.load, self.cross, self.progress = bounds, load, cross, progress
        self.sizes = np.asarray([hi - lo for lo, hi in bounds], dtype=np.int64)
        self.n = int(self.sizes.sum())
        self.max_group_ops = max_group_ops
        self.dep_drop: dict[int, np.ndarray] = {}
        self.msg_drop: dict[int, np.ndarray] = {}
        self.sweeps = self.solves = self.largest = 0
        self.groups: list[list[int]] = [[u] for u in range(len(bounds))]
        back = int(np.count_nonzero(cross.send_unit > cross.recv_unit))
        if back > _BACK_PER_UNIT * len(bounds):  # messages go back and forth: units together from the start
            self.groups = self._merged(self.groups)
        cross.regroup(self.groups)

    def _merged(self, groups: list[list[int]]) -> list[list[int]]:
        """``groups`` merged in order, each merge at most ``max_group_ops``."""
        out: list[list[int]] = []
        for g in groups:
            if out and int(self.sizes[out[-1]].sum() + self.sizes[g].sum()) <= self.max_group_ops:
                out[-1] = sorted(out[-1] + g)
            else:
                out.append(list(g))
        return out

    def read(self, g: int) -> _Group:
        """Group ``g``'s units, their dependencies and messages inside each unit as local rows."""
        units = self.groups[g]
        data = [self.load(u) for u in units]
        offsets = np.concatenate([[0], np.cumsum([len(d.weight) for d in data])]).astype(np.int64)
        srcs, dsts = [], []
        for u, d, off in zip(units, data, offsets.tolist(), strict=False):
            for s, t, drop in (
                (d.dep_src, d.dep_dst, self.dep_drop),
                (d.msg_send, d.msg_recv, self.msg_drop),
            ):
                s, t = _kept(s, t, drop.get(u))
                srcs.append(s + off)
                dsts.append(t + off)
        # within each unit, its dependencies come before its messages: the order ties are broken in
        # (an op's in-edges are its dependencies, in table order, then at most one message)
        weight = np.concatenate([d.weight for d in data]) if data else np.zeros(0)
        return _Group(units, data, offsets, weight, np.concatenate(srcs), np.concatenate(dsts))

    def local(self, grp: _Group, rows: np.ndarray) -> np.ndarray:
        """Local rows of global ``rows`` of the group's units."""
        unit = np.searchsorted(np.asarray([self.bounds[u][0] for u in grp.units]), rows, side="right") - 1
        lo = np.asarray([self.bounds[u][0] for u in grp.units], dtype=np.int64)
        return grp.offsets[unit] + rows - lo[unit]

    def solve(self, g: int, grp: _Group) -> _Solved:
        """Group ``g`` with the messages into it whose sends are placed as inputs; the rest wait."""
        nb = len(grp.weight)
        inc, inside = self.cross.into(g)
        known = self.cross.final[inc]
        virt = np.arange(nb, nb + len(inc), dtype=np.int64)
        # an input node per message from another group: a known one finishes at its send's finish
        # (a node without in-edges finishes at its weight); one still unknown sits on a loop, so it
        # and everything behind it stay unplaced this time
        src = np.concatenate([grp.dep_src, self.local(grp, self.cross.send[inside]), virt, virt[~known]])
        dst = np.concatenate(
            [
                grp.dep_dst,
                self.local(grp, self.cross.recv[inside]),
                self.local(grp, self.cross.recv[inc]),
                virt[~known],
            ]
        )
        weight = np.concatenate([grp.weight, np.where(known, self.cross.value[inc], 0.0)])
        gen = generations(nb + len(inc), src, dst)
        finish, pred = heaviest_paths(gen, src, dst, weight)
        self.solves += 1
        self.largest = max(self.largest, nb)
        return _Solved(gen, finish, pred, inc, int(np.count_nonzero(gen[:nb] >= 0)))

    def publish(self, g: int, grp: _Group, solved: _Solved) -> None:
        """The finishes of the sends of ``g`` placed this time, for the groups they go to."""
        out = self.cross.out_of(g)
        local = self.local(grp, self.cross.send[out])
        new = (solved.gen[local] >= 0) & ~self.cross.final[out]
        self.cross.value[out[new]] = solved.finish[local[new]]
        self.cross.final[out[new]] = True

    def run(self, done: Callable[[_Group, _Solved], None], phase: str) -> list[int]:
        """Sweep until every group is done (``done`` is called once for each); the groups left
        undone when a sweep solves none (their unplaced ops are on or behind a cycle)."""
        finished = [False] * len(self.groups)
        seen = [-1] * len(self.groups)  # known inputs at the group's last solve
        placed = np.zeros(len(self.bounds), dtype=np.int64)
        if self.progress is not None:
            self.progress(phase, 0, self.n)
        while not all(finished):
            self.sweeps += 1
            solved_any = False
            for g in range(len(self.groups)):
                if finished[g]:
                    continue
                known = int(np.count_nonzero(self.cross.final[self.cross.into(g)[0]]))
                if known == seen[g]:
                    continue  # nothing new flows in: it would place what it placed before
                seen[g] = known
                grp = self.read(g)
                solved = self.solve(g, grp)
                solved_any = True
                self.publish(g, grp, solved)
                placed[grp.units] = (
                    np.add.reduceat(solved.gen[: len(grp.weight)] >= 0, grp.offsets[:-1])
                    if len(grp.weight)
                    else 0
                )
                if solved.placed == len(grp.weight):
                    finished[g] = True
                    done(grp, solved)
                del grp, solved
                if self.progress is not None:
                    self.progress(phase, int(placed.sum()), self.n)
            if not solved_any:
                return [g for g in range(len(self.groups)) if not finished[g]]
            waiting = [self.groups[g] for g in range(len(self.groups)) if not finished[g]]
            if len(waiting) > 1:  # they wait on each other: solve them together where they fit
                merged = self._merged(waiting)
                if len(merged) < len(waiting):
                    kept = [self.groups[g] for g in range(len(self.groups)) if finished[g]]
                    self.groups = kept + merged
                    finished = [True] * len(kept) + [False] * len(merged)
                    seen = [-1] * len(self.groups)
                    self.cross.regroup(self.groups)
        return []


def _kept(src: np.ndarray, dst: np.ndarray, drop: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The edges not at the positions ``drop``."""
    if drop is None or not len(drop):
        return src, dst
    keep = np.ones(len(src), dtype=bool)
    keep[drop] = False
    return src[keep], dst[keep]


def batched_heaviest_path(
    bounds: Sequence[tuple[int, int]],
    load: Callable[[int], PathBatch],
    cross_send: np.ndarray,
    cross_recv: np.ndarray,
    *,
    max_group_ops: int | None = None,
    name: str = "trace",
    on_cycle: str = "break",
    where: Callable[[np.ndarray], str] | None = None,
    progress: ProgressFn | None = None,
    spill_dir: str | None = None,
) -> BatchedPath:
    """The duration-weighted heaviest path across ranks, and each rank's own, unit by unit.

    Parameters
    ----------
    bounds
        ``(lo, hi)`` global rows of each unit of whole ranks, ascending and contiguous from 0.
    load
        Reads unit ``u`` (called again for each solve: nothing of a unit is kept).
    cross_send, cross_recv
        Global rows of the messages whose send and receive are in different units, by
        ascending send.
    max_group_ops
        Most ops solved at once when units are grouped (default: the largest unit, so units
        are never grouped).
    name
        The trace's name, for errors.
    on_cycle
        ``"break"``: drop the backward edges inside each cycle, as
        :func:`~etstore.dag.break_cycles` drops them over the whole graph (the ops on or
        behind a cycle and their edges are then held at once); ``"raise"``: refuse.
    where
        Names rows (``rank R id I, ...``) for the cycle error.
    progress
        ``progress("path", ops placed, ops)`` after each solve (``"path without cycles"`` on
        the second round after breaking cycles).
    spill_dir
        Directory of the temporary predecessor file (default: the system's).

    Raises
    ------
    CycleError
        ``on_cycle="raise"`` and the dependencies and messages form a cycle.

    Notes
    -----
    Each solve is O(V_g + E_g log E_g) for its group. A trace whose messages all go to the
    same or a later unit takes one sweep (one solve per unit); a later sweep solves only the
    groups a message into which became known since, after merging the groups still waiting.
    Memory: one group's solve, the messages between units, each rank's result.
    """
    starts = np.asarray([lo for lo, _ in bounds], dtype=np.int64)
    n = bounds[-1][1] if bounds else 0
    largest_unit = max((hi - lo for lo, hi in bounds), default=0)
    cross = _Cross(starts, cross_send, cross_recv)
    sweeps = _Sweeps(bounds, load, cross, max(max_group_ops or 0, largest_unit), progress)
    links = _Links(n, len(bounds) > 1, spill_dir)
    out = _Outcome(len(bounds))
    try:
        left = sweeps.run(lambda grp, solved: out.take(sweeps, grp, solved, links), "path")
        dropped = 0
        if left:
            stuck = _stuck(sweeps, left)
            if on_cycle == "raise":
                first = np.sort(np.concatenate([rows for rows, _ in stuck]))[:5]
                named = where(first) if where is not None else ", ".join(map(str, first.tolist()))
                raise CycleError(f"trace {name!r} has a dependency cycle ({named}, ...); no critical path")
            dropped = _break(sweeps, stuck)
            cross.value[:] = 0.0
            cross.final[:] = False
            links.close()
            links = _Links(n, len(bounds) > 1, spill_dir)
            out = _Outcome(len(bounds), own_cycles=True)
            left = sweeps.run(lambda grp, solved: out.take(sweeps, grp, solved, links), "path without cycles")
            assert not left, "cycles left after breaking them"
        length, last = out.end()
        rows = links.chain(last) if last >= 0 else np.zeros(0, dtype=np.int64)
    finally:
        links.close()
    ranks, lengths, counts = out.per_rank()
    return BatchedPath(
        length, rows, ranks, lengths, counts, dropped, sweeps.sweeps, sweeps.solves, sweeps.largest
    )


class _Outcome:
    """What each done group adds: its units' heaviest ends, predecessors and ranks' own paths."""

    def __init__(self, k: int, own_cycles: bool = False) -> None:
        self.ends: list[tuple[float, int] | None] = [None] * k  # each unit's first op that ends last
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * k
        self.own_cycles = own_cycles

    def take(self, sweeps: _Sweeps, grp: _Group, solved: _Solved, links: _Links) -> None:
        nb = len(grp.weight)
        finish, pred = solved.finish[:nb], solved.pred[:nb]
        lo = np.asarray([sweeps.bounds[u][0] for u in grp.units], dtype=np.int64)
        unit_of = np.searchsorted(grp.offsets, np.arange(nb), side="right") - 1
        glob = np.full(nb, -1, dtype=np.int64)
        mine = (pred >= 0) & (pred < nb)
        glob[mine] = lo[unit_of[pred[mine]]] + pred[mine] - grp.offsets[unit_of[pred[mine]]]
        from_cross = pred >= nb
        glob[from_cross] = sweeps.cross.send[solved.incoming[pred[from_cross] - nb]]
        rank_parts = _rank_paths(grp, None if self.own_cycles else solved.gen[:nb])
        for i, u in enumerate(grp.units):
            a, z = int(grp.offsets[i]), int(grp.offsets[i + 1])
            links.put(int(lo[i]), glob[a:z])
            if z > a:
                last = a + int(np.argmax(finish[a:z]))
                self.ends[u] = (float(finish[last]), int(lo[i]) + last - a)
            self.parts[u] = rank_parts[i]

    def end(self) -> tuple[float, int]:
        """The first op (in row order) that ends last, and its finish; ``(0.0, -1)`` without ops."""
        best, row = -np.inf, -1
        for got in self.ends:  # units in row order: a tie keeps the first
            if got is not None and got[0] > best:
                best, row = got
        return (best, row) if row >= 0 else (0.0, -1)

    def per_rank(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [p for p in self.parts if p is not None]
        if not parts:
            return np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int64)
        ranks, lengths, counts = (np.concatenate(cols) for cols in zip(*parts, strict=True))
        return ranks, lengths, counts


def _rank_paths(grp: _Group, gen: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per unit of the group, each rank's heaviest path over its dependencies alone: ranks,
    lengths, op counts.

    ``gen`` orders every op of the group (a layering of all its edges orders its dependencies
    too); None after cycles were broken, when each rank's own cycles are broken as they would
    be on that rank alone and the dependencies ordered again.
    """
    nb = len(grp.weight)
    srcs, dsts = [], []
    for d, off in zip(grp.data, grp.offsets.tolist(), strict=False):
        srcs.append(d.dep_src + off)
        dsts.append(d.dep_dst + off)
    src, dst = np.concatenate(srcs), np.concatenate(dsts)  # every dependency: none was dropped here
    if gen is None:
        keep = break_cycles(nb, src, dst) if len(src) else np.ones(0, dtype=bool)
        src, dst = src[keep], dst[keep]
        gen = generations(nb, src, dst)
    finish, pred = heaviest_paths(gen, src, dst, grp.weight)
    links = np.ascontiguousarray(pred, dtype=np.int64).data
    out = []
    for d, off in zip(grp.data, grp.offsets.tolist(), strict=False):
        starts = (d.rank_starts + off).tolist()
        lengths = np.zeros(len(d.ranks))
        counts = np.zeros(len(d.ranks), dtype=np.int64)
        for i, (a, z) in enumerate(pairwise(starts)):
            last = a + int(np.argmax(finish[a:z]))
            steps, v = 1, links[last]
            while v >= 0:  # the path's ops: O(path), summed over ranks at most O(V)
                steps, v = steps + 1, links[v]
            lengths[i], counts[i] = float(finish[last]), steps
        out.append((np.asarray(d.ranks, dtype=np.int32), lengths, counts))
    return out


def _stuck(sweeps: _Sweeps, left: list[int]) -> list[tuple[np.ndarray, _Group]]:
    """Per group left undone, its unplaced ops (global rows, ascending) and its units read (its
    inputs are those of its last solve, so a solve again places what that one placed)."""
    out = []
    for g in left:
        grp = sweeps.read(g)
        solved = sweeps.solve(g, grp)
        unplaced = np.flatnonzero(solved.gen[: len(grp.weight)] < 0)
        unit = np.searchsorted(grp.offsets, unplaced, side="right") - 1
        lo = np.asarray([sweeps.bounds[u][0] for u in grp.units], dtype=np.int64)
        out.append((np.sort(lo[unit] + unplaced - grp.offsets[unit]), grp))
    return out


def _break(sweeps: _Sweeps, stuck: list[tuple[np.ndarray, _Group]]) -> int:
    """Drop the edges :func:`~etstore.dag.break_cycles` drops, found on the ops on or behind a
    cycle alone (every cycle, and every path from one, lies among them); returns how many."""
    members = np.sort(np.concatenate([rows for rows, _ in stuck]))
    src, dst, tags = [], [], []
    for _, grp in stuck:
        for u, d in zip(grp.units, grp.data, strict=True):
            lo, hi = sweeps.bounds[u]
            inside = np.zeros(hi - lo, dtype=bool)
            inside[members[(members >= lo) & (members < hi)] - lo] = True
            for kind, (s, t) in enumerate(((d.dep_src, d.dep_dst), (d.msg_send, d.msg_recv))):
                pos = np.flatnonzero(inside[s] & inside[t])
                src.append(s[pos] + lo)
                dst.append(t[pos] + lo)
                tags.append(np.stack([np.full(len(pos), u), np.full(len(pos), kind), pos]))
    cross = sweeps.cross
    both = np.isin(cross.send, members) & np.isin(cross.recv, members)
    pos = np.flatnonzero(both)
    src.append(cross.send[pos])
    dst.append(cross.recv[pos])
    tags.append(np.stack([np.full(len(pos), -1), np.full(len(pos), 2), pos]))
    gsrc, gdst, tag = np.concatenate(src), np.concatenate(dst), np.concatenate(tags, axis=1)
    keep = break_cycles(len(members), np.searchsorted(members, gsrc), np.searchsorted(members, gdst))
    drop = tag[:, ~keep]
    for _, grp in stuck:
        for u in grp.units:
            mine = drop[:, drop[0] == u]
            sweeps.dep_drop[u] = mine[2, mine[1] == 0]
            sweeps.msg_drop[u] = mine[2, mine[1] == 1]
    cross.keep[drop[2, drop[1] == 2]] = False
    return int(drop.shape[1])
