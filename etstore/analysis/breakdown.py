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
for late peers.
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
from etstore.sim.replay import collective_transfers
from etstore.sim.result import busbw_factor, nccl_bytes

__all__ = ["Breakdown", "breakdown", "kernel_class", "merged_length"]

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
        raise OptionError(
            f"trace {trace.name!r} has no recorded device activity (GPU kernels, copies with Kineto times) "
            "to break down"
        )
    steps: dict[int, list[tuple[str, int]]] = {
        int(r): sorted(((str(x[0]), int(x[1])) for x in v), key=lambda t: t[1])
        for r, v in (trace.params.get("profiler_steps") or {}).items()
    }
    when = np.where(d.launch >= 0, d.launch, d.start)  # which step launched it
    out: dict[str, list[Any]] = {k: [] for k in _RANK_COLUMNS}
    krows: dict[str, list[Any]] = {"rank": [], "kernel_class": [], "count": [], "sum_us": [], "pct": []}
    for r in sorted(set(d.rank.tolist())):
        mine = d.rank == r
        mine_steps = steps.get(r, [])
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
                out[key].append(v)
        c, dur = d.cls[whole], (d.end - d.start)[whole]
        total = float(dur.sum())
        for kc in ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"):
            sel = c == kc
            if sel.any():
                t = float(dur[sel].sum())
                for col, v in (("rank", r), ("kernel_class", kc), ("count", int(sel.sum())), ("sum_us", t)):
                    krows[col].append(v)
                krows["pct"].append(_pct(t, total))
    return Breakdown(pa.table(out), pa.table(krows), _collective_waits(trace))


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
    start = np.asarray([starts[(int(r), int(i))] for r, i in zip(rank, ids, strict=True)], dtype=np.int64)
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
    busbw = [
        round(nccl_bytes(c, int(b), members[k]) * busbw_factor(c, members[k]) / (x * 1e3), 3)
        if c and b and x > 0
        else None
        for c, b, x, k in zip(
            t["comm_type"].to_pylist(), t["size_bytes"].to_pylist(), transfer, key, strict=True
        )
    ]
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
            "busbw_transfer_gb_per_s": pa.array(busbw, pa.float64()),
        }
    )
