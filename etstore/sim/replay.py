"""Replay a recorded step as it ran, and set each rank's simulated step beside the measured one.

A recorded trace (PyTorch ET + Kineto, ``params["execution"] == "recorded"``) carries its
measured compute: CPU ops with their own work (time blocked in a synchronizing call is a
dependency on the device work it waited for, not a duration), GPU activities on their
streams, each after its launch and the waits it was held by. What it does not carry is a
network: a collective kernel's recorded time is mostly waiting for its peers. So:

* each rank enters the step when it did in the recording (its ``ProfilerStep#`` start,
  else its first op): one op per rank, ``etstore::enter_step``, lasts from the earliest
  rank's entry to its own, and every op of the rank without a dependency waits for it;
* each collective instance (the k-th collective of a process group on every member) has a
  *transfer* part, measured as the median end of its kernels less the latest start, when
  every peer had arrived: the rest of a kernel's time is waiting for peers, which the
  replay models by the collective itself;
* the network is fitted to those transfer parts: link latency and bandwidth of a
  one-switch topology (``switch:N``) by non-negative least squares on the relative error,
  using that the simulated time of a collective is affine in latency and in 1/bandwidth;
  a given topology is used as it is, for what-ifs.

The measured step of a rank runs from its entry to the end of the last of its ops (CPU or
GPU) in the recording; the simulated one from the same entry to the same ops' simulated
end. Ops are the ones the recording has on both sides, so the two are comparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etstore.errors import OptionError
from etstore.model import Trace, deps_table
from etstore.sim._lsq import nonneg_lstsq
from etstore.sim.config import SimConfig
from etstore.sim.engine import RECORDED, simulate
from etstore.sim.result import SimResult
from etstore.sim.sweep import collective_workload
from etstore.topology import Topology

__all__ = ["ENTRY_NAME", "Replay", "collective_transfers", "fit_network", "replay"]

ENTRY_NAME = "etstore::enter_step"
_BASE_LAT_NS, _BASE_BW = 500.0, 50.0  # the point the affine model is taken at


@dataclass(frozen=True)
class Replay:
    """A replayed recording: per-rank steps, per-collective rows, the network used, the run."""

    steps: pa.Table  # rank, step, measured_us, simulated_us, error_pct
    collectives: pa.Table  # per rank and instance: measured, transfer and simulated times
    topology: Topology
    fitted: bool
    result: SimResult


class _Entry(NamedTuple):
    """A rank's recorded step: where it entered, its ``ProfilerStep#N`` starts, its last end (µs)."""

    at: int
    steps: list[tuple[str, int]]
    last: int


def _rank_entries(trace: Trace) -> dict[int, _Entry]:
    """Each rank enters at its first ``ProfilerStep#``, else at its first op (``params["windows"]``)."""
    profiler: Mapping[str, Any] = trace.params.get("profiler_steps") or {}
    windows: Mapping[str, Any] = trace.params.get("windows") or {}
    out: dict[int, _Entry] = {}
    for r in trace.ranks:
        first, last = windows.get(str(r)) or (0, 0)
        steps = [(str(name), int(start)) for name, start, _ in profiler.get(str(r)) or []]
        at = steps[0][1] if steps else int(first)
        out[r] = _Entry(at, steps or [("window", at)], int(last))
    return out


def _with_entries(trace: Trace, entries: Mapping[int, _Entry]) -> Trace:
    """The trace with one entry op per rank (see the module's note)."""
    ops, deps = trace.ops, trace.deps
    t0 = min(e.at for e in entries.values())
    rank = ops["rank"].to_numpy()
    ids = ops["id"].to_numpy().astype(np.uint64)
    has_dep = set(zip(deps["rank"].to_numpy().tolist(), deps["dst"].to_numpy().tolist(), strict=True))
    new_rows: dict[str, list[Any]] = {f.name: [] for f in ops.schema}
    e_src, e_dst, e_rank = [], [], []
    for r, entry in sorted(entries.items()):
        mine = ids[rank == r]
        eid = int(mine.max()) + 1
        row = dict.fromkeys(new_rows)
        row.update(
            rank=r,
            id=eid,
            name=ENTRY_NAME,
            type="COMP_NODE",
            duration_micros=entry.at - t0,
            start_time_micros=t0,
            is_cpu_op=True,
        )
        for k, v in row.items():
            new_rows[k].append(v)
        roots = [int(i) for i in mine.tolist() if (r, int(i)) not in has_dep]
        e_src += [eid] * len(roots)
        e_dst += roots
        e_rank += [r] * len(roots)
    extra = pa.Table.from_pydict(new_rows, schema=ops.schema)
    new_deps = deps_table(np.asarray(e_rank, dtype=np.int32), e_src, e_dst, "ctrl")
    return trace.replace(
        ops=pa.concat_tables([ops, extra]), deps=pa.concat_tables([deps, new_deps.cast(deps.schema)])
    )


def collective_transfers(trace: Trace) -> pa.Table:
    """Per collective kernel: its instance, measured time and the instance's transfer part (µs).

    The k-th ``COMM_COLL_NODE`` of a process group on each rank is instance k (the
    simulator pairs them the same way). The transfer part is the median end of the
    instance's kernels less their latest start: the time after the last peer arrived.
    """
    ops = trace.ops
    is_coll = np.asarray([t == "COMM_COLL_NODE" for t in ops["type"].to_pylist()], dtype=bool)
    rows = np.flatnonzero(is_coll)
    if not len(rows):
        return pa.table({"rank": pa.array([], pa.int32())})
    sub = ops.take(pa.array(rows))
    rank = sub["rank"].to_numpy()
    ids = sub["id"].to_numpy().astype(np.int64)
    pg = [p or "" for p in sub["pg_name"].to_pylist()]
    start = sub["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    dur = sub["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    seq = np.zeros(len(rows), dtype=np.int64)
    count: dict[tuple[int, str], int] = {}
    for i in np.lexsort((ids, rank)).tolist():
        key = (int(rank[i]), pg[i])
        seq[i] = count.get(key, 0)
        count[key] = seq[i] + 1
    transfer = np.zeros(len(rows), dtype=np.float64)
    for group, k in {(p, int(s)) for p, s in zip(pg, seq.tolist(), strict=True)}:
        members = np.flatnonzero((np.asarray(pg, dtype=object) == group) & (seq == k))
        ends = start[members] + dur[members]
        transfer[members] = max(1.0, float(np.median(ends)) - float(start[members].max()))
    return pa.table(
        {
            "rank": pa.array(rank, pa.int32()),
            "id": pa.array(ids.astype(np.uint64)),
            "pg_name": pg,
            "seq": seq,
            "comm_type": sub["comm_type"],
            "size_bytes": sub["comm_size"],
            "measured_us": dur.astype(np.float64),
            "transfer_us": transfer,
        }
    )


def fit_network(transfers: pa.Table, num_npus: int, config: SimConfig | None = None) -> Topology:
    """``switch:N`` with the latency and bandwidth that best give the measured transfer parts.

    One simulation per distinct collective (type, size) at a base point and one per
    parameter give each time as ``c + a·latency + b/bandwidth``; the relative errors are
    then minimised over latency ≥ 0 and 1/bandwidth ≥ 0.
    """
    cfg = (config or SimConfig()).replace(integer_ns=False)
    measured: dict[tuple[str, int], list[float]] = {}
    for c, size, t in zip(
        *(transfers[k].to_pylist() for k in ("comm_type", "size_bytes", "transfer_us")), strict=True
    ):
        if c and size:
            measured.setdefault((str(c), int(size)), []).append(float(t))
    keys = sorted(measured)
    if not keys:
        return Topology.from_spec(f"switch:{num_npus},bw={_BASE_BW:g},lat={_BASE_LAT_NS:g}")

    def times(lat: float, bw: float) -> np.ndarray:
        topo = Topology.from_spec(f"switch:{num_npus},bw={bw!r},lat={lat!r}")
        return np.asarray(
            [
                simulate(
                    collective_workload(c, num_npus, s if c != "ALL_GATHER" else s * num_npus),
                    topo,
                    config=cfg,
                ).total_ns
                / 1e3
                for c, s in keys
            ]
        )

    base = times(_BASE_LAT_NS, _BASE_BW)
    a = (times(2 * _BASE_LAT_NS, _BASE_BW) - base) / _BASE_LAT_NS  # µs per ns of latency
    b = (times(_BASE_LAT_NS, _BASE_BW / 2) - base) * _BASE_BW  # µs per (1 / GB/s)
    c = base - a * _BASE_LAT_NS - b / _BASE_BW
    m = np.asarray([float(np.median(measured[k])) for k in keys])
    x = nonneg_lstsq(np.stack([a / m, b / m], axis=1), 1.0 - c / m)
    lat = float(x[0])
    bw = 1.0 / float(x[1]) if x[1] > 1e-12 else 1e6
    return Topology.from_spec(f"switch:{num_npus},bw={bw:.6g},lat={lat:.6g}")


def replay(trace: Trace, topo: Topology | None = None, *, config: SimConfig | None = None) -> Replay:
    """Replay ``trace`` (recorded) on ``topo``, or on a network fitted to its own collectives.

    Raises
    ------
    OptionError
        The trace carries no recorded timings (an execution trace without Kineto, a
        Chakra or synthetic trace): there is nothing measured to replay.
    """
    if trace.params.get("execution") != RECORDED:
        raise OptionError(
            f"trace {trace.name!r} was not recorded with timings (a PyTorch execution trace linked with its "
            "Kineto trace): nothing measured to replay; 'etstore sim' simulates it"
        )
    entries = _rank_entries(trace)
    ranks = sorted(entries)
    transfers = collective_transfers(trace)
    fitted = topo is None
    if topo is None:
        topo = fit_network(transfers, max(ranks) + 1, config)
    work = _with_entries(trace, entries)
    res = simulate(work, topo, config=config)
    steps = _steps(trace, res, entries)
    return Replay(steps, _collective_rows(transfers, res), topo, fitted, res)


def _steps(trace: Trace, res: SimResult, entries: Mapping[int, _Entry]) -> pa.Table:
    """One row per rank and profiler step: the measured step beside the simulated one.

    A step starts where the thread left off before the first op that started in it (that op's
    start less its thread time), in the recording and in the replay alike; the first starts at
    the rank's entry, the last ends with the rank's last op.
    """
    ops = trace.ops
    rank = ops["rank"].to_numpy()
    start = ops["start_time_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    dur = ops["duration_micros"].to_numpy(zero_copy_only=False).astype(np.int64)
    cpu = pc.fill_null(ops["is_cpu_op"], False).to_numpy(zero_copy_only=False) & (start > 0)
    sim = res.ops
    s_rank = sim["rank"].to_numpy()
    s_end = sim["end_ns"].to_numpy()
    is_entry = sim["name"].to_numpy(zero_copy_only=False) == ENTRY_NAME
    n0 = ops.num_rows  # the replay's ops are the trace's, in its order, then the entries
    out: dict[str, list[Any]] = {
        "rank": [],
        "step": [],
        "measured_us": [],
        "simulated_us": [],
        "error_pct": [],
    }
    for r, entry in sorted(entries.items()):
        mine = np.flatnonzero((rank == r) & cpu)
        mine = mine[np.argsort(start[mine], kind="stable")]
        rec = [float(entry.at)]
        rep = [float(s_end[(s_rank == r) & is_entry].max()) / 1e3]
        for _, at in entry.steps[1:]:
            i = int(np.searchsorted(start[mine], at))
            b = int(mine[min(i, len(mine) - 1)])
            rec.append(float(start[b] - dur[b]))
            rep.append(float(s_end[b]) / 1e3 - float(dur[b]))
        rec.append(float(entry.last))
        rep.append(float(s_end[:n0][s_rank[:n0] == r].max()) / 1e3)
        for k, (name, _) in enumerate(entry.steps):
            measured, simulated = rec[k + 1] - rec[k], rep[k + 1] - rep[k]
            out["rank"].append(r)
            out["step"].append(name)
            out["measured_us"].append(measured)
            out["simulated_us"].append(round(simulated, 3))
            out["error_pct"].append(round(100.0 * (simulated - measured) / measured, 2) if measured else None)
    return pa.table(out)


def _collective_rows(transfers: pa.Table, res: SimResult) -> pa.Table:
    if not transfers.num_rows or "id" not in transfers.column_names:
        return transfers
    sim = res.ops
    key = {
        (int(r), int(i)): (s, e)
        for r, i, s, e in zip(
            sim["rank"].to_pylist(),
            sim["id"].to_pylist(),
            sim["start_ns"].to_pylist(),
            sim["end_ns"].to_pylist(),
            strict=True,
        )
    }
    simulated = [
        round((key[(int(r), int(i))][1] - key[(int(r), int(i))][0]) / 1e3, 3)
        if (int(r), int(i)) in key
        else None
        for r, i in zip(transfers["rank"].to_pylist(), transfers["id"].to_pylist(), strict=True)
    ]
    return transfers.append_column("simulated_us", pa.array(simulated, pa.float64()))
