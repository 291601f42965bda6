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
  last one are left out (HTA counts only whole iterations).

Per collective instance (the k-th of a process group on every member), the *arrival skew* is the
latest start less the earliest; a member's *wait* is the latest start less its own, its
*transfer* its end less the latest start; bus bandwidth on the transfer part (GB = 10^9 B, as
nccl-tests) is what the network gave it, where the recorded kernel's own time includes waiting
for late peers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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

    ranks: pa.Table  # rank, kernel_us, idle_us, compute_us, non_compute_us, *_pct, comm_comp_overlap_pct
    kernels: pa.Table  # rank, kernel_class, count, sum_us, pct (of the rank's activity time)
    collectives: pa.Table  # rank, pg_name, seq, comm_type, size_bytes, measured/skew/wait/transfer µs, busbw


def _device(trace: Trace) -> pa.Table:
    """The trace's device activities HTA would count: not launched in a rank's last profiler step
    when it recorded two or more."""
    ops = trace.ops
    dev = pc.and_(pc.invert(pc.fill_null(ops["is_cpu_op"], True)), pc.greater(ops["start_time_micros"], 0))
    dev = pc.and_(dev, pc.invert(pc.equal(ops["type"], "METADATA_NODE")))
    rows = ops.filter(dev)
    last: dict[int, int] = {}
    for r, steps in (trace.params.get("profiler_steps") or {}).items():
        if len(steps) >= 2:
            last[int(r)] = max(int(s[1]) for s in steps)
    if not last or not rows.num_rows:
        return rows
    # a device activity's launch: the CPU op with a ctrl edge to it
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
    for r, s, d in zip(*(trace.deps[k].to_pylist() for k in ("rank", "src", "dst")), strict=True):
        at = cpu_start.get((int(r), int(s)))
        if at is not None:
            launched[(int(r), int(d))] = at
    keep = [
        launched.get((int(r), int(i)), int(st)) < last.get(int(r), 1 << 62)
        for r, i, st in zip(
            rows["rank"].to_pylist(),
            rows["id"].to_pylist(),
            rows["start_time_micros"].to_pylist(),
            strict=True,
        )
    ]
    return rows.filter(pa.array(keep, pa.bool_()))


def breakdown(trace: Trace) -> Breakdown:
    """Measured breakdowns of a recorded ``trace`` (see the module's note).

    Raises
    ------
    OptionError
        The trace has no recorded device activity (no Kineto times, or a CPU-only recording):
        there is no GPU time to break down.
    """
    dev = _device(trace)
    if not dev.num_rows:
        raise OptionError(
            f"trace {trace.name!r} has no recorded device activity (GPU kernels, copies with Kineto times) "
            "to break down"
        )
    rank = dev["rank"].to_numpy()
    start = dev["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    end = start + dev["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    cls = np.asarray([kernel_class(n or "") for n in dev["name"].to_pylist()], dtype=object)
    out: dict[str, list[Any]] = {k: [] for k in _RANK_COLUMNS}
    krows: dict[str, list[Any]] = {"rank": [], "kernel_class": [], "count": [], "sum_us": [], "pct": []}
    for r in sorted(set(rank.tolist())):
        mine = rank == r
        s, e, c = start[mine], end[mine], cls[mine]
        span = float(e.max() - s.min())
        run = merged_length(s, e)
        comp = c == "COMPUTATION"
        compute = merged_length(s[comp], e[comp])
        idle = span - run
        comm = c == "COMMUNICATION"
        comm_us = merged_length(s[comm], e[comm])
        overlap = _overlap_length((s[comm], e[comm]), (s[comp], e[comp]))
        for k, v in (
            ("rank", r),
            ("kernel_us", span),
            ("idle_us", idle),
            ("compute_us", compute),
            ("non_compute_us", span - compute - idle),
            ("idle_pct", _pct(idle, span)),
            ("compute_pct", _pct(compute, span)),
            ("non_compute_pct", _pct(span - compute - idle, span)),
            ("comm_comp_overlap_pct", _pct(overlap, comm_us) if comm_us else None),
        ):
            out[k].append(v)
        total = float((e - s).sum())
        for k in ("COMPUTATION", "COMMUNICATION", "MEMORY", "OTHER"):
            sel = c == k
            if sel.any():
                t = float((e[sel] - s[sel]).sum())
                for col, v in (("rank", r), ("kernel_class", k), ("count", int(sel.sum())), ("sum_us", t)):
                    krows[col].append(v)
                krows["pct"].append(_pct(t, total))
    return Breakdown(pa.table(out), pa.table(krows), _collective_waits(trace))


_RANK_COLUMNS = (
    "rank",
    "kernel_us",
    "idle_us",
    "compute_us",
    "non_compute_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_comp_overlap_pct",
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
