"""Where the time of a recorded step went, as measured: HTA's breakdowns, and each collective's wait.

A recorded trace (PyTorch ET + Kineto) carries its device activities with their Kineto times.
The breakdowns read them as HolisticTraceAnalysis (HTA) defines its own, so the numbers agree
with what users know:

* **kernel classes**: communication (``nccl…Kernel``), memory (``Memcpy…``, ``Memset…``,
  ``dma…``), computation (every other kernel except NCCL's, copies and ``…Sync``), other;
* **temporal** (per rank): the *kernel time* runs from the first device activity's start to the
  last one's end; *idle* is the part no activity covers, *compute* the part a computation kernel
  covers, *non-compute* the rest (communication and copies alone);
* **overlap** (per rank): the share of communication time during which a computation kernel ran;
* as HTA does, where a rank recorded two or more ``ProfilerStep#`` the activities launched in its
  last one are left out of the rank's ``all`` row (HTA counts only whole iterations); a row per
  profiler step follows, each with the activities launched in it;
* **launch-bound** (``launch_bound_pct``): the share of the kernel time the device sat idle
  waiting for the host, in gaps whose next activity was launched only after the gap began (the
  launch taken at its CPU op's start: a lower bound).

Per collective instance (the k-th of a process group on every member), the *arrival skew* is the
latest start less the earliest; a member's *wait* is the latest start less its own, its
*transfer* its end less the latest start; bus bandwidth on the transfer part (GB = 10^9 B, as
nccl-tests) is what the network gave it, where the recorded kernel's own time includes waiting
for late peers. In an expansion of a recording, a collective it replaced starts when the
expansion's record says (``params["collective_blocks"]``), as its own row does.

The per-rank tables are built a few ranks at a time (:class:`RankBreakdowns`, over
:func:`device_activities`), so a stored trace can be broken down without loading it whole
(:mod:`etstore.app.breakdown`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.model import Trace
from etstore.sim._holds import recorded_blocks
from etstore.sim.replay import collective_transfers
from etstore.sim.result import busbw_factor, nccl_bytes

__all__ = [
    "Breakdown",
    "RankBreakdowns",
    "breakdown",
    "busbw_transfer",
    "collective_table",
    "device_activities",
    "kernel_class",
    "merged_length",
    "no_device_activity",
]

_COMM = re.compile(r"nccl.*Kernel")
_MEMORY = re.compile(r"Memcpy|Memset|dma")
_NOT_COMPUTE = re.compile(r"nccl.*Kernel|.*Memcpy|Memset|.*Sync")  # matched at the name's start, as HTA


def kernel_class(name: str) -> str:
    """``COMMUNICATION``, ``MEMORY``, ``COMPUTATION`` or ``OTHER``, by HTA's rules.

    >>> [kernel_class(n) for n in ("ncclKernel_AllReduce_RING_LL_Sum_float", "Memcpy HtoD (Pinned -> Device)",
    ...  "sm90_xmma_gemm_f32f32", "cudaDeviceSynchronize")]
    ['COMMUNICATION', 'MEMORY', 'COMPUTATION', 'OTHER']
    """
    if _COMM.match(name):
        return "COMMUNICATION"
    if _MEMORY.match(name):
        return "MEMORY"
    if not _NOT_COMPUTE.match(name):
        return "COMPUTATION"
    return "OTHER"


def merged_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals ``[start, end)``.

    >>> merged_length(np.array([0, 5, 20]), np.array([10, 12, 25]))
    17.0
    """
    if not len(start):
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order].astype(np.float64), end[order].astype(np.float64)
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]  # an interval that starts after all before it ended
    firsts = np.flatnonzero(new)
    lasts = np.r_[firsts[1:] - 1, len(s) - 1]
    return float((reach[lasts] - s[firsts]).sum())


def _overlap_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of (union of ``a``) ∩ (union of ``b``): |A| + |B| - |A ∪ B|."""
    both = (np.r_[a[0], b[0]], np.r_[a[1], b[1]])
    return merged_length(*a) + merged_length(*b) - merged_length(*both)


@dataclass(frozen=True)
class Breakdown:
    """The measured breakdowns of a recorded trace (every time µs, every share %)."""

    ranks: pa.Table  # rank, step ("all", then each ProfilerStep#), kernel_us, idle_us, ..., *_pct
    kernels: pa.Table  # rank, kernel_class, count, sum_us, pct (of the rank's activity time, "all")
    collectives: pa.Table  # rank, pg_name, seq, comm_type, size_bytes, measured/skew/wait/transfer µs, busbw


class _Device(NamedTuple):
    """A trace's device activities as columns, with when each was launched."""

    rank: np.ndarray
    start: np.ndarray  # µs
    end: np.ndarray
    cls: np.ndarray  # kernel class
    launch: np.ndarray  # start of the CPU op that launched it (µs), -1 where unknown


def _device(trace: Trace) -> _Device:
    """The trace's device activities and their launches (the CPU op with a ctrl edge to each)."""
    ops = trace.ops
    dev = pc.and_(pc.invert(pc.fill_null(ops["is_cpu_op"], True)), pc.greater(ops["start_time_micros"], 0))
    dev = pc.and_(dev, pc.invert(pc.equal(ops["type"], "METADATA_NODE")))
    rows = ops.filter(dev)
    cpu_start = {
        (int(r), int(i)): int(s)
        for r, i, s, c in zip(
            ops["rank"].to_pylist(),
            ops["id"].to_pylist(),
            ops["start_time_micros"].to_pylist(),
            ops["is_cpu_op"].to_pylist(),
            strict=True,
        )
        if c and s
    }
    launched: dict[tuple[int, int], int] = {}
    for r, src, d in zip(*(trace.deps[k].to_pylist() for k in ("rank", "src", "dst")), strict=True):
        at = cpu_start.get((int(r), int(src)))
        if at is not None:
            launched[(int(r), int(d))] = at
    start = rows["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    return _Device(
        rank=rows["rank"].to_numpy(),
        start=start,
        end=start + rows["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64),
        cls=np.asarray([kernel_class(n or "") for n in rows["name"].to_pylist()], dtype=object),
        launch=np.asarray(
            [
                launched.get((int(r), int(i)), -1)
                for r, i in zip(rows["rank"].to_pylist(), rows["id"].to_pylist(), strict=True)
            ],
            dtype=np.int64,
        ),
    )


def device_activities(ops: pa.Table, dep_src: np.ndarray, dep_dst: np.ndarray) -> _Device:
    """The device activities of ``ops`` (some whole ranks) and their launches, given the rows of
    each dependency's ends in ``ops`` in table order: :func:`breakdown`'s reading of a trace,
    in numpy (the same where each rank's op ids are unique, as a store's are).

    ``ops`` needs ``rank``, ``id``, ``name``, ``type``, ``is_cpu_op``, ``start_time_micros`` and
    ``duration_micros``.
    """
    dev = pc.and_(pc.invert(pc.fill_null(ops["is_cpu_op"], True)), pc.greater(ops["start_time_micros"], 0))
    dev = pc.and_(dev, pc.invert(pc.equal(ops["type"], "METADATA_NODE")))
    at = np.flatnonzero(pc.fill_null(dev, False).to_numpy(zero_copy_only=False))
    rows = ops.take(pa.array(at, pa.int64()))
    op_start = pc.fill_null(ops["start_time_micros"], 0).to_numpy().astype(np.int64)
    cpu = pc.fill_null(ops["is_cpu_op"], False).to_numpy(zero_copy_only=False) & (op_start != 0)
    dep_src, dep_dst = np.asarray(dep_src, dtype=np.int64), np.asarray(dep_dst, dtype=np.int64)
    by_cpu = np.flatnonzero(cpu[dep_src])
    launch_of = np.full(ops.num_rows, -1, dtype=np.int64)
    if len(by_cpu):  # the last such dependency in table order sets an op's launch
        last = len(by_cpu) - 1 - np.unique(dep_dst[by_cpu][::-1], return_index=True)[1]
        launch_of[dep_dst[by_cpu[last]]] = op_start[dep_src[by_cpu[last]]]
    names = pc.fill_null(rows["name"], "")
    classes = pc.unique(names).to_pylist()
    cls = np.asarray([kernel_class(n) for n in classes], dtype=object)
    start = rows["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    return _Device(
        rank=rows["rank"].to_numpy(),
        start=start,
        end=start + rows["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64),
        cls=cls[pc.index_in(names, pa.array(classes, pa.string())).to_numpy()] if len(classes) else cls,
        launch=launch_of[at],
    )


def _launch_bound(start: np.ndarray, end: np.ndarray, launch: np.ndarray) -> float:
    """GPU idle time (µs) in gaps whose next activity was launched only after the gap began: the
    device waited for the host. (The launch is its CPU op's start, so this is a lower bound.)"""
    if len(start) < 2:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e, at = start[order], end[order], launch[order]
    reach = np.maximum.accumulate(e)
    gap = np.flatnonzero(s[1:] > reach[:-1]) + 1  # an idle gap ends at activity k
    starved = at[gap] > reach[gap - 1]
    return float((s[gap] - reach[gap - 1])[starved].sum())


def _row(d: _Device, sel: np.ndarray) -> dict[str, Any]:
    """The temporal breakdown of the activities ``sel`` (see the module's note)."""
    s, e, c = d.start[sel], d.end[sel], d.cls[sel]
    span = float(e.max() - s.min())
    idle = span - merged_length(s, e)
    comp = c == "COMPUTATION"
    compute = merged_length(s[comp], e[comp])
    comm = c == "COMMUNICATION"
    comm_us = merged_length(s[comm], e[comm])
    overlap = _overlap_length((s[comm], e[comm]), (s[comp], e[comp]))
    launch_bound = _launch_bound(s, e, d.launch[sel])
    return {
        "kernel_us": span,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": span - compute - idle,
        "idle_pct": _pct(idle, span),
        "compute_pct": _pct(compute, span),
        "non_compute_pct": _pct(span - compute - idle, span),
        "comm_comp_overlap_pct": _pct(overlap, comm_us) if comm_us else None,
        "launch_bound_pct": _pct(launch_bound, span),
    }


def breakdown(trace: Trace) -> Breakdown:
    """Measured breakdowns of a recorded ``trace`` (see the module's note).

    Raises
    ------
    OptionError
        The trace has no recorded device activity (no Kineto times, or a CPU-only recording):
        there is no GPU time to break down.
    """
    d = _device(trace)
    if not len(d.rank):
        raise OptionError(no_device_activity(trace.name))
    rows = RankBreakdowns(trace.params)
    rows.add(d)
    ranks, kernels = rows.tables()
    return Breakdown(ranks, kernels, _collective_waits(trace))


def no_device_activity(name: str) -> str:
    """The refusal of a trace without device activity."""
    return (
        f"trace {name!r} has no recorded device activity (GPU kernels, copies with Kineto times) "
        "to break down"
    )


class RankBreakdowns:
    """The ``ranks`` and ``kernels`` tables, added to rank by rank: device activities of some
    whole ranks at a time (:func:`device_activities`), ranks ascending, give the rows the whole
    trace gives."""

    def __init__(self, params: Any) -> None:
        self.steps: dict[int, list[tuple[str, int]]] = {
            int(r): sorted(((str(x[0]), int(x[1])) for x in v), key=lambda t: t[1])
            for r, v in ((params or {}).get("profiler_steps") or {}).items()
        }
        self.out: dict[str, list[Any]] = {k: [] for k in _RANK_COLUMNS}
        self.krows: dict[str, list[Any]] = {k: [] for k in ("rank", "kernel_class", "count", "sum_us", "pct")}
        self.activities = 0

    def add(self, d: _Device) -> None:
        """The rows of the ranks of ``d`` (each rank's activities one block, ranks ascending)."""
        self.activities += len(d.rank)
        if not len(d.rank):
            return
        cuts = np.flatnonzero(d.rank[1:] != d.rank[:-1]) + 1
        for a, z in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(d.rank)].tolist(), strict=True):
            self._rank(int(d.rank[a]), _Device(*(x[a:z] for x in d)))

    def _rank(self, r: int, d: _Device) -> None:
        when = np.where(d.launch >= 0, d.launch, d.start)  # which step launched it
        mine = np.ones(len(d.rank), dtype=bool)
        mine_steps = self.steps.get(r, [])
        # the whole trace as HTA counts it: without what the last of two or more steps launched
        whole = mine & (when < mine_steps[-1][1]) if len(mine_steps) >= 2 else mine
        rows = [("all", whole)]
        for k, (name, at) in enumerate(mine_steps):
            nxt = mine_steps[k + 1][1] if k + 1 < len(mine_steps) else None
            sel = mine & (when >= at if k else np.ones_like(mine)) & (when < nxt if nxt is not None else True)
            if sel.any():
                rows.append((name, sel))
        for step, sel in rows:
            if not sel.any():
                continue
            for key, v in {"rank": r, "step": step, **_row(d, sel)}.items():
                self.out[key].append(v)
        c, dur = d.cls[whole], (d.end - d.start)[whole]
        total = float(dur.sum())
        for kc in ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"):
            sel = c == kc
            if sel.any():
                t = float(dur[sel].sum())
                for col, v in (("rank", r), ("kernel_class", kc), ("count", int(sel.sum())), ("sum_us", t)):
                    self.krows[col].append(v)
                self.krows["pct"].append(_pct(t, total))

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """``ranks`` and ``kernels`` (see :class:`Breakdown`)."""
        return pa.table(self.out), pa.table(self.krows)


_RANK_COLUMNS = (
    "rank",
    "step",
    "kernel_us",
    "idle_us",
    "compute_us",
    "non_compute_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_comp_overlap_pct",
    "launch_bound_pct",
)


def _pct(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def _collective_waits(trace: Trace) -> pa.Table:
    """Per member of each collective instance: arrival skew, its wait, its transfer, bus bandwidth."""
    t = collective_transfers(trace)
    if not t.num_rows:
        return t
    ops = trace.ops
    starts = {
        (int(r), int(i)): int(s)
        for r, i, s in zip(
            ops["rank"].to_pylist(), ops["id"].to_pylist(), ops["start_time_micros"].to_pylist(), strict=True
        )
    }
    rank, ids = t["rank"].to_pylist(), t["id"].to_pylist()
    expanded = t["expanded"].to_numpy(zero_copy_only=False)
    start = np.zeros(t.num_rows, dtype=np.int64)
    kept = np.flatnonzero(~expanded).tolist()
    start[kept] = [starts[(int(rank[i]), int(ids[i]))] for i in kept]
    if expanded.any():  # a node an expansion replaced started when its record says, not at its id
        found = recorded_blocks(trace.params or {})[0] or {}
        start[expanded] = [x or 0 for x in found["start_time_micros"]]
    key = [f"{p}/{s}" for p, s in zip(t["pg_name"].to_pylist(), t["seq"].to_pylist(), strict=True)]
    latest: dict[str, int] = {}
    earliest: dict[str, int] = {}
    members: dict[str, int] = {}
    for k, s in zip(key, start.tolist(), strict=True):
        latest[k] = max(latest.get(k, s), s)
        earliest[k] = min(earliest.get(k, s), s)
        members[k] = members.get(k, 0) + 1
    wait = np.asarray([latest[k] - s for k, s in zip(key, start.tolist(), strict=True)], dtype=np.float64)
    skew = np.asarray([latest[k] - earliest[k] for k in key], dtype=np.float64)
    transfer = t["own_transfer_us"].to_numpy()
    busbw = busbw_transfer(
        t["comm_type"].to_pylist(),
        t["size_bytes"].to_pylist(),
        np.asarray([members[k] for k in key], dtype=np.int64),
        transfer,
    )
    return collective_table(t, skew, wait, transfer, busbw)


def busbw_transfer(
    comm_type: list[str | None], size_bytes: list[int | None], members: np.ndarray, transfer_us: np.ndarray
) -> pa.Array:
    """Bus bandwidth (GB/s, GB = 10^9 B) of each collective member's transfer part, rounded to
    3 places; null without a type, a size or a transfer time."""
    factor: dict[tuple[str, int], tuple[int, float]] = {}
    out: list[float | None] = []
    for c, b, m, x in zip(comm_type, size_bytes, members.tolist(), transfer_us.tolist(), strict=True):
        if not (c and b and x > 0):
            out.append(None)
            continue
        f = factor.get((c, m))
        if f is None:
            f = factor[(c, m)] = (nccl_bytes(c, 1, m), busbw_factor(c, m))
        out.append(round(int(b) * f[0] * f[1] / (x * 1e3), 3))
    return pa.array(out, pa.float64())


def collective_table(
    t: pa.Table, skew: np.ndarray, wait: np.ndarray, transfer: np.ndarray, busbw: pa.Array
) -> pa.Table:
    """The ``collectives`` table from :func:`~etstore.sim.replay.collective_transfers` rows and
    their waits."""
    return pa.table(
        {
            "rank": t["rank"],
            "pg_name": t["pg_name"],
            "seq": t["seq"],
            "comm_type": t["comm_type"],
            "size_bytes": t["size_bytes"],
            "measured_us": t["measured_us"],
            "skew_us": skew,
            "wait_us": wait,
            "transfer_us": transfer,
            "busbw_transfer_gb_per_s": busbw,
        }
    )
