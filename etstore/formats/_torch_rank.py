"""One rank of a PyTorch execution trace as columns, and the edits the execution model makes
to them beyond the ET's own nodes: runs a backend's worker did not record, and the releases
an op gets from the data it reads on another thread (:mod:`.pytorch_et`, :mod:`._torch_lanes`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from etstore.formats._torch_et_nodes import Comm

__all__ = ["RankColumns", "add_unrecorded_runs", "data_releases"]


@dataclass
class RankColumns:
    """One rank's ops as columns (ET nodes first, then linked device activities)."""

    ids: np.ndarray
    names: list[str]
    types: list[str]
    is_cpu: list[bool | None]
    dur: np.ndarray
    start: np.ndarray
    comm: Comm
    extras: list[list[tuple[str, bytes]]]
    src: list[np.ndarray] = field(default_factory=list)  # dependency rows, by kind below
    dst: list[np.ndarray] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def append(
        self,
        names: list[str],
        is_cpu: bool,
        dur: np.ndarray,
        start: np.ndarray,
        extras: list[list[tuple[str, bytes]]],
    ) -> np.ndarray:
        """Add compute ops after the existing ones (ids after the largest); returns their rows."""
        n, m = len(self.names), len(names)
        self.ids = np.concatenate([self.ids, int(self.ids.max(initial=0)) + 1 + np.arange(m, dtype=np.int64)])
        self.names += names
        self.types += ["COMP_NODE"] * m
        self.is_cpu += [is_cpu] * m
        self.dur = np.concatenate([self.dur, np.asarray(dur, dtype=np.int64)])
        self.start = np.concatenate([self.start, np.asarray(start, dtype=np.int64)])
        self.extras += extras
        for lst in (self.comm.kind, self.comm.size, self.comm.pg, self.comm.peer, self.comm.tag):
            lst.extend([None] * m)
        return np.arange(n, n + m, dtype=np.int64)

    def edge(self, src: np.ndarray, dst: np.ndarray, kind: str) -> None:
        self.src.append(np.asarray(src, dtype=np.int64))
        self.dst.append(np.asarray(dst, dtype=np.int64))
        self.kinds.append(kind)


def add_unrecorded_runs(rank: RankColumns, calls: list[int]) -> list[int]:
    """A stand-in, off any thread, for the run a backend's worker did not record (the ET ended
    first): it becomes the collective, launched by its call, writing what the call would have
    written, and it lasts until the first op that read its result started (by then it had
    ended). Its call is then a plain CPU op that returned, as an async call does. Returns the
    stand-ins' rows."""
    rows: list[int] = []
    c = rank.comm
    for call in calls:
        readers = np.concatenate(
            [d[s == call] for s, d, k in zip(rank.src, rank.dst, rank.kinds, strict=True) if k == "data"]
            or [np.zeros(0, dtype=np.int64)]
        )
        readers = readers[rank.start[readers] > 0]
        begin = int(rank.start[call])
        end = int(rank.start[readers].min()) if len(readers) else begin + int(rank.dur[call])
        (row,) = rank.append(
            [f"{rank.names[call]} (unrecorded run)"],
            True,
            np.asarray([max(end - begin, 0)], dtype=np.int64),
            np.asarray([begin], dtype=np.int64),
            [[("unrecorded_run_of", str(int(rank.ids[call])).encode())]],  # its call, in the op's attrs
        )
        c.kind[row], c.kind[call] = c.kind[call], None
        c.size[row], c.size[call] = c.size[call], None
        c.pg[row], c.pg[call] = c.pg[call], None
        c.peer[row], c.peer[call] = c.peer[call], None
        c.tag[row], c.tag[call] = c.tag[call], None
        kind = c.kind[row]
        rank.types[row], rank.types[call] = (kind.node_type if kind else "COMP_NODE"), "COMP_NODE"
        for s, k in zip(rank.src, rank.kinds, strict=True):
            if k in ("data", "overwrite"):  # what it wrote, the run wrote
                s[s == call] = row
        rank.edge(np.asarray([call]), np.asarray([row]), "launch")
        rows.append(int(row))
    return rows


def data_releases(
    rank: RankColumns, seq: np.ndarray, tids: np.ndarray, end: np.ndarray, runs: list[int]
) -> np.ndarray:
    """Per position of ``seq``: the latest recorded end of an op of another thread (or of an
    unrecorded run, ``runs``: on no thread) whose data it reads (its ``data`` edges), else -1."""
    n = len(rank.names)
    end_of = np.full(n, -1, dtype=np.int64)
    end_of[seq] = end
    tid_of = np.full(n, -1, dtype=np.int64)
    tid_of[: len(tids)] = tids
    for r in runs:
        end_of[r] = int(rank.start[r] + rank.dur[r])
        tid_of[r] = -2 - r  # a thread of its own
    at = np.full(n, -1, dtype=np.int64)
    at[seq] = np.arange(len(seq))
    out = np.full(len(seq), -1, dtype=np.int64)
    for src, dst, kind in zip(rank.src, rank.dst, rank.kinds, strict=True):
        if kind != "data" or not len(src):
            continue
        keep = (at[dst] >= 0) & (end_of[src] >= 0) & (tid_of[src] != tid_of[dst]) & (tid_of[src] != -1)
        np.maximum.at(out, at[dst[keep]], end_of[src[keep]])
    return out
